package sha256x8

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"testing"
)

// padded returns msgs padded in place, as Sum wants them.
func padded(msgs [][]byte) ([][]byte, []int) {
	ps := make([][]byte, len(msgs))
	lens := make([]int, len(msgs))
	for i, m := range msgs {
		ps[i] = Pad(append([]byte(nil), m...), len(m))
		lens[i] = len(m)
	}
	return ps, lens
}

func TestPad(t *testing.T) {
	for n := range 300 {
		b := Pad(make([]byte, n), n)
		if len(b) != PaddedLen(n) || len(b)%64 != 0 || len(b)-n < 9 || len(b)-n > 72 {
			t.Fatalf("n=%d: padded to %d, PaddedLen %d", n, len(b), PaddedLen(n))
		}
	}
}

// TestSumMatchesStdlib hashes messages of every length up to a few blocks,
// in counts that leave lanes idle, against crypto/sha256: through the
// lanes wherever this CPU has them, whatever Enabled says.
func TestSumMatchesStdlib(t *testing.T) {
	if len(kernels) == 0 {
		t.Log("no lanes on this CPU: checking the fallback only")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, count := range []int{1, 2, 7, 8, 9, 15, 16, 17, 33, 100} {
		t.Run(fmt.Sprint(count), func(t *testing.T) {
			for round := range 20 {
				msgs := make([][]byte, count)
				for i := range msgs {
					n := rng.IntN(600)
					if round == 0 {
						n = (i * 7) % 200 // the block edges: 55, 56, 63, 64, 119, 120
					}
					msgs[i] = make([]byte, n)
					for j := range msgs[i] {
						msgs[i][j] = byte(rng.Uint32())
					}
				}
				ps, lens := padded(msgs)
				runs := map[string]func([][32]byte){"Sum": func(got [][32]byte) { Sum(ps, lens, got) }}
				for _, k := range kernels {
					runs[k.name] = func(got [][32]byte) { sum(k, ps, got) }
				}
				for name, run := range runs {
					got := make([][32]byte, count)
					run(got)
					for i, m := range msgs {
						if want := sha256.Sum256(m); got[i] != want {
							t.Fatalf("%s: message %d of %d (%d bytes): %x, want %x", name, i, count, len(m), got[i], want)
						}
					}
				}
			}
		})
	}
}

func TestSumEdges(t *testing.T) {
	var msgs [][]byte
	for n := 0; n <= 200; n++ {
		m := make([]byte, n)
		for j := range m {
			m[j] = byte(n + j)
		}
		msgs = append(msgs, m)
	}
	ps, lens := padded(msgs)
	got := make([][32]byte, len(msgs))
	Sum(ps, lens, got)
	for i, m := range msgs {
		if want := sha256.Sum256(m); got[i] != want {
			t.Fatalf("%d bytes: %x, want %x", len(m), got[i], want)
		}
	}
}

func BenchmarkSum(b *testing.B) {
	for _, size := range []int{64, 500, 4096} {
		msgs := make([][]byte, 64)
		for i := range msgs {
			msgs[i] = make([]byte, size)
		}
		ps, _ := padded(msgs)
		out := make([][32]byte, len(msgs))
		for _, k := range kernels {
			b.Run(fmt.Sprintf("%s/%d", k.name, size), func(b *testing.B) {
				b.SetBytes(int64(size * len(msgs)))
				for b.Loop() {
					sum(k, ps, out)
				}
			})
		}
		b.Run(fmt.Sprintf("stdlib/%d", size), func(b *testing.B) {
			b.SetBytes(int64(size * len(msgs)))
			for b.Loop() {
				for i, m := range msgs {
					out[i] = sha256.Sum256(m)
				}
			}
		})
	}
}
