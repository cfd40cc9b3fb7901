package canon

// This file: prediction. The shape cache (the sorted member order of
// recent objects), name predictions, and predicted(), which parses the
// members of an object whose names are the predicted ones through fixed
// 64-byte windows.

import (
	"encoding/binary"
	"math/bits"
)

// noFirst marks objects predicted from their container (not by state.first).
const noFirst = 0xFF

// maxShape is the largest object whose member order is cached.
const maxShape = 16

// shape remembers the sorted order of an object's members by their name
// prefixes (in input order). Records of one topic repeat the same shapes,
// so most objects are ordered by comparing n prefixes instead of sorting.
// Only shapes whose prefixes are pairwise distinct are cached: then the
// prefixes alone decide the order and rule out duplicate names.
//
// names (in input order) predicts the input after each name's opening
// quote. A name whose input matches is the cached name.
type shape struct {
	n        int
	sorted   bool // perm is the identity
	prefixes [maxShape]uint64
	perm     [maxShape]uint8 // perm[k] is the input index of the k-th member in order
	names    [maxShape]pname
	pending  uint64 // the prefix sequence hash of the last object that missed (see sortObject)
}

// pname is the input expected after the opening quote of a plain name of
// up to 6 bytes (len): the name, '"' and ':' as a little-endian word under
// mask. Other names get mask 0 and pat 1, which nothing matches.
type pname struct {
	pat, mask uint64
	len       uint8
}

// shapeSlot picks the shape cache slot of an object of n members whose
// first member (in input order) has the name prefix p.
func shapeSlot(n int, p uint64) int {
	return (n*31 + int(p>>56)) & (len(state{}.shapes) - 1)
}

// remember caches the order of ms (now sorted; its input order is
// recovered from the buffer offsets) if the prefixes are pairwise distinct.
func (s *state) remember(buf []byte, sh *shape, ms []member, sorted bool) {
	sh.n = 0
	for i := 1; i < len(ms); i++ {
		if ms[i-1].prefix == ms[i].prefix {
			return
		}
	}
	if sorted {
		for i := range ms {
			sh.prefixes[i] = ms[i].prefix
			sh.perm[i] = uint8(i)
			sh.predict(i, buf[ms[i].key:ms[i].keyEnd])
		}
		sh.n, sh.sorted = len(ms), true
		return
	}
	// The input order is by buffer offset.
	for k := range ms {
		pos := 0
		for i := range ms {
			if ms[i].start < ms[k].start {
				pos++
			}
		}
		sh.prefixes[pos] = ms[k].prefix
		sh.perm[k] = uint8(pos)
		sh.predict(pos, buf[ms[k].key:ms[k].keyEnd])
	}
	sh.n, sh.sorted = len(ms), false
}

// rememberPerm caches the order perm (see rankOrder) of ms, in input
// order, whose prefixes are pairwise distinct.
func (sh *shape) rememberPerm(buf []byte, ms []member, perm *[maxShape]uint8, sorted bool) {
	for i := range ms {
		sh.prefixes[i&(maxShape-1)] = ms[i].prefix
		sh.predict(i, buf[ms[i].key:ms[i].keyEnd])
	}
	sh.perm = *perm
	sh.n, sh.sorted = len(ms), sorted
}

// predict sets the prediction of input member i, whose name is name.
func (sh *shape) predict(i int, name []byte) {
	p := &sh.names[i]
	p.pat, p.mask = 1, 0
	if len(name) > 6 {
		return
	}
	var pat uint64
	for k, c := range name {
		if !strSafe[c] {
			return
		}
		pat |= uint64(c) << (8 * k)
	}
	l := uint(len(name))
	p.pat = pat | '"'<<(8*l) | ':'<<(8*l+8)
	p.mask = 1<<(8*l+16) - 1
	p.len = uint8(l)
}

// predicted parses the members from pos (the opening quote of a name, or
// not) as long as their names are the predicted ones and their values are
// scalars. It is the common case (records repeat shapes) in a small
// function with few live values; the input and the buffer are accessed
// through 64-byte windows, which needs few bounds checks. It commits only
// whole members and never errs (an invalid value is left to the general
// member loop, which finds the error). It returns the buffer, the position
// and whether a member value just ended at pos (the parse goes on after
// it); otherwise pos is where the next member starts (after a ',') and the
// general member loop takes over. Ignore pointers must not apply to the
// members.
func (s *state) predicted(buf, in []byte, pos int) ([]byte, int, bool) {
	slot := (s.pslot - 1) & (len(s.shapes) - 1)
	sh := &s.shapes[slot]
	k0 := s.pk
	pk, shn := k0, min(sh.n, maxShape)
	n := len(in)
	after := false
	// The members parsed here, from k0: their buffer offsets (each ends
	// where the next starts; st[pk-k0] is the end of the last) and input
	// offsets. They become member records only if the object is not
	// closed here.
	st, inp := &s.st, &s.inp
	for pk < shn && pos+64 <= n {
		start := len(buf)
		if cap(buf)-start < 64 {
			break
		}
		win := (*[64]byte)(in[pos : pos+64])
		p := &sh.names[pk&(maxShape-1)]
		w := binary.LittleEndian.Uint64(win[1:9])
		if win[0] != '"' || w&p.mask != p.pat {
			break
		}
		l := int(p.len & 7)
		ob := (*[64]byte)(buf[start : start+64])
		binary.LittleEndian.PutUint16(ob[0:2], uint16('s')|uint16(l)<<8)
		binary.LittleEndian.PutUint64(ob[2:10], w)
		j := l + 3 // the value in win
		v := l + 2 // the value in ob
		var e int  // the end of the value in win
		switch win[j] {
		case '"':
			i := j + 1
			q := i
			t := special(binary.LittleEndian.Uint64(win[i : i+8]))
			if t == 0 {
				q += 8
				t = special(binary.LittleEndian.Uint64(win[i+8 : i+16]))
				if t == 0 {
					q += 8
					t = special(binary.LittleEndian.Uint64(win[i+16 : i+24]))
					if t == 0 {
						q += 8
						t = special(binary.LittleEndian.Uint64(win[i+24 : i+32]))
					}
				}
			}
			q += bits.TrailingZeros64(t) >> 3
			if t != 0 && win[q&63] == '"' {
				bv := ob[v : v+34]
				binary.LittleEndian.PutUint16(bv[0:2], uint16('s')|uint16(q-i)<<8)
				*(*[16]byte)(bv[2:18]) = *(*[16]byte)(win[i : i+16])
				*(*[16]byte)(bv[18:34]) = *(*[16]byte)(win[i+16 : i+32])
				v += 2 + q - i
				e = q + 1
				break
			}
			if x, o, ok := strWin(win, ob, i, v+2); ok {
				binary.LittleEndian.PutUint16(ob[v:v+2], uint16('s')|uint16(o-v-2)<<8)
				v, e = o, x
				break
			}
			b, end, _, err := str(buf[:start+v], in, pos+j)
			if err != nil {
				goto done
			}
			buf = b[:start]
			v, e = len(b)-start, end-pos
		case '1', '2', '3', '4', '5', '6', '7', '8', '9':
			i := j + 1
			for i < j+17 && isDigit(win[i&63]) {
				i++
			}
			if win[i&63] == '.' && isDigit(win[(i+1)&63]) {
				for i += 2; i < j+17 && isDigit(win[i&63]); i++ {
				}
			}
			if i-j <= 16 && win[i&63]|0x20 != 'e' && win[i&63] != '.' {
				bv := ob[v : v+18]
				binary.LittleEndian.PutUint16(bv[0:2], uint16('d')|uint16(i-j)<<8)
				binary.LittleEndian.PutUint64(bv[2:10], binary.LittleEndian.Uint64(win[j:j+8]))
				binary.LittleEndian.PutUint64(bv[10:18], binary.LittleEndian.Uint64(win[j+8:j+16]))
				v += 2 + i - j
				e = i
				break
			}
			fallthrough
		case '-', '0':
			b, end, err := number(buf[:start+v], in, pos+j)
			if err != nil {
				goto done
			}
			buf = b[:start]
			v, e = len(b)-start, end-pos
		case 't':
			if binary.LittleEndian.Uint32(win[j:j+4]) != 't'|'r'<<8|'u'<<16|'e'<<24 {
				goto done
			}
			ob[v] = 't'
			v++
			e = j + 4
		case 'f':
			if binary.LittleEndian.Uint32(win[j+1:j+5]) != 'a'|'l'<<8|'s'<<16|'e'<<24 {
				goto done
			}
			ob[v] = 'f'
			v++
			e = j + 5
		case 'n':
			if binary.LittleEndian.Uint32(win[j:j+4]) != 'n'|'u'<<8|'l'<<16|'l'<<24 {
				goto done
			}
			ob[v] = 'n'
			v++
			e = j + 4
		default:
			goto done
		}
		buf = buf[:start+v]
		c := (pk - k0) & (maxShape - 1)
		st[c], inp[c] = int32(start), int32(pos)
		pk++
		pos += e
		if pos < n && in[pos] == ',' {
			pos++
			continue
		}
		after = true
		if k0 == 0 && pk == shn && shn >= 2 && pos < n && in[pos] == '}' && len(s.stack) > 1 {
			// The whole object was parsed here: close it (the hit
			// path of closeObject, without member records).
			f := &s.stack[len(s.stack)-1]
			if !sh.sorted {
				st[pk&(2*maxShape-1)] = int32(len(buf))
				buf = s.reorderSpans(buf, int(f.body), st, &sh.perm, pk)
			}
			buf = append(buf, '}')
			s.stack = s.stack[:len(s.stack)-1]
			a := &s.stack[len(s.stack)-1]
			a.child = uint8(slot + 1)
			pos++
			if !a.obj && a.active == 0 && pos+3 <= n && in[pos] == ',' && in[pos+1] == '{' && in[pos+2] == '"' && len(s.stack) < s.maxDepth {
				// The next element of an array of records: open it
				// here (as the general loop would), predicting the
				// shape of the object just closed.
				a.index++
				a.elem = int32(len(buf))
				buf = append(buf, 'o')
				s.stack = append(s.stack, frame{})
				f := &s.stack[len(s.stack)-1]
				f.obj, f.body, f.mstart, f.first = true, int32(len(buf)), int32(len(s.members)), noFirst
				pos += 2
				k0, pk, after = 0, 0, false
				continue
			}
			s.pslot, s.pk = 0, 0
			return buf, pos, true
		}
		break
	}
done:
	s.pk = pk
	if cnt := pk - k0; cnt > 0 {
		st[cnt] = int32(len(buf))
		for c := range cnt {
			k := (k0 + c) & (maxShape - 1)
			s.members = append(s.members, member{})
			m := &s.members[len(s.members)-1]
			m.prefix, m.start, m.key, m.keyEnd, m.end, m.in = sh.prefixes[k], st[c], st[c]+2, st[c]+2+int32(sh.names[k].len), st[c+1], inp[c]
		}
	}
	return buf, pos, after
}

// strWin decodes the string that starts (after its opening quote) at
// win[x] into ob[o:], if it fits in the windows and holds only ASCII,
// two- and three-byte UTF-8 sequences and escapes other than surrogates
// (non-ASCII text). It returns the window offsets after the closing quote
// and after the decoded bytes; ok is false for anything else (str decodes
// it, or finds the error). Runs of ASCII move eight bytes at a time.
func strWin(win, ob *[64]byte, x, o int) (int, int, bool) {
	for x <= 56 && o <= 56 {
		w := binary.LittleEndian.Uint64(win[x : x+8])
		binary.LittleEndian.PutUint64(ob[o:o+8], w)
		// The word was copied as it is: UTF-8 sequences in it stay so,
		// only the first '"', '\\' or control byte (or a sequence
		// running past the word) ends the copied run. Flags below that
		// byte are exact (bytes >= 0x80 cause no borrows).
		t := special(w)
		k := 8
		for t != 0 {
			k = bits.TrailingZeros64(t) >> 3
			c := byte(w >> (8 * uint(k)))
			if c < 0x80 || k > 6 {
				break
			}
			c1 := byte(w >> (8 * uint(k+1)))
			if c >= 0xC2 && c < 0xE0 && c1&0xC0 == 0x80 {
				t &= ^uint64(0) << (8 * uint(k+2))
				k = 8
				continue
			}
			break
		}
		x += k
		o += k
		if k == 8 {
			continue
		}
		if x > 56 || o > 56 {
			break
		}
		switch c := win[x]; {
		case c == '"':
			return x + 1, o, true
		case c == '\\':
			switch win[x+1] {
			case '"', '\\', '/':
				ob[o] = win[x+1]
			case 'b':
				ob[o] = '\b'
			case 'f':
				ob[o] = '\f'
			case 'n':
				ob[o] = '\n'
			case 'r':
				ob[o] = '\r'
			case 't':
				ob[o] = '\t'
			case 'u':
				a, b, c, d := hexVal[win[x+2]], hexVal[win[x+3]], hexVal[win[x+4]], hexVal[win[x+5]]
				if a|b|c|d < 0 {
					return 0, 0, false
				}
				switch r := rune(a)<<12 | rune(b)<<8 | rune(c)<<4 | rune(d); {
				case r < 0x80:
					ob[o] = byte(r)
					o++
				case r < 0x800:
					ob[o], ob[o+1] = 0xC0|byte(r>>6), 0x80|byte(r)&0x3F
					o += 2
				case r < 0xD800 || r >= 0xE000:
					ob[o], ob[o+1], ob[o+2] = 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F
					o += 3
				default:
					return 0, 0, false
				}
				x += 6
				continue
			default:
				return 0, 0, false
			}
			x += 2
			o++
		case c >= 0xC2 && c < 0xE0:
			if win[x+1]&0xC0 != 0x80 {
				return 0, 0, false
			}
			ob[o], ob[o+1] = c, win[x+1]
			x += 2
			o += 2
		case c >= 0xE0 && c < 0xF0:
			c1, c2 := win[x+1], win[x+2]
			lo, hi := byte(0x80), byte(0xBF)
			if c == 0xE0 {
				lo = 0xA0
			} else if c == 0xED {
				hi = 0x9F
			}
			if c1 < lo || c1 > hi || c2&0xC0 != 0x80 {
				return 0, 0, false
			}
			ob[o], ob[o+1], ob[o+2] = c, c1, c2
			x += 3
			o += 3
		default:
			return 0, 0, false
		}
	}
	return 0, 0, false
}

// reorderSpans reorders the n members of the object whose body starts at
// body, member i spanning buf[st[i]:st[i+1]], into the order perm, through
// s.tmp.
func (s *state) reorderSpans(buf []byte, body int, st *[2 * maxShape]int32, perm *[maxShape]uint8, n int) []byte {
	tmp := s.tmp[:0]
	if need := len(buf) - body + 32; cap(tmp) < need {
		tmp = make([]byte, 0, 2*need)
		s.tmp = tmp
	}
	dst, src := tmp[:cap(tmp)], buf[:cap(buf)]
	d := 0
	for k := range n {
		i := perm[k&(maxShape-1)] & (maxShape - 1)
		d = move(dst, src, d, int(st[i]), int(st[i+1]))
	}
	copy(buf[body:], dst[:d])
	return buf
}
