package pipeline_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// TestBreakBatchDigestsAcrossCompositions: the same values decided once
// in one large batch (hashed in lanes) and again in batches of one or two
// (hashed one at a time, below laneMin), in the other order and mixed with
// bad input: every second copy is a duplicate, so "out" holds exactly the
// first round's valid records. Lengths straddle block edges and laneMax.
func TestBreakBatchDigestsAcrossCompositions(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.Entity = "/id"
	rt.DeadLetter = "dlq"
	cfg := testConfig(t, kc, dsn, rt)
	r := start(t, cfg, openStore(t, dsn))

	var valid []*kgo.Record
	var first []*kgo.Record
	bad := 0
	for i := range 90 {
		n := i * 3
		if i >= 80 {
			n = 8<<10 - 40 + (i-80)*9 // around laneMax
		}
		v := fmt.Sprintf(`{"id":"e%d","pad":%q}`, i, strings.Repeat("p", n))
		valid = append(valid, rec(fmt.Sprintf("k%d", i), v))
		first = append(first, rec(fmt.Sprintf("k%d", i), v))
		switch i % 9 {
		case 2:
			first = append(first, rec("bad", `{"pad":1}`)) // no /id
			bad++
		case 5:
			first = append(first, rec("bad", `{"id":`)) // invalid
			bad++
		case 7:
			first = append(first, tomb("bad")) // tombstone on a pointer route
			bad++
		}
	}
	one(t, kc, "in", first...)
	r.waitRecords("svc", len(first))
	waitOutput(t, kc, "out", len(valid))

	total := len(first)
	for i := len(valid) - 1; i >= 0; i -= 2 {
		batch := []*kgo.Record{rec(string(valid[i].Key), string(valid[i].Value))}
		if i > 0 {
			batch = append(batch, rec(string(valid[i-1].Key), string(valid[i-1].Value)))
		}
		one(t, kc, "in", batch...)
		total += len(batch)
		r.waitRecords("svc", total)
	}
	if got := kc.ReadAll("out"); len(got) != len(valid) {
		t.Fatalf("out holds %d records, want %d (the second copies are duplicates)", len(got), len(valid))
	}
	if got := kc.ReadAll("dlq"); len(got) != bad {
		t.Fatalf("dlq holds %d records, want %d", len(got), bad)
	}
}
