//go:build !amd64 || purego

package sha256x8

const supported = false

var kernels []namedKernel

func hasSHA() bool { return false }
