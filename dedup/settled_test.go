package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

// SettledProgress waits for a transaction holding the progress row, and
// reads what it committed: a decider learning the outcome of its own batch
// must not read P from before a commit still in flight (on Citus, a
// two-phase commit prepared on the worker that holds the row).
// ReadProgress reads the old P meanwhile.
func TestSettledProgressWaitsForACommitInFlight(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	p, epoch := partition(t, s, "settled")
	inflight, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer inflight.Rollback(ctx)
	if _, err := inflight.Exec(ctx, `UPDATE progress SET next_offset = 7 WHERE grp = $1 AND topic = $2 AND part = $3`,
		p.Group, p.Topic, p.Partition); err != nil {
		t.Fatal(err)
	}
	if pr, err := s.ReadProgress(ctx, p); err != nil || pr.Next != 0 {
		t.Fatalf("ReadProgress during the commit: %+v, %v; want the old P, 0", pr, err)
	}
	type result struct {
		pr  dedup.Progress
		err error
	}
	done := make(chan result, 1)
	go func() {
		pr, err := s.SettledProgress(ctx, p)
		done <- result{pr, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !waiting(ctx, t, s) {
		select {
		case r := <-done:
			t.Fatalf("SettledProgress returned %+v, %v while the commit was in flight", r.pr, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("SettledProgress never waited")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := inflight.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.pr.Next != 7 || r.pr.Epoch != epoch {
		t.Fatalf("SettledProgress: %+v, %v; want P 7 at epoch %d", r.pr, r.err, epoch)
	}
}
