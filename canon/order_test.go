package canon

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestRankOrder checks rankOrder, which replaces sorting, against a sort
// of the prefixes. It must decline (ok false, the general sort runs) only
// on equal prefixes: declining more would not show in a digest, so every
// other test would pass.
func TestRankOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 2000 {
		n := 2 + rng.IntN(maxShape-1)
		ms := make([]member, n)
		for i := range ms {
			ms[i].prefix = rng.Uint64() >> (rng.IntN(4) * 16)
		}
		if iter%4 == 0 {
			ms[rng.IntN(n)].prefix = ms[rng.IntN(n)].prefix // maybe a tie
		}
		byPrefix := make([]int, n)
		for i := range byPrefix {
			byPrefix[i] = i
		}
		slices.SortFunc(byPrefix, func(a, b int) int {
			return cmp.Compare(ms[a].prefix, ms[b].prefix)
		})
		distinct := true
		for k := 1; k < n; k++ {
			distinct = distinct && ms[byPrefix[k-1]].prefix != ms[byPrefix[k]].prefix
		}
		check := func(what string, perm *[maxShape]uint8, sorted, ok bool) {
			t.Helper()
			if ok != distinct {
				t.Fatalf("%s: ok %v, distinct %v: %v", what, ok, distinct, ms)
			}
			if !ok {
				return
			}
			for k := range n {
				if int(perm[k]) != byPrefix[k] {
					t.Fatalf("%s: perm %v, want %v", what, perm[:n], byPrefix)
				}
			}
			if sorted != slices.IsSorted(byPrefix) {
				t.Fatalf("%s: sorted %v for %v", what, sorted, byPrefix)
			}
		}
		var perm [maxShape]uint8
		_, sorted, ok := rankOrder(ms, &perm)
		check("rankOrder", &perm, sorted, ok)
	}
}

// TestShapeCachedOnRepeat checks that a member order seen twice in a row
// is cached (sortObject caches only repeated orders), so that records of
// a stable order keep taking the cached order and the name predictions.
func TestShapeCachedOnRepeat(t *testing.T) {
	h := mustNew(t)
	st := new(state)
	// No two of its objects share a shape slot (shapeSlot).
	doc := []byte(`{"z":1,"a":{"c":2,"b":3},"m":[{"q":1,"p":2},{"q":3,"p":4}]}`)
	for range 2 {
		if err := h.encode(st, doc); err != nil {
			t.Fatal(err)
		}
	}
	if st.topSlot == 0 {
		t.Error("top-level shape not cached after two records of one order")
	}
}
