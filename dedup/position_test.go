package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dam-dedup/dam/dedup"
)

// The progress row keeps the committed offset its owner knew (never going
// back) and the input topic's id (bound once).
func TestProgressPosition(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	p, epoch := partition(t, s, "position")
	read := func() dedup.Progress {
		t.Helper()
		pr, err := s.ReadProgress(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return pr
	}
	if pr := read(); pr.Delivered != -1 || pr.TopicID != ([16]byte{}) {
		t.Fatalf("a new partition: %+v, want no delivered offset and no topic id", pr)
	}
	decide := func(start, end, delivered int64) {
		t.Helper()
		b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: start, End: end, Delivered: delivered,
			Records: []dedup.Record{{Offset: start, Entity: []byte("e"), Digest: digest(fmt.Sprint(start))}}}
		if _, err := s.Decide(ctx, b, nil); err != nil {
			t.Fatal(err)
		}
	}
	decide(0, 1, 0) // unknown: nothing recorded
	if pr := read(); pr.Delivered != -1 {
		t.Fatalf("after a decide without a delivered offset: %d", pr.Delivered)
	}
	decide(1, 2, 1)
	decide(2, 3, 0)
	if pr := read(); pr.Delivered != 1 || pr.Next != 3 {
		t.Fatalf("after decides knowing 1 then nothing: %+v", pr)
	}
	if err := s.SetDelivered(ctx, []dedup.Delivered{{Partition: p, Offset: 3}, {Partition: dedup.Partition{Group: "g", Topic: "absent"}, Offset: 9}}); err != nil {
		t.Fatal(err)
	}
	decide(3, 4, 2) // an older knowledge does not go back
	if pr := read(); pr.Delivered != 3 {
		t.Fatalf("delivered %d, want 3", pr.Delivered)
	}

	id1, id2 := [16]byte{1, 2, 3}, [16]byte{9}
	if got, err := s.BindTopic(ctx, p, epoch, id1); err != nil || got != id1 {
		t.Fatalf("first bind: %x, %v", got, err)
	}
	if got, err := s.BindTopic(ctx, p, epoch, id2); err != nil || got != id1 {
		t.Fatalf("second bind: %x, %v; want the first id back", got, err)
	}
	if pr := read(); pr.TopicID != id1 {
		t.Fatalf("topic id %x, want %x", pr.TopicID, id1)
	}
	if _, err := s.BindTopic(ctx, p, epoch+1, id1); !errors.Is(err, dedup.ErrFenced) {
		t.Fatalf("a bind under another epoch: %v, want ErrFenced", err)
	}
}

func TestRecordError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "22023"}, true},
		{fmt.Errorf("dedup: decide: %w", &pgconn.PgError{Code: "54000"}), true},
		{&pgconn.PgError{Code: "42P01"}, false}, // a missing table: every record would fail
		{&pgconn.PgError{Code: "57P01"}, false}, // a server shutting down: an outage
		{fmt.Errorf("%w: x", dedup.ErrUnavailable), false},
		{dedup.ErrFenced, false},
		{errors.New("other"), false},
		{nil, false},
	} {
		if got := dedup.RecordError(c.err); got != c.want {
			t.Errorf("RecordError(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
