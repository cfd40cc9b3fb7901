package canon

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestSumEqual(t *testing.T) {
	tests := []struct {
		name   string
		ignore []string
		a, b   string
		equal  bool
	}{
		{"banana projection unchanged", nil,
			`{"banana_id":"B-007","name":"Mr. Banana","ripeness_level":"Mostly Yellow"}`,
			"{\n\"banana_id\": \"B-007\",\n\"name\": \"Mr. Banana\",\n\"ripeness_level\": \"Mostly Yellow\"\n}", true},
		{"banana member order", nil,
			`{"banana_id":"B-007","ripeness_level":"Perfectly Yellow"}`,
			`{"ripeness_level":"Perfectly Yellow","banana_id":"B-007"}`, true},
		{"banana ripeness changed", nil,
			`{"banana_id":"B-007","ripeness_level":"Mostly Yellow"}`,
			`{"banana_id":"B-007","ripeness_level":"Perfectly Yellow"}`, false},
		{"whitespace", nil, `{"a":[1,2,{"b":null}]}`, " {\t\"a\" :\r\n[ 1 , 2 , { \"b\" : null } ] }\n", true},
		{"unicode escape", nil, `"\u0041"`, `"A"`, true},
		{"escaped solidus", nil, `"a\/b"`, `"a/b"`, true},
		{"escaped non-ASCII", nil, `"caf\u00e9"`, `"café"`, true},
		{"surrogate pair", nil, `"\ud83c\udf4c"`, `"🍌"`, true},
		{"escaped name", nil, `{"\u0062":1}`, `{"b":1}`, true},
		{"1 vs 1.0", nil, `1`, `1.0`, false},
		{"1 vs 1e0", nil, `1`, `1e0`, false},
		{"1.0 vs 1e0", nil, `1.0`, `1e0`, false},
		{"-0 vs 0", nil, `-0`, `0`, false},
		{"1e0 vs 1E0", nil, `1e0`, `1E0`, false},
		{"number vs string", nil, `1`, `"1"`, false},
		{"array order", nil, `[1,2]`, `[2,1]`, false},
		{"nested order", nil, `{"x":{"b":1,"a":[{"d":1,"c":2}]}}`, `{"x":{"a":[{"c":2,"d":1}],"b":1}}`, true},
		{"empty object vs array", nil, `{}`, `[]`, false},
		{"empty string vs null", nil, `""`, `null`, false},
		{"array vs nested array", nil, `[[]]`, `[[],[]]`, false},
		{"object split", nil, `[{"a":1},{"b":2}]`, `[{"a":1,"b":2}]`, false},
		{"string boundaries", nil, `["ab","c"]`, `["a","bc"]`, false},
		{"name/value boundary", nil, `{"ab":"c"}`, `{"a":"bc"}`, false},
		{"ignore top member", []string{"/updated_at"},
			`{"id":1,"updated_at":"2026-01-01"}`, `{"updated_at":"2027-01-01","id":1}`, true},
		{"ignore absent member", []string{"/updated_at"}, `{"id":1,"updated_at":"x"}`, `{"id":1}`, true},
		{"ignore does not hide others", []string{"/updated_at"}, `{"id":1}`, `{"id":2}`, false},
		{"ignore star", []string{"/items/*/ts"},
			`{"items":[{"id":1,"ts":1},{"id":2,"ts":2}]}`, `{"items":[{"ts":9,"id":1},{"id":2,"ts":[8]}]}`, true},
		{"ignore star keeps order", []string{"/items/*/ts"},
			`{"items":[{"id":1,"ts":1},{"id":2}]}`, `{"items":[{"id":2},{"id":1}]}`, false},
		{"ignore star member", []string{"/meta/*"}, `{"meta":{"a":1,"b":2},"x":1}`, `{"meta":{},"x":1}`, true},
		{"ignore ~1", []string{"/a~1b"}, `{"a/b":1,"c":1}`, `{"a/b":2,"c":1}`, true},
		{"ignore ~1 literal", []string{"/a~1b"}, `{"a~1b":1}`, `{"a~1b":2}`, false},
		{"ignore ~0", []string{"/m~0n"}, `{"m~n":1,"c":1}`, `{"c":1,"m~n":2}`, true},
		{"ignore escaped name", []string{"/ts"}, `{"\u0074s":1,"x":1}`, `{"x":1}`, true},
		{"ignore array index", []string{"/list/0"}, `{"list":[1,2,3]}`, `{"list":[9,2,3]}`, true},
		{"ignored index is positional", []string{"/list/0"}, `{"list":[1,2,3]}`, `{"list":[2,3]}`, false},
		{"ignore array index other", []string{"/list/0"}, `{"list":[1,2,3]}`, `{"list":[1,9,3]}`, false},
		{"index token on member", []string{"/m/0"}, `{"m":{"0":1,"1":1}}`, `{"m":{"1":1}}`, true},
		{"leading-zero token is no index", []string{"/list/01"}, `[1]`, `[1]`, true},
		{"leading-zero token", []string{"/list/01"}, `{"list":[1,2]}`, `{"list":[1,3]}`, false},
		{"two pointers share a prefix", []string{"/a/b", "/a/c"},
			`{"a":{"b":1,"c":2,"d":3}}`, `{"a":{"d":3}}`, true},
		{"ignore deep inside star", []string{"/*/x/*/y"},
			`{"p":{"x":[{"y":1,"z":1}]},"q":{"x":{"k":{"y":2}}}}`, `{"p":{"x":[{"z":1}]},"q":{"x":{"k":{}}}}`, true},
		{"ignore only at its path", []string{"/a/ts"}, `{"ts":1,"a":{"ts":1}}`, `{"ts":2,"a":{"ts":1}}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := mustNew(t, WithIgnore(tt.ignore...))
			a, b := mustSum(t, h, tt.a), mustSum(t, h, tt.b)
			if (a == b) != tt.equal {
				t.Errorf("Sum(%s) == Sum(%s) is %v, want %v", tt.a, tt.b, a == b, tt.equal)
			}
			if a.Scheme() != SchemeJSON1 {
				t.Errorf("scheme %d, want %d", a.Scheme(), SchemeJSON1)
			}
		})
	}
}

func TestTombstoneAndBytes(t *testing.T) {
	j := mustNew(t)
	b := mustNew(t, WithFormat(FormatBytes))
	tomb, err := j.Sum(nil)
	if err != nil || tomb != Tombstone {
		t.Fatalf("Sum(nil) = %v, %v; want Tombstone", tomb, err)
	}
	if d, _ := b.Sum(nil); d != Tombstone {
		t.Fatalf("bytes Sum(nil) = %v, want Tombstone", d)
	}
	null := mustSum(t, j, "null")
	empty, err := b.Sum([]byte{})
	if err != nil {
		t.Fatal(err)
	}
	if tomb == null || tomb == empty || null == empty {
		t.Fatalf("tombstone %v, null %v, empty bytes %v must all differ", tomb, null, empty)
	}
	if empty.Scheme() != SchemeBytes1 {
		t.Fatalf("bytes scheme %d", empty.Scheme())
	}
	// Bytes format is exact: member order matters, invalid JSON is fine.
	if mustSum(t, b, `{"a":1,"b":2}`) == mustSum(t, b, `{"b":2,"a":1}`) {
		t.Error("bytes format ignored member order")
	}
	if _, err := b.Sum([]byte{0xff, 0}); err != nil {
		t.Errorf("bytes format rejected binary: %v", err)
	}
	if _, err := j.Sum([]byte{}); !errors.Is(err, ErrSyntax) {
		t.Errorf("json Sum(empty) = %v, want ErrSyntax", err)
	}
	for _, d := range []Digest{tomb, null, empty} {
		if p, err := ParseDigest(d[:]); err != nil || p != d {
			t.Errorf("ParseDigest(%v) = %v, %v", d, p, err)
		}
	}
}

// invalidCases are invalid documents, the sentinel and the offset of
// their error (TestInvalid; TestReferenceHostile runs them through the
// reference encoder too).
var invalidCases = []struct {
	name   string
	in     string
	err    error
	offset int
}{
	{"empty", ``, ErrSyntax, 0},
	{"only whitespace", " \n", ErrSyntax, 2},
	{"duplicate", `{"a":1,"a":2}`, ErrDuplicateMember, 7},
	{"duplicate escaped", `{"a":1,"\u0061":2}`, ErrDuplicateMember, 7},
	{"duplicate unsorted", `{"b":1,"a":1,"c":1,"a":2}`, ErrDuplicateMember, 19},
	{"duplicate nested", `[{"x":{"k":1,"k":1}}]`, ErrDuplicateMember, 13},
	{"lone high surrogate", `"\ud800"`, ErrInvalidUTF8, 1},
	{"lone low surrogate", `"\udc00"`, ErrInvalidUTF8, 1},
	{"high then BMP", `"\ud800\u0041"`, ErrInvalidUTF8, 1},
	{"high then end", `"\ud800x"`, ErrInvalidUTF8, 1},
	{"invalid UTF-8", "\"a\xffb\"", ErrInvalidUTF8, 2},
	{"truncated UTF-8", "\"\xc3\"", ErrInvalidUTF8, 1},
	{"overlong UTF-8", "\"\xc0\xaf\"", ErrInvalidUTF8, 1},
	{"UTF-8 surrogate", "\"\xed\xa0\x80\"", ErrInvalidUTF8, 1},
	{"invalid UTF-8 in name", "{\"\xff\":1}", ErrInvalidUTF8, 2},
	{"BOM", "\xef\xbb\xbf{}", ErrSyntax, 0},
	{"trailing garbage", `{} x`, ErrTrailingData, 3},
	{"two values", `1 2`, ErrTrailingData, 2},
	{"trailing NUL", "1\x00", ErrTrailingData, 1},
	{"leading zero", `01`, ErrSyntax, 0},
	{"negative leading zero", `-01`, ErrSyntax, 1},
	{"minus only", `-`, ErrSyntax, 1},
	{"trailing dot", `1.`, ErrSyntax, 2},
	{"leading dot", `.5`, ErrSyntax, 0},
	{"plus", `+1`, ErrSyntax, 0},
	{"bare exponent", `1e`, ErrSyntax, 2},
	{"exponent sign only", `1e+`, ErrSyntax, 3},
	{"NaN", `NaN`, ErrSyntax, 0},
	{"Infinity", `Infinity`, ErrSyntax, 0},
	{"negative Infinity", `-Infinity`, ErrSyntax, 1},
	{"hex number", `0x10`, ErrTrailingData, 1},
	{"single quotes", `'a'`, ErrSyntax, 0},
	{"trailing comma array", `[1,]`, ErrSyntax, 3},
	{"trailing comma object", `{"a":1,}`, ErrSyntax, 7},
	{"missing comma", `[1 2]`, ErrSyntax, 3},
	{"missing colon", `{"a" 1}`, ErrSyntax, 5},
	{"missing value", `{"a":}`, ErrSyntax, 5},
	{"unquoted name", `{a:1}`, ErrSyntax, 1},
	{"number name", `{1:1}`, ErrSyntax, 1},
	{"unterminated string", `"abc`, ErrSyntax, 0},
	{"unterminated escape", `"abc\`, ErrSyntax, 4},
	{"unterminated array", `[1,2`, ErrSyntax, 4},
	{"unterminated object", `{"a":1`, ErrSyntax, 6},
	{"unclosed nested", `[[]`, ErrSyntax, 3},
	{"extra close", `[]]`, ErrTrailingData, 2},
	{"mismatched close", `[}`, ErrSyntax, 1},
	{"x escape", `"\x41"`, ErrSyntax, 1},
	{"short u escape", `"\u12"`, ErrSyntax, 1},
	{"bad hex", `"\u12g4"`, ErrSyntax, 1},
	{"uppercase U escape", `"\U0041"`, ErrSyntax, 1},
	{"tab in string", "\"a\tb\"", ErrSyntax, 2},
	{"newline in string", "\"a\nb\"", ErrSyntax, 2},
	{"NUL in string", "\"a\x00b\"", ErrSyntax, 2},
	{"truncated true", `tru`, ErrSyntax, 0},
	{"capital True", `True`, ErrSyntax, 0},
	{"nulll", `nulll`, ErrTrailingData, 4},
	{"comment", `[1 /* c */]`, ErrSyntax, 3},
	{"form feed is no whitespace", "\f1", ErrSyntax, 0},
	{"NBSP is no whitespace", "\u00a01", ErrSyntax, 0},
	{"lone comma", `,`, ErrSyntax, 0},
	{"colon in array", `[1:2]`, ErrSyntax, 2},
}

func TestInvalid(t *testing.T) {
	h := mustNew(t)
	for _, tt := range invalidCases {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.Sum([]byte(tt.in))
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Sum(%q) = %v, want *Error", tt.in, err)
			}
			if !errors.Is(err, tt.err) || e.Offset != tt.offset {
				t.Errorf("Sum(%q) = %v (offset %d), want %v at %d", tt.in, err, e.Offset, tt.err, tt.offset)
			}
			if !strings.HasPrefix(err.Error(), "canon: invalid JSON at byte ") {
				t.Errorf("message %q", err)
			}
			if _, err2 := h.AppendCanonical(nil, []byte(tt.in)); err2 == nil || err2.Error() != err.Error() {
				t.Errorf("AppendCanonical error %v, Sum error %v", err2, err)
			}
		})
	}
}

func TestDuplicateIgnoredMember(t *testing.T) {
	h := mustNew(t, WithIgnore("/ts", "/meta"))
	for _, in := range []string{`{"ts":1,"ts":2}`, `{"meta":{"a":1,"a":2}}`, `{"meta":["\ud800"]}`, `{"ts":01}`} {
		if _, err := h.Sum([]byte(in)); err == nil {
			t.Errorf("Sum(%s) with the member ignored: no error", in)
		}
	}
}

func TestLimits(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	h := mustNew(t, WithMaxDepth(3), WithMaxSize(10))
	if _, err := h.Sum([]byte(deep(3))); err != nil {
		t.Errorf("depth 3: %v", err)
	}
	var e *Error
	if _, err := h.Sum([]byte(deep(4))); !errors.As(err, &e) || e.Err != ErrTooDeep || e.Offset != 3 {
		t.Errorf("depth 4: %v", err)
	}
	if _, err := h.Sum([]byte(`[{"a":{}}]`)); err != nil {
		t.Errorf("depth 3 with objects: %v", err)
	}
	if _, err := h.Sum([]byte(`[{"a":{"b":1}}]`)); !errors.Is(err, ErrTooDeep) && !errors.Is(err, ErrTooLarge) {
		t.Errorf("too deep or large: %v", err)
	}
	if _, err := h.Sum([]byte(`"0123456789"`)); !errors.As(err, &e) || e.Err != ErrTooLarge || e.Offset != 10 {
		t.Errorf("11 bytes over 10: %v", err)
	}
	if _, err := h.Sum([]byte(`"01234567"`)); err != nil {
		t.Errorf("10 bytes: %v", err)
	}
	def := mustNew(t)
	if _, err := def.Sum([]byte(deep(DefaultMaxDepth))); err != nil {
		t.Errorf("default depth: %v", err)
	}
	if _, err := def.Sum([]byte(deep(DefaultMaxDepth + 1))); !errors.Is(err, ErrTooDeep) {
		t.Errorf("default depth + 1: %v", err)
	}
}

func TestNewErrors(t *testing.T) {
	for _, opts := range [][]Option{
		{WithIgnore("")},
		{WithIgnore("a")},
		{WithIgnore("/ok", "/a~2")},
		{WithMaxDepth(0)},
		{WithMaxSize(-1)},
		{WithFormat(Format(9))},
		{WithIgnore(make([]string, MaxIgnore+1)...)},
	} {
		if _, err := New(opts...); err == nil {
			t.Errorf("New with %d options: no error", len(opts))
		}
	}
	_, err := New(WithIgnore("/a~2"))
	const want = `canon: ignore pointer "/a~2": invalid escape "~2" at byte 2`
	if err == nil || err.Error() != want || !errors.Is(err, ErrInvalidPointer) {
		t.Errorf("New(/a~2) = %v, want %s", err, want)
	}
}

func TestValidatePointer(t *testing.T) {
	for p, ok := range map[string]bool{
		"": false, "/": true, "/a": true, "a": false, "/a/b": true, "/*": true, "/items/*/ts": true,
		"/a~0b": true, "/a~1b": true, "/a~": false, "/a~2": false, "/~x": false, "/~~0": false,
		"/0": true, "/01": true, "/\xff": false, "//": true, "/ünï": true,
	} {
		err := ValidatePointer(p)
		if (err == nil) != ok {
			t.Errorf("ValidatePointer(%q) = %v, want ok=%v", p, err, ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidPointer) {
			t.Errorf("ValidatePointer(%q) = %v, not ErrInvalidPointer", p, err)
		}
	}
}

func TestParseFormat(t *testing.T) {
	for s, want := range map[string]Format{"json": FormatJSON, "bytes": FormatBytes} {
		if f, err := ParseFormat(s); err != nil || f != want || f.String() != s {
			t.Errorf("ParseFormat(%q) = %v, %v", s, f, err)
		}
	}
	if _, err := ParseFormat("JSON"); err == nil {
		t.Error("ParseFormat(JSON): no error")
	}
}

func TestAppendCanonical(t *testing.T) {
	h := mustNew(t, WithIgnore("/ts"))
	got, err := h.AppendCanonical([]byte("> "), []byte(`{"z":[1,"a\"\u0001",{}],"ts":5,"\u00e9":null,"a":{"y":true,"x":false},"e":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `> {
  "a": {
    "x": false,
    "y": true
  },
  "e": [],
  "z": [
    1,
    "a\"\u0001",
    {}
  ],
  "é": null
}
`
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// The canonical form is JSON that hashes the same (without ignores).
	plain := mustNew(t)
	if mustSum(t, plain, string(got[2:])) != mustSum(t, h, `{"z":[1,"a\"\u0001",{}],"ts":5,"é":null,"a":{"y":true,"x":false},"e":[]}`) {
		t.Error("canonical form hashes differently")
	}
	if out, _ := h.AppendCanonical(nil, nil); !bytes.Equal(out, []byte("(tombstone)")) {
		t.Errorf("tombstone: %q", out)
	}
}

func TestSumAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under -race")
	}
	h := mustNew(t, WithIgnore("/items/*/ts"))
	in := projection(2048)
	h.Sum(in)
	if n := testing.AllocsPerRun(100, func() { h.Sum(in) }); n != 0 {
		t.Errorf("Sum allocates %v times per run", n)
	}
}

// TestShapeCache hashes objects of one shape in a row, so that later ones
// take the cached member order, and checks them against fresh hashers.
func TestShapeCache(t *testing.T) {
	docs := []struct{ a, b string }{
		{`{"z":1,"a":2,"m":3}`, `{"a":2,"m":3,"z":1}`},
		{`{"z":1,"a":2,"m":3}`, `{"m":3,"z":1,"a":2}`},
		{`{"zebra_long_1":1,"a":2,"m":3}`, `{"a":2,"m":3,"zebra_long_1":1}`},
		{`{"zebra_long_2":1,"a":2,"m":3}`, `{"m":3,"a":2,"zebra_long_2":1}`},
		{`{"samepref_b":1,"samepref_a":2}`, `{"samepref_a":2,"samepref_b":1}`},
		{`{"samepref_a":1,"samepref_b":2}`, `{"samepref_b":2,"samepref_a":1}`},
		{`{"ts":1,"a":2}`, `{"a":2}`},
		{`{"ts":1,"a":2}`, `{"ts":3,"a":2}`},
		{`[{"y":1,"x":2},{"y":3,"x":4},{"y":5,"x":6}]`, `[{"x":2,"y":1},{"x":4,"y":3},{"x":6,"y":5}]`},
	}
	h := mustNew(t, WithIgnore("/ts"))
	for _, d := range docs {
		fresh := mustNew(t, WithIgnore("/ts"))
		if got, want := mustSum(t, h, d.a), mustSum(t, fresh, d.b); got != want {
			t.Errorf("%s (after others) != %s (fresh)", d.a, d.b)
		}
	}
	if mustSum(t, h, `{"zebra_long_1":1,"a":2,"m":3}`) == mustSum(t, h, `{"zebra_long_2":1,"a":2,"m":3}`) {
		t.Error("names differing after 8 bytes hash equal")
	}
	if _, err := h.Sum([]byte(`{"samepref_a":1,"samepref_a":2}`)); !errors.Is(err, ErrDuplicateMember) {
		t.Errorf("duplicate after cached shape: %v", err)
	}
}

// TestConcurrent shares one Hasher between goroutines (run with -race):
// pooled scratch state must never leak between calls.
func TestConcurrent(t *testing.T) {
	h := mustNew(t, WithIgnore("/items/*/ts"))
	docs := [][]byte{projection(200), projection(2048), []byte(`{"b":1,"a":[{"y":1,"x":2}]}`), []byte(`[1,"\u00e9",null]`)}
	want := make([]Digest, len(docs))
	for i, d := range docs {
		want[i] = mustSum(t, mustNew(t, WithIgnore("/items/*/ts")), string(d))
	}
	done := make(chan error)
	for g := range 4 {
		go func() {
			for i := range 200 {
				k := (g + i) % len(docs)
				if d, err := h.Sum(docs[k]); err != nil || d != want[k] {
					done <- fmt.Errorf("goroutine %d, doc %d: %v, %v", g, k, d, err)
					return
				}
				if _, err := h.Sum([]byte(`{"a":1,"a":2}`)); err == nil {
					done <- errors.New("duplicate accepted")
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
