package dedup_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

// Skip steps past the record a partition stands at: not decided (P at
// it), it is logged as skipped and P moves past it; decided and not
// delivered (below P, at C), its log entry turns skipped. Either way the
// epoch moves (the owner is fenced), the skip is recorded with who, why
// and when, and recovery's reads of the log see the entry as skipped.
func TestSkipRecordsAndFences(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	p, epoch := partition(t, s, "in")
	// [0,3): 0 a:A forward, 1 a:A duplicate, 2 b:X forward; P = 3.
	decideAll(t, s, "svc", p, epoch, []rec{{"a", "A"}, {"a", "A"}, {"b", "X"}}, 3)

	// Not where the partition stands: refused, nothing changes.
	for _, tc := range []struct {
		offset, committed int64
		want              string
	}{
		{4, 3, "not decided yet, and the partition's progress is 3"},
		{4, -1, "not decided yet, and the partition's progress is 3"},
		{0, 1, "below the group's committed offset 1"},
		{1, 1, "decided a duplicate"},
	} {
		_, err := s.Skip(ctx, p, tc.offset, tc.committed, "alice", "why")
		if !errors.Is(err, dedup.ErrSkip) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Skip(%d, C %d): %v, want ErrSkip saying %q", tc.offset, tc.committed, err, tc.want)
		}
	}
	if pr, _ := s.ReadProgress(ctx, p); pr.Epoch != epoch || pr.Next != 3 {
		t.Fatalf("a refused skip changed the progress: %+v", pr)
	}

	// Not decided: P = C = 3.
	sk, err := s.Skip(ctx, p, 3, 3, "alice", "poison pill, ticket 42")
	if err != nil || sk.Was != 0 || sk.By != "alice" || sk.At.IsZero() {
		t.Fatalf("Skip(3): %+v, %v", sk, err)
	}
	pr, err := s.ReadProgress(ctx, p)
	if err != nil || pr.Epoch != epoch+1 || pr.Next != 4 {
		t.Fatalf("after Skip(3): %+v, %v; want epoch %d, P 4", pr, err, epoch+1)
	}
	if _, err := s.Skip(ctx, p, 3, 3, "bob", "again"); !errors.Is(err, dedup.ErrSkip) || !strings.Contains(err.Error(), "skipped already, by alice") {
		t.Fatalf("second Skip(3): %v", err)
	}
	entries, covered, err := s.Logged(ctx, p, 3, 4)
	if err != nil || !covered || len(entries) != 1 || entries[0].Decision != dedup.Skipped {
		t.Fatalf("Logged(3, 4): %+v %v %v", entries, covered, err)
	}
	od, err := s.DecisionAt(ctx, p, 3)
	if err != nil || !od.Covered || od.Decision != dedup.Skipped {
		t.Fatalf("DecisionAt(3): %+v, %v", od, err)
	}
	got, ok, err := s.SkipAt(ctx, p, 3)
	if err != nil || !ok || got.By != "alice" || got.Reason != "poison pill, ticket 42" || !got.At.Equal(sk.At) {
		t.Fatalf("SkipAt(3): %+v %v %v", got, ok, err)
	}

	// Decided and not delivered: C = 2, the forward of b at 2 is skipped.
	sk, err = s.Skip(ctx, p, 2, 2, "bob", strings.Repeat("x", 5000))
	if err != nil || sk.Was != dedup.Forward || string(sk.Entity) != "b" || len(sk.Reason) > dedup.MaxCauseBytes {
		t.Fatalf("Skip(2): %+v, %v", sk, err)
	}
	entries, _, err = s.Logged(ctx, p, 0, 3)
	if err != nil || len(entries) != 2 || entries[0].Decision != dedup.Forward || entries[1].Decision != dedup.Skipped || string(entries[1].Entity) != "b" {
		t.Fatalf("Logged(0, 3) after Skip(2): %+v %v", entries, err)
	}
	if pr, _ := s.ReadProgress(ctx, p); pr.Epoch != epoch+2 || pr.Next != 4 {
		t.Fatalf("after Skip(2): %+v", pr)
	}
	// The fenced owner cannot decide any more.
	b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 4, End: 5,
		Records: []dedup.Record{{Offset: 4, Entity: []byte("a"), Digest: digest("B")}}}
	if _, err := s.Decide(ctx, b, nil); !errors.Is(err, dedup.ErrFenced) {
		t.Fatalf("Decide by the owner from before the skip: %v, want ErrFenced", err)
	}
	if _, err := s.Skip(ctx, dedup.Partition{Group: "g", Topic: "none"}, 0, -1, "a", "b"); !errors.Is(err, dedup.ErrSkip) {
		t.Fatalf("Skip on a partition without progress: %v", err)
	}
}

// PruneLogKept deletes delivered batches logged longer ago than keep, a
// bounded number at a time, and never one at or above the delivered
// offset; the skips below the log's new start go with it.
func TestPruneLogKept(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	p, epoch := partition(t, s, "in")
	var recs []rec
	for i := 0; i < 10; i++ {
		recs = append(recs, rec{"a", string(rune('A' + i))})
	}
	decideAll(t, s, "svc", p, epoch, recs, 2) // five batches [0,2) .. [8,10)
	if _, err := s.Skip(ctx, p, 10, 10, "alice", "x"); err != nil {
		t.Fatal(err)
	}
	// Logged just now: kept for an hour.
	if n, err := s.PruneLogKept(ctx, p, 10, time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("PruneLogKept(keep 1h): %d, %v", n, err)
	}
	// keep 0, delivered 7: [0,2) [2,4) [4,6) go, [6,8) straddles 7 and stays;
	// two at a time.
	if n, err := s.PruneLogKept(ctx, p, 7, 0, 2); err != nil || n != 2 {
		t.Fatalf("PruneLogKept(7, batch 2): %d, %v", n, err)
	}
	if n, err := s.PruneLogKept(ctx, p, 7, 0, 2); err != nil || n != 1 {
		t.Fatalf("PruneLogKept(7, batch 2) again: %d, %v", n, err)
	}
	if first, ok, err := s.LogStart(ctx, p); err != nil || !ok || first != 6 {
		t.Fatalf("LogStart after pruning: %d %v %v, want 6", first, ok, err)
	}
	if _, ok, _ := s.SkipAt(ctx, p, 10); !ok {
		t.Fatal("a skip above the log's start was pruned")
	}
	if n, err := s.PruneLogKept(ctx, p, 11, 0, 100); err != nil || n != 3 {
		t.Fatalf("PruneLogKept(11): %d, %v", n, err)
	}
	if _, ok, _ := s.SkipAt(ctx, p, 10); ok {
		t.Fatal("a skip below the log's start was kept")
	}
}
