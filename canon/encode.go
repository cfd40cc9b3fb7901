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

// less orders members by name bytes.
func (s *state) less(a, b *member) bool {
	if a.prefix != b.prefix {
		return a.prefix < b.prefix
	}
	return bytes.Compare(s.buf[a.key:a.keyEnd], s.buf[b.key:b.keyEnd]) < 0
}

func (s *state) sameName(a, b *member) bool {
	return a.prefix == b.prefix && bytes.Equal(s.buf[a.key:a.keyEnd], s.buf[b.key:b.keyEnd])
}

func namePrefix(name []byte) uint64 {
	if len(name) >= 8 {
		return binary.BigEndian.Uint64(name)
	}
	var p uint64
	for i, c := range name {
		p |= uint64(c) << (56 - 8*i)
	}
	return p
}

// frame is one open array or object.
type frame struct {
	obj        bool
	ignoreElem bool   // arrays: the current element is ignored
	body       int    // buffer offset after the 'a' or 'o' tag
	mstart     int    // objects: index of the first member in state.members
	elem       int    // arrays: buffer offset of the current element
	index      int    // arrays: index of the current element
	active     uint64 // ignore pointers whose tokens match this container's path
}

// state is the pooled scratch of one Sum: the encoding, a second buffer
// for reordering members, the explicit parse stack and the open members.
type state struct {
	buf, tmp []byte
	out      []byte // the final encoding: buf, or tmp when the top object was reordered
	stack    []frame
	members  []member
}

// strSafe marks the bytes a string can hold that need no work: printable
// ASCII other than '"' and '\\'.
var strSafe = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipWS(in []byte, pos int) int {
	for pos < len(in) && isWS(in[pos]) {
		pos++
	}
	return pos
}

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

// encode parses in and leaves its canonical encoding in s.buf. It never
// recurses: nesting lives in s.stack, bounded by h.maxDepth.
func (s *state) encode(h *Hasher, in []byte) error {
	s.buf = s.buf[:0]
	s.stack = s.stack[:0]
	s.members = s.members[:0]
	s.out = nil
	n := len(in)
	pos := 0
	active := h.all // ignore pointers that may apply inside the next value
	var err error
	for {
		// A value starts here.
		pos = skipWS(in, pos)
		if pos >= n {
			return unexpected(in, pos, "a value")
		}
		switch in[pos] {
		case '{':
			if len(s.stack) >= h.maxDepth {
				return &Error{Offset: pos, Err: ErrTooDeep, Detail: "limit " + strconv.Itoa(h.maxDepth)}
			}
			s.buf = append(s.buf, 'o')
			pos = skipWS(in, pos+1)
			if pos < n && in[pos] == '}' {
				s.buf = append(s.buf, '}')
				pos++
				break
			}
			s.stack = append(s.stack, frame{obj: true, body: len(s.buf), mstart: len(s.members), active: active})
			if pos, active, err = s.member(h, in, pos); err != nil {
				return err
			}
			continue
		case '[':
			if len(s.stack) >= h.maxDepth {
				return &Error{Offset: pos, Err: ErrTooDeep, Detail: "limit " + strconv.Itoa(h.maxDepth)}
			}
			s.buf = append(s.buf, 'a')
			pos = skipWS(in, pos+1)
			if pos < n && in[pos] == ']' {
				s.buf = append(s.buf, ']')
				pos++
				break
			}
			f := frame{body: len(s.buf), elem: len(s.buf), active: active}
			active, f.ignoreElem = h.matchIndex(active, len(s.stack), 0)
			s.stack = append(s.stack, f)
			continue
		case '"':
			if pos, _, err = s.str(in, pos); err != nil {
				return err
			}
		case 't':
			if n-pos < 4 || string(in[pos:pos+4]) != "true" {
				return syntaxErr(pos, "invalid literal, expected true")
			}
			s.buf = append(s.buf, 't')
			pos += 4
		case 'f':
			if n-pos < 5 || string(in[pos:pos+5]) != "false" {
				return syntaxErr(pos, "invalid literal, expected false")
			}
			s.buf = append(s.buf, 'f')
			pos += 5
		case 'n':
			if n-pos < 4 || string(in[pos:pos+4]) != "null" {
				return syntaxErr(pos, "invalid literal, expected null")
			}
			s.buf = append(s.buf, 'n')
			pos += 4
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			if pos, err = s.number(in, pos); err != nil {
				return err
			}
		default:
			return unexpected(in, pos, "a value")
		}

		// A value ended: close containers until one continues.
		for {
			pos = skipWS(in, pos)
			if len(s.stack) == 0 {
				if pos < n {
					return &Error{Offset: pos, Err: ErrTrailingData}
				}
				if s.out == nil {
					s.out = s.buf
				}
				return nil
			}
			f := &s.stack[len(s.stack)-1]
			if f.obj {
				s.members[len(s.members)-1].end = int32(len(s.buf))
				if pos < n && in[pos] == ',' {
					if pos, active, err = s.member(h, in, skipWS(in, pos+1)); err != nil {
						return err
					}
					break
				}
				if pos < n && in[pos] == '}' {
					if err := s.closeObject(f); err != nil {
						return err
					}
					s.stack = s.stack[:len(s.stack)-1]
					pos++
					continue
				}
				return unexpected(in, pos, "',' or '}'")
			}
			if f.ignoreElem {
				s.buf = s.buf[:f.elem]
			}
			if pos < n && in[pos] == ',' {
				f.index++
				f.elem = len(s.buf)
				active, f.ignoreElem = h.matchIndex(f.active, len(s.stack)-1, f.index)
				pos++
				break
			}
			if pos < n && in[pos] == ']' {
				s.buf = append(s.buf, ']')
				s.stack = s.stack[:len(s.stack)-1]
				pos++
				continue
			}
			return unexpected(in, pos, "',' or ']'")
		}
	}
}

// member parses a member name and its colon in the innermost object and
// returns the position of the value and the pointers active inside it.
func (s *state) member(h *Hasher, in []byte, pos int) (int, uint64, error) {
	if pos >= len(in) || in[pos] != '"' {
		return pos, 0, unexpected(in, pos, "a member name")
	}
	start := len(s.buf)
	end, key, err := s.str(in, pos)
	if err != nil {
		return end, 0, err
	}
	m := member{start: int32(start), key: int32(key), keyEnd: int32(len(s.buf)), in: int32(pos)}
	m.prefix = namePrefix(s.buf[key:])
	end = skipWS(in, end)
	if end >= len(in) || in[end] != ':' {
		return end, 0, unexpected(in, end, "':'")
	}
	f := &s.stack[len(s.stack)-1]
	var child uint64
	if f.active != 0 {
		child, m.ignored = h.matchName(f.active, len(s.stack)-1, s.buf[m.key:m.keyEnd])
	}
	s.members = append(s.members, m)
	return end + 1, child, nil
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

// closeObject sorts the innermost object's members by name, rejects equal
// names, drops ignored members and ends the object. The top-level object
// is reordered into s.tmp only, which then is the final encoding: no copy
// back.
func (s *state) closeObject(f *frame) error {
	ms := s.members[f.mstart:]
	sorted, ignored := true, false
	for i := range ms {
		ignored = ignored || ms[i].ignored
		if i > 0 && sorted && !s.less(&ms[i-1], &ms[i]) {
			if s.sameName(&ms[i-1], &ms[i]) {
				return s.dupErr(ms[i-1], ms[i])
			}
			sorted = false
		}
	}
	if !sorted {
		if len(ms) <= 12 {
			for i := 1; i < len(ms); i++ {
				for j := i; j > 0 && s.less(&ms[j], &ms[j-1]); j-- {
					ms[j-1], ms[j] = ms[j], ms[j-1]
				}
			}
		} else {
			slices.SortFunc(ms, func(a, b member) int {
				if a.prefix != b.prefix {
					if a.prefix < b.prefix {
						return -1
					}
					return 1
				}
				return bytes.Compare(s.buf[a.key:a.keyEnd], s.buf[b.key:b.keyEnd])
			})
		}
		for i := 1; i < len(ms); i++ {
			if s.sameName(&ms[i-1], &ms[i]) {
				return s.dupErr(ms[i-1], ms[i])
			}
		}
	}
	top := len(s.stack) == 1
	switch {
	case top && (!sorted || ignored):
		s.tmp = append(s.tmp[:0], s.buf[:f.body]...)
		for i := range ms {
			if !ms[i].ignored {
				s.tmp = append(s.tmp, s.buf[ms[i].start:ms[i].end]...)
			}
		}
		s.tmp = append(s.tmp, '}')
		s.out = s.tmp
	case !sorted || ignored:
		s.tmp = s.tmp[:0]
		for i := range ms {
			if !ms[i].ignored {
				s.tmp = append(s.tmp, s.buf[ms[i].start:ms[i].end]...)
			}
		}
		s.buf = append(s.buf[:f.body], s.tmp...)
	}
	s.buf = append(s.buf, '}')
	s.members = s.members[:f.mstart]
	return nil
}

func (s *state) key(m member) []byte { return s.buf[m.key:m.keyEnd] }

func (s *state) dupErr(a, b member) error {
	return &Error{Offset: int(max(a.in, b.in)), Err: ErrDuplicateMember, Detail: strconv.Quote(string(s.key(a)))}
}

// str appends the string starting at the quote at pos as 's' uvarint(len)
// decoded bytes. It returns the position after the closing quote and the
// buffer offset of the decoded bytes.
func (s *state) str(in []byte, pos int) (int, int, error) {
	n := len(in)
	i := pos + 1
	j := i
	for j < n && strSafe[in[j]] {
		j++
	}
	if j < n && in[j] == '"' {
		// Fast path: plain ASCII, the length is known before copying.
		s.buf = append(s.buf, 's')
		s.buf = binary.AppendUvarint(s.buf, uint64(j-i))
		k := len(s.buf)
		s.buf = append(s.buf, in[i:j]...)
		return j + 1, k, nil
	}
	// Slow path: reserve one length byte, decode, then fix the length.
	s.buf = append(s.buf, 's', 0)
	lenAt := len(s.buf) - 1
	k := len(s.buf)
	s.buf = append(s.buf, in[i:j]...)
	for {
		if j >= n {
			return j, k, syntaxErr(pos, "unterminated string")
		}
		c := in[j]
		switch {
		case c == '"':
			j++
			l := len(s.buf) - k
			if l < 0x80 {
				s.buf[lenAt] = byte(l)
				return j, k, nil
			}
			var tmp [binary.MaxVarintLen64]byte
			w := binary.PutUvarint(tmp[:], uint64(l))
			s.buf = append(s.buf, tmp[:w-1]...)
			copy(s.buf[lenAt+w:], s.buf[k:k+l])
			copy(s.buf[lenAt:], tmp[:w])
			return j, lenAt + w, nil
		case c == '\\':
			var err error
			if j, err = s.escape(in, j); err != nil {
				return j, k, err
			}
		case c < 0x20:
			return j, k, syntaxErr(j, "control character in string")
		default:
			// c >= 0x80: validate one UTF-8 sequence (DecodeRune also
			// rejects encoded surrogates and overlong forms).
			r, size := utf8.DecodeRune(in[j:])
			if r == utf8.RuneError && size == 1 {
				return j, k, &Error{Offset: j, Err: ErrInvalidUTF8, Detail: "invalid UTF-8"}
			}
			s.buf = append(s.buf, in[j:j+size]...)
			j += size
		}
		start := j
		for j < n && strSafe[in[j]] {
			j++
		}
		s.buf = append(s.buf, in[start:j]...)
	}
}

// escape decodes the escape at in[j] == '\\' and returns the position after it.
func (s *state) escape(in []byte, j int) (int, error) {
	if j+1 >= len(in) {
		return j, syntaxErr(j, "unterminated string")
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
			return j, syntaxErr(j, `invalid \u escape`)
		}
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if j+12 <= len(in) && in[j+6] == '\\' && in[j+7] == 'u' {
				lo, ok := hex4(in, j+8)
				if !ok {
					return j + 6, syntaxErr(j+6, `invalid \u escape`)
				}
				if lo >= 0xDC00 && lo < 0xE000 {
					s.buf = utf8.AppendRune(s.buf, 0x10000+(r-0xD800)<<10+(lo-0xDC00))
					return j + 12, nil
				}
			}
			return j, &Error{Offset: j, Err: ErrInvalidUTF8, Detail: "lone surrogate " + string(in[j:j+6])}
		case r >= 0xDC00 && r < 0xE000:
			return j, &Error{Offset: j, Err: ErrInvalidUTF8, Detail: "lone surrogate " + string(in[j:j+6])}
		}
		s.buf = utf8.AppendRune(s.buf, r)
		return j + 6, nil
	default:
		return j, syntaxErr(j, "invalid escape")
	}
	s.buf = append(s.buf, c)
	return j + 2, nil
}

func hex4(in []byte, i int) (rune, bool) {
	if i+4 > len(in) {
		return 0, false
	}
	var r rune
	for _, c := range in[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number validates the RFC 8259 number at pos and appends its literal text.
func (s *state) number(in []byte, pos int) (int, error) {
	n := len(in)
	i := pos
	if in[i] == '-' {
		i++
	}
	switch {
	case i < n && in[i] == '0':
		i++
		if i < n && isDigit(in[i]) {
			return i, syntaxErr(i-1, "leading zero in number")
		}
	case i < n && isDigit(in[i]):
		for i < n && isDigit(in[i]) {
			i++
		}
	default:
		return i, syntaxErr(i, "expected digit in number")
	}
	if i < n && in[i] == '.' {
		i++
		d := i
		for i < n && isDigit(in[i]) {
			i++
		}
		if i == d {
			return i, syntaxErr(i, "expected digit after decimal point")
		}
	}
	if i < n && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < n && (in[i] == '+' || in[i] == '-') {
			i++
		}
		d := i
		for i < n && isDigit(in[i]) {
			i++
		}
		if i == d {
			return i, syntaxErr(i, "expected digit in exponent")
		}
	}
	s.buf = append(s.buf, 'd')
	s.buf = binary.AppendUvarint(s.buf, uint64(i-pos))
	s.buf = append(s.buf, in[pos:i]...)
	return i, nil
}
