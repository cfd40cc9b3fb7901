//go:build ignore

// gen_asm writes block_amd64.s: SHA-256's compression function over eight
// messages at once, one in each 32-bit lane of the AVX2 registers. Run it
// with go generate; the unrolled rounds are easier to check in this
// generator than in the 3,000 lines it writes.
package main

import (
	"bytes"
	"fmt"
	"os"
)

var k = [64]uint32{
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

var out bytes.Buffer

func p(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }

// w is the stack slot of schedule word t: 8 lanes of 4 bytes.
func w(t int) string { return fmt.Sprintf("%d(SP)", t*32) }

// ror xors x rotated right by n into acc, through tmp (the two shifted
// halves do not overlap, so xor stands for or).
func ror(x, acc, tmp string, n int) {
	p("\tVPSRLD $%d, %s, %s", n, x, tmp)
	p("\tVPXOR %s, %s, %s", tmp, acc, acc)
	p("\tVPSLLD $%d, %s, %s", 32-n, x, tmp)
	p("\tVPXOR %s, %s, %s", tmp, acc, acc)
}

// sigma sets acc to x>>>r1 ^ x>>>r2 ^ (x>>s or x>>>s when rot).
func sigma(x, acc, tmp string, r1, r2, s int, rot bool) {
	p("\tVPSRLD $%d, %s, %s", r1, x, acc)
	p("\tVPSLLD $%d, %s, %s", 32-r1, x, tmp)
	p("\tVPXOR %s, %s, %s", tmp, acc, acc)
	ror(x, acc, tmp, r2)
	if rot {
		ror(x, acc, tmp, s)
	} else {
		p("\tVPSRLD $%d, %s, %s", s, x, tmp)
		p("\tVPXOR %s, %s, %s", tmp, acc, acc)
	}
}

// kernel writes the TEXT of one compression function: AVX2 alone, or
// with vl AVX-512VL's rotates and three-input logic on the same 256-bit
// registers (half the instructions).
func kernel(name string, vl bool) {
	p("// func %s(state *[8][8]uint32, ptrs *[8]*byte, n int)", name)
	p("TEXT ·%s(SB), 0, $2048-24", name)
	p("\tMOVQ state+0(FP), DI")
	p("\tMOVQ ptrs+8(FP), SI")
	p("\tMOVQ n+16(FP), CX")
	gp := []string{"R8", "R9", "R10", "R11", "R12", "R13", "R14", "R15"}
	for l, r := range gp {
		p("\tMOVQ %d(SI), %s", l*8, r)
	}
	p("\tXORQ AX, AX // offset of the block in every message")
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_loop:", name)
	// Words 0-7, then 8-15: load eight lanes, byte-swap, transpose.
	for half := 0; half < 2; half++ {
		for l, r := range gp {
			p("\tVMOVDQU %d(%s)(AX*1), Y%d", half*32, r, l)
			p("\tVPSHUFB flip<>(SB), Y%d, Y%d", l, l)
		}
		for i := 0; i < 4; i++ {
			p("\tVPUNPCKLDQ Y%d, Y%d, Y%d", 2*i+1, 2*i, 8+2*i)
			p("\tVPUNPCKHDQ Y%d, Y%d, Y%d", 2*i+1, 2*i, 9+2*i)
		}
		// u0..u7 in Y0..Y7: (t0,t2), (t1,t3), (t4,t6), (t5,t7).
		pairs := [][2]int{{8, 10}, {9, 11}, {12, 14}, {13, 15}}
		for i, pr := range pairs {
			p("\tVPUNPCKLQDQ Y%d, Y%d, Y%d", pr[1], pr[0], 2*i)
			p("\tVPUNPCKHQDQ Y%d, Y%d, Y%d", pr[1], pr[0], 2*i+1)
		}
		// u0=w0|w4 of lanes 0-3, u1=w1|w5, u2=w2|w6, u3=w3|w7; u4..u7 lanes 4-7.
		for j := 0; j < 4; j++ {
			p("\tVPERM2I128 $0x20, Y%d, Y%d, Y%d", 4+j, j, 8+j)
			p("\tVPERM2I128 $0x31, Y%d, Y%d, Y%d", 4+j, j, 12+j)
		}
		for j := 0; j < 8; j++ {
			p("\tVMOVDQU Y%d, %s", 8+j, w(half*8+j))
		}
	}
	// The message schedule.
	for t := 16; t < 64; t++ {
		p("\tVMOVDQU %s, Y0", w(t-2))
		p("\tVMOVDQU %s, Y3", w(t-15))
		if vl {
			sigmaVL("Y0", "Y1", "Y2", "Y6", 17, 19, 10, false)
			sigmaVL("Y3", "Y4", "Y5", "Y7", 7, 18, 3, false)
		} else {
			sigma("Y0", "Y1", "Y2", 17, 19, 10, false)
			sigma("Y3", "Y4", "Y5", 7, 18, 3, false)
		}
		p("\tVPADDD Y4, Y1, Y1")
		p("\tVPADDD %s, Y1, Y1", w(t-7))
		p("\tVPADDD %s, Y1, Y1", w(t-16))
		p("\tVMOVDQU Y1, %s", w(t))
	}
	// The rounds, a..h in Y0..Y7, renamed instead of moved.
	for i := 0; i < 8; i++ {
		p("\tVMOVDQU %d(DI), Y%d", i*32, i)
	}
	reg := func(i int) string { return fmt.Sprintf("Y%d", i) }
	for t := 0; t < 64; t++ {
		r := func(i int) string { return reg(((i-t)%8 + 8) % 8) }
		a, b, c, d, e, f, g, h := r(0), r(1), r(2), r(3), r(4), r(5), r(6), r(7)
		p("\t// round %d", t)
		p("\tVPADDD %s, %s, Y8", w(t), h)
		p("\tVPADDD kx8<>+%d(SB), Y8, Y8", t*32)
		if vl {
			sigmaVL(e, "Y9", "Y10", "Y11", 6, 11, 25, true)
			p("\tVPADDD Y9, Y8, Y8")
			p("\tVMOVDQA32 %s, Y12", e)
			p("\tVPTERNLOGD $0xca, %s, %s, Y12 // e ? f : g", g, f)
			p("\tVPADDD Y12, Y8, Y8")
			p("\tVPADDD Y8, %s, %s", d, d)
			sigmaVL(a, "Y13", "Y14", "Y15", 2, 13, 22, true)
			p("\tVPADDD Y13, Y8, Y8")
			p("\tVMOVDQA32 %s, Y12", a)
			p("\tVPTERNLOGD $0xe8, %s, %s, Y12 // majority", c, b)
			p("\tVPADDD Y12, Y8, %s", h)
			continue
		}
		sigma(e, "Y9", "Y10", 6, 11, 25, true)
		p("\tVPADDD Y9, Y8, Y8")
		p("\tVPXOR %s, %s, Y11", g, f)
		p("\tVPAND %s, Y11, Y11", e)
		p("\tVPXOR %s, Y11, Y11", g)
		p("\tVPADDD Y11, Y8, Y8")
		p("\tVPADDD Y8, %s, %s", d, d)
		sigma(a, "Y12", "Y13", 2, 13, 22, true)
		p("\tVPADDD Y12, Y8, Y8")
		p("\tVPOR %s, %s, Y14", b, a)
		p("\tVPAND %s, Y14, Y14", c)
		p("\tVPAND %s, %s, Y15", b, a)
		p("\tVPOR Y15, Y14, Y14")
		p("\tVPADDD Y14, Y8, %s", h)
	}
	// After 64 rounds the names are back where they started.
	for i := 0; i < 8; i++ {
		p("\tVPADDD %d(DI), Y%d, Y%d", i*32, i, i)
		p("\tVMOVDQU Y%d, %d(DI)", i, i*32)
	}
	p("\tADDQ $64, AX")
	p("\tDECQ CX")
	p("\tJNZ %s_loop", name)
	p("\tVZEROUPPER")
	p("%s_done:", name)
	p("\tRET")
}

// sigmaVL is sigma with AVX-512VL: acc = x>>>r1 ^ x>>>r2 ^ (x>>s or
// x>>>s when rot), one rotate each and one three-way xor.
func sigmaVL(x, acc, t1, t2 string, r1, r2, s int, rot bool) {
	p("\tVPRORD $%d, %s, %s", r1, x, acc)
	p("\tVPRORD $%d, %s, %s", r2, x, t1)
	if rot {
		p("\tVPRORD $%d, %s, %s", s, x, t2)
	} else {
		p("\tVPSRLD $%d, %s, %s", s, x, t2)
	}
	p("\tVPTERNLOGD $0x96, %s, %s, %s // xor", t2, t1, acc)
}

func main() {
	p("// Code generated by gen_asm.go; DO NOT EDIT.")
	p("")
	p("//go:build amd64 && !purego")
	p("")
	p("#include \"textflag.h\"")
	p("")
	// K[t] broadcast to the eight lanes.
	for t, v := range k {
		for l := 0; l < 8; l += 2 {
			p("DATA kx8<>+%d(SB)/8, $0x%08x%08x", t*32+l*4, v, v)
		}
	}
	p("GLOBL kx8<>(SB), RODATA|NOPTR, $%d", 64*32)
	p("")
	// Byte order: SHA-256 reads big-endian words.
	for i := 0; i < 4; i++ {
		v := "0x0405060700010203"
		if i%2 == 1 {
			v = "0x0c0d0e0f08090a0b"
		}
		p("DATA flip<>+%d(SB)/8, $%s", i*8, v)
	}
	p("GLOBL flip<>(SB), RODATA|NOPTR, $32")
	p("")
	kernel("blocks", false)
	p("")
	kernel("blocksVL", true)
	if err := os.WriteFile("block_amd64.s", out.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
