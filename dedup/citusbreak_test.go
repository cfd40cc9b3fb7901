package dedup_test

// Adversarial tests of dam on Citus (branch citusbreak). Each test states
// the finding it proves; they run on plain PostgreSQL too, where they pass,
// and fail on Citus (DAM_TEST_CITUS=1) on today's code.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

// Finding: on Citus the window cleanup never deletes anything, so
// window_ids grows without bound (a resource exhausted).
//
// docs/citus.md says the window cleanup runs on Citus "every shard, in short
// chunks". The sidecar runs dedup.Store.CleanupWindow every
// cleanup_interval for each window-mode route (pipeline/modes.go); its
// statement (sqlExpire) picks the expired ids with SELECT ... FOR UPDATE SKIP
// LOCKED filtered by service only, which is a multi-shard FOR UPDATE: Citus
// refuses it ("could not run distributed query with FOR UPDATE/SHARE
// commands", 0A000). cleanupLoop logs a warning and tries again at the next
// interval, forever: no expired id is ever deleted, and every forwarded
// message id stays in window_ids for good. The same refusal breaks
// `dam state prune` (sqlPruneChunk: FOR UPDATE OF s SKIP LOCKED) and
// `dam state reset SERVICE` (sqlResetChunk: FOR UPDATE): the existing
// TestPruneWindowAndCleanup, TestPruneStateChunks, TestResetServiceInBatches
// and TestStateOpsEveryMode fail on Citus for the same reason, and
// TestResetServiceHoldsNoLongLocks hangs there (it waits for a first batch
// that never comes).
func TestCitusWindowCleanupDeletesExpiredIds(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	st := newStream(t, s, "cleanup", dedup.Rule{Mode: dedup.Window, Window: time.Hour})
	var recs []vrec
	for i := range 40 {
		recs = append(recs, vrec{fmt.Sprint("id-", i), "x", 0})
	}
	// Forwarded two hours ago with a window of one hour: all expired.
	st.decide(time.Now().Add(-2*time.Hour), recs...)

	// What the sidecar's cleanup loop does every cleanup_interval.
	for round := 1; round <= 3; round++ {
		n, ran, err := s.CleanupWindow(ctx, "svc", 0)
		if err != nil || !ran {
			var left int64
			_ = s.Pool().QueryRow(ctx, `SELECT count(*) FROM window_ids WHERE service = 'svc'`).Scan(&left)
			t.Fatalf("window cleanup round %d: deleted %d, ran %v, %v; %d expired ids left in window_ids "+
				"(the sidecar retries at every interval, and the table only grows)", round, n, ran, err, left)
		}
		if round == 1 && n != 40 {
			t.Fatalf("window cleanup deleted %d expired ids, want 40", n)
		}
	}
	var left int64
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM window_ids WHERE service = 'svc'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d expired ids left after the cleanup", left)
	}
}
