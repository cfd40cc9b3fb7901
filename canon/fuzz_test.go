package canon

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzSum: no input panics; errors are *Error inside the input; limits hold;
// the canonical form hashes like the input.
func FuzzSum(f *testing.F) {
	for _, s := range []string{`{"a":[1,"x",{"b":null}]}`, `"\ud800"`, `[[[[`, `{"ts":1,"ts":2}`, `1e5`, "\"\xff\""} {
		f.Add([]byte(s))
	}
	const maxDepth, maxSize = 8, 4096
	h := mustNew(f, WithMaxDepth(maxDepth), WithMaxSize(maxSize))
	ign := mustNew(f, WithMaxDepth(maxDepth), WithMaxSize(maxSize), WithIgnore("/ts", "/*/0", "/a/*/b"))
	plain := mustNew(f, WithMaxDepth(maxDepth+1), WithMaxSize(1<<20))
	f.Fuzz(func(t *testing.T, in []byte) {
		d, err := h.Sum(in)
		_, ierr := ign.Sum(in)
		if (err == nil) != (ierr == nil) {
			t.Fatalf("validity depends on ignore pointers: %v vs %v", err, ierr)
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Offset < 0 || e.Offset > len(in) {
				t.Fatalf("Sum(%q) = %#v", in, err)
			}
			if len(in) > maxSize && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Sum of %d bytes: %v", len(in), err)
			}
			return
		}
		if len(in) > maxSize || d.Scheme() != SchemeJSON1 {
			t.Fatalf("Sum(%q) = %v, no error", in, d)
		}
		c, err := h.AppendCanonical(nil, in)
		if err != nil {
			t.Fatalf("AppendCanonical(%q): %v", in, err)
		}
		if d2, err := plain.Sum(c); err != nil || d2 != d {
			t.Fatalf("canonical form %q of %q hashes to %v, %v; want %v", c, in, d2, err, d)
		}
	})
}

// hasDuplicate reports whether any object in the JSON text repeats a
// member name (compared decoded, as canon does).
func hasDuplicate(in []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(in))
	type obj struct {
		names map[string]bool
		key   bool // the next token is a member name
	}
	var stack []*obj
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *obj
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.key {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1] != nil {
					stack[len(stack)-1].key = true
				}
				continue
			}
			name := tok.(string)
			if top.names[name] {
				return true
			}
			top.names[name] = true
			top.key = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &obj{names: map[string]bool{}, key: true})
			continue
		case json.Delim('['):
			stack = append(stack, nil)
			continue
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1] != nil {
			stack[len(stack)-1].key = true
		}
	}
}

// FuzzEquivalence: whatever encoding/json accepts (without duplicates and
// with valid UTF-8), canon accepts, and re-marshalling (sorted keys,
// re-escaped strings, number text kept) does not change the hash.
func FuzzEquivalence(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"\u00e9"]}`, `{"a":1,"\u0061":2}`, `"<&>"`, `[1.0,1e0,-0]`, `{"x":{"z":"\/","y":"\ud83c\udf4c"}}`} {
		f.Add([]byte(s))
	}
	h := mustNew(f, WithMaxDepth(10000))
	f.Fuzz(func(t *testing.T, in []byte) {
		if !json.Valid(in) || hasDuplicate(in) {
			return
		}
		d, err := h.Sum(in)
		if err != nil {
			// encoding/json replaces invalid UTF-8 and lone surrogates.
			if errors.Is(err, ErrInvalidUTF8) || errors.Is(err, ErrTooLarge) {
				return
			}
			t.Fatalf("encoding/json accepts %q, canon: %v", in, err)
		}
		if !utf8.Valid(in) {
			t.Fatalf("canon accepts invalid UTF-8 %q", in)
		}
		dec := json.NewDecoder(bytes.NewReader(in))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		out, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if d2, err := h.Sum(out); err != nil || d2 != d {
			t.Fatalf("%q re-marshalled as %q: %v, %v; want %v", in, out, d2, err, d)
		}
	})
}

// FuzzPointer: ValidatePointer never panics and accepts exactly the RFC
// 6901 pointers (minus "" and invalid UTF-8); a valid one builds a Hasher.
func FuzzPointer(f *testing.F) {
	for _, s := range []string{"/a", "", "a", "/a~2", "/items/*/ts", "/a~1b/~0", "/~", "/0/01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		err := ValidatePointer(p)
		want := strings.HasPrefix(p, "/") && utf8.ValidString(p) &&
			strings.Count(p, "~") == strings.Count(p, "~0")+strings.Count(p, "~1")
		if (err == nil) != want {
			t.Fatalf("ValidatePointer(%q) = %v, want ok=%v", p, err, want)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidPointer) || !strings.Contains(err.Error(), strconv.Quote(p)) {
				t.Fatalf("ValidatePointer(%q) = %v", p, err)
			}
			return
		}
		h, err := New(WithIgnore(p))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.Sum([]byte(`{"a":[{"b":1}],"~":{"/":2}}`)); err != nil {
			t.Fatal(err)
		}
	})
}
