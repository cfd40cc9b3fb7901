package canon

// This file: scalars. Strings (validation, escapes, copying runs) and
// numbers, and the word-at-a-time helpers they share with the member fast
// paths.

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
)

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
// copied at once. On any error the string is decoded again by decodeStr,
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
	// Invalid: find the first bad byte.
	_, j, err := decodeStr(buf[:start], in, pos)
	return buf[:start], j, start + 2, err
}

// decodeStr appends the decoded value of the string whose opening quote
// is at pos and returns the position after its closing quote. It is the
// plain decoder, byte by byte: str calls it for an invalid string, to name
// exactly the first bad byte, and SumValues for the strings it returns.
func decodeStr(dst, in []byte, pos int) ([]byte, int, error) {
	n := len(in)
	for j := pos + 1; ; {
		if j >= n {
			return dst, j, syntaxErr(pos, "unterminated string")
		}
		switch c := in[j]; {
		case c == '"':
			return dst, j + 1, nil
		case c == '\\':
			var err error
			if dst, j, err = escape(dst, in, j); err != nil {
				return dst, j, err
			}
		case c < 0x20:
			return dst, j, syntaxErr(j, "control character in string")
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			j++
		default:
			// utf8.DecodeRune rejects encoded surrogates, overlong forms
			// and sequences cut short.
			r, size := utf8.DecodeRune(in[j:])
			if r == utf8.RuneError && size == 1 {
				return dst, j, &Error{Offset: j, Err: ErrInvalidUTF8, Detail: "invalid UTF-8"}
			}
			dst = append(dst, in[j:j+size]...)
			j += size
		}
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
		}
		// str decodes these inline; here only for decodeStr.
		return utf8.AppendRune(buf, r), j + 6, nil
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
