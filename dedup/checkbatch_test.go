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
	cctx, cancel := context.WithTimeout(ctx, 600*time.Millisecond)
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
	if elapsed > 600*time.Millisecond {
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
