package canon

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"slices"
	"strconv"
	"unicode/utf8"
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

// frame is one open array or object.
type frame struct {
	obj        bool
	ignoreElem bool   // arrays: the current element is ignored
	ignored    bool   // objects: some member is ignored
	body       int32  // buffer offset after the 'a' or 'o' tag
	mstart     int32  // objects: index of the first member in state.members
	elem       int32  // arrays: buffer offset of the current element
	index      int32  // arrays: index of the current element
	active     uint64 // ignore pointers whose tokens match this container's path
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

	// first predicts the shape of an object that is the first one in its
	// container (no previous object to predict from) by the first four
	// bytes of its input after the '"' opening its first name: the shape
	// slot + 1 of the last object that started so, or 0.
	first [64]uint8
}

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
}

// pname is the input expected after the opening quote of a plain name of
// up to 6 bytes (len): the name, '"' and ':' as a little-endian word under
// mask. Other names get mask 0 and pat 1, which nothing matches.
type pname struct {
	pat, mask uint64
	len       uint8
}

// strSafe marks the bytes a string can hold that need no work: printable
// ASCII other than '"' and '\\'.
var strSafe = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special flags (high bit per byte) the bytes of w that are not strSafe.
// A borrow only runs upward from a byte that is itself special, so the
// lowest flagged byte is exact (higher flags may be false).
//
// A byte >= 0x80 is flagged by w itself, so the subtractions need no
// masking: they flag only bytes < 0x20, '"' and '\\' (no borrow in) or
// bytes >= 0x80 (flagged anyway).
func special(w uint64) uint64 {
	return ((w - 0x20*lsb) | (w ^ '"'*lsb - lsb) | (w ^ '\\'*lsb - lsb) | w) & msb
}

// appendShort appends tag, the length (< 0x80) and in[i:j]. Short values
// are copied with two 8-byte moves into the buffer's spare capacity instead
// of a memmove call (bytes past the new length are garbage, never read).
// It is small enough to be inlined.
func appendShort(buf []byte, tag byte, in []byte, i, j int) []byte {
	l := len(buf)
	if j-i > 16 || i+16 > len(in) || cap(buf)-l < 18 {
		return appendLong(buf, tag, in[i:j])
	}
	b := buf[l : l+18]
	binary.LittleEndian.PutUint16(b, uint16(tag)|uint16(j-i)<<8)
	binary.LittleEndian.PutUint64(b[2:], binary.LittleEndian.Uint64(in[i:]))
	binary.LittleEndian.PutUint64(b[10:], binary.LittleEndian.Uint64(in[i+8:]))
	return buf[:l+2+j-i]
}

// appendRaw appends in[i:j], moving up to 16 bytes as two 8-byte words
// through spare capacity instead of a memmove call.
func appendRaw(buf, in []byte, i, j int) []byte {
	l := len(buf)
	if j-i > 16 || i+16 > len(in) || cap(buf)-l < 16 {
		return append(buf, in[i:j]...)
	}
	b := buf[l : l+16]
	binary.LittleEndian.PutUint64(b, binary.LittleEndian.Uint64(in[i:]))
	binary.LittleEndian.PutUint64(b[8:], binary.LittleEndian.Uint64(in[i+8:]))
	return buf[:l+j-i]
}

func appendLong(buf []byte, tag byte, v []byte) []byte {
	return append(append(buf, tag, byte(len(v))), v...)
}

// scanSafe returns the index of the first byte at or after j that is not
// strSafe (or len(in)), testing eight bytes at a time. In each test a
// borrow only runs upward from a byte that is itself special, so the
// lowest flagged byte is exact.
func scanSafe(in []byte, j int) int {
	for j+8 <= len(in) {
		if t := special(binary.LittleEndian.Uint64(in[j:])); t != 0 {
			return j + bits.TrailingZeros64(t)>>3
		}
		j += 8
	}
	for j < len(in) && strSafe[in[j]] {
		j++
	}
	return j
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
	active := h.all // ignore pointers that may apply inside the next value
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
			if f := &s.stack[len(s.stack)-1]; f.active != 0 {
				active, m.ignored = h.matchName(f.active, len(s.stack)-1, buf[k:])
				f.ignored = f.ignored || m.ignored
			}
		}
		// Scalar values are parsed here, others under value. The string
		// and number fast paths repeat those under value on purpose: this
		// member loop is the hottest path, and the compiler would not
		// inline them as functions (a call here was measurably slower).
		// Change both together; the tests and fuzz corpora check both.
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
			if l := len(buf); i-pos <= 16 && pos+16 <= n && cap(buf)-l >= 18 {
				b := buf[l : l+18]
				binary.LittleEndian.PutUint16(b, uint16('d')|uint16(i-pos)<<8)
				binary.LittleEndian.PutUint64(b[2:], binary.LittleEndian.Uint64(in[pos:]))
				binary.LittleEndian.PutUint64(b[10:], binary.LittleEndian.Uint64(in[pos+8:]))
				buf = buf[:l+2+i-pos]
			} else {
				buf = appendShort(buf, 'd', in, pos, i)
			}
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
		if l := len(buf); i-pos <= 16 && pos+16 <= n && cap(buf)-l >= 18 {
			b := buf[l : l+18]
			binary.LittleEndian.PutUint16(b, uint16('d')|uint16(i-pos)<<8)
			binary.LittleEndian.PutUint64(b[2:], binary.LittleEndian.Uint64(in[pos:]))
			binary.LittleEndian.PutUint64(b[10:], binary.LittleEndian.Uint64(in[pos+8:]))
			buf = buf[:l+2+i-pos]
		} else {
			buf = appendShort(buf, 'd', in, pos, i)
		}
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
			active, f.ignoreElem = h.matchIndex(f.active, len(s.stack)-1, 0)
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
				active, f.ignoreElem = h.matchIndex(f.active, len(s.stack)-1, int(f.index))
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
// s.tmp. Members up to 32 bytes move as one 32-byte array through spare
// capacity (never past a capacity); longer ones with memmove.
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
		a, e := int(st[i]), int(st[i+1])
		if e-a <= 32 && a+32 <= len(src) && d+32 <= len(dst) {
			sp, dp := (*[32]byte)(src[a:a+32]), (*[32]byte)(dst[d:d+32])
			*(*[16]byte)(dp[:]) = *(*[16]byte)(sp[:])
			*(*[16]byte)(dp[16:]) = *(*[16]byte)(sp[16:])
			d += e - a
			continue
		}
		d += copy(dst[d:], src[a:e])
	}
	copy(buf[body:], dst[:d])
	return buf
}

// matchName returns the pointers still active inside member name of a
// container at depth d, and whether the member is ignored.
func (h *Hasher) matchName(active uint64, d int, name []byte) (uint64, bool) {
	var child uint64
	for a := active; a != 0; a &= a - 1 {
		i := bits.TrailingZeros64(a)
		t := &h.ptrs[i][d]
		if t.star || t.name == string(name) {
			if len(h.ptrs[i]) == d+1 {
				return 0, true
			}
			child |= 1 << uint(i)
		}
	}
	return child, false
}

// matchIndex is matchName for array element idx.
func (h *Hasher) matchIndex(active uint64, d, idx int) (uint64, bool) {
	var child uint64
	for a := active; a != 0; a &= a - 1 {
		i := bits.TrailingZeros64(a)
		t := &h.ptrs[i][d]
		if t.star || t.index == idx {
			if len(h.ptrs[i]) == d+1 {
				return 0, true
			}
			child |= 1 << uint(i)
		}
	}
	return child, false
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
	buf, err = s.sortObject(buf, ms, body, top, ignored, sh)
	if err != nil || sh == nil || sh.n == 0 {
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
// sorts the members and caches the shape in sh (if not nil).
func (s *state) sortObject(buf []byte, ms []member, body int, top, ignored bool, sh *shape) ([]byte, error) {
	sorted := true
	for i := 1; i < len(ms); i++ {
		if !less(buf, &ms[i-1], &ms[i]) {
			if sameName(buf, &ms[i-1], &ms[i]) {
				return buf, dupErr(buf, ms[i-1], ms[i])
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
				return buf, dupErr(buf, ms[i-1], ms[i])
			}
		}
	}
	if sh != nil {
		s.remember(buf, sh, ms, sorted)
	}
	if sorted && !ignored {
		return append(buf, '}'), nil
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
	return s.finish(buf, tmp, body, top), nil
}

// shapeSlot picks the shape cache slot of an object of n members whose
// first member (in input order) has the name prefix p.
func shapeSlot(n int, p uint64) int {
	return (n*31 + int(p>>56)) & (len(state{}.shapes) - 1)
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

// reorder writes the members of an object in the order perm (indexes
// into ms), dropping ignored ones, and ends the object. Members up to 32
// bytes move as one 32-byte array through spare capacity (reading and
// writing past them, never past a capacity) in a loop without calls;
// from the first longer member on, members are copied with memmove.
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
	i := 0
	// Every member lies in buf and tmp has room for all of them plus 32
	// bytes, so when buf has 32 spare bytes to read past a member only
	// the member length needs a test.
	if len(buf)+32 <= len(src) {
		for ; i < len(perm); i++ {
			m := &ms[perm[i]]
			if ignored && m.ignored {
				continue
			}
			a, e := int(m.start), int(m.end)
			if e-a > 32 {
				break
			}
			sp := (*[32]byte)(src[a : a+32])
			dp := (*[32]byte)(dst[d : d+32])
			*(*[16]byte)(dp[:]) = *(*[16]byte)(sp[:])
			*(*[16]byte)(dp[16:]) = *(*[16]byte)(sp[16:])
			d += e - a
		}
	}
	for ; i < len(perm); i++ {
		if m := &ms[perm[i]]; !ignored || !m.ignored {
			d += copy(dst[d:], src[m.start:m.end])
		}
	}
	return s.finish(buf, tmp[:d], body, top)
}

func dupErr(buf []byte, a, b member) error {
	return &Error{Offset: int(max(a.in, b.in)), Err: ErrDuplicateMember, Detail: strconv.Quote(string(buf[a.key:a.keyEnd]))}
}

// scanRun returns the index of the first '"', '\\' or control byte at or
// after i (or len(in)), validating the UTF-8 of the bytes before it: ok is
// false if they are invalid. ASCII is skipped eight bytes at a time and
// two-byte sequences (Latin text) are checked inline.
func scanRun(in []byte, i int) (j int, ok bool) {
	n := len(in)
	for i+8 <= n {
		// Flags below the first '"', '\\' or control byte are exact
		// (bytes >= 0x80 cause no borrows), so one word serves for all
		// the sequences in it.
		t := special(binary.LittleEndian.Uint64(in[i:]))
		next := i + 8
		for t != 0 {
			j := i + bits.TrailingZeros64(t)>>3
			c := in[j]
			if c < 0x80 {
				return j, true
			}
			if c >= 0xC2 && c < 0xE0 && j+1 < n && in[j+1]&0xC0 == 0x80 {
				if j+2 >= next {
					next = j + 2
					break
				}
				t &= ^uint64(0) << (8 * uint(j+2-i) & 63)
				continue
			}
			r, size := utf8.DecodeRune(in[j:])
			if r == utf8.RuneError && size == 1 {
				return j, false
			}
			next = j + size
			break
		}
		i = next
	}
	for {
		for i < n && strSafe[in[i]] {
			i++
		}
		if i >= n || in[i] < 0x80 {
			return i, true
		}
		r, size := utf8.DecodeRune(in[i:])
		if r == utf8.RuneError && size == 1 {
			return i, false
		}
		i += size
	}
}

// str appends the string whose opening quote is at pos. It returns the
// position after the closing quote and the buffer offset of the decoded
// bytes. Runs between escapes are validated while they are scanned and
// copied at once. On any error the string is decoded again by strSlow,
// which finds the exact error.
func str(buf, in []byte, pos int) ([]byte, int, int, error) {
	n := len(in)
	i := pos + 1
	j, ok := scanRun(in, i)
	if ok && j < n && in[j] == '"' {
		if j-i < 0x80 {
			return appendShort(buf, 's', in, i, j), j + 1, len(buf) + 2, nil
		}
		buf = binary.AppendUvarint(append(buf, 's'), uint64(j-i))
		k := len(buf)
		return append(buf, in[i:j]...), j + 1, k, nil
	}
	start := len(buf)
	// Reserve one length byte, decode, then fix the length.
	buf = append(buf, 's', 0)
	lenAt := len(buf) - 1
	k := len(buf)
	for ok && j < n && in[j] == '\\' {
		buf = appendRaw(buf, in, i, j)
		// \uXXXX other than surrogates, inline (non-ASCII text).
		if j+6 <= n && in[j+1] == 'u' {
			h := in[j+2 : j+6 : j+6]
			if a, b, c, d := hexVal[h[0]], hexVal[h[1]], hexVal[h[2]], hexVal[h[3]]; a|b|c|d >= 0 {
				switch r := rune(a)<<12 | rune(b)<<8 | rune(c)<<4 | rune(d); {
				case r < 0x80:
					buf = append(buf, byte(r))
				case r < 0x800:
					buf = append(buf, 0xC0|byte(r>>6), 0x80|byte(r)&0x3F)
				case r < 0xD800 || r >= 0xE000:
					buf = append(buf, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
				default:
					goto esc
				}
				i = j + 6
				goto scan
			}
		}
	esc:
		{
			var err error
			if buf, i, err = escape(buf, in, j); err != nil {
				break
			}
		}
	scan:
		j, ok = scanRun(in, i)
		if ok && j < n && in[j] == '"' {
			buf = appendRaw(buf, in, i, j)
			j++
			l := len(buf) - k
			if l < 0x80 {
				buf[lenAt] = byte(l)
				return buf, j, k, nil
			}
			var tmp [binary.MaxVarintLen64]byte
			w := binary.PutUvarint(tmp[:], uint64(l))
			buf = append(buf, tmp[:w-1]...)
			copy(buf[lenAt+w:], buf[k:k+l])
			copy(buf[lenAt:], tmp[:w])
			return buf, j, lenAt + w, nil
		}
	}
	return strSlow(buf[:start], in, pos, pos+1)
}

// strSlow appends the string whose opening quote is at pos, decoding byte
// by byte from j (bytes before j need no work). It is the reference
// decoder: str calls it for invalid strings, so that errors name exactly
// the first bad byte. It returns the position after the closing quote and
// the buffer offset of the decoded bytes.
func strSlow(buf, in []byte, pos, j int) ([]byte, int, int, error) {
	n := len(in)
	// Reserve one length byte, decode, then fix the length.
	buf = append(buf, 's', 0)
	lenAt := len(buf) - 1
	k := len(buf)
	buf = append(buf, in[pos+1:j]...)
	for {
		if j >= n {
			return buf, j, k, syntaxErr(pos, "unterminated string")
		}
		c := in[j]
		switch {
		case c == '"':
			j++
			l := len(buf) - k
			if l < 0x80 {
				buf[lenAt] = byte(l)
				return buf, j, k, nil
			}
			var tmp [binary.MaxVarintLen64]byte
			w := binary.PutUvarint(tmp[:], uint64(l))
			buf = append(buf, tmp[:w-1]...)
			copy(buf[lenAt+w:], buf[k:k+l])
			copy(buf[lenAt:], tmp[:w])
			return buf, j, lenAt + w, nil
		case c == '\\':
			var err error
			if buf, j, err = escape(buf, in, j); err != nil {
				return buf, j, k, err
			}
		case c < 0x20:
			return buf, j, k, syntaxErr(j, "control character in string")
		case c >= 0xC2 && c < 0xE0 && j+1 < n && in[j+1]&0xC0 == 0x80:
			// A two-byte sequence (Latin text): valid as it stands.
			buf = append(buf, c, in[j+1])
			j += 2
		default:
			// c >= 0x80: validate the whole run of non-ASCII bytes at once
			// (utf8.Valid also rejects encoded surrogates and overlong
			// forms; a sequence cut short by an ASCII byte is invalid).
			e := j + 1
			for e < n && in[e] >= 0x80 {
				e++
			}
			if !utf8.Valid(in[j:e]) {
				// Find the offending byte for the error.
				for j < e {
					r, size := utf8.DecodeRune(in[j:e])
					if r == utf8.RuneError && size == 1 {
						break
					}
					j += size
				}
				return buf, j, k, &Error{Offset: j, Err: ErrInvalidUTF8, Detail: "invalid UTF-8"}
			}
			buf = append(buf, in[j:e]...)
			j = e
		}
		start := j
		j = scanSafe(in, j)
		buf = appendRaw(buf, in, start, j)
	}
}

// escape decodes the escape at in[j] == '\\' and returns the position after it.
func escape(buf, in []byte, j int) ([]byte, int, error) {
	if j+1 >= len(in) {
		return buf, j, syntaxErr(j, "unterminated string")
	}
	var c byte
	switch in[j+1] {
	case '"', '\\', '/':
		c = in[j+1]
	case 'b':
		c = '\b'
	case 'f':
		c = '\f'
	case 'n':
		c = '\n'
	case 'r':
		c = '\r'
	case 't':
		c = '\t'
	case 'u':
		r, ok := hex4(in, j+2)
		if !ok {
			return buf, j, syntaxErr(j, `invalid \u escape`)
		}
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if j+12 <= len(in) && in[j+6] == '\\' && in[j+7] == 'u' {
				lo, ok := hex4(in, j+8)
				if !ok {
					return buf, j + 6, syntaxErr(j+6, `invalid \u escape`)
				}
				if lo >= 0xDC00 && lo < 0xE000 {
					return utf8.AppendRune(buf, 0x10000+(r-0xD800)<<10+(lo-0xDC00)), j + 12, nil
				}
			}
			return buf, j, &Error{Offset: j, Err: ErrInvalidUTF8, Detail: "lone surrogate " + string(in[j:j+6])}
		case r >= 0xDC00 && r < 0xE000:
			return buf, j, &Error{Offset: j, Err: ErrInvalidUTF8, Detail: "lone surrogate " + string(in[j:j+6])}
		case r < 0x80:
			return append(buf, byte(r)), j + 6, nil
		case r < 0x800:
			return append(buf, 0xC0|byte(r>>6), 0x80|byte(r)&0x3F), j + 6, nil
		}
		return append(buf, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F), j + 6, nil
	default:
		return buf, j, syntaxErr(j, "invalid escape")
	}
	return append(buf, c), j + 2, nil
}

func hex4(in []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(in) {
		return 0, false
	}
	h := in[i : i+4 : i+4]
	a, b, c, d := hexVal[h[0]], hexVal[h[1]], hexVal[h[2]], hexVal[h[3]]
	if a|b|c|d < 0 {
		return 0, false
	}
	return rune(a)<<12 | rune(b)<<8 | rune(c)<<4 | rune(d), true
}

// hexVal is the value of a hex digit, or -1.
var hexVal = func() (t [256]int8) {
	for c := range t {
		switch {
		case c >= '0' && c <= '9':
			t[c] = int8(c - '0')
		case c >= 'a' && c <= 'f':
			t[c] = int8(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			t[c] = int8(c - 'A' + 10)
		default:
			t[c] = -1
		}
	}
	return t
}()

func isDigit(c byte) bool { return c-'0' < 10 }

// number validates the RFC 8259 number at pos and appends its literal text.
func number(buf, in []byte, pos int) ([]byte, int, error) {
	n := len(in)
	i := pos
	if in[i] == '-' {
		i++
	}
	switch {
	case i < n && in[i] == '0':
		i++
		if i < n && isDigit(in[i]) {
			return buf, i, syntaxErr(i-1, "leading zero in number")
		}
	case i < n && isDigit(in[i]):
		for i++; i < n && isDigit(in[i]); i++ {
		}
	default:
		return buf, i, syntaxErr(i, "expected digit in number")
	}
	if i < n && in[i] == '.' {
		i++
		d := i
		for i < n && isDigit(in[i]) {
			i++
		}
		if i == d {
			return buf, i, syntaxErr(i, "expected digit after decimal point")
		}
	}
	if i < n && in[i]|0x20 == 'e' {
		i++
		if i < n && (in[i] == '+' || in[i] == '-') {
			i++
		}
		d := i
		for i < n && isDigit(in[i]) {
			i++
		}
		if i == d {
			return buf, i, syntaxErr(i, "expected digit in exponent")
		}
	}
	if l := i - pos; l < 0x80 {
		buf = append(buf, 'd', byte(l))
	} else {
		buf = append(buf, 'd')
		buf = binary.AppendUvarint(buf, uint64(l))
	}
	return append(buf, in[pos:i]...), i, nil
}
