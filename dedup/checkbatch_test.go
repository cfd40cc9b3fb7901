package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dam-dedup/dam/dedup"
)

// CheckBatch decides in item order, per identity, like a run of Check.
func TestCheckBatchSemantics(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	if _, err := s.Check(ctx, "svc", []byte("b"), digest("B")); err != nil {
		t.Fatal(err)
	}
	items := []dedup.CheckItem{
		{Service: "svc", Entity: []byte("b"), Digest: digest("B")}, // duplicate of the stored B
		{Service: "svc", Entity: []byte("a"), Digest: digest("A")}, // new
		{Service: "svc", Entity: []byte("a"), Digest: digest("A")}, // duplicate of the item before
		{Service: "other", Entity: []byte("a"), Digest: digest("A")},
		{Service: "svc", Entity: []byte("b"), Digest: digest("C")},
		{Service: "svc", Entity: nil, Digest: digest("E")}, // the empty entity
		{Service: "svc", Entity: []byte("a"), Digest: digest("B")},
		{Service: "svc", Entity: []byte("a"), Digest: digest("A")},
	}
	out, err := s.CheckBatch(ctx, items, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "[duplicate forward duplicate forward forward forward forward forward]"
	if fmt.Sprint(out) != want {
		t.Fatalf("got %v, want %v", out, want)
	}
	if st, err := s.Get(ctx, "svc", []byte("a")); err != nil || st.Digest != digest("A") || st.Topic != "" || st.Offset != -1 {
		t.Fatalf("state of a: %+v, %v", st, err)
	}
	if out, err := s.CheckBatch(ctx, nil, out); err != nil || len(out) != 0 {
		t.Fatalf("empty batch: %v, %v", out, err)
	}
	if _, err := s.CheckBatch(ctx, []dedup.CheckItem{{Service: "svc", Entity: []byte("x")}}, nil); !errors.Is(err, dedup.ErrInvalid) {
		t.Fatalf("zero digest: %v", err)
	}
}

// Inside a caller's transaction, a CheckBatch holds only if it commits.
func TestCheckBatchInTransaction(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	items := []dedup.CheckItem{{Service: "svc", Entity: []byte("a"), Digest: digest("A")}}
	err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
		out, err := dedup.CheckBatch(ctx, tx, items, nil)
		if err != nil || out[0] != dedup.Forward {
			t.Fatalf("%v %v", out, err)
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "svc", []byte("a")); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("rolled back CheckBatch left state: %v", err)
	}
}

// A CheckBatch that would outlive its context's deadline waiting on a row
// lock is aborted by PostgreSQL itself, before the deadline: the error
// means nothing was decided, even though the lock is released afterwards.
func TestCheckBatchDeadlineAbortsOnServer(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	if _, err := s.Check(ctx, "svc", []byte("a"), digest("A")); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM state WHERE service = 'svc' AND entity = 'a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	const deadline = 1500 * time.Millisecond
	cctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	_, err = s.CheckBatch(cctx, []dedup.CheckItem{
		{Service: "svc", Entity: []byte("b"), Digest: digest("B")},
		{Service: "svc", Entity: []byte("a"), Digest: digest("B")},
	}, nil)
	elapsed := time.Since(start)
	var pgErr *pgconn.PgError
	if !errors.Is(err, dedup.ErrUnavailable) || !errors.As(err, &pgErr) || (pgErr.Code != "55P03" && pgErr.Code != "57014") {
		t.Fatalf("CheckBatch on a locked row: %v; want ErrUnavailable from the server's lock or statement timeout", err)
	}
	if elapsed > deadline {
		t.Fatalf("answered after %v: past the deadline", elapsed)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := s.Get(ctx, "svc", []byte("b")); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("b was decided by an aborted batch: %v", err)
	}
	if st, err := s.Get(ctx, "svc", []byte("a")); err != nil || st.Digest != digest("A") {
		t.Fatalf("a changed: %+v %v", st, err)
	}
	// The pool is usable after the aborted batch.
	if out, err := s.CheckBatch(ctx, []dedup.CheckItem{{Service: "svc", Entity: []byte("a"), Digest: digest("B")}}, nil); err != nil || out[0] != dedup.Forward {
		t.Fatalf("after: %v %v", out, err)
	}
}

// TestCheckBatchTimeNeverGoesBack: the decision time CheckBatch (serve's
// path, a group commit of several clients' items) writes for an identity
// never goes back (sqlClock's promise: "whichever instance writes it"),
// even for an item that waits behind another transaction's row lock while
// a Decide forwards the same identity: a time earlier than the one stored
// would make the identity read as last forwarded before it really was, and
// a refresh_after route would forward its next unchanged record (Refresh)
// a few milliseconds after the check forwarded it: a duplicate forwarded.
func TestCheckBatchTimeNeverGoesBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	p, epoch := partition(t, s, "in")
	// a, then b, in the order the check locks them.
	a, b := "a", "b"
	if distributed(t, s) {
		a, b = lockedInOrder(ctx, t, s)
	}
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
	if d := decide(0, a, "X"); d != dedup.Forward {
		t.Fatalf("a X: %v", d)
	}
	// Another transaction holds a's row (a decider, a reset).
	blocker, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `SELECT 1 FROM state WHERE service = 'svc' AND entity = $1::bytea FOR UPDATE`, a); err != nil {
		t.Fatal(err)
	}
	type res struct {
		out []dedup.Decision
		err error
	}
	done := make(chan res, 1)
	go func() {
		out, err := s.CheckBatch(ctx, []dedup.CheckItem{
			{Service: "svc", Entity: []byte(a), Digest: digest("Z")},
			{Service: "svc", Entity: []byte(b), Digest: digest("X")},
		}, nil)
		done <- res{out, err}
	}()
	for !waiting(ctx, t, s) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(700 * time.Millisecond) // below lock_timeout (2s)
	// Meanwhile b is forwarded by a decider: stored (Y, t_D).
	if d := decide(1, b, "Y"); d != dedup.Forward {
		t.Fatalf("b Y: %v", d)
	}
	var tD time.Time
	if err := s.Pool().QueryRow(ctx, `SELECT updated_at FROM state WHERE service = 'svc' AND entity = $1::bytea`, b).Scan(&tD); err != nil {
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
	if err := s.Pool().QueryRow(ctx, `SELECT updated_at FROM state WHERE service = 'svc' AND entity = $1::bytea`, b).Scan(&tC); err != nil {
		t.Fatal(err)
	}
	if tC.Before(tD) {
		t.Errorf("b's stored time went back: %v written after %v (by %v)", tC, tD, tD.Sub(tC))
	}
	// b X again, right after the check forwarded X: not due for a refresh.
	d := decide(2, b, "X")
	if since := time.Since(forwardedByCheck); d != dedup.Duplicate && since < refresh {
		t.Errorf("b X, %v after the check forwarded X (refresh_after %v): %v, want Duplicate: a duplicate forwarded", since, refresh, d)
	}
}
