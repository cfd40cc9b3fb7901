package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

// TestBreak2CheckTimeGoesBack: the decision time written for one identity
// must never go back (sqlClock's promise: "whichever instance writes it"),
// and a refresh_after route must forward an unchanged record only when its
// identity was last forwarded longer ago than refresh_after. serve's path
// (Store.CheckBatch, group commit of several clients' items) writes
// updated_at = now(), its transaction's start: an item that waits behind
// another item's row lock writes, after a Decide that forwarded the same
// identity later, a time earlier than the one stored. The identity then
// reads as last forwarded before it really was, and the next unchanged
// record of a refresh_after route is forwarded (Refresh) although the
// identity was forwarded (by the check) a few milliseconds earlier: a
// duplicate forwarded.
func TestBreak2CheckTimeGoesBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	p, epoch := partition(t, s, "in")
	const refresh = 500 * time.Millisecond
	rule := dedup.Rule{RefreshAfter: refresh}
	decide := func(start int64, entity, content string) dedup.Decision {
		t.Helper()
		b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Rule: rule, Start: start, End: start + 1,
			Records: []dedup.Record{{Offset: start, Entity: []byte(entity), Digest: digest(content)}}}
		out, err := s.Decide(ctx, b, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	if d := decide(0, "a", "X"); d != dedup.Forward {
		t.Fatalf("a X: %v", d)
	}
	// Another transaction holds a's row (a decider, a reset).
	blocker, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `SELECT 1 FROM state WHERE service = 'svc' AND entity = 'a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	type res struct {
		out []dedup.Decision
		err error
	}
	done := make(chan res, 1)
	go func() {
		out, err := s.CheckBatch(ctx, []dedup.CheckItem{
			{Service: "svc", Entity: []byte("a"), Digest: digest("Z")},
			{Service: "svc", Entity: []byte("b"), Digest: digest("X")},
		}, nil)
		done <- res{out, err}
	}()
	for !waiting(ctx, t, s) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(700 * time.Millisecond) // below lock_timeout (2s)
	// Meanwhile b is forwarded by a decider: stored (Y, t_D).
	if d := decide(1, "b", "Y"); d != dedup.Forward {
		t.Fatalf("b Y: %v", d)
	}
	var tD time.Time
	if err := s.Pool().QueryRow(ctx, `SELECT updated_at FROM state WHERE service = 'svc' AND entity = 'b'`).Scan(&tD); err != nil {
		t.Fatal(err)
	}
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.out[1] != dedup.Forward { // b: X after Y
		t.Fatalf("check b X after Y: %v", r.out[1])
	}
	forwardedByCheck := time.Now() // b was last forwarded (X) no later than this
	var tC time.Time
	if err := s.Pool().QueryRow(ctx, `SELECT updated_at FROM state WHERE service = 'svc' AND entity = 'b'`).Scan(&tC); err != nil {
		t.Fatal(err)
	}
	if tC.Before(tD) {
		t.Errorf("b's stored time went back: %v written after %v (by %v)", tC, tD, tD.Sub(tC))
	}
	// b X again, right after the check forwarded X: not due for a refresh.
	d := decide(2, "b", "X")
	if since := time.Since(forwardedByCheck); d != dedup.Duplicate && since < refresh {
		t.Errorf("b X, %v after the check forwarded X (refresh_after %v): %v, want Duplicate: a duplicate forwarded", since, refresh, d)
	}
}
