//go:build amd64 && !purego

package sha256x8

import "golang.org/x/sys/cpu"

// blocks runs SHA-256's compression function over n blocks of each of
// eight messages: ptrs[l] points at lane l's next n*64 bytes, state[w][l]
// is word w of lane l's state. AVX2.
//
//go:noescape
func blocks(state *[8][Lanes]uint32, ptrs *[Lanes]*byte, n int)

// blocksVL is blocks with AVX-512VL's rotates and three-input logic, on
// the same 256-bit registers.
//
//go:noescape
func blocksVL(state *[8][Lanes]uint32, ptrs *[Lanes]*byte, n int)

// cpuid returns the registers of CPUID leaf eax, subleaf ecx.
func cpuid(eax, ecx uint32) (a, b, c, d uint32)

var supported = cpu.X86.HasAVX2

// hasVL: x/sys/cpu sets the AVX-512 flags only where the OS saves the
// registers.
var hasVL = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL

// kernels are the compression functions this CPU runs, best first.
var kernels = func() (ks []namedKernel) {
	if hasVL {
		ks = append(ks, namedKernel{"avx512vl", kernelVL})
	}
	if supported {
		ks = append(ks, namedKernel{"avx2", kernelAVX2})
	}
	return ks
}()

const (
	kernelAVX2 = iota
	kernelVL
)

// run calls kernel k.
func run(k int, state *[8][Lanes]uint32, ptrs *[Lanes]*byte, n int) {
	if k == kernelVL {
		blocksVL(state, ptrs, n)
		return
	}
	blocks(state, ptrs, n)
}

// hasSHA reports the SHA extensions (CPUID leaf 7, EBX bit 29), which
// crypto/sha256 uses when present.
func hasSHA() bool {
	if max, _, _, _ := cpuid(0, 0); max < 7 {
		return false
	}
	_, b, _, _ := cpuid(7, 0)
	return b&(1<<29) != 0
}
