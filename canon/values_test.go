package canon

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestSumValues(t *testing.T) {
	tests := []struct {
		name   string
		ignore []string
		ptrs   []string
		in     string
		want   []string // the values' bytes; nil with err
		err    error    // ErrNoValue or an *Error sentinel
		kinds  []Kind   // checked if set
	}{
		{"string decoded", nil, []string{"/banana_id"}, `{"banana_id":"B-\u0030\u00307","x":1}`, []string{"B-007"}, nil, nil},
		{"string escapes", nil, []string{"/id"}, `{"id":"a\"\\\/\b\f\n\r\t\u00e9\ud83c\udf4c"}`, []string{"a\"\\/\b\f\n\r\té🍌"}, nil, nil},
		{"empty string", nil, []string{"/id"}, `{"id":""}`, []string{""}, nil, nil},
		{"long string", nil, []string{"/id"}, `{"id":"` + strings.Repeat("é", 200) + `"}`, []string{strings.Repeat("é", 200)}, nil, nil},
		{"integer is its text", nil, []string{"/id"}, `{"id":7}`, []string{"7"}, nil, []Kind{KindNumber}},
		{"7 and \"7\" differ by kind", nil, []string{"/a", "/b"}, `{"a":7,"b":"7"}`, []string{"7", "7"}, nil, []Kind{KindNumber, KindString}},
		{"number as written", nil, []string{"/a", "/b", "/c"}, `{"a":1.0,"b":-1e+05,"c":0}`, []string{"1.0", "-1e+05", "0"}, nil, nil},
		{"literals", nil, []string{"/a", "/b", "/c"}, `{"a":true,"b":false,"c":null}`, []string{"true", "false", "null"}, nil, []Kind{KindBool, KindBool, KindNull}},
		{"object compacted", nil, []string{"/id"}, "{\"id\" : { \"b\" : [ 1 , \"x y\" ] ,\n\t\"a\":{} } }", []string{`{"b":[1,"x y"],"a":{}}`}, nil, []Kind{KindObject}},
		{"object keeps escapes", nil, []string{"/id"}, `{"id":{"k":"\u0041\"]}"}}`, []string{`{"k":"\u0041\"]}"}`}, nil, nil},
		{"array compacted", nil, []string{"/id"}, `{"id":[ [] , {} , "a,b" ]}`, []string{`[[],{},"a,b"]`}, nil, []Kind{KindArray}},
		{"whitespace around", nil, []string{"/id"}, " { \"id\" :\t\"x\" \n} ", []string{"x"}, nil, nil},
		{"number before whitespace", nil, []string{"/a/0"}, `{"a":[12 , 3]}`, []string{"12"}, nil, nil},
		{"nested", nil, []string{"/meta/id"}, `{"meta":{"trace":"t","id":"m-1"},"id":"e-1"}`, []string{"m-1"}, nil, nil},
		{"array index", nil, []string{"/items/1/sku"}, `{"items":[{"sku":"a"},{"sku":"b"}]}`, []string{"b"}, nil, nil},
		{"top-level array", nil, []string{"/0/id"}, `[{"id":1},{"id":2}]`, []string{"1"}, nil, nil},
		{"numeric token names a member", nil, []string{"/m/0"}, `{"m":{"0":"zero"}}`, []string{"zero"}, nil, nil},
		{"escaped tokens", nil, []string{"/a~1b/m~0n"}, `{"a/b":{"m~n":"x"}}`, []string{"x"}, nil, nil},
		{"empty name", nil, []string{"/"}, `{"":"e"}`, []string{"e"}, nil, nil},
		{"non-ASCII name", nil, []string{"/größe"}, `{"gr\u00f6\u00dfe":"L"}`, []string{"L"}, nil, nil},
		{"several pointers in order", nil, []string{"/version", "/id", "/meta/id"},
			`{"meta":{"id":"m"},"id":"e","version":3}`, []string{"3", "e", "m"}, nil, []Kind{KindNumber, KindString, KindString}},
		{"same pointer twice", nil, []string{"/id", "/id"}, `{"id":"e"}`, []string{"e", "e"}, nil, nil},
		{"value in an ignored member", []string{"/meta"}, []string{"/meta/id"}, `{"meta":{"id":"m"},"x":1}`, []string{"m"}, nil, nil},
		{"ignored value", []string{"/id"}, []string{"/id"}, `{"id":"e","x":1}`, []string{"e"}, nil, nil},
		{"value under an ignore wildcard", []string{"/items/*"}, []string{"/items/0/id"}, `{"items":[{"id":"i"}]}`, []string{"i"}, nil, nil},
		{"value beside ignored", []string{"/ts"}, []string{"/id"}, `{"ts":1,"id":"e"}`, []string{"e"}, nil, nil},

		{"missing member", nil, []string{"/id"}, `{"banana_id":"x"}`, nil, ErrNoValue, nil},
		{"missing second", nil, []string{"/id", "/version"}, `{"id":"x"}`, nil, ErrNoValue, nil},
		{"index out of range", nil, []string{"/items/2"}, `{"items":[1,2]}`, nil, ErrNoValue, nil},
		{"dash is no element", nil, []string{"/items/-"}, `{"items":[1]}`, nil, ErrNoValue, nil},
		{"leading zero is no index", nil, []string{"/items/01"}, `{"items":[1,2]}`, nil, ErrNoValue, nil},
		{"through a scalar", nil, []string{"/id/x"}, `{"id":"x"}`, nil, ErrNoValue, nil},
		{"name token on an array", nil, []string{"/items/sku"}, `{"items":[{"sku":1}]}`, nil, ErrNoValue, nil},
		{"not an object", nil, []string{"/id"}, `"id"`, nil, ErrNoValue, nil},
		{"tombstone", nil, []string{"/id"}, "\x00nil", nil, ErrNoValue, nil},
		{"invalid JSON", nil, []string{"/id"}, `{"id":"x",}`, nil, ErrSyntax, nil},
		{"invalid after the value", nil, []string{"/id"}, `{"id":"x"} x`, nil, ErrTrailingData, nil},
		{"duplicate entity", nil, []string{"/id"}, `{"id":"a","id":"b"}`, nil, ErrDuplicateMember, nil},
		{"lone surrogate", nil, []string{"/id"}, `{"id":"\ud800"}`, nil, ErrInvalidUTF8, nil},
		{"invalid UTF-8", nil, []string{"/id"}, "{\"id\":\"a\xffb\"}", nil, ErrInvalidUTF8, nil},
		{"invalid elsewhere", nil, []string{"/id"}, `{"id":"e","x":01}`, nil, ErrSyntax, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := mustNew(t, WithIgnore(tt.ignore...), WithValues(tt.ptrs...))
			in := []byte(tt.in)
			if tt.in == "\x00nil" {
				in = nil
			}
			prefix := []byte("keep")
			vals := make([]Value, len(tt.ptrs))
			d, out, err := h.SumValues(in, prefix, vals)
			if !bytes.Equal(out[:len(prefix)], prefix) {
				t.Errorf("dst prefix changed: %q", out)
			}
			if tt.err != nil {
				if !errors.Is(err, tt.err) || len(out) != len(prefix) || !d.IsZero() {
					t.Fatalf("SumValues(%q) = %v, %q, %v; want %v", tt.in, d, out, err, tt.err)
				}
				var ve *ValueError
				if errors.As(err, &ve) && !strings.Contains(err.Error(), fmt.Sprintf("%q", ve.Pointer)) {
					t.Errorf("error %q does not name the pointer", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("SumValues(%q): %v", tt.in, err)
			}
			for i, v := range vals {
				if string(v.Bytes) != tt.want[i] {
					t.Errorf("value %d (%s) = %q, want %q", i, tt.ptrs[i], v.Bytes, tt.want[i])
				}
				if tt.kinds != nil && v.Kind != tt.kinds[i] {
					t.Errorf("value %d (%s) is a %v, want a %v", i, tt.ptrs[i], v.Kind, tt.kinds[i])
				}
				if cap(v.Bytes) != len(v.Bytes) {
					t.Errorf("value %d has spare capacity %d", i, cap(v.Bytes)-len(v.Bytes))
				}
			}
			// The values do not change the digest.
			if want := mustSum(t, mustNew(t, WithIgnore(tt.ignore...)), tt.in); d != want {
				t.Errorf("digest %v, Sum without values %v", d, want)
			}
			if got, err := refValues(h, in); err != nil || fmt.Sprintf("%q", got) != fmt.Sprintf("%q", vals) {
				t.Errorf("reference values %q, %v", got, err)
			}
		})
	}
}

// TestSumValuesBytes: on a format: bytes route the digest is the raw
// bytes', the entity comes from canon's own parser, and a value that is
// not JSON has no entity (an error: dead letter), never a mangled one.
func TestSumValuesBytes(t *testing.T) {
	h := mustNew(t, WithFormat(FormatBytes), WithValues("/id"))
	raw := mustNew(t, WithFormat(FormatBytes))
	in := `{"b":1, "id":"B-007"}`
	var vals [1]Value
	d, _, err := h.SumValues([]byte(in), nil, vals[:])
	if err != nil || string(vals[0].Bytes) != "B-007" || d != mustSum(t, raw, in) || d.Scheme() != SchemeBytes1 {
		t.Fatalf("SumValues = %v, %q, %v; want the raw digest and B-007", d, vals[0].Bytes, err)
	}
	for _, bad := range []string{`not json`, `{"id":"x"`, `{"id":"x","id":"y"}`, "\xff"} {
		if _, _, err := h.SumValues([]byte(bad), nil, vals[:]); !errors.As(err, new(*Error)) {
			t.Errorf("SumValues(%q) = %v, want an *Error", bad, err)
		}
	}
	if _, _, err := h.SumValues([]byte(`{"x":1}`), nil, vals[:]); !errors.Is(err, ErrNoValue) {
		t.Errorf("missing entity: %v", err)
	}
	if _, _, err := h.SumValues(nil, nil, vals[:]); !errors.Is(err, ErrNoValue) || !strings.Contains(err.Error(), "tombstone") {
		t.Errorf("tombstone: %v", err)
	}
}

// TestSumValuesNeverMerges: entities that differ only in invalid UTF-8 or
// in a lone surrogate are errors on a bytes route (encoding/json would
// turn each into U+FFFD: one identity for different records, and one of
// them wrongly dropped as a duplicate). Entities that differ in valid
// text stay different (as bytes and kind).
func TestSumValuesNeverMerges(t *testing.T) {
	h := mustNew(t, WithFormat(FormatBytes), WithValues("/id"))
	var vals [1]Value
	for _, in := range []string{
		`{"id":"\ud800"}`, `{"id":"\udbff"}`, `{"id":"\udc00x"}`, `{"id":"\ud800\u0041"}`,
		"{\"id\":\"B-\xff\"}", "{\"id\":\"B-\xfe\"}", "{\"id\":\"B-\xed\xa0\x80\"}", "{\"id\":\"B-\xc0\xaf\"}",
		"{\"id\":\"B-\xef\xbf\xbd\",\"x\":\"\xff\"}",
	} {
		if _, _, err := h.SumValues([]byte(in), nil, vals[:]); !errors.Is(err, ErrInvalidUTF8) {
			t.Errorf("SumValues(%q) = %q, %v; want ErrInvalidUTF8", in, vals[0].Bytes, err)
		}
	}
	seen := map[string]string{}
	for _, in := range []string{
		`{"id":"B-\ufffd"}`, `{"id":"B-\ufffe"}`, `{"id":"B-\ud83c\udf4c"}`, `{"id":"B-\ud83c\udf4d"}`,
		`{"id":"B-"}`, `{"id":"B-\u0000"}`, `{"id":"B-\u0000\u0000"}`, `{"id":["B-"]}`, `{"id":"[\"B-\"]"}`,
	} {
		if _, _, err := h.SumValues([]byte(in), nil, vals[:]); err != nil {
			t.Fatalf("SumValues(%s): %v", in, err)
		}
		key := vals[0].Kind.String() + ":" + string(vals[0].Bytes)
		if prev, ok := seen[key]; ok {
			t.Errorf("%s and %s share the entity %s", prev, in, key)
		}
		seen[key] = in
	}
}

func TestSumValuesAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under -race")
	}
	h := mustNew(t, WithIgnore("/items/*/ts"), WithValues("/banana_id", "/version"))
	in := projection(2048)
	dst := make([]byte, 0, 64)
	var vals [2]Value
	if _, _, err := h.SumValues(in, dst, vals[:]); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { h.SumValues(in, dst, vals[:]) }); n != 0 {
		t.Errorf("SumValues allocates %v times per run", n)
	}
	if string(vals[0].Bytes) != "B-007" || string(vals[1].Bytes) != "42" || vals[1].Kind != KindNumber {
		t.Errorf("values %q %q", vals[0].Bytes, vals[1].Bytes)
	}
}

func TestWithValuesErrors(t *testing.T) {
	for _, tt := range []struct {
		ptrs []string
		want string
	}{
		{[]string{""}, `canon: value pointer "": empty pointer: the whole value is no member`},
		{[]string{"id"}, `canon: value pointer "id": must start with "/"`},
		{[]string{"/items/*/id"}, `canon: value pointer "/items/*/id": "*" cannot name one value`},
		{[]string{"/a~2"}, `canon: value pointer "/a~2": invalid escape "~2" at byte 2`},
		{make([]string, MaxValues+1), "canon: 9 value pointers: at most 8"},
	} {
		_, err := New(WithValues(tt.ptrs...))
		if err == nil || err.Error() != tt.want {
			t.Errorf("New(WithValues(%q)) = %v, want %s", tt.ptrs, err, tt.want)
		}
	}
	var pe *PointerError
	if _, err := New(WithValues("/a/*")); !errors.As(err, &pe) || pe.Offset != 3 || !errors.Is(err, ErrInvalidPointer) {
		t.Errorf("New(WithValues(/a/*)) = %#v", err)
	}
	ptrs := func(n int) []string {
		p := make([]string, n)
		for i := range p {
			p[i] = fmt.Sprintf("/p%d", i)
		}
		return p
	}
	if _, err := New(WithIgnore(ptrs(MaxIgnore)...), WithValues(ptrs(MaxValues)...)); err != nil {
		t.Errorf("New with %d ignore and %d value pointers: %v", MaxIgnore, MaxValues, err)
	}
	if _, err := New(WithIgnore(ptrs(MaxIgnore + 1)...)); err == nil {
		t.Errorf("New with %d ignore pointers: no error", MaxIgnore+1)
	}
	h := mustNew(t, WithValues("/a", "/b"))
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "1 vals for 2 value pointers") {
			t.Errorf("SumValues with too few vals: %v", r)
		}
	}()
	h.SumValues([]byte(`{}`), nil, make([]Value, 1))
}

// valueHashers are the option sets of FuzzValues.
var valueHashers = []struct {
	name string
	opts []Option
}{
	{"id", []Option{WithValues("/id")}},
	{"nested", []Option{WithValues("/meta/id", "/version", "/0")}},
	{"ignored", []Option{WithIgnore("/meta", "/*/ts"), WithValues("/meta/id", "/items/1/ts")}},
	{"limits", []Option{WithMaxDepth(4), WithMaxSize(128), WithValues("/a/b", "/a")}},
	{"bytes", []Option{WithFormat(FormatBytes), WithValues("/id")}},
}

// FuzzValues compares SumValues with the reference (refValues: the plain
// parser's value spans, strings decoded by it, other values compacted by
// encoding/json), checks that the digest is Sum's without the values, and
// feeds the documents of a sequence through one Hasher.
func FuzzValues(f *testing.F) {
	f.Add(uint8(0), []byte(`{"id":"B-007","x":[1,2]}`+seqSep+`{"x":1,"id":7}`+seqSep+`{"id":{"a" : [ 1 ]}}`))
	f.Add(uint8(1), []byte(`{"meta":{"id":"m"},"version":3,"0":null}`+seqSep+`[{"id":1}]`))
	f.Add(uint8(2), []byte(`{"meta":{"id":"\u00e9"},"items":[{"ts":1},{"ts":"\ud83c\udf4c"}]}`))
	f.Add(uint8(4), []byte(`{"id":"\ud800"}`+seqSep+`{"id":"`+"\xff"+`"}`))
	f.Fuzz(func(t *testing.T, opt uint8, in []byte) {
		hs := valueHashers[int(opt)%len(valueHashers)]
		h, err := New(hs.opts...)
		if err != nil {
			t.Fatal(err)
		}
		plain, err := New(append(hs.opts[:len(hs.opts):len(hs.opts)], func(o *options) { o.values = nil })...)
		if err != nil {
			t.Fatal(err)
		}
		vals := make([]Value, len(h.vptrs))
		docs := bytes.Split(in, []byte(seqSep))
		if len(docs) > 16 {
			docs = docs[:16]
		}
		for _, doc := range docs {
			d, out, err := h.SumValues(doc, []byte("x"), vals)
			want, werr := refValues(h, doc)
			if (err == nil) != (werr == nil) {
				t.Fatalf("%s: SumValues(%q) = %v, reference %v", hs.name, doc, err, werr)
			}
			if err != nil {
				var e, we *Error
				if errors.As(err, &e) != errors.As(werr, &we) || e != nil && e.Err != we.Err ||
					errors.Is(err, ErrNoValue) != errors.Is(werr, ErrNoValue) || string(out) != "x" {
					t.Fatalf("%s: SumValues(%q) = %v, reference %v", hs.name, doc, err, werr)
				}
				continue
			}
			for i := range vals {
				if !bytes.Equal(vals[i].Bytes, want[i].Bytes) || vals[i].Kind != want[i].Kind {
					t.Fatalf("%s: SumValues(%q): value %d %v %q, reference %v %q", hs.name, doc, i, vals[i].Kind, vals[i].Bytes, want[i].Kind, want[i].Bytes)
				}
			}
			if pd, err := plain.Sum(doc); err != nil || pd != d {
				t.Fatalf("%s: SumValues(%q) digest %v, Sum %v, %v", hs.name, doc, d, pd, err)
			}
		}
	})
}
