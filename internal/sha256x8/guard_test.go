//go:build unix

package sha256x8

import (
	"crypto/sha256"
	"math/rand/v2"
	"syscall"
	"testing"
)

// guarded returns a padded copy of m placed so that its last byte is the
// last byte before a PROT_NONE page, and one placed so that its first byte
// is the first after one: any read past either end faults.
func guarded(t *testing.T, m []byte, atEnd bool) []byte {
	ps := syscall.Getpagesize()
	p := PaddedLen(len(m))
	pages := (p+ps-1)/ps + 2
	mem, err := syscall.Mmap(-1, 0, pages*ps, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	if err := syscall.Mprotect(mem[:ps], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mprotect(mem[(pages-1)*ps:], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	var start int
	if atEnd {
		start = (pages-1)*ps - p
	} else {
		start = ps
	}
	b := mem[start : start : start+p]
	b = Pad(append(b, m...), len(m))
	if &b[0] != &mem[start] {
		t.Fatal("reallocated")
	}
	return b
}

// TestSumWithinGuardPages: every kernel reads nothing outside a padded
// message: messages ending just before a PROT_NONE page, or starting just
// after one, of every count and of the lengths around the block edges,
// hash as crypto/sha256 hashes them.
func TestSumWithinGuardPages(t *testing.T) {
	if len(kernels) == 0 {
		t.Skip("no lanes")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for _, k := range kernels {
		for _, atEnd := range []bool{true, false} {
			for _, count := range []int{1, 2, 3, 7, 8, 9, 17} {
				for round := range 10 {
					msgs := make([][]byte, count)
					ps := make([][]byte, count)
					lens := make([]int, count)
					for i := range msgs {
						n := rng.IntN(300)
						if round == 0 {
							n = []int{0, 55, 56, 63, 64, 119, 120, 127, 128}[i%9]
						}
						m := make([]byte, n)
						for j := range m {
							m[j] = byte(rng.Uint32())
						}
						msgs[i], ps[i], lens[i] = m, guarded(t, m, atEnd), n
					}
					out := make([][32]byte, count)
					sum(k, ps, out)
					for i, m := range msgs {
						if want := sha256.Sum256(m); out[i] != want {
							t.Fatalf("%s count %d msg %d (%d bytes): %x want %x", k.name, count, i, len(m), out[i], want)
						}
					}
				}
			}
		}
	}
}
