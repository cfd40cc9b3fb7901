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
	_, err := compilePointer(p)
	return err
}

func compilePointer(p string) ([]token, error) {
	perr := func(off int, reason string) error {
		return &PointerError{Pointer: p, Offset: off, Reason: reason}
	}
	if p == "" {
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
