package dedup

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestLowerBound: the branch-free search agrees with slices.BinarySearch
// on sorted arrays with repeats, for values below, between, on and above
// their elements.
func TestLowerBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		a := make([]uint64, rng.IntN(70))
		for i := range a {
			a[i] = rng.Uint64N(50)
		}
		slices.Sort(a)
		for w := range uint64(52) {
			want, _ := slices.BinarySearch(a, w)
			if got := lowerBound(a, w); got != want {
				t.Fatalf("lowerBound(%v, %d) = %d, want %d", a, w, got, want)
			}
		}
	}
}

// TestSortWindows: both of its sorts order by window, stably.
func TestSortWindows(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{0, 1, 2, 255, 256, 257, 5000} {
		for _, spread := range []uint64{1, 3, 1 << 8, 1 << 40, ^uint64(0)} {
			a := make([]keyed, n)
			for i := range a {
				a[i] = keyed{w: rng.Uint64N(spread) << rng.IntN(2), k: int32(i)}
			}
			want := slices.Clone(a)
			slices.SortStableFunc(want, func(x, y keyed) int { return cmpUint64(x.w, y.w) })
			if got := sortWindows(a); !slices.Equal(got, want) {
				t.Fatalf("n=%d spread=%d: sortWindows differs from a stable sort", n, spread)
			}
		}
	}
}
