package dedup_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/dam-dedup/dam/dedup"
)

// TestIdentify: the distinct entities of a batch's valid records come out
// once each, in key order (bytea's order: every statement locks and
// writes in it, and the server's sort of the read's array is a pass over
// presorted keys), every record's slot names its own entity, and the
// index finds each entity and nothing else, whatever the order the batch
// holds them in: already sorted, reversed, shuffled, with repeats,
// invalid records, and the empty entity (nil or not). The pools are made
// to catch a sort by 8-byte windows after the shared prefix: keys that
// share long prefixes, differ only past the window, are prefixes of each
// other, end in zero bytes (a shorter key's window ties with its own
// zero-padded extension), or hold bytes at and above 0x80.
func TestIdentify(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	fixed := [][]byte{nil, {}, {0}, {0, 0}, {1}, {0xff}, []byte("a"), []byte("ab"), []byte("b"), []byte("entity-000001"), []byte("entity-000010")}
	alphabet := []byte{0, 1, 'a', 'b', 0x7f, 0x80, 0xff}
	randomPool := func() [][]byte {
		prefix := make([]byte, rng.IntN(20))
		for i := range prefix {
			prefix[i] = alphabet[rng.IntN(len(alphabet))]
		}
		pool := make([][]byte, 2+rng.IntN(12)+rng.IntN(2)*rng.IntN(500))
		for i := range pool {
			e := append([]byte(nil), prefix[:rng.IntN(len(prefix)+1)]...)
			if rng.IntN(4) > 0 {
				e = append(e, prefix[len(e):]...) // most share the whole prefix
			}
			for range rng.IntN(20) {
				e = append(e, alphabet[rng.IntN(len(alphabet))])
			}
			pool[i] = e
		}
		return pool
	}
	for n := range 3000 {
		pool := fixed
		if n%2 == 1 {
			pool = randomPool()
		}
		size := rng.IntN(40)
		if n%10 == 0 || n%10 == 5 { // large enough for the radix sort
			size = 256 + rng.IntN(2000)
		}
		recs := make([]dedup.Record, size)
		for k := range recs {
			recs[k] = dedup.Record{Offset: int64(k), Entity: pool[rng.IntN(len(pool))], Invalid: rng.IntN(8) == 0}
		}
		switch n % 3 {
		case 1: // in key order already
			slices.SortFunc(recs, func(a, b dedup.Record) int { return bytes.Compare(a.Entity, b.Entity) })
		case 2: // in reverse key order
			slices.SortFunc(recs, func(a, b dedup.Record) int { return bytes.Compare(b.Entity, a.Entity) })
		}
		entities, find, slots := dedup.Identify(recs)
		want := map[string]bool{}
		for _, r := range recs {
			if !r.Invalid {
				want[string(r.Entity)] = true
			}
		}
		if len(entities) != len(want) {
			t.Fatalf("batch %d: %d entities, want %d distinct", n, len(entities), len(want))
		}
		for i, e := range entities {
			if e == nil {
				t.Fatalf("batch %d: entity %d is nil (the empty entity is sent as empty bytes)", n, i)
			}
			if i > 0 && bytes.Compare(entities[i-1], e) >= 0 {
				t.Fatalf("batch %d: entities %q then %q: not in strictly increasing key order", n, entities[i-1], e)
			}
			if j, ok := find(e); !ok || j != i {
				t.Fatalf("batch %d: find(%q) = %d, %v; want %d", n, e, j, ok, i)
			}
		}
		for _, e := range append(pool, fixed...) {
			if j, ok := find(e); ok != want[string(e)] || ok && !bytes.Equal(entities[j], e) {
				t.Fatalf("batch %d: find(%q) = %d, %v; the batch has it: %v", n, e, j, ok, want[string(e)])
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

// BenchmarkIdentify: a batch of 4,000 records (the end-to-end benchmark's
// typical decide) over 100,000 entities keyed as its records are.
func BenchmarkIdentify(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	recs := make([]dedup.Record, 4000)
	for k := range recs {
		recs[k] = dedup.Record{Offset: int64(k), Entity: fmt.Appendf(nil, "entity-%06d", rng.IntN(100000))}
	}
	b.ReportAllocs()
	for b.Loop() {
		entities, find, _ := dedup.Identify(recs)
		for _, e := range entities {
			if _, ok := find(e); !ok {
				b.Fatal("not found")
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
}
