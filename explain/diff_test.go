package explain

import (
	"strings"
	"testing"

	"github.com/dam-dedup/dam/canon"
)

func TestFirstDifference(t *testing.T) {
	h, err := canon.New(canon.WithIgnore("/ts"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := canon.New(canon.WithFormat(canon.FormatBytes))
	for _, tc := range []struct {
		name     string
		h        *canon.Hasher
		old, new string
		tomb     int // 1: old is a tombstone, 2: new is
		want     string
	}{
		{"equal, reordered, ignored", h, `{"a":1,"b":[1,2],"ts":1}`, `{"ts":2,"b":[1,2],"a":1}`, 0, ""},
		{"scalar", h, `{"a":1,"b":"x"}`, `{"a":1,"b":"y"}`, 0, `/b: "x" -> "y"`},
		{"number text", h, `{"n":1}`, `{"n":1.0}`, 0, `/n: 1 -> 1.0`},
		{"first in name order", h, `{"z":1,"a":1}`, `{"z":2,"a":2}`, 0, `/a: 1 -> 2`},
		{"member added", h, `{"a":1}`, `{"a":1,"b":null}`, 0, `/b: (absent) -> null`},
		{"member removed", h, `{"a":1,"b":{"c":true}}`, `{"a":1}`, 0, `/b: {"c":true} -> (absent)`},
		{"array longer", h, `[1,2]`, `[1,2,3]`, 0, `/2: (absent) -> 3`},
		{"nested", h, `{"items":[{"id":1,"q":[1]}]}`, `{"items":[{"id":1,"q":[2]}]}`, 0, `/items/0/q/0: 1 -> 2`},
		{"type change", h, `{"a":[1]}`, `{"a":{"0":1}}`, 0, `/a: [1] -> {"0":1}`},
		{"escaped names", h, `{"a/b":1,"c~d":1}`, `{"a/b":2,"c~d":1}`, 0, `/a~1b: 1 -> 2`},
		{"escapes are decoded", h, `{"s":"\u0041"}`, `{"s":"A"}`, 0, ""},
		{"whole value", h, `1`, `"1"`, 0, `(the whole value): 1 -> "1"`},
		{"tombstone", h, ``, `{"a":1}`, 1, `(the whole value): (tombstone) -> {"a":1}`},
		{"bytes", raw, "abcdef", "abcxef", 0, `byte 3: hex:646566 -> hex:786566`},
		{"bytes shorter", raw, "abc", "ab", 0, `byte 2: hex:63 -> (ends at byte 2)`},
		// Member names and values come from producers: what a terminal
		// could act on is escaped, and a long name is shortened.
		{"name with a terminal escape", h, `{"\u001b[2J":1}`, `{"\u001b[2J":2}`, 0, `/\u001b[2J: 1 -> 2`},
		{"name with C1 and bidi controls", h, `{"a\u009b1m\u202e":1}`, `{"a\u009b1m\u202e":2}`, 0, `/a\u009b1m\u202e: 1 -> 2`},
		{"name with a backslash", h, `{"a\\u0041":1}`, `{"a\\u0041":2}`, 0, `/a\\u0041: 1 -> 2`},
		{"name above the BMP, not printable", h, `{"\udb40\udc01":1}`, `{"\udb40\udc01":2}`, 0, `/\udb40\udc01: 1 -> 2`},
		{"value with C1 and bidi controls", h, `{"a":"\u009b\u202e"}`, `{"a":"x"}`, 0, `/a: "\u009b\u202e" -> "x"`},
		{"raw value with a terminal escape", h, ``, "\x1b]0;t\x07\xff", 1, `(the whole value): (tombstone) -> \u001b]0;t\u0007\xff`},
		{"long name", h, `{"` + strings.Repeat("n", 300) + `":1}`, `{"` + strings.Repeat("n", 300) + `":2}`, 0,
			"/" + strings.Repeat("n", 120) + "... (300 bytes): 1 -> 2"},
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
		got := ""
		if ok {
			got = d.String()
		}
		if got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
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
	if len(d.String()) > 600 || !strings.HasPrefix(d.Path, "/"+strings.Repeat("m", 120)+"... (1000 bytes)/") {
		t.Errorf("path of %d bytes: %.200q", len(d.Path), d.Path)
	}
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
	for in, want := range map[string]string{
		"B-007":        "B-007",
		"café au lait": "café au lait",
		"a\x1b[2J":     "hex:611b5b324a",
		"a\u009b1m":    "hex:61c29b316d",
		"a\u202eb":     "hex:61e280ae62",
		"a\tb":         "hex:610962",
		"a\xff":        "hex:61ff",
	} {
		if got := ShowEntity([]byte(in)); got != want {
			t.Errorf("ShowEntity(%q) = %q, want %q", in, got, want)
		}
	}
}
