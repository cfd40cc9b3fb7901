package canon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// genValue returns a random tree of the shapes encoding/json decodes to
// (with UseNumber). A small alphabet makes equal trees likely enough.
func genValue(r *rand.Rand, depth int) any {
	k := r.IntN(10)
	if depth <= 0 && k >= 7 {
		k = r.IntN(7)
	}
	switch k {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2, 3:
		nums := []string{"0", "-0", "1", "1.0", "1e0", "1E+0", "-12.5e-3", "42", "3.14"}
		if r.IntN(2) == 0 {
			return json.Number(nums[r.IntN(len(nums))])
		}
		return json.Number(strconv.Itoa(r.IntN(2000) - 1000))
	case 4, 5, 6:
		return genString(r)
	case 7, 8:
		n := r.IntN(4)
		a := make([]any, n)
		for i := range a {
			a[i] = genValue(r, depth-1)
		}
		return a
	default:
		n := r.IntN(5)
		m := make(map[string]any, n)
		for range n {
			m[genString(r)] = genValue(r, depth-1)
		}
		return m
	}
}

var genRunes = []rune{'a', 'b', 'A', ' ', '"', '\\', '/', '\n', '\t', 0, 0x1f, 'é', 'ß', '\u2028', '🍌', '€', '\uffff', 0x10ffff}

func genString(r *rand.Rand) string {
	var b strings.Builder
	for range r.IntN(4) {
		b.WriteRune(genRunes[r.IntN(len(genRunes))])
	}
	return b.String()
}

// writeJSON serialises v with shuffled members, random whitespace and
// random escapes: a different text of the same tree each time.
func writeJSON(b *bytes.Buffer, r *rand.Rand, v any) {
	ws := func() {
		for range r.IntN(3) {
			b.WriteByte(" \t\n\r"[r.IntN(4)])
		}
	}
	ws()
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case json.Number:
		b.WriteString(string(v))
	case string:
		writeString(b, r, v)
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSON(b, r, e)
		}
		ws()
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			ws()
			writeString(b, r, k)
			ws()
			b.WriteByte(':')
			writeJSON(b, r, v[k])
		}
		ws()
		b.WriteByte('}')
	default:
		panic(fmt.Sprintf("writeJSON: %T", v))
	}
	ws()
}

func writeString(b *bytes.Buffer, r *rand.Rand, s string) {
	b.WriteByte('"')
	for _, c := range s {
		mustEscape := c < 0x20 || c == '"' || c == '\\'
		if !mustEscape && r.IntN(3) != 0 {
			b.WriteRune(c)
			continue
		}
		switch {
		case c == '"' && r.IntN(2) == 0:
			b.WriteString(`\"`)
		case c == '\\' && r.IntN(2) == 0:
			b.WriteString(`\\`)
		case c == '\n' && r.IntN(2) == 0:
			b.WriteString(`\n`)
		case c == '/' && r.IntN(2) == 0:
			b.WriteString(`\/`)
		case c > 0xffff:
			c -= 0x10000
			fmt.Fprintf(b, `\u%04x\u%04X`, 0xd800+(c>>10), 0xdc00+(c&0x3ff))
		default:
			f := `\u%04x`
			if r.IntN(2) == 0 {
				f = `\u%04X`
			}
			fmt.Fprintf(b, f, c)
		}
	}
	b.WriteByte('"')
}

func decodeJSON(t *testing.T, doc []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("encoding/json rejects %q: %v", doc, err)
	}
	return v
}

func TestPropertyReserialise(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	h := mustNew(t)
	for i := range 3000 {
		v := genValue(r, 4)
		var a, b bytes.Buffer
		writeJSON(&a, r, v)
		writeJSON(&b, r, v)
		if !reflect.DeepEqual(decodeJSON(t, a.Bytes()), v) {
			t.Fatalf("case %d: generator wrote %q for %#v", i, a.Bytes(), v)
		}
		da, db := mustSum(t, h, a.String()), mustSum(t, h, b.String())
		if da != db {
			t.Fatalf("case %d: %q and %q hash differently", i, a.Bytes(), b.Bytes())
		}
		// The canonical form is itself JSON of the same tree.
		c, err := h.AppendCanonical(nil, a.Bytes())
		if err != nil || !reflect.DeepEqual(decodeJSON(t, c), v) || mustSum(t, h, string(c)) != da {
			t.Fatalf("case %d: canonical form %q of %q: %v", i, c, a.Bytes(), err)
		}
	}
}

// mutate changes one scalar of v (in place where it can) and returns the
// new tree, which differs from the old one.
func mutate(r *rand.Rand, v any) any {
	switch v := v.(type) {
	case nil:
		return false
	case bool:
		return !v
	case json.Number:
		if v == "7" {
			return json.Number("7.0")
		}
		return json.Number("7")
	case string:
		if _, size := utf8.DecodeLastRuneInString(v); size > 0 && r.IntN(2) == 0 {
			return v[:len(v)-size] + "Z" // "Z" is not in genRunes: always a change
		}
		return v + "x"
	case []any:
		if len(v) == 0 {
			return append(v, nil)
		}
		i := r.IntN(len(v))
		v[i] = mutate(r, v[i])
		return v
	case map[string]any:
		if len(v) == 0 {
			v["new"] = nil
			return v
		}
		for k, e := range v {
			v[k] = mutate(r, e)
			return v
		}
	}
	panic("unreachable")
}

func TestPropertyMutation(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	h := mustNew(t)
	for i := range 3000 {
		v := genValue(r, 4)
		var a, b bytes.Buffer
		writeJSON(&a, r, v)
		before := decodeJSON(t, a.Bytes())
		w := mutate(r, v)
		writeJSON(&b, r, w)
		if reflect.DeepEqual(before, decodeJSON(t, b.Bytes())) {
			t.Fatalf("case %d: mutation of %q was a no-op", i, a.Bytes())
		}
		if mustSum(t, h, a.String()) == mustSum(t, h, b.String()) {
			t.Fatalf("case %d: %q and %q hash equal", i, a.Bytes(), b.Bytes())
		}
	}
}

func TestPropertyDeepEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	h := mustNew(t)
	equal := 0
	for i := range 20000 {
		v, w := genValue(r, 2), genValue(r, 2)
		var a, b bytes.Buffer
		writeJSON(&a, r, v)
		writeJSON(&b, r, w)
		want := reflect.DeepEqual(decodeJSON(t, a.Bytes()), decodeJSON(t, b.Bytes()))
		if got := mustSum(t, h, a.String()) == mustSum(t, h, b.String()); got != want {
			t.Fatalf("case %d: %q vs %q: hash equal %v, trees equal %v", i, a.Bytes(), b.Bytes(), got, want)
		}
		if want {
			equal++
		}
	}
	if equal < 100 {
		t.Fatalf("only %d equal pairs: the generator does not exercise equality", equal)
	}
}
