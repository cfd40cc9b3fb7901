package explain

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/canon"
)

// firstDifference names the first path at which two values differ, and
// the two sides there, in the words of testdata/TestFirstDifference.golden.
func TestFirstDifference(t *testing.T) {
	h, err := canon.New(canon.WithIgnore("/ts"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := canon.New(canon.WithFormat(canon.FormatBytes))
	var b strings.Builder
	for _, tc := range []struct {
		name     string
		h        *canon.Hasher
		old, new string
		tomb     int // 1: old is a tombstone, 2: new is
	}{
		{"equal, reordered, ignored", h, `{"a":1,"b":[1,2],"ts":1}`, `{"ts":2,"b":[1,2],"a":1}`, 0},
		{"scalar", h, `{"a":1,"b":"x"}`, `{"a":1,"b":"y"}`, 0},
		{"number text", h, `{"n":1}`, `{"n":1.0}`, 0},
		{"first in name order", h, `{"z":1,"a":1}`, `{"z":2,"a":2}`, 0},
		{"member added", h, `{"a":1}`, `{"a":1,"b":null}`, 0},
		{"member removed", h, `{"a":1,"b":{"c":true}}`, `{"a":1}`, 0},
		{"array longer", h, `[1,2]`, `[1,2,3]`, 0},
		{"nested", h, `{"items":[{"id":1,"q":[1]}]}`, `{"items":[{"id":1,"q":[2]}]}`, 0},
		{"type change", h, `{"a":[1]}`, `{"a":{"0":1}}`, 0},
		{"escaped names", h, `{"a/b":1,"c~d":1}`, `{"a/b":2,"c~d":1}`, 0},
		{"escapes are decoded", h, `{"s":"\u0041"}`, `{"s":"A"}`, 0},
		{"whole value", h, `1`, `"1"`, 0},
		{"tombstone", h, ``, `{"a":1}`, 1},
		{"bytes", raw, "abcdef", "abcxef", 0},
		{"bytes shorter", raw, "abc", "ab", 0},
		// Member names and values come from producers: what a terminal
		// could act on is escaped, and a long name is shortened.
		{"name with a terminal escape", h, `{"\u001b[2J":1}`, `{"\u001b[2J":2}`, 0},
		{"name with C1 and bidi controls", h, `{"a\u009b1m\u202e":1}`, `{"a\u009b1m\u202e":2}`, 0},
		{"name with a backslash", h, `{"a\\u0041":1}`, `{"a\\u0041":2}`, 0},
		{"name above the BMP, not printable", h, `{"\udb40\udc01":1}`, `{"\udb40\udc01":2}`, 0},
		{"value with C1 and bidi controls", h, `{"a":"\u009b\u202e"}`, `{"a":"x"}`, 0},
		{"raw value with a terminal escape", h, ``, "\x1b]0;t\x07\xff", 1},
		{"long name", h, `{"` + strings.Repeat("n", 300) + `":1}`, `{"` + strings.Repeat("n", 300) + `":2}`, 0},
	} {
		var o, n []byte = []byte(tc.old), []byte(tc.new)
		switch tc.tomb {
		case 1:
			o = nil
		case 2:
			n = nil
		}
		d, ok, err := firstDifference(tc.h, o, n)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		got := "(none)"
		if ok {
			got = d.String()
		}
		fmt.Fprintf(&b, "%s: %s\n", tc.name, got)
	}
	CheckGolden(t, t.Name(), b.String())
}

// A difference's path stays bounded however deep and long the names on
// the way are.
func TestFirstDifferencePathBounded(t *testing.T) {
	h, err := canon.New()
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("m", 1000)
	var o, n strings.Builder
	for range 100 {
		o.WriteString(`{"` + name + `":`)
		n.WriteString(`{"` + name + `":`)
	}
	o.WriteString("1" + strings.Repeat("}", 100))
	n.WriteString("2" + strings.Repeat("}", 100))
	d, ok, err := firstDifference(h, []byte(o.String()), []byte(n.String()))
	if err != nil || !ok {
		t.Fatalf("difference: %v, %v", ok, err)
	}
	if len(d.String()) > 600 {
		t.Errorf("path of %d bytes: %.200q", len(d.Path), d.Path)
	}
	CheckGolden(t, t.Name(), d.String()+"\n")
}

// FuzzFirstDifference: a difference is found iff the digests differ, for
// any two valid values.
func FuzzFirstDifference(f *testing.F) {
	for _, s := range [][2]string{
		{`{"a":1}`, `{"a":1}`}, {`{"a":1,"b":2}`, `{"b":2,"a":1}`}, {`[1,[2]]`, `[1,[3]]`},
		{`{"a":"\u00e9"}`, `{"a":"é"}`}, {`{"ts":1}`, `{"ts":2}`}, {`0`, `-0`}, {`{"":{}}`, `{"":[]}`},
	} {
		f.Add(s[0], s[1])
	}
	h, err := canon.New(canon.WithIgnore("/ts", "/*/ts"))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		da, err1 := h.Sum([]byte(a))
		db, err2 := h.Sum([]byte(b))
		if err1 != nil || err2 != nil {
			return
		}
		d, found, err := firstDifference(h, []byte(a), []byte(b))
		if err != nil {
			t.Fatalf("valid values %q, %q: %v", a, b, err)
		}
		if found != (da != db) {
			t.Fatalf("%q vs %q: difference %v (%v), digests equal %v", a, b, found, d, da == db)
		}
	})
}

// An identity is shown as text only when every rune of it is printable:
// one a terminal could act on (a C1 control, a bidi override) or a tab
// that breaks the columns is shown in hex.
func TestShowEntity(t *testing.T) {
	var b strings.Builder
	for _, in := range []string{"B-007", "café au lait", "a\x1b[2J", "a\u009b1m", "a\u202eb", "a\tb", "a\xff"} {
		fmt.Fprintf(&b, "%q: %s\n", in, ShowEntity([]byte(in)))
	}
	CheckGolden(t, t.Name(), b.String())
}
