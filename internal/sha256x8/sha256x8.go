// Package sha256x8 computes SHA-256 over many messages at once, eight at a
// time in the 32-bit lanes of AVX2 registers. It exists for x86-64 CPUs
// that have AVX2 but no SHA extensions (Intel's server cores before Ice
// Lake), where crypto/sha256 hashes one message at a time at about a third
// of the rate; where SHA extensions exist crypto/sha256 is faster still,
// and Enabled is false.
package sha256x8

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
)

//go:generate go run gen_asm.go

// Lanes is the number of messages hashed side by side.
const Lanes = 8

// Supported reports whether this CPU can run the lanes (AVX2).
var Supported = supported

// Enabled reports whether Sum hashes in lanes: where they are supported
// and the CPU has no SHA extensions. When it is false, Sum runs
// crypto/sha256 over each message. Tests set it to run the lanes on any
// CPU that supports them.
var Enabled = supported && !hasSHA()

var iv = [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}

// Pad appends SHA-256's padding for a message of n bytes to b, which must
// end with that message: afterwards the message and its padding are a
// whole number of 64-byte blocks.
func Pad(b []byte, n int) []byte {
	b = append(b, 0x80)
	z := (55 - n) & 63 // zeros up to 8 bytes short of a block's end
	for ; z >= 8; z -= 8 {
		b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	}
	for ; z > 0; z-- {
		b = append(b, 0)
	}
	return binary.BigEndian.AppendUint64(b, uint64(n)<<3)
}

// PaddedLen is the length of an n-byte message after Pad.
func PaddedLen(n int) int { return (n + 8 + 64) &^ 63 }

// Sum sets out[i] to the SHA-256 of message i: msgs[i][:lens[i]], which
// Pad must have padded in place (len(msgs[i]) == PaddedLen(lens[i])).
// len(out) and len(lens) must be len(msgs).
func Sum(msgs [][]byte, lens []int, out [][32]byte) {
	for i, m := range msgs {
		if len(m) != PaddedLen(lens[i]) {
			panic("sha256x8: message not padded")
		}
	}
	if !Enabled {
		for i, m := range msgs {
			out[i] = sha256.Sum256(m[:lens[i]])
		}
		return
	}
	sum(kernels[0], msgs, out)
}

// namedKernel is a compression function over eight lanes (see blocks),
// run by run: a direct call, so that the state stays on sum's stack (a
// function value would make it escape).
type namedKernel struct {
	name string
	id   int
}

// Kernel names the compression function Sum runs in lanes ("avx512vl",
// "avx2"), or is "" where there is none.
func Kernel() string {
	if len(kernels) == 0 {
		return ""
	}
	return kernels[0].name
}

// lane is one message being hashed: its padded bytes, the offset of its
// next block and how many blocks are left.
type lane struct {
	m         []byte
	off, left int
	msg       int // index in msgs, -1 when the lane is idle
}

// sum hashes padded messages through the lanes: each lane takes the next
// message as soon as its own is done, so lanes idle only at the end.
func sum(k namedKernel, msgs [][]byte, out [][32]byte) {
	var st [8][Lanes]uint32 // state word, lane
	var ptrs [Lanes]*byte
	var ls [Lanes]lane
	next := 0
	for l := range ls {
		ls[l].msg = -1
	}
	for {
		n, any := math.MaxInt, -1
		for l := range ls {
			if ls[l].msg < 0 && next < len(msgs) {
				ls[l] = lane{m: msgs[next], left: len(msgs[next]) / 64, msg: next}
				for i := range iv {
					st[i][l] = iv[i]
				}
				next++
			}
			if ls[l].msg >= 0 {
				n, any = min(n, ls[l].left), l
			}
		}
		if any < 0 {
			return
		}
		for l := range ls {
			k := l
			if ls[l].msg < 0 {
				k = any // a valid block whose result is dropped
			}
			ptrs[l] = &ls[k].m[ls[k].off]
		}
		run(k.id, &st, &ptrs, n)
		for l := range ls {
			if ls[l].msg < 0 {
				continue
			}
			ls[l].off += n * 64
			if ls[l].left -= n; ls[l].left == 0 {
				o := &out[ls[l].msg]
				for i := range st {
					binary.BigEndian.PutUint32(o[4*i:], st[i][l])
				}
				ls[l].msg = -1
			}
		}
	}
}
