package dedup_test

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/dam-dedup/dam/dedup"
)

// TestIdentify: the distinct entities of a batch's valid records come out
// once each, in key order (bytea's order: every statement locks and
// writes in it, and the server's sort of the read's array is a pass over
// presorted keys), and every record's slot names its own entity, whatever
// the order the batch holds them in: already sorted, reversed, shuffled,
// with repeats, invalid records, and the empty entity (nil or not).
func TestIdentify(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pool := [][]byte{nil, {}, {0}, {0, 0}, {1}, {0xff}, []byte("a"), []byte("ab"), []byte("b"), []byte("entity-000001"), []byte("entity-000010")}
	for n := range 300 {
		recs := make([]dedup.Record, rng.IntN(40))
		for k := range recs {
			recs[k] = dedup.Record{Offset: int64(k), Entity: pool[rng.IntN(len(pool))], Invalid: rng.IntN(8) == 0}
		}
		switch n % 3 {
		case 1: // in key order already
			slices.SortFunc(recs, func(a, b dedup.Record) int { return bytes.Compare(a.Entity, b.Entity) })
		case 2: // in reverse key order
			slices.SortFunc(recs, func(a, b dedup.Record) int { return bytes.Compare(b.Entity, a.Entity) })
		}
		entities, index, slots := dedup.Identify(recs)
		want := map[string]bool{}
		for _, r := range recs {
			if !r.Invalid {
				want[string(r.Entity)] = true
			}
		}
		if len(entities) != len(want) || len(index) != len(want) {
			t.Fatalf("batch %d: %d entities, %d indexed, want %d distinct", n, len(entities), len(index), len(want))
		}
		for i, e := range entities {
			if e == nil {
				t.Fatalf("batch %d: entity %d is nil (the empty entity is sent as empty bytes)", n, i)
			}
			if i > 0 && bytes.Compare(entities[i-1], e) >= 0 {
				t.Fatalf("batch %d: entities %q then %q: not in strictly increasing key order", n, entities[i-1], e)
			}
			if j, ok := index[string(e)]; !ok || int(j) != i {
				t.Fatalf("batch %d: index[%q] = %d, %v; want %d", n, e, j, ok, i)
			}
		}
		for k, r := range recs {
			switch {
			case r.Invalid && slots[k] != -1:
				t.Fatalf("batch %d: invalid record %d has slot %d, want -1", n, k, slots[k])
			case !r.Invalid && !bytes.Equal(entities[slots[k]], r.Entity):
				t.Fatalf("batch %d: record %d of entity %q has the slot of %q", n, k, r.Entity, entities[slots[k]])
			}
		}
	}
}
