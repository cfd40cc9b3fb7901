package dedup_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

// TestDecideSources checks Batch.Sources: each record's entry names the
// input record that last set its identity's state before it (in an
// earlier batch or earlier in the same one), -1 without a state, in every
// mode and statement shape; a batch that asks for none gets none.
func TestDecideSources(t *testing.T) {
	t.Parallel()
	rules := []dedup.Rule{
		{Mode: dedup.LastSeen},
		{Mode: dedup.LastSeen, RefreshAfter: time.Hour},
		{Mode: dedup.Window, Window: time.Hour},
		{Mode: dedup.Version},
	}
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		for _, rule := range rules {
			t.Run(fmt.Sprintf("%s/refresh=%v", rule.Mode, rule.RefreshAfter > 0), func(t *testing.T) {
				name := fmt.Sprintf("sources-%s-%v", rule.Mode, rule.RefreshAfter > 0)
				p, epoch := partition(t, s, name)
				// Offsets 0..2 in one batch, 3..5 in the next: x at 0,
				// again at 2 (same content, version 1) and 3; y at 1, 4
				// (version 2, new content); 5 invalid.
				mk := func(off int64, e, content string, v int64) dedup.Record {
					return dedup.Record{Offset: off, Entity: []byte(e), Digest: digest(content), Version: v}
				}
				batches := [][]dedup.Record{
					{mk(0, "x", "A", 1), mk(1, "y", "A", 1), mk(2, "x", "A", 1)},
					{mk(3, "x", "A", 1), mk(4, "y", "B", 2), {Offset: 5, Entity: []byte("z"), Invalid: true}},
				}
				want := [][]int64{{-1, -1, 0}, {0, 1, -1}}
				start := int64(0)
				for i, recs := range batches {
					b := &dedup.Batch{Service: name, Rule: rule, Partition: p, Epoch: epoch, Start: start, End: start + int64(len(recs)),
						Records: recs, Sources: make([]dedup.Source, len(recs))}
					if _, err := s.Decide(context.Background(), b, nil); err != nil {
						t.Fatal(err)
					}
					got := make([]int64, len(b.Sources))
					for k, src := range b.Sources {
						got[k] = src.Offset
						if src.Offset >= 0 && (src.Topic != p.Topic || src.Partition != p.Partition) {
							t.Errorf("batch %d record %d: source %+v, want topic %s partition %d", i, k, src, p.Topic, p.Partition)
						}
					}
					if !slices.Equal(got, want[i]) {
						t.Errorf("batch %d: source offsets %v, want %v", i, got, want[i])
					}
					start = b.End
				}
				b := &dedup.Batch{Service: name, Rule: rule, Partition: p, Epoch: epoch, Start: start, End: start + 1,
					Records: []dedup.Record{mk(start, "x", "A", 1)}}
				if _, err := s.Decide(context.Background(), b, nil); err != nil || b.Sources != nil {
					t.Fatalf("without Sources: err %v, sources %v", err, b.Sources)
				}
			})
		}
	})
}
