package dedup_test

import (
	"context"
	"fmt"
	"log"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
)

// CheckBatch decides several records in one round trip and one
// transaction, in their order: a repeated identity compares against the
// item before it.
func ExampleStore_CheckBatch() {
	ctx := context.Background()
	store, err := dedup.Open(ctx, exampleDSN(), dedup.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	a := canon.Digest{byte(canon.SchemeJSON1), 0xaa}
	b := canon.Digest{byte(canon.SchemeJSON1), 0xbb}
	items := []dedup.CheckItem{
		{Service: "customer-2", Entity: []byte("banana-1"), Digest: a},
		{Service: "customer-2", Entity: []byte("banana-2"), Digest: a},
		{Service: "customer-2", Entity: []byte("banana-1"), Digest: a},
		{Service: "customer-2", Entity: []byte("banana-1"), Digest: b},
	}
	decisions, err := store.CheckBatch(ctx, items, nil)
	if err != nil {
		log.Fatal(err)
	}
	for i, d := range decisions {
		fmt.Println(string(items[i].Entity), d)
	}
	// Output:
	// banana-1 forward
	// banana-2 forward
	// banana-1 duplicate
	// banana-1 forward
}
