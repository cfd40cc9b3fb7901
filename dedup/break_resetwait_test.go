package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pgtest"
)

// TestBreakResetServiceWaitsThenKeeps: ResetService's chunk waits for a
// row a decider holds (FOR UPDATE), then deletes what it locked, the
// version the decider committed meanwhile included. A chunk that deleted
// by tid missed it: the DELETE looked the tid up with the statement's
// snapshot, taken before the wait, so the row the reset waited for was
// kept and the reset reported success; under live traffic a reset would
// miss exactly the identities being decided, and the replay an operator
// runs after it would drop their records as duplicates. A delete by key
// follows the update chain (PostgreSQL's recheck) and deletes it.
func TestBreakResetServiceWaitsThenKeeps(t *testing.T) {
	ctx := context.Background()
	s, err := dedup.Open(ctx, pgtest.DSN(t), dedup.Config{MaxConns: 4, LockTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if distributed(t, s) {
		t.Skip("the one-server statement")
	}
	p, epoch := partition(t, s, "in")
	decideAll(t, s, "svc", p, epoch, []rec{{"a", "1"}, {"b", "1"}, {"c", "1"}}, 3)
	// A decider rewriting b, in flight (what a Decide's rewrite does).
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	d := digest("2")
	if _, err := tx.Exec(ctx, `UPDATE state SET digest = $1, updated_at = clock_timestamp() WHERE service = 'svc' AND entity = 'b'`, d[:]); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = s.ResetService(ctx, "svc")
		done <- err
	}()
	for !waiting(ctx, t, s) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	left, err := s.Count(ctx, "svc")
	if err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		st, _ := s.Get(ctx, "svc", []byte("b"))
		t.Fatalf("ResetService returned (%d deleted) and left %d identities of the service; b: digest %x... (the decider's)", n, left, st.Digest[:4])
	}
}
