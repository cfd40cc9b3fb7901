package sha256x8

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
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

// TestSumLongAmongShort: long messages (up to 20,000 bytes) among short
// ones, so that lanes are refilled many times, hash as crypto/sha256
// hashes them in every kernel.
func TestSumLongAmongShort(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, k := range kernels {
		for round := range 30 {
			count := 1 + rng.IntN(150)
			msgs := make([][]byte, count)
			for i := range msgs {
				n := rng.IntN(70)
				if rng.IntN(5) == 0 {
					n = rng.IntN(20000)
				}
				msgs[i] = make([]byte, n)
				for j := range msgs[i] {
					msgs[i][j] = byte(rng.Uint32())
				}
			}
			ps := make([][]byte, count)
			lens := make([]int, count)
			for i, m := range msgs {
				ps[i] = Pad(append([]byte(nil), m...), len(m))
				lens[i] = len(m)
			}
			out := make([][32]byte, count)
			sum(k, ps, out)
			for i, m := range msgs {
				if want := sha256.Sum256(m); out[i] != want {
					t.Fatalf("%s round %d msg %d", k.name, round, i)
				}
			}
		}
	}
}

// TestSum32BitBuild: the package (and so canon, and all of dam) builds
// where int is 32 bits (386, arm): no constant in it overflows an int
// there (such as a minimum started at 1<<62).
func TestSum32BitBuild(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("no go command to build with:", err)
	}
	for _, arch := range []string{"386", "arm"} {
		cmd := exec.Command(gobin, "build", "-o", os.DevNull, ".")
		cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "CGO_ENABLED=0", "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("GOARCH=%s go build ./internal/sha256x8: %v\n%s", arch, err, out)
		}
	}
}
