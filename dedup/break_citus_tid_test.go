package dedup_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/dam-dedup/dam/dedup"
)

// TestBreakCitusRewriteByTidHitsOtherShards: tables distributed under a
// running dam (the case engine.go's relearn is written for) leave the store
// deciding in the one-server shape for as long as a batch's identities sit
// in one shard: Citus routes that single-shard SELECT ... FOR UPDATE, whose
// ctid is a tid in that shard. The rewrite by tid (cb20b48) has no key
// condition: Citus runs it on every shard, where the same tid is some other
// identity's row. A forward of one identity then writes its digest into
// other identities' state (a write reaching the wrong row): their next
// unchanged record is forwarded (a duplicate) and a record equal to the
// foreign digest is dropped (a loss). The row-count check cannot undo it:
// COMMIT is in the same pipeline.
//
// On plain PostgreSQL migration 005 does nothing and the test passes.
func TestBreakCitusRewriteByTidHitsOtherShards(t *testing.T) {
	ctx := context.Background()
	const n = 64
	var recs []rec
	for i := range n {
		recs = append(recs, rec{fmt.Sprint("e-", i), "A"})
	}
	// dam decides offsets [0, n), then `dam migrate` distributes the tables
	// under it: every shard's rows are copied in, from the first tid of its
	// first page.
	_, s, p, epoch := distributedUnderRunningDam(t, "tid", recs)

	// The next batch: one existing identity changes.
	b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: n, End: n + 1,
		Records: []dedup.Record{{Offset: n, Entity: []byte("e-0"), Digest: digest("B")}}}
	out, err := s.Decide(ctx, b, nil)
	t.Logf("Decide: %v, %v", out, err)

	for i := 1; i < n; i++ {
		e := fmt.Sprint("e-", i)
		st, err := s.Get(ctx, "svc", []byte(e))
		if err != nil {
			t.Fatalf("%s: %v", e, err)
		}
		if st.Digest != digest("A") || st.Offset != int64(i) {
			t.Errorf("%s: state %v from offset %d, want A's from offset %d: e-0's write reached it", e, st.Digest, st.Offset, i)
		}
	}
}
