package dedup_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
)

// Check joins the caller's own transaction: the decision holds only if the
// caller's other writes commit with it.
func ExampleCheck() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampleDSN()) // search_path selects dam's schema
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	a := canon.Digest{byte(canon.SchemeBytes1), 0xaa} // normally from package canon
	b := canon.Digest{byte(canon.SchemeBytes1), 0xbb}
	for _, content := range []canon.Digest{a, a, b, a} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			d, err := dedup.Check(ctx, tx, "customer-2", []byte("banana-1"), content)
			if err != nil {
				return err
			}
			fmt.Println(d)
			// ... the caller's own writes, in the same transaction ...
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// forward
	// duplicate
	// forward
	// forward
}

// Decide decides a batch of one partition in one transaction, fenced by the
// epoch that Acquire returned.
func ExampleStore_Decide() {
	ctx := context.Background()
	store, err := dedup.Open(ctx, exampleDSN(), dedup.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	p := dedup.Partition{Group: "dam-customer-2", Topic: "projections.customer-2", Partition: 0}
	pr, err := store.Acquire(ctx, p)
	if err != nil {
		log.Fatal(err)
	}
	if !pr.HasNext { // a new partition: start where Kafka starts
		if err := store.InitProgress(ctx, p, pr.Epoch, 100); err != nil {
			log.Fatal(err)
		}
		pr.Next = 100
	}
	a := canon.Digest{byte(canon.SchemeJSON1), 0xaa}
	b := canon.Digest{byte(canon.SchemeJSON1), 0xbb}
	batch := &dedup.Batch{
		Service: "customer-2", Partition: p, Epoch: pr.Epoch,
		Start: pr.Next, End: 104,
		Records: []dedup.Record{
			{Offset: 100, Entity: []byte("banana-1"), Digest: a},
			{Offset: 101, Entity: []byte("banana-1"), Digest: a},
			{Offset: 102, Entity: []byte("banana-2"), Digest: a},
			{Offset: 103, Entity: []byte("banana-1"), Digest: b},
		},
	}
	decisions, err := store.Decide(ctx, batch, nil)
	if err != nil {
		log.Fatal(err)
	}
	for i, d := range decisions {
		fmt.Println(batch.Records[i].Offset, string(batch.Records[i].Entity), d)
	}
	// Recovery reads back what was decided in [100, 104).
	logged, covered, err := store.Logged(ctx, p, 100, 104)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("covered:", covered, "forwarded:", len(logged))
	// Output:
	// 100 banana-1 forward
	// 101 banana-1 duplicate
	// 102 banana-2 forward
	// 103 banana-1 forward
	// covered: true forwarded: 3
}

// Window mode decides by message id: a repeat of an id inside the window
// is a duplicate whatever its content; from the id's expiry on, it is new
// again. Batch.Now pins the clock (the sidecar leaves it zero: the
// database's clock).
func ExampleStore_Decide_window() {
	ctx := context.Background()
	store, err := dedup.Open(ctx, exampleDSN(), dedup.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	p := dedup.Partition{Group: "dam-payments", Topic: "commands.payments", Partition: 0}
	pr, err := store.Acquire(ctx, p)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.InitProgress(ctx, p, pr.Epoch, 0); err != nil {
		log.Fatal(err)
	}
	rule := dedup.Rule{Mode: dedup.Window, Window: 24 * time.Hour}
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	a := canon.Digest{byte(canon.SchemeJSON1), 0xaa}
	b := canon.Digest{byte(canon.SchemeJSON1), 0xbb}
	next := int64(0)
	decide := func(at time.Duration, id string, content canon.Digest) {
		batch := &dedup.Batch{Service: "payments", Partition: p, Epoch: pr.Epoch, Rule: rule, Now: start.Add(at),
			Start: next, End: next + 1, Records: []dedup.Record{{Offset: next, Entity: []byte(id), Digest: content}}}
		decisions, err := store.Decide(ctx, batch, nil)
		if err != nil {
			log.Fatal(err)
		}
		next++
		fmt.Println(at, id, decisions[0])
	}
	decide(0, "key-1", a)
	decide(time.Hour, "key-1", b) // a retry with changed content: still a duplicate
	decide(time.Hour, "key-2", a)
	decide(24*time.Hour, "key-1", a) // the window of key-1 is over
	// Output:
	// 0s key-1 forward
	// 1h0m0s key-1 duplicate
	// 1h0m0s key-2 forward
	// 24h0m0s key-1 forward
}
