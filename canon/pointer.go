package canon

// This file: pointers. Compiling RFC 6901 pointers and matching them
// against the path of the member or element being parsed.

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf8"
)

// token is one reference token of a compiled pointer.
type token struct {
	name  string // decoded (~0, ~1) member name
	star  bool   // "*": any member or index
	index int    // array index the token also matches, or -1
}

// ValidatePointer reports whether p is an acceptable ignore pointer: an
// RFC 6901 pointer other than "" (which would ignore the whole value), in
// valid UTF-8, where every "~" is followed by "0" or "1".
func ValidatePointer(p string) error {
	_, err := compilePointer(p, false)
	return err
}

// compilePointer compiles an ignore pointer, or a value pointer (value:
// no "*" token; its numeric tokens still match a member or an index).
func compilePointer(p string, value bool) ([]token, error) {
	perr := func(off int, reason string) error {
		return &PointerError{Pointer: p, Offset: off, Reason: reason, Value: value}
	}
	if p == "" {
		if value {
			return nil, perr(0, "empty pointer: the whole value is no member")
		}
		return nil, perr(0, "empty pointer would ignore the whole value")
	}
	if p[0] != '/' {
		return nil, perr(0, `must start with "/"`)
	}
	if !utf8.ValidString(p) {
		return nil, perr(0, "invalid UTF-8")
	}
	for i := 0; i < len(p); i++ {
		if p[i] != '~' {
			continue
		}
		if i+1 >= len(p) || (p[i+1] != '0' && p[i+1] != '1') {
			esc := p[i:min(i+2, len(p))]
			return nil, perr(i, fmt.Sprintf("invalid escape %q at byte %d", esc, i))
		}
	}
	parts := strings.Split(p[1:], "/")
	toks := make([]token, len(parts))
	for i, raw := range parts {
		t := token{index: -1}
		if raw == "*" {
			if value {
				return nil, perr(len(p)-len(strings.Join(parts[i:], "/")), `"*" cannot name one value`)
			}
			t.star = true
		}
		t.name = strings.NewReplacer("~1", "/", "~0", "~").Replace(raw)
		// RFC 6901 array indexes: "0" or digits without a leading zero.
		if len(raw) > 0 && len(raw) <= 9 && (raw == "0" || raw[0] != '0') {
			if n, err := strconv.Atoi(raw); err == nil && n >= 0 && raw[0] != '+' && raw[0] != '-' {
				t.index = n
			}
		}
		toks[i] = t
	}
	return toks, nil
}

// nameFilter returns the set of the first bytes (modulo 64) of the names
// that the pointers in active can match in an object at depth d: a member
// whose name starts otherwise (prefix>>56, 0 for "") matches none of
// them, so the member loop calls matchName only for the few that may.
func (h *Hasher) nameFilter(active uint64, d int) uint64 {
	var set uint64
	for a := active; a != 0; a &= a - 1 {
		t := &h.ptrs[bits.TrailingZeros64(a)][d]
		if t.star {
			return ^uint64(0)
		}
		var c byte
		if t.name != "" {
			c = t.name[0]
		}
		set |= 1 << (c & 63)
	}
	return set
}

// matchName returns the pointers still active inside member name of a
// container at depth d, and whether the member is ignored. A value
// pointer ending here records pos, the input offset of the member's
// value. Inside an ignored member only value pointers stay active.
func (s *state) matchName(h *Hasher, active uint64, d int, name []byte, pos int) (uint64, bool) {
	var child uint64
	ignored := false
	for a := active; a != 0; a &= a - 1 {
		i := bits.TrailingZeros64(a)
		if t := &h.ptrs[i][d]; t.star || t.name == string(name) {
			child, ignored = s.matched(h, i, d, pos, child, ignored)
		}
	}
	if ignored {
		child &= h.values
	}
	return child, ignored
}

// matchIndex is matchName for array element idx.
func (s *state) matchIndex(h *Hasher, active uint64, d, idx, pos int) (uint64, bool) {
	var child uint64
	ignored := false
	for a := active; a != 0; a &= a - 1 {
		i := bits.TrailingZeros64(a)
		if t := &h.ptrs[i][d]; t.star || t.index == idx {
			child, ignored = s.matched(h, i, d, pos, child, ignored)
		}
	}
	if ignored {
		child &= h.values
	}
	return child, ignored
}

// matched handles pointer i matching the member or element at depth d
// whose value starts at pos: it goes on inside, ignores it, or records it.
func (s *state) matched(h *Hasher, i, d, pos int, child uint64, ignored bool) (uint64, bool) {
	switch {
	case len(h.ptrs[i]) > d+1:
		return child | 1<<uint(i), ignored
	case h.values&(1<<uint(i)) == 0:
		return child, true
	}
	s.found |= 1 << uint(i)
	s.vpos[(i-h.nIgnore)&(MaxValues-1)] = int32(pos)
	return child, ignored
}
