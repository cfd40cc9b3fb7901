package canon

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/dam-dedup/dam/internal/sha256x8"
)

// checkReference encodes in with the fast encoder (through st, which
// carries shape predictions from earlier documents) and with refEncode,
// and reports a difference in the encoded bytes, the validity, the
// sentinel or the offset of an error.
func checkReference(h *Hasher, st *state, in []byte) error {
	want, werr := refEncode(h, in)
	err := h.encode(st, in)
	switch {
	case err != nil && werr != nil:
		var e, we *Error
		if !errors.As(err, &e) || !errors.As(werr, &we) {
			return fmt.Errorf("errors %v, reference %v: want *Error", err, werr)
		}
		// Which of several duplicate names is reported may differ.
		if e.Err != we.Err || e.Offset != we.Offset && e.Err != ErrDuplicateMember {
			return fmt.Errorf("error %v, reference %v at byte %d", err, werr, we.Offset)
		}
		return nil
	case err != nil:
		return fmt.Errorf("error %v, reference encodes %q", err, want)
	case werr != nil:
		return fmt.Errorf("encodes %q, reference error %v", st.out, werr)
	case !bytes.Equal(st.out, want):
		return fmt.Errorf("encodes\n\t%q\nreference\n\t%q", st.out, want)
	}
	return nil
}

// TestReferenceGoldenFile runs every JSON document of testdata/digests.txt
// through both encoders, each block's in order through one state, and
// checks that the golden digests are the reference encoding's.
func TestReferenceGoldenFile(t *testing.T) {
	blocks, _ := readGolden(t)
	for _, b := range blocks {
		h := mustNew(t, b.opts...)
		if h.Format() != FormatJSON {
			continue
		}
		st := new(state)
		for _, gl := range b.lines {
			if gl.doc == nil {
				continue
			}
			if err := checkReference(h, st, gl.doc); err != nil {
				t.Errorf("%s:%d (%s): %.80q: %v", goldenPath, gl.n, b.hasher(), gl.doc, err)
				continue
			}
			if want, err := refEncode(h, gl.doc); err == nil {
				if d := jsonDigest(want); d.String() != gl.result {
					t.Errorf("%s:%d: the reference encoding hashes to %s, the golden digest is %s", goldenPath, gl.n, d, gl.result)
				}
			}
		}
	}
}

// TestReferenceEquivalenceFile runs testdata/equivalence.txt through both
// encoders: each block in order through one state, then every document
// through a fresh one.
func TestReferenceEquivalenceFile(t *testing.T) {
	for _, b := range readEquivalence(t, "testdata/equivalence.txt") {
		h := mustNew(t, WithIgnore(b.ignore...))
		st := new(state)
		for _, doc := range b.docs {
			for _, s := range []*state{st, new(state)} {
				if err := checkReference(h, s, []byte(doc)); err != nil {
					t.Errorf("line %d block: %s: %v", b.line, doc, err)
				}
			}
		}
	}
}

// TestReferenceHostile runs the hostile inputs (hostile_test.go) and the
// invalid documents of TestInvalid through both encoders.
func TestReferenceHostile(t *testing.T) {
	type input struct {
		name string
		h    *Hasher
		in   []byte
	}
	big := mustNew(t, WithMaxSize(16<<20))
	deep := mustNew(t, WithMaxDepth(5000), WithMaxSize(16<<20))
	var ins []input
	add := func(name string, h *Hasher, in []byte) { ins = append(ins, input{name, h, in}) }
	add("10 MB of [", big, bytes.Repeat([]byte("["), 10<<20))
	add("depth 5000", deep, append(bytes.Repeat([]byte(`{"a":[`), 2500), bytes.Repeat([]byte("]}"), 2500)...))
	add("depth 5001", deep, append(bytes.Repeat([]byte(`[`), 5001), bytes.Repeat([]byte("]"), 5001)...))
	add("1 MiB number", mustNew(t), append([]byte("1"), bytes.Repeat([]byte("0"), DefaultMaxSize-1)...))
	add("1 MiB + 1 number", mustNew(t), append([]byte("1"), bytes.Repeat([]byte("0"), DefaultMaxSize)...))
	var a bytes.Buffer
	a.WriteByte('{')
	for i, k := range rand.New(rand.NewPCG(7, 8)).Perm(20000) {
		if i > 0 {
			a.WriteByte(',')
		}
		fmt.Fprintf(&a, `"k%d":%d`, k, k)
	}
	add("20000 members", big, append(a.Bytes(), '}'))
	add("20000 members and a duplicate", big, append(a.Bytes(), `,"k777":1}`...))
	doc := []byte(`{"a":[1,-2.5e+3,"x\u00e9\ud83c\udf4c\n",{"b":null,"c":true}],"d":false,"é":{}}`)
	ign := mustNew(t, WithIgnore("/a/*/b", "/d"))
	for i := range doc {
		add(fmt.Sprintf("prefix %d", i), ign, doc[:i])
	}
	for _, tt := range invalidCases {
		add(tt.name, mustNew(t), []byte(tt.in))
	}
	for _, in := range ins {
		if err := checkReference(in.h, new(state), in.in); err != nil {
			t.Errorf("%s: %.200v", in.name, err)
		}
	}
}

// seqHashers are the option sets of FuzzSequence.
var seqHashers = []struct {
	name string
	opts []Option
}{
	{"plain", nil},
	{"ignore", []Option{WithIgnore("/ts", "/items/*/ts", "/*/0", "/a/*/b", "/0/id")}},
	{"ignore top", []Option{WithIgnore("/*", "/0/*")}},
	{"depth 3", []Option{WithMaxDepth(3)}},
	{"size 64", []Option{WithMaxSize(64)}},
	{"all", []Option{WithIgnore("/id", "/*/ts", "/1"), WithMaxDepth(5), WithMaxSize(512)}},
	{"values", []Option{WithIgnore("/ts", "/*/note"), WithValues("/id", "/0/id", "/a/sku")}},
}

// FuzzSequence feeds a sequence of documents through one state, as the
// documents of a topic go through one Hasher: the shape cache and the
// name predictions of earlier documents apply to later ones (repeated
// shapes, near-repeats that break a prediction). Then it hashes the
// documents again, nested as the elements of an array and as the members
// of an object. Every encoding must be byte-identical to refEncode's
// under each option set, and Sum must hash it.
func FuzzSequence(f *testing.F) {
	f.Add(uint8(0), []byte(`{"id":1,"sku":"a"}`+seqSep+`{"id":2,"sku":"b"}`+seqSep+`{"sku":"c","id":3}`))
	f.Add(uint8(1), []byte(`{"a":1,"ts":2}`+seqSep+`{"a":1,"ts":{"x":1}}`+seqSep+`{"a":1,"tt":2}`))
	f.Fuzz(func(t *testing.T, opt uint8, in []byte) {
		hs := seqHashers[int(opt)%len(seqHashers)]
		h, err := New(hs.opts...)
		if err != nil {
			t.Fatal(err)
		}
		docs := bytes.Split(in, []byte(seqSep))
		if len(docs) > 32 {
			docs = docs[:32]
		}
		st := new(state)
		check := func(what string, doc []byte) {
			if err := checkReference(h, st, doc); err != nil {
				t.Fatalf("%s (%s): %q: %v", what, hs.name, doc, err)
			}
			d, err := h.Sum(doc)
			want, werr := refEncode(h, doc)
			if (err == nil) != (werr == nil) || err == nil && d != jsonDigest(want) {
				t.Fatalf("%s (%s): Sum(%q) = %v, %v; reference %q, %v", what, hs.name, doc, d, err, want, werr)
			}
		}
		for i, doc := range docs {
			check(fmt.Sprintf("document %d", i), doc)
		}
		var arr, obj bytes.Buffer
		arr.WriteByte('[')
		obj.WriteByte('{')
		for i, doc := range docs {
			if i > 0 {
				arr.WriteByte(',')
				obj.WriteByte(',')
			}
			arr.Write(doc)
			fmt.Fprintf(&obj, `"%c":`, 'a'+i%26)
			obj.Write(doc)
		}
		check("as an array", append(arr.Bytes(), ']'))
		check("as an object", append(obj.Bytes(), '}'))
		for i, doc := range docs {
			check(fmt.Sprintf("document %d again", i), doc)
		}
		// The same documents through a Batch, in lanes where this CPU
		// has them: SumValues' digests, values and errors, each under
		// its index.
		old := sha256x8.Enabled
		sha256x8.Enabled = sha256x8.Supported
		defer func() { sha256x8.Enabled = old }()
		got, errs, vals := batchDigests(h, h.NewBatch(), docs, len(h.vptrs))
		for i, doc := range docs {
			want := make([]Value, len(h.vptrs))
			d, _, err := h.SumValues(doc, nil, want)
			if fmt.Sprint(err) != fmt.Sprint(errs[i]) || d != got[i] || err == nil && fmt.Sprint(want) != fmt.Sprint(vals[i]) {
				t.Fatalf("document %d (%s) through a Batch: %v, %v, %q; SumValues %v, %v, %q", i, hs.name, got[i], errs[i], vals[i], d, err, want)
			}
		}
	})
}

// jsonDigest is the scheme 1 digest of an encoding.
func jsonDigest(enc []byte) Digest {
	d := Digest{byte(SchemeJSON1)}
	sum := sha256.Sum256(enc)
	copy(d[1:], sum[:])
	return d
}
