//go:build !amd64 || purego

package sha256x8

const supported = false

var kernels []namedKernel

func hasSHA() bool { return false }

func run(k int, state *[8][Lanes]uint32, ptrs *[Lanes]*byte, n int) {
	panic("sha256x8: no lanes on this architecture")
}
