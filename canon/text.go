package canon

import (
	"encoding/binary"
	"unicode/utf8"
)

// appendText renders a canonical encoding (as built by encode, so known to
// be well formed) as indented JSON, one member or element per line.
func appendText(dst, enc []byte) []byte {
	var kinds []byte // open containers, 'a' or 'o'
	open := false    // a container was just opened and has no element yet
	indent := func(d int) {
		dst = append(dst, '\n')
		for range d {
			dst = append(dst, "  "...)
		}
	}
	readStr := func(i int) ([]byte, int) { // i at the 's' tag
		l, w := binary.Uvarint(enc[i+1:])
		start := i + 1 + w
		return enc[start : start+int(l)], start + int(l)
	}
	for i := 0; i < len(enc); {
		c := enc[i]
		if c == ']' || c == '}' {
			kinds = kinds[:len(kinds)-1]
			if !open {
				indent(len(kinds))
			}
			dst = append(dst, c)
			open = false
			i++
			continue
		}
		if len(kinds) > 0 {
			if !open {
				dst = append(dst, ',')
			}
			indent(len(kinds))
			if kinds[len(kinds)-1] == 'o' {
				var name []byte
				name, i = readStr(i)
				dst = appendQuoted(dst, name)
				dst = append(dst, ": "...)
				c = enc[i]
			}
		}
		open = false
		switch c {
		case 'n':
			dst = append(dst, "null"...)
			i++
		case 't':
			dst = append(dst, "true"...)
			i++
		case 'f':
			dst = append(dst, "false"...)
			i++
		case 'd':
			var num []byte
			num, i = readStr(i)
			dst = append(dst, num...)
		case 's':
			var str []byte
			str, i = readStr(i)
			dst = appendQuoted(dst, str)
		case 'a', 'o':
			if c == 'a' {
				dst = append(dst, '[')
			} else {
				dst = append(dst, '{')
			}
			kinds = append(kinds, c)
			open = true
			i++
		}
	}
	return append(dst, '\n')
}

// appendQuoted appends s (valid UTF-8) as a JSON string, escaping only what
// JSON requires.
func appendQuoted(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			_, size := utf8.DecodeRune(s[i:])
			dst = append(dst, s[i:i+size]...)
			i += size
			continue
		}
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\n':
			dst = append(dst, '\\', 'n')
		case c == '\r':
			dst = append(dst, '\\', 'r')
		case c == '\t':
			dst = append(dst, '\\', 't')
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
		i++
	}
	return append(dst, '"')
}
