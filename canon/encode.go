package canon

// This file: the core walk. The parse state and the iterative parser
// (encode), which moves between member names, values and what follows a
// value on an explicit stack. Scalars are in scalar.go, objects in
// object.go, the prediction of repeated shapes in predict.go, pointers in
// pointer.go.

import (
	"encoding/binary"
	"math/bits"
	"strconv"
)

// frame is one open array or object.
type frame struct {
	obj        bool
	ignoreElem bool   // arrays: the current element is ignored
	ignored    bool   // objects: some member is ignored
	body       int32  // buffer offset after the 'a' or 'o' tag
	mstart     int32  // objects: index of the first member in state.members
	elem       int32  // arrays: buffer offset of the current element
	index      int32  // arrays: index of the current element
	active     uint64 // pointers whose tokens match this container's path
	names      uint64 // objects: nameFilter of active
	child      uint8  // shape slot + 1 of the last object closed in this container, or 0
	first      uint8  // objects: index in state.first of the input after '{', or noFirst
}

// state is the pooled scratch of one Sum: the encoding, a second buffer
// for reordering members, the explicit parse stack and the open members.
type state struct {
	buf, tmp []byte
	out      []byte // the final encoding: buf, or tmp when the top object was reordered
	stack    []frame
	members  []member
	shapes   [16]shape // recent object shapes, by member count and first name byte

	// Name prediction: the names of an object are expected to be those of
	// the shape in slot pslot-1 (0: none), member pk next. An object
	// predicts the shape of the last object closed in its container (the
	// previous record, for the top-level object).
	pslot, pk int
	topSlot   uint8
	maxDepth  int // the hasher's

	// The members parsed by predicted: buffer offsets (each member ends
	// where the next starts) and input offsets. In the state, not locals:
	// locals are zeroed on every call.
	st  [2 * maxShape]int32
	inp [maxShape]int32

	// The values found at the hasher's value pointers: found has the
	// pointer's bit set, vpos the input offset where the value starts
	// (maybe at whitespace), by value index.
	found uint64
	vpos  [MaxValues]int32

	// first predicts the shape of an object that is the first one in its
	// container (no previous object to predict from) by the first four
	// bytes of its input after the '"' opening its first name: the shape
	// slot + 1 of the last object that started so, or 0.
	first [64]uint8
}

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func syntaxErr(pos int, detail string) error {
	return &Error{Offset: pos, Err: ErrSyntax, Detail: detail}
}

func unexpected(in []byte, pos int, want string) error {
	if pos >= len(in) {
		return syntaxErr(pos, "unexpected end of input, expected "+want)
	}
	c := in[pos]
	if c == 0xEF && pos == 0 {
		return syntaxErr(pos, "byte order mark")
	}
	var what string
	if c >= 0x20 && c < 0x7f {
		what = strconv.QuoteRune(rune(c))
	} else {
		what = "byte 0x" + strconv.FormatUint(uint64(c), 16)
	}
	return syntaxErr(pos, "unexpected "+what+", expected "+want)
}

// encode parses in and leaves its canonical encoding in s.out. It never
// recurses: nesting lives in an explicit stack, bounded by h.maxDepth. The
// buffer lives in a local (a register), stored back on return; the stack
// and the open members stay in s: fewer live values spill less.
//
// Control moves with goto between name (a member name starts, after '{'
// or ','), value (a value starts) and after (a value ended). The members
// of an object whose values are scalars are parsed in a tight loop under
// name, which leaves it for other values and at the end of the object.
func (s *state) encode(h *Hasher, in []byte) (err error) {
	buf := s.buf[:0]
	s.maxDepth = h.maxDepth
	s.stack = s.stack[:0]
	s.members = s.members[:0]
	// Spare capacity lets appendShort copy without calls; the encoding of
	// typical JSON is a little shorter than the text.
	if want := min(len(in)+len(in)/4, 1<<16) + 64; cap(buf) < want {
		buf = make([]byte, 0, want)
		s.tmp = make([]byte, 0, want)
	}
	s.out = nil
	n := len(in)
	pos := 0
	active := h.all // pointers that may apply inside the next value
	s.found = 0
	goto value

name:
	for {
		if s.pslot != 0 && s.stack[len(s.stack)-1].active == 0 {
			var after bool
			if buf, pos, after = s.predicted(buf, in, pos); after {
				goto after
			}
		}
		if pos >= n || in[pos] != '"' {
			for pos < n && isWS(in[pos]) {
				pos++
			}
			if pos >= n || in[pos] != '"' {
				err = unexpected(in, pos, "a member name")
				goto fail
			}
		}
		start := len(buf)
		i := pos + 1
		var j, k int
		var prefix uint64
		// Predicted name: one masked compare instead of scanning.
		if ps := s.pslot; ps != 0 {
			sh := &s.shapes[(ps-1)&(len(s.shapes)-1)]
			if pk := s.pk; pk < sh.n && uint(pk) < maxShape && i+8 <= n && cap(buf)-start >= 10 {
				p := &sh.names[pk]
				if w := binary.LittleEndian.Uint64(in[i:]); w&p.mask == p.pat {
					l := int(p.len)
					binary.LittleEndian.PutUint16(buf[start:start+2], uint16('s')|uint16(l)<<8)
					binary.LittleEndian.PutUint64(buf[start+2:start+10], w)
					buf = buf[:start+2+l]
					k = start + 2
					prefix = sh.prefixes[pk]
					s.pk = pk + 1
					j = i + l + 2
					goto colon
				}
			}
			s.pslot = 0
		}
		// Fast path, no calls: a plain ASCII name of up to 15 bytes
		// is tested and copied as two 8-byte words.
		if l := len(buf); i+16 <= n && cap(buf)-l >= 18 {
			w0 := binary.LittleEndian.Uint64(in[i:])
			w1 := binary.LittleEndian.Uint64(in[i+8:])
			t := special(w0)
			if t == 0 {
				t = special(w1)
				if t != 0 {
					j = i + 8 + bits.TrailingZeros64(t)>>3
				}
			} else {
				j = i + bits.TrailingZeros64(t)>>3
			}
			if t != 0 && in[j] == '"' {
				b := buf[l : l+18]
				binary.LittleEndian.PutUint16(b, uint16('s')|uint16(j-i)<<8)
				binary.LittleEndian.PutUint64(b[2:], w0)
				binary.LittleEndian.PutUint64(b[10:], w1)
				buf = buf[:l+2+j-i]
				k = l + 2
				prefix = bits.ReverseBytes64(w0)
				if l := uint(j - i); l < 8 {
					prefix &^= ^uint64(0) >> (8 * (l & 7))
				}
				j++
				goto named
			}
		}
		if buf, j, k, err = str(buf, in, pos); err != nil {
			goto fail
		}
		prefix = namePrefix(buf, k, len(buf))
	named:
		if j >= n || in[j] != ':' {
			for j < n && isWS(in[j]) {
				j++
			}
			if j >= n || in[j] != ':' {
				err = unexpected(in, j, "':'")
				goto fail
			}
		}
		j++
	colon:
		// Fill the member in place: building it on the stack and
		// copying it costs a store-forwarding stall.
		s.members = append(s.members, member{})
		m := &s.members[len(s.members)-1]
		m.prefix, m.start, m.key, m.keyEnd, m.in = prefix, int32(start), int32(k), int32(len(buf)), int32(pos)
		pos = j
		active = 0
		if h.all != 0 {
			if f := &s.stack[len(s.stack)-1]; f.active != 0 && f.names&(1<<(prefix>>56&63)) != 0 {
				active, m.ignored = s.matchName(h, f.active, len(s.stack)-1, buf[k:], pos)
				f.ignored = f.ignored || m.ignored
			}
		}
		// Scalar values are parsed here, others under value. The string
		// and number fast paths repeat those under value on purpose: this
		// member loop is the hottest path, and the compiler does not
		// inline them as functions (a shared shortStr costs 178, over the
		// budget of 80; its call added 6% instructions per 200 B record).
		// Change both together; the reference encoder and FuzzSequence
		// check both.
	scalar:
		if pos >= n {
			goto value
		}
		switch in[pos] {
		case ' ', '\t', '\n', '\r':
			pos++
			goto scalar
		case '"':
			i := pos + 1
			// Fast path, no calls: plain ASCII of up to 31 bytes, tested
			// 8 bytes at a time and copied as one 32-byte array.
			if l := len(buf); i+32 <= n && cap(buf)-l >= 34 {
				j := i
				t := special(binary.LittleEndian.Uint64(in[i:]))
				for t == 0 && j < i+24 {
					j += 8
					t = special(binary.LittleEndian.Uint64(in[j:]))
				}
				if t != 0 {
					if j += bits.TrailingZeros64(t) >> 3; in[j] == '"' {
						binary.LittleEndian.PutUint16(buf[l:l+2], uint16('s')|uint16(j-i)<<8)
						v := *(*[32]byte)(in[i : i+32])
						*(*[32]byte)(buf[l+2 : l+34]) = v
						buf = buf[:l+2+j-i]
						pos = j + 1
						break
					}
				}
			}
			if buf, pos, _, err = str(buf, in, pos); err != nil {
				goto fail
			}
		case '1', '2', '3', '4', '5', '6', '7', '8', '9':
			// Fast path: an integer or a plain decimal, inline.
			i := pos + 1
			for i < n && isDigit(in[i]) {
				i++
			}
			if i < n && in[i] == '.' && i+1 < n && isDigit(in[i+1]) {
				for i += 2; i < n && isDigit(in[i]); i++ {
				}
			}
			if i < n && (in[i]|0x20 == 'e' || in[i] == '.') || i-pos >= 0x80 {
				if buf, pos, err = number(buf, in, pos); err != nil {
					goto fail
				}
				break
			}
			buf = appendShort(buf, 'd', in, pos, i)
			pos = i
		case 't':
			if n-pos < 4 || string(in[pos:pos+4]) != "true" {
				goto value
			}
			buf = append(buf, 't')
			pos += 4
		case 'f':
			if n-pos < 5 || string(in[pos:pos+5]) != "false" {
				goto value
			}
			buf = append(buf, 'f')
			pos += 5
		case 'n':
			if n-pos < 4 || string(in[pos:pos+4]) != "null" {
				goto value
			}
			buf = append(buf, 'n')
			pos += 4
		default:
			goto value
		}
		s.members[len(s.members)-1].end = int32(len(buf))
		if pos < n && in[pos] == ',' {
			pos++
			continue
		}
		goto after
	}

value:
	for pos < n && in[pos] <= ' ' && isWS(in[pos]) {
		pos++
	}
	if pos >= n {
		err = unexpected(in, pos, "a value")
		goto fail
	}
	switch c := in[pos]; c {
	case '"':
		i := pos + 1
		// Fast path, no calls: plain ASCII of up to 31 bytes, tested
		// 8 bytes at a time and copied as one 32-byte array.
		if l := len(buf); i+32 <= n && cap(buf)-l >= 34 {
			j := i
			t := special(binary.LittleEndian.Uint64(in[i:]))
			for t == 0 && j < i+24 {
				j += 8
				t = special(binary.LittleEndian.Uint64(in[j:]))
			}
			if t != 0 {
				if j += bits.TrailingZeros64(t) >> 3; in[j] == '"' {
					binary.LittleEndian.PutUint16(buf[l:l+2], uint16('s')|uint16(j-i)<<8)
					v := *(*[32]byte)(in[i : i+32])
					*(*[32]byte)(buf[l+2 : l+34]) = v
					buf = buf[:l+2+j-i]
					pos = j + 1
					break
				}
			}
		}
		if buf, pos, _, err = str(buf, in, pos); err != nil {
			goto fail
		}
	case '1', '2', '3', '4', '5', '6', '7', '8', '9':
		// Fast path: an integer or a plain decimal, inline.
		i := pos + 1
		for i < n && isDigit(in[i]) {
			i++
		}
		if i < n && in[i] == '.' && i+1 < n && isDigit(in[i+1]) {
			for i += 2; i < n && isDigit(in[i]); i++ {
			}
		}
		if i < n && (in[i]|0x20 == 'e' || in[i] == '.') || i-pos >= 0x80 {
			if buf, pos, err = number(buf, in, pos); err != nil {
				goto fail
			}
			break
		}
		buf = appendShort(buf, 'd', in, pos, i)
		pos = i
	case '-', '0':
		if buf, pos, err = number(buf, in, pos); err != nil {
			goto fail
		}
	case '{', '[':
		if len(s.stack) >= h.maxDepth {
			err = &Error{Offset: pos, Err: ErrTooDeep, Detail: "limit " + strconv.Itoa(h.maxDepth)}
			goto fail
		}
		pos++
		for pos < n && isWS(in[pos]) {
			pos++
		}
		if c == '{' {
			if pos < n && in[pos] == '}' {
				buf = append(buf, 'o', '}')
				pos++
				break
			}
			buf = append(buf, 'o')
			if d := len(s.stack); d > 0 {
				s.pslot = int(s.stack[d-1].child)
			} else {
				s.pslot = int(s.topSlot)
			}
			first := uint8(noFirst)
			if s.pslot == 0 && pos+5 <= n {
				first = uint8(binary.LittleEndian.Uint32(in[pos+1:pos+5]) * 0x9E3779B1 >> 26)
				s.pslot = int(s.first[first%uint8(len(s.first))])
			}
			if s.pslot != 0 && s.shapes[(s.pslot-1)&(len(s.shapes)-1)].names[0].mask == 0 {
				// The first name cannot be predicted, so no name can.
				s.pslot = 0
			}
			s.pk = 0
			// Fill the frame in place: building it on the stack and
			// copying it costs a store-forwarding stall.
			s.stack = append(s.stack, frame{})
			f := &s.stack[len(s.stack)-1]
			f.obj, f.body, f.mstart, f.active, f.first = true, int32(len(buf)), int32(len(s.members)), active, first
			if active != 0 {
				f.names = h.nameFilter(active, len(s.stack)-1)
			}
			goto name
		}
		if pos < n && in[pos] == ']' {
			buf = append(buf, 'a', ']')
			pos++
			break
		}
		buf = append(buf, 'a')
		s.stack = append(s.stack, frame{})
		f := &s.stack[len(s.stack)-1]
		f.body, f.elem, f.active = int32(len(buf)), int32(len(buf)), active
		active = 0
		if f.active != 0 {
			active, f.ignoreElem = s.matchIndex(h, f.active, len(s.stack)-1, 0, pos)
		}
		goto value
	case 't':
		if n-pos < 4 || string(in[pos:pos+4]) != "true" {
			err = syntaxErr(pos, "invalid literal, expected true")
			goto fail
		}
		buf = append(buf, 't')
		pos += 4
	case 'f':
		if n-pos < 5 || string(in[pos:pos+5]) != "false" {
			err = syntaxErr(pos, "invalid literal, expected false")
			goto fail
		}
		buf = append(buf, 'f')
		pos += 5
	case 'n':
		if n-pos < 4 || string(in[pos:pos+4]) != "null" {
			err = syntaxErr(pos, "invalid literal, expected null")
			goto fail
		}
		buf = append(buf, 'n')
		pos += 4
	default:
		err = unexpected(in, pos, "a value")
		goto fail
	}

after:
	for {
		for pos < n && in[pos] <= ' ' && isWS(in[pos]) {
			pos++
		}
		if len(s.stack) == 0 {
			if pos < n {
				err = &Error{Offset: pos, Err: ErrTrailingData}
				goto fail
			}
			if s.out == nil {
				s.out = buf
			}
			s.buf = buf
			return nil
		}
		f := &s.stack[len(s.stack)-1]
		if f.obj {
			s.members[len(s.members)-1].end = int32(len(buf))
			if pos < n && in[pos] == ',' {
				pos++
				goto name
			}
			if pos < n && in[pos] == '}' {
				ms := s.members[f.mstart:]
				var slot uint8
				if buf, slot, err = s.closeObject(buf, ms, int(f.body), len(s.stack) == 1, f.ignored); err != nil {
					goto fail
				}
				s.members = s.members[:f.mstart]
				if f.first != noFirst && slot != 0 {
					s.first[f.first%uint8(len(s.first))] = slot
				}
				s.stack = s.stack[:len(s.stack)-1]
				if d := len(s.stack); d > 0 {
					s.stack[d-1].child = slot
				} else {
					s.topSlot = slot
				}
				s.pslot = 0
				pos++
				continue
			}
			err = unexpected(in, pos, "',' or '}'")
			goto fail
		}
		if f.ignoreElem {
			buf = buf[:f.elem]
		}
		if pos < n && in[pos] == ',' {
			f.index++
			f.elem = int32(len(buf))
			if f.active != 0 {
				active, f.ignoreElem = s.matchIndex(h, f.active, len(s.stack)-1, int(f.index), pos+1)
			}
			pos++
			goto value
		}
		if pos < n && in[pos] == ']' {
			buf = append(buf, ']')
			s.stack = s.stack[:len(s.stack)-1]
			pos++
			continue
		}
		err = unexpected(in, pos, "',' or ']'")
		goto fail
	}
fail:
	return err
}
