package canon

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Defaults for the limits.
const (
	// DefaultMaxDepth is the default maximum nesting of arrays and objects.
	DefaultMaxDepth = 128
	// DefaultMaxSize is the default maximum value size in bytes (1 MiB).
	DefaultMaxSize = 1 << 20
	// MaxSize is the largest accepted WithMaxSize (offsets are 32-bit).
	MaxSize = 1 << 30
	// MaxIgnore is the largest number of ignore pointers one Hasher takes
	// (they are matched as a bit set).
	MaxIgnore = 64
)

// Format selects how a value is hashed.
type Format uint8

// The formats.
const (
	// FormatJSON hashes the structure of a JSON value (scheme SchemeJSON1).
	FormatJSON Format = iota
	// FormatBytes hashes the raw bytes (scheme SchemeBytes1).
	FormatBytes
)

// String returns "json" or "bytes".
func (f Format) String() string {
	switch f {
	case FormatJSON:
		return "json"
	case FormatBytes:
		return "bytes"
	}
	return "Format(" + strconv.Itoa(int(f)) + ")"
}

// ParseFormat parses "json" or "bytes".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "json":
		return FormatJSON, nil
	case "bytes":
		return FormatBytes, nil
	}
	return 0, fmt.Errorf("canon: unknown format %q (want json or bytes)", s)
}

type options struct {
	ignore   []string
	maxDepth int
	maxSize  int
	format   Format
}

// Option configures a Hasher.
type Option func(*options)

// WithIgnore leaves the values at these RFC 6901 pointers out of the hash.
// A token "*" matches any member or array index; a numeric token also
// matches that array index.
func WithIgnore(ptrs ...string) Option {
	return func(o *options) { o.ignore = append(o.ignore, ptrs...) }
}

// WithMaxDepth sets the maximum nesting of arrays and objects (default 128).
func WithMaxDepth(n int) Option { return func(o *options) { o.maxDepth = n } }

// WithMaxSize sets the maximum value size in bytes (default 1 MiB).
func WithMaxSize(n int) Option { return func(o *options) { o.maxSize = n } }

// WithFormat selects the format (default FormatJSON).
func WithFormat(f Format) Option { return func(o *options) { o.format = f } }

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
