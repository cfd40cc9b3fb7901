package canon

// This file: objects. Member records, ordering members by name, rejecting
// duplicate names and dropping ignored members when an object closes.

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"slices"
)

// member is one object member in the scratch buffer, from its name's 's'
// tag (start) to the end of its value (end).
type member struct {
	prefix                  uint64 // first 8 name bytes, big-endian: most comparisons end here
	start, key, keyEnd, end int32
	in                      int32 // input offset of the name, for errors
	ignored                 bool
}

// less orders members by name bytes. Inlined: the full comparison is
// only needed when the 8-byte prefixes tie.
func less(buf []byte, a, b *member) bool {
	return a.prefix < b.prefix || a.prefix == b.prefix && lessNames(buf, a, b)
}

func lessNames(buf []byte, a, b *member) bool {
	return bytes.Compare(buf[a.key:a.keyEnd], buf[b.key:b.keyEnd]) < 0
}

func sameName(buf []byte, a, b *member) bool {
	return a.prefix == b.prefix && bytes.Equal(buf[a.key:a.keyEnd], buf[b.key:b.keyEnd])
}

// namePrefix returns the first 8 bytes of buf[key:end] as a big-endian
// number, zero padded. It loads 8 bytes at once when the capacity allows
// (bytes past end are masked off).
func namePrefix(buf []byte, key, end int) uint64 {
	l := end - key
	if key+8 <= cap(buf) {
		w := binary.BigEndian.Uint64(buf[key : key+8 : key+8])
		if l < 8 {
			w &^= ^uint64(0) >> (8 * uint(l))
		}
		return w
	}
	var p uint64
	for i, c := range buf[key:end] {
		p |= uint64(c) << (56 - 8*i)
	}
	return p
}

// closeObject sorts an object's members (ms) by name, rejects equal names,
// drops ignored members (ignored: there are some) and ends the object. The
// top-level object is reordered into s.tmp only, which then is the final
// encoding: no copy back.
//
// It returns the shape cache slot + 1 that now holds the object's shape,
// or 0.
func (s *state) closeObject(buf []byte, ms []member, body int, top, ignored bool) ([]byte, uint8, error) {
	n := len(ms)
	if n < 2 {
		if n == 1 && ignored {
			buf = buf[:body]
		}
		return append(buf, '}'), 0, nil
	}
	var sh *shape
	var slot int
	var err error
	var cached bool
	if ps := s.pslot; ps != 0 && s.pk == n && s.shapes[(ps-1)&(len(s.shapes)-1)].n == n {
		// Every name matched the predicted shape, which did not change
		// since the object opened (closing an object ends prediction).
		slot = (ps - 1) & (len(s.shapes) - 1)
		sh = &s.shapes[slot]
		goto hit
	}
	if n <= maxShape {
		// Slot by size and first name byte, so that small objects of
		// different shapes (coordinates, money) do not evict each other.
		slot = shapeSlot(n, ms[0].prefix)
		sh = &s.shapes[slot]
		if sh.n == n && sh.prefixes[0] == ms[0].prefix {
			for i := 1; i < n; i++ {
				if sh.prefixes[i] != ms[i].prefix {
					goto miss
				}
			}
			goto hit
		}
	}
miss:
	buf, cached, err = s.sortObject(buf, ms, body, top, ignored, sh)
	if err != nil || !cached {
		return buf, 0, err
	}
	return buf, uint8(slot + 1), nil
hit:
	if sh.sorted && !ignored {
		return append(buf, '}'), uint8(slot + 1), nil
	}
	return s.reorder(buf, ms, sh.perm[:n], body, top, ignored), uint8(slot + 1), nil
}

// sortObject is closeObject for objects whose shape is not cached: it
// sorts the members and caches the shape in sh (if not nil), reporting
// whether it did.
//
// Objects whose members come in another order in every record (some
// producers shuffle them) would only evict cached shapes and pay for
// caching their own, which never hits: a shape of distinct prefixes is
// cached only when its member order (a hash of the prefix sequence) is
// that of the last object that missed the slot.
func (s *state) sortObject(buf []byte, ms []member, body int, top, ignored bool, sh *shape) ([]byte, bool, error) {
	if len(ms) <= maxShape {
		var perm [maxShape]uint8
		if seq, sorted, ok := rankOrder(ms, &perm); ok {
			// Distinct prefixes: they alone decide the order, and no
			// two names are equal.
			n := len(ms)
			cached := false
			if sh != nil {
				if cached = sh.pending == seq; cached {
					sh.rememberPerm(buf, ms, &perm, sorted)
				} else {
					sh.pending = seq
				}
			}
			if sorted && !ignored {
				return append(buf, '}'), cached, nil
			}
			return s.reorder(buf, ms, perm[:n], body, top, ignored), cached, nil
		}
	}
	sorted := true
	for i := 1; i < len(ms); i++ {
		if !less(buf, &ms[i-1], &ms[i]) {
			if sameName(buf, &ms[i-1], &ms[i]) {
				return buf, false, dupErr(buf, ms[i-1], ms[i])
			}
			sorted = false
			break
		}
	}
	if !sorted {
		if len(ms) <= 12 {
			for i := 1; i < len(ms); i++ {
				m := ms[i]
				j := i
				for ; j > 0 && less(buf, &m, &ms[j-1]); j-- {
					ms[j] = ms[j-1]
				}
				ms[j] = m
			}
		} else {
			slices.SortFunc(ms, func(a, b member) int {
				if a.prefix != b.prefix {
					if a.prefix < b.prefix {
						return -1
					}
					return 1
				}
				return bytes.Compare(buf[a.key:a.keyEnd], buf[b.key:b.keyEnd])
			})
		}
		for i := 1; i < len(ms); i++ {
			if sameName(buf, &ms[i-1], &ms[i]) {
				return buf, false, dupErr(buf, ms[i-1], ms[i])
			}
		}
	}
	cached := false
	if sh != nil {
		s.remember(buf, sh, ms, sorted)
		cached = sh.n != 0
	}
	if sorted && !ignored {
		return append(buf, '}'), cached, nil
	}
	tmp := s.tmp[:0]
	if top {
		tmp = append(tmp, buf[:body]...)
	}
	for i := range ms {
		if m := &ms[i]; !ignored || !m.ignored {
			tmp = append(tmp, buf[m.start:m.end]...)
		}
	}
	return s.finish(buf, tmp, body, top), cached, nil
}

// rankOrder sets perm[k] to the index in ms of the k-th member by name
// prefix, counting for each member the prefixes below its own (no
// branches to mispredict on shuffled members), if the prefixes of ms (at
// most maxShape) are pairwise distinct; ok is false if they are not.
// sorted reports whether ms is already in order; seq is a hash of the
// sequence of prefixes.
func rankOrder(ms []member, perm *[maxShape]uint8) (seq uint64, sorted, ok bool) {
	var seen uint32
	sorted = true
	for i := range ms {
		p := ms[i].prefix
		seq = (seq ^ p) * 0x9E3779B97F4A7C15
		var r uint64
		for j := range ms {
			_, b := bits.Sub64(ms[j].prefix, p, 0)
			r += b
		}
		seen |= 1 << (r & 31)
		perm[r&(maxShape-1)] = uint8(i)
		sorted = sorted && r == uint64(i)
	}
	// Equal prefixes share a rank, leaving another rank unused.
	return seq, sorted, seen == 1<<len(ms)-1
}

// finish ends an object whose members were reordered into tmp: the
// top-level object stays in s.tmp (the final encoding), others are copied
// back into buf.
func (s *state) finish(buf, tmp []byte, body int, top bool) []byte {
	if top {
		tmp = append(tmp, '}')
		s.tmp, s.out = tmp, tmp
		return append(buf, '}')
	}
	s.tmp = tmp
	return append(append(buf[:body], tmp...), '}')
}

// reorder writes the members of an object in the order perm (indexes
// into ms), dropping ignored ones, and ends the object.
func (s *state) reorder(buf []byte, ms []member, perm []uint8, body int, top, ignored bool) []byte {
	tmp := s.tmp[:0]
	if top {
		tmp = append(tmp, buf[:body]...)
	}
	if need := len(tmp) + len(buf) - body + 32; cap(tmp) < need {
		tmp = append(make([]byte, 0, 2*need), tmp...)
	}
	d := len(tmp)
	dst, src := tmp[:cap(tmp)], buf[:cap(buf)]
	for _, k := range perm {
		if m := &ms[k]; !ignored || !m.ignored {
			d = move(dst, src, d, int(m.start), int(m.end))
		}
	}
	return s.finish(buf, tmp[:d], body, top)
}

func dupErr(buf []byte, a, b member) error {
	return &Error{Offset: int(max(a.in, b.in)), Err: ErrDuplicateMember, Detail: quoteInput(buf[a.key:a.keyEnd])}
}

// move copies src[a:e] to dst[d:] and returns the end of the copy in dst.
// Up to 32 bytes move as one 32-byte array through spare capacity
// (reading and writing past them, never past a capacity) without a call.
func move(dst, src []byte, d, a, e int) int {
	if e-a <= 32 && a+32 <= len(src) && d+32 <= len(dst) {
		sp, dp := (*[32]byte)(src[a:a+32]), (*[32]byte)(dst[d:d+32])
		*(*[16]byte)(dp[:]) = *(*[16]byte)(sp[:])
		*(*[16]byte)(dp[16:]) = *(*[16]byte)(sp[16:])
		return d + e - a
	}
	return d + copy(dst[d:], src[a:e])
}
