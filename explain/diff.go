package explain

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/dam-dedup/dam/canon"
)

// Difference is the first structural difference between two values: a
// JSON pointer and both sides, as compact JSON ("(absent)" for a member or
// element only one side has). All three are for display: what a terminal
// could act on in a member name or a value (control and format
// characters) is escaped as in JSON, a backslash in a name is doubled,
// and each name and value is shortened past maxShown bytes, the path
// past maxPath.
type Difference struct {
	Path string `json:"path"`
	Old  string `json:"old"`
	New  string `json:"new"`
}

// String returns "path: old -> new".
func (d Difference) String() string {
	path := d.Path
	if path == "" {
		path = "(the whole value)"
	}
	return fmt.Sprintf("%s: %s -> %s", path, d.Old, d.New)
}

// absent marks a side that has no value at the path.
const absent = "(absent)"

// maxShown bounds a value or a member name shown in a difference;
// maxPath bounds its whole path.
const (
	maxShown = 120
	maxPath  = 4 * maxShown
)

// firstDifference compares old and new as h hashes them: the canonical
// forms of their trees (members sorted by name, ignored values left out),
// walked in that order; for format bytes, the first differing byte. It
// returns false when the values are equal to h.
func firstDifference(h *canon.Hasher, oldValue, newValue []byte) (Difference, bool, error) {
	if oldValue == nil || newValue == nil {
		if oldValue == nil && newValue == nil {
			return Difference{}, false, nil
		}
		return Difference{Old: showRaw(oldValue, h), New: showRaw(newValue, h)}, true, nil
	}
	if h.Format() == canon.FormatBytes {
		return bytesDifference(oldValue, newValue)
	}
	ot, err := canonicalTree(h, oldValue)
	if err != nil {
		return Difference{}, false, fmt.Errorf("stored content: %w", err)
	}
	nt, err := canonicalTree(h, newValue)
	if err != nil {
		return Difference{}, false, fmt.Errorf("new content: %w", err)
	}
	d, ok := treeDifference("", ot, nt)
	d.Path = shortenTo(d.Path, maxPath)
	return d, ok, nil
}

// canonicalTree parses the canonical form of value: numbers keep their
// literal text (json.Number), as the hash does.
func canonicalTree(h *canon.Hasher, value []byte) (any, error) {
	text, err := h.AppendCanonical(nil, value)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical form: %w", err)
	}
	return v, nil
}

// treeDifference walks two decoded trees in canonical order.
func treeDifference(path string, a, b any) (Difference, bool) {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		names := make([]string, 0, len(av)+len(bv))
		for n := range av {
			names = append(names, n)
		}
		for n := range bv {
			if _, dup := av[n]; !dup {
				names = append(names, n)
			}
		}
		slices.Sort(names) // byte order: the canonical order of members
		for _, n := range names {
			p := path + "/" + escapePointer(n)
			x, inA := av[n]
			y, inB := bv[n]
			switch {
			case !inA:
				return Difference{Path: p, Old: absent, New: show(y)}, true
			case !inB:
				return Difference{Path: p, Old: show(x), New: absent}, true
			}
			if d, ok := treeDifference(p, x, y); ok {
				return d, true
			}
		}
		return Difference{}, false
	case []any:
		bv, ok := b.([]any)
		if !ok {
			break
		}
		for i := range max(len(av), len(bv)) {
			p := fmt.Sprintf("%s/%d", path, i)
			switch {
			case i >= len(av):
				return Difference{Path: p, Old: absent, New: show(bv[i])}, true
			case i >= len(bv):
				return Difference{Path: p, Old: show(av[i]), New: absent}, true
			}
			if d, ok := treeDifference(p, av[i], bv[i]); ok {
				return d, true
			}
		}
		return Difference{}, false
	default:
		if fmt.Sprintf("%T", a) == fmt.Sprintf("%T", b) && a == b {
			return Difference{}, false
		}
	}
	return Difference{Path: path, Old: show(a), New: show(b)}, true
}

// escapePointer escapes a member name as an RFC 6901 reference token,
// for display: escaped (printable) and shortened.
func escapePointer(s string) string {
	return shorten(printable(strings.NewReplacer("~", "~0", "/", "~1").Replace(s), true))
}

// show renders a decoded value as compact JSON, escaped and shortened.
func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return shorten(printable(fmt.Sprint(v), false))
	}
	return shorten(printable(string(b), false))
}

// printable escapes what a terminal could act on: each rune that is not
// printable (C0 and C1 controls, DEL, format characters such as bidi
// overrides) as a JSON escape, \uXXXX (a surrogate pair above U+FFFF), and
// each byte that is not UTF-8 as \xNN. With names, a backslash is doubled
// too, so that a name's own backslashes are not read as escapes; JSON text
// has its backslashes escaped already.
func printable(s string, names bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !strconv.IsPrint(r) || names && r == '\\' {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case names && r == '\\':
			b.WriteString(`\\`)
		case strconv.IsPrint(r):
			b.WriteString(s[i : i+n])
		case r > 0xFFFF:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.String()
}

func shorten(s string) string { return shortenTo(s, maxShown) }

// shortenTo cuts s to at most limit bytes, at a rune's start, and says how
// long it was.
func shortenTo(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("... (%d bytes)", len(s))
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// showRaw renders a record value: "(tombstone)" for nil, text or hex.
func showRaw(v []byte, h *canon.Hasher) string {
	if v == nil {
		return "(tombstone)"
	}
	if h.Format() == canon.FormatBytes {
		return "hex:" + shorten(hex.EncodeToString(v))
	}
	return shorten(printable(string(v), false))
}

// bytesDifference reports the first differing byte of two raw values.
func bytesDifference(a, b []byte) (Difference, bool, error) {
	if bytes.Equal(a, b) {
		return Difference{}, false, nil
	}
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	at := func(v []byte) string {
		if i >= len(v) {
			return fmt.Sprintf("(ends at byte %d)", len(v))
		}
		return "hex:" + hex.EncodeToString(v[i:min(len(v), i+16)])
	}
	return Difference{Path: fmt.Sprintf("byte %d", i), Old: at(a), New: at(b)}, true, nil
}
