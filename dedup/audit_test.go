package dedup_test

import (
	"context"
	"testing"

	"github.com/dam-dedup/dam/dedup"
)

// DecisionAt reads a decision back from the log by offset, says when the
// log no longer covers an offset, and LastForward finds an entity's last
// logged forward.
func TestDecisionAtAndLastForward(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	p, epoch := partition(t, s, "in")
	// offsets: 0 a:A, 1 b:X, 2 a:A (dup), 3 c:invalid, 4 a:B, 5 a:B (dup)
	decideAll(t, s, "svc", p, epoch, []rec{{"a", "A"}, {"b", "X"}, {"a", "A"}, {"c", ""}, {"a", "B"}, {"a", "B"}}, 3)
	for _, tc := range []struct {
		offset int64
		want   dedup.Decision
		entity string
		first  int64
	}{{0, dedup.Forward, "a", 0}, {2, dedup.Duplicate, "", 0}, {3, dedup.Invalid, "c", 3}, {4, dedup.Forward, "a", 3}, {5, dedup.Duplicate, "", 3}} {
		od, err := s.DecisionAt(ctx, p, tc.offset)
		if err != nil {
			t.Fatal(err)
		}
		if !od.Covered || od.Decision != tc.want || string(od.Entity) != tc.entity || od.First != tc.first || od.End != tc.first+3 || od.LoggedAt.IsZero() {
			t.Errorf("offset %d: %+v", tc.offset, od)
		}
		if !od.HasLog || od.LogFrom != 0 || od.LogTo != 6 {
			t.Errorf("offset %d: log range %+v", tc.offset, od)
		}
	}
	if od, err := s.DecisionAt(ctx, p, 6); err != nil || od.Covered {
		t.Fatalf("offset 6 (not decided): %+v, %v", od, err)
	}
	for before, want := range map[int64]int64{1: 0, 4: 0, 5: 4, 100: 4} {
		f, ok, err := s.LastForward(ctx, p, []byte("a"), before)
		if err != nil || !ok || f.Offset != want || f.LoggedAt.IsZero() {
			t.Errorf("LastForward(a, before %d): %+v %v %v, want %d", before, f, ok, err, want)
		}
	}
	if _, ok, err := s.LastForward(ctx, p, []byte("a"), 0); ok || err != nil {
		t.Fatalf("LastForward before 0: %v %v", ok, err)
	}
	// Pruned below 3: the first batch is no longer covered.
	if _, err := s.PruneLog(ctx, p, 3); err != nil {
		t.Fatal(err)
	}
	od, err := s.DecisionAt(ctx, p, 2)
	if err != nil || od.Covered || !od.HasLog || od.LogFrom != 3 || od.LogTo != 6 {
		t.Fatalf("offset 2 after pruning: %+v, %v", od, err)
	}
	if _, ok, _ := s.LastForward(ctx, p, []byte("a"), 4); ok {
		t.Fatal("LastForward found a pruned forward")
	}
	other := dedup.Partition{Group: p.Group, Topic: "never", Partition: 0}
	if od, err := s.DecisionAt(ctx, other, 0); err != nil || od.Covered || od.HasLog {
		t.Fatalf("a partition without a log: %+v, %v", od, err)
	}
}
