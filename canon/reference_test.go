package canon

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"slices"
	"unicode/utf8"
)

// refEncode is the reference encoder: a plain recursive implementation of
// the documented encoding, written to be checked by eye against this
// grammar (scheme 1, docs/hashing.md#structural-hash):
//
//	enc(null)    = 'n'           enc(true) = 't'     enc(false) = 'f'
//	enc(number)  = 'd' uvarint(len(text)) text       (the literal, as written)
//	enc(string)  = 's' uvarint(len(utf8)) utf8      (the decoded value)
//	enc(array)   = 'a' enc(e0) enc(e1) ... ']'      (ignored elements left out)
//	enc(object)  = 'o' enc(name_k) enc(value_k) ... '}'
//	               members sorted by their decoded name bytes, ignored ones
//	               left out; a name twice in one object is an error
//
// on RFC 8259 JSON (whitespace: space, tab, CR, LF; no BOM; nothing after
// the value), with invalid UTF-8 and lone surrogates rejected. A member or
// element is ignored when an ignore pointer has exactly as many tokens as
// its path and each token matches: "*" anything, a name the member of that
// name, a canonical index that array element. Errors are *Error with the
// sentinel and the offset the fast encoder reports (only the choice between
// several duplicate names may differ). Value pointers do not change the
// encoding; refValues reads their values.
func refEncode(h *Hasher, in []byte) (enc []byte, err error) {
	if len(in) > h.maxSize {
		return nil, &Error{Offset: h.maxSize, Err: ErrTooLarge}
	}
	p := &refParser{h: h, in: in}
	enc, err = p.value(nil, nil)
	if err != nil {
		return nil, err
	}
	if p.ws(); p.pos < len(in) {
		return nil, &Error{Offset: p.pos, Err: ErrTrailingData}
	}
	return enc, nil
}

// refValues is the reference of SumValues: it parses in with refEncode's
// parser and returns, for each value pointer, the decoded string or the
// value's text compacted by encoding/json, and the JSON type.
func refValues(h *Hasher, in []byte) ([]Value, error) {
	if in == nil {
		if len(h.vptrs) == 0 {
			return nil, nil
		}
		return nil, &ValueError{Pointer: h.vptrs[0], Tombstone: true}
	}
	if len(in) > h.maxSize {
		return nil, &Error{Offset: h.maxSize, Err: ErrTooLarge}
	}
	n := len(h.vptrs)
	p := &refParser{h: h, in: in, spans: make([][2]int, n), found: make([]bool, n)}
	if _, err := p.value(nil, nil); err != nil {
		return nil, err
	}
	if p.ws(); p.pos < len(in) {
		return nil, &Error{Offset: p.pos, Err: ErrTrailingData}
	}
	vals := make([]Value, n)
	for i := range vals {
		if !p.found[i] {
			return nil, &ValueError{Pointer: h.vptrs[i]}
		}
		raw := in[p.spans[i][0]:p.spans[i][1]]
		kinds := map[byte]Kind{'"': KindString, '{': KindObject, '[': KindArray, 't': KindBool, 'f': KindBool, 'n': KindNull}
		k, ok := kinds[raw[0]]
		if !ok {
			k = KindNumber
		}
		if k == KindString {
			q := &refParser{h: h, in: raw}
			s, err := q.str()
			if err != nil {
				panic(err)
			}
			vals[i] = Value{s, k}
			continue
		}
		var b bytes.Buffer
		if err := json.Compact(&b, raw); err != nil {
			panic(err)
		}
		vals[i] = Value{b.Bytes(), k}
	}
	return vals, nil
}

type refParser struct {
	h   *Hasher
	in  []byte
	pos int
	// spans[i] is the input span of the value at value pointer i, if found.
	spans [][2]int
	found []bool
}

// refStep is one step of a path: a member name or an array index.
type refStep struct {
	name  string
	index int // -1 for a member
}

func refErr(off int, s error) error { return &Error{Offset: off, Err: s} }

func (p *refParser) ws() {
	for p.pos < len(p.in) && (p.in[p.pos] == ' ' || p.in[p.pos] == '\t' || p.in[p.pos] == '\n' || p.in[p.pos] == '\r') {
		p.pos++
	}
}

// at reports whether path is exactly where pointer toks points; star
// allows the "*" wildcard (ignore pointers).
func refAt(toks []token, path []refStep, star bool) bool {
	if len(toks) != len(path) {
		return false
	}
	for i, t := range toks {
		switch {
		case star && t.star:
		case path[i].index < 0 && t.name == path[i].name:
		case path[i].index >= 0 && t.index == path[i].index:
		default:
			return false
		}
	}
	return true
}

func (p *refParser) ignored(path []refStep) bool {
	for _, toks := range p.h.ptrs[:p.h.nIgnore] {
		if refAt(toks, path, true) {
			return true
		}
	}
	return false
}

// value parses the value at p.pos, the value at path inside the open
// containers stack ('a' or 'o' each).
func (p *refParser) value(path []refStep, stack []byte) ([]byte, error) {
	p.ws()
	start := p.pos
	enc, err := p.scalarOrContainer(path, stack)
	for i, toks := range p.h.ptrs[p.h.nIgnore:] {
		if err == nil && p.found != nil && refAt(toks, path, false) {
			p.spans[i], p.found[i] = [2]int{start, p.pos}, true
		}
	}
	return enc, err
}

func (p *refParser) scalarOrContainer(path []refStep, stack []byte) ([]byte, error) {
	if p.pos >= len(p.in) {
		return nil, refErr(p.pos, ErrSyntax)
	}
	start := p.pos
	switch c := p.in[p.pos]; {
	case c == '"':
		s, err := p.str()
		return refTagged('s', s), err
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == '{' || c == '[':
		if len(stack) >= p.h.maxDepth {
			return nil, refErr(start, ErrTooDeep)
		}
		p.pos++
		if c == '[' {
			return p.array(path, append(stack, 'a'))
		}
		return p.object(path, append(stack, 'o'))
	}
	for _, lit := range []string{"true", "false", "null"} {
		if bytes.HasPrefix(p.in[p.pos:], []byte(lit)) {
			p.pos += len(lit)
			return []byte{lit[0]}, nil
		}
	}
	return nil, refErr(start, ErrSyntax)
}

func (p *refParser) array(path []refStep, stack []byte) ([]byte, error) {
	enc := []byte{'a'}
	p.ws()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return append(enc, ']'), nil
	}
	for i := 0; ; i++ {
		elem := append(slices.Clip(path), refStep{index: i})
		v, err := p.value(elem, stack)
		if err != nil {
			return nil, err
		}
		if !p.ignored(elem) {
			enc = append(enc, v...)
		}
		p.ws()
		switch {
		case p.pos < len(p.in) && p.in[p.pos] == ',':
			p.pos++
		case p.pos < len(p.in) && p.in[p.pos] == ']':
			p.pos++
			return append(enc, ']'), nil
		default:
			return nil, refErr(p.pos, ErrSyntax)
		}
	}
}

func (p *refParser) object(path []refStep, stack []byte) ([]byte, error) {
	type member struct {
		name []byte
		enc  []byte // name and value
		at   int    // input offset of the name
		drop bool
	}
	var ms []member
	p.ws()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return []byte{'o', '}'}, nil
	}
	for {
		p.ws()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return nil, refErr(p.pos, ErrSyntax)
		}
		at := p.pos
		name, err := p.str()
		if err != nil {
			return nil, err
		}
		if p.ws(); p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return nil, refErr(p.pos, ErrSyntax)
		}
		p.pos++
		elem := append(slices.Clip(path), refStep{name: string(name), index: -1})
		v, err := p.value(elem, stack)
		if err != nil {
			return nil, err
		}
		ms = append(ms, member{name, append(refTagged('s', name), v...), at, p.ignored(elem)})
		p.ws()
		if p.pos < len(p.in) && p.in[p.pos] == ',' {
			p.pos++
			continue
		}
		if p.pos < len(p.in) && p.in[p.pos] == '}' {
			p.pos++
			break
		}
		return nil, refErr(p.pos, ErrSyntax)
	}
	slices.SortStableFunc(ms, func(a, b member) int { return bytes.Compare(a.name, b.name) })
	enc := []byte{'o'}
	for i, m := range ms {
		if i > 0 && bytes.Equal(ms[i-1].name, m.name) {
			return nil, refErr(max(ms[i-1].at, m.at), ErrDuplicateMember)
		}
		if !m.drop {
			enc = append(enc, m.enc...)
		}
	}
	return append(enc, '}'), nil
}

func refTagged(tag byte, b []byte) []byte {
	return append(binary.AppendUvarint([]byte{tag}, uint64(len(b))), b...)
}

// str decodes the string whose opening quote is at p.pos.
func (p *refParser) str() ([]byte, error) {
	in, open := p.in, p.pos
	out := []byte{}
	j := open + 1
	hex4 := func(i int) (rune, bool) {
		if i+4 > len(in) {
			return 0, false
		}
		var r rune
		for _, c := range in[i : i+4] {
			switch {
			case c >= '0' && c <= '9':
				r = r<<4 | rune(c-'0')
			case c >= 'a' && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case c >= 'A' && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	for {
		if j >= len(in) {
			return nil, refErr(open, ErrSyntax) // unterminated
		}
		switch c := in[j]; {
		case c == '"':
			p.pos = j + 1
			return out, nil
		case c < 0x20:
			return nil, refErr(j, ErrSyntax)
		case c >= 0x80:
			r, size := utf8.DecodeRune(in[j:])
			if r == utf8.RuneError && size == 1 {
				return nil, refErr(j, ErrInvalidUTF8)
			}
			out = append(out, in[j:j+size]...)
			j += size
		case c != '\\':
			out = append(out, c)
			j++
		case j+1 >= len(in):
			return nil, refErr(j, ErrSyntax)
		default:
			simple := map[byte]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}
			if e, ok := simple[in[j+1]]; ok {
				out = append(out, e)
				j += 2
				continue
			}
			if in[j+1] != 'u' {
				return nil, refErr(j, ErrSyntax)
			}
			r, ok := hex4(j + 2)
			if !ok {
				return nil, refErr(j, ErrSyntax)
			}
			if r >= 0xD800 && r < 0xDC00 && j+12 <= len(in) && in[j+6] == '\\' && in[j+7] == 'u' {
				lo, ok := hex4(j + 8)
				if !ok {
					return nil, refErr(j+6, ErrSyntax)
				}
				if lo >= 0xDC00 && lo < 0xE000 {
					out = utf8.AppendRune(out, 0x10000+(r-0xD800)<<10+(lo-0xDC00))
					j += 12
					continue
				}
			}
			if r >= 0xD800 && r < 0xE000 {
				return nil, refErr(j, ErrInvalidUTF8) // lone surrogate
			}
			out = utf8.AppendRune(out, r)
			j += 6
		}
	}
}

// number parses the RFC 8259 number at p.pos: -? (0 | [1-9][0-9]*)
// (. [0-9]+)? ([eE] [+-]? [0-9]+)?
func (p *refParser) number() ([]byte, error) {
	in, start := p.in, p.pos
	i := start
	digits := func() int {
		d := i
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
		return i - d
	}
	if in[i] == '-' {
		i++
	}
	switch {
	case i < len(in) && in[i] == '0':
		if i++; i < len(in) && in[i] >= '0' && in[i] <= '9' {
			return nil, refErr(i-1, ErrSyntax) // leading zero
		}
	case digits() == 0:
		return nil, refErr(i, ErrSyntax)
	}
	if i < len(in) && in[i] == '.' {
		i++
		if digits() == 0 {
			return nil, refErr(i, ErrSyntax)
		}
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		if digits() == 0 {
			return nil, refErr(i, ErrSyntax)
		}
	}
	p.pos = i
	return refTagged('d', in[start:i]), nil
}
