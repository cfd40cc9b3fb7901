package canon

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/dam-dedup/dam/internal/sha256x8"
)

// setLanes runs the rest of the test with SHA-256 in lanes on or off (on
// only where the CPU supports them), whatever this CPU would choose.
func setLanes(t *testing.T, on bool) {
	old := sha256x8.Enabled
	sha256x8.Enabled = on && sha256x8.Supported
	t.Cleanup(func() { sha256x8.Enabled = old })
}

// batchDigests adds docs to a Batch of h in order (index = position) and
// returns the digests and errors, as Sum or SumValues would give them.
func batchDigests(h *Hasher, b *Batch, docs [][]byte, nvals int) ([]Digest, []error, [][]Value) {
	ds := make([]Digest, len(docs))
	errs := make([]error, len(docs))
	vals := make([][]Value, len(docs))
	for i, doc := range docs {
		vals[i] = make([]Value, nvals)
		_, errs[i] = b.Add(i, doc, nil, vals[i])
	}
	seen := make([]bool, len(docs))
	b.Flush(func(i int, d Digest) {
		if seen[i] {
			panic(fmt.Sprintf("index %d reported twice", i))
		}
		seen[i], ds[i] = true, d
	})
	for i := range docs {
		if seen[i] == (errs[i] != nil) {
			panic(fmt.Sprintf("index %d: reported %v, error %v", i, seen[i], errs[i]))
		}
	}
	return ds, errs, vals
}

// TestBatchGolden hashes every golden document through one Batch per
// block, with and without lanes and values: the digests and errors are
// Sum's and SumValues', which digests.txt pins.
func TestBatchGolden(t *testing.T) {
	blocks, _ := readGolden(t)
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("lanes=%v", on), func(t *testing.T) {
			setLanes(t, on)
			for _, blk := range blocks {
				var docs [][]byte
				for _, gl := range blk.lines {
					docs = append(docs, gl.doc)
				}
				h := mustNew(t, blk.opts...)
				b := h.NewBatch()
				for round := range 2 { // the second reuses the flushed Batch
					ds, errs, _ := batchDigests(h, b, docs, 0)
					for i, gl := range blk.lines {
						if got := goldenResult(ds[i], errs[i]); gl.result != "" && got != gl.result {
							t.Errorf("%s:%d (%s), round %d: Batch gives %s, want %s", goldenPath, gl.n, blk.hasher(), round, got, gl.result)
						}
					}
				}
				hv := mustNew(t, append(blk.opts, WithValues("/id"))...)
				ds, errs, vals := batchDigests(hv, hv.NewBatch(), docs, 1)
				for i, doc := range docs {
					var want [1]Value
					d, _, err := hv.SumValues(doc, nil, want[:])
					if fmt.Sprint(err) != fmt.Sprint(errs[i]) || err == nil && (d != ds[i] || !bytes.Equal(want[0].Bytes, vals[i][0].Bytes) || want[0].Kind != vals[i][0].Kind) {
						t.Errorf("%s:%d (%s, value /id): Batch gives %v %v %q, SumValues %v %v %q",
							goldenPath, blk.lines[i].n, blk.hasher(), ds[i], errs[i], vals[i][0].Bytes, d, err, want[0].Bytes)
					}
				}
			}
		})
	}
}

// TestBatchMixed mixes, in one Batch, what goes through lanes and what
// does not: long values (one at a time), tombstones, errors, lengths at
// every block edge, and enough values that Add hashes before Flush.
func TestBatchMixed(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("lanes=%v", on), func(t *testing.T) {
			setLanes(t, on)
			for _, format := range []Format{FormatJSON, FormatBytes} {
				h := mustNew(t, WithFormat(format), WithMaxSize(64<<10))
				var docs [][]byte
				for n := range 300 {
					switch {
					case n%50 == 7:
						docs = append(docs, nil)
					case n%50 == 13:
						docs = append(docs, []byte(`{"a":1,"a":2}`))
					case n%50 == 21:
						docs = append(docs, []byte(`"`+strings.Repeat("x", laneMax+n)+`"`))
					case n%50 == 22:
						docs = append(docs, []byte(`"`+strings.Repeat("y", 70<<10)+`"`)) // too large
					default:
						docs = append(docs, []byte(fmt.Sprintf(`{"n":%d,"pad":%q}`, n, strings.Repeat("z", n%140))))
					}
				}
				b := h.NewBatch()
				for round := range 3 {
					ds, errs, _ := batchDigests(h, b, docs[round*10:], 0)
					for i, doc := range docs[round*10:] {
						d, err := h.Sum(doc)
						if fmt.Sprint(err) != fmt.Sprint(errs[i]) || d != ds[i] {
							t.Fatalf("format %v, document %d (%d bytes): Batch %v %v, Sum %v %v", format, i, len(doc), ds[i], errs[i], d, err)
						}
					}
				}
			}
		})
	}
}

// TestBatchErrors: a value the Batch refuses is Sum's error, typed, and
// leaves nothing queued for its index.
func TestBatchErrors(t *testing.T) {
	h := mustNew(t, WithValues("/id"))
	b := h.NewBatch()
	var v [1]Value
	if _, err := b.Add(0, []byte(`{"x":1}`), nil, v[:]); !errors.Is(err, ErrNoValue) {
		t.Fatalf("missing /id: %v", err)
	}
	if _, err := b.Add(1, []byte(`{"id":`), nil, v[:]); !errors.Is(err, ErrSyntax) {
		t.Fatalf("truncated: %v", err)
	}
	n := 0
	b.Flush(func(int, Digest) { n++ })
	if n != 0 {
		t.Fatalf("%d digests reported for refused values", n)
	}
}

func TestLanes(t *testing.T) {
	setLanes(t, false)
	if got := Lanes(); got != "off" {
		t.Fatalf("lanes off: Lanes() = %q", got)
	}
	setLanes(t, true)
	want := "off"
	if sha256x8.Supported {
		want = sha256x8.Kernel()
	}
	if got := Lanes(); got != want || got == "" {
		t.Fatalf("lanes on: Lanes() = %q, want %q", got, want)
	}
}

func BenchmarkBatch(b *testing.B) {
	h := mustNew(b)
	docs := make([][]byte, 256)
	total := 0
	for i := range docs {
		docs[i] = []byte(fmt.Sprintf(`{"id":"entity-%06d","name":"Banana %d","items":[{"sku":"SKU-%05d","qty":%d,"note":"%s"}],"pad":"%s"}`,
			i, i, i*7, i%12, strings.Repeat("ü", 20), strings.Repeat("p", 300)))
		total += len(docs[i])
	}
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("lanes=%v", on), func(b *testing.B) {
			if on && !sha256x8.Supported {
				b.Skip("no lanes on this CPU")
			}
			old := sha256x8.Enabled
			sha256x8.Enabled = on
			defer func() { sha256x8.Enabled = old }()
			bt := h.NewBatch()
			b.SetBytes(int64(total))
			for b.Loop() {
				for i, doc := range docs {
					if _, err := bt.Add(i, doc, nil, nil); err != nil {
						b.Fatal(err)
					}
				}
				bt.Flush(func(int, Digest) {})
			}
		})
	}
	b.Run("sum", func(b *testing.B) {
		b.SetBytes(int64(total))
		for b.Loop() {
			for _, doc := range docs {
				if _, err := h.Sum(doc); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// encLen is the length of value's canonical encoding under h.
func encLen(t testing.TB, h *Hasher, value []byte) int {
	st := new(state)
	if err := h.encode(st, value); err != nil {
		t.Fatal(err)
	}
	return len(st.out)
}

// docOfEncLen returns a JSON string value whose encoding under h is n
// bytes, or nil when none is.
func docOfEncLen(t testing.TB, h *Hasher, n int) []byte {
	for k := 0; k <= n; k++ {
		doc := []byte(`"` + strings.Repeat("q", k) + `"`)
		switch l := encLen(t, h, doc); {
		case l == n:
			return doc
		case l > n:
			return nil
		}
	}
	return nil
}

// checkBatch adds docs to b in order and checks each digest, error and
// value (nvals of them) against h.SumValues, and that each document is
// reported once, or never when it is an error.
func checkBatch(t *testing.T, h *Hasher, b *Batch, docs [][]byte, nvals int) {
	t.Helper()
	ds := make([]Digest, len(docs))
	errs := make([]error, len(docs))
	seen := make([]int, len(docs))
	vals := make([][]Value, len(docs))
	for i, d := range docs {
		vals[i] = make([]Value, nvals)
		_, errs[i] = b.Add(i, d, nil, vals[i])
	}
	b.Flush(func(i int, d Digest) { seen[i]++; ds[i] = d })
	for i, doc := range docs {
		want := make([]Value, nvals)
		d, _, err := h.SumValues(doc, nil, want)
		if fmt.Sprint(err) != fmt.Sprint(errs[i]) {
			t.Fatalf("doc %d (%d bytes): Batch err %v, SumValues %v", i, len(doc), errs[i], err)
		}
		if err != nil {
			if seen[i] != 0 {
				t.Fatalf("doc %d: error %v but reported %d times", i, err, seen[i])
			}
			continue
		}
		if seen[i] != 1 || ds[i] != d {
			t.Fatalf("doc %d (%d bytes): Batch %v (reported %d), SumValues %v", i, len(doc), ds[i], seen[i], d)
		}
		for k := range want {
			if !bytes.Equal(want[k].Bytes, vals[i][k].Bytes) || want[k].Kind != vals[i][k].Kind {
				t.Fatalf("doc %d value %d: %q vs %q", i, k, vals[i][k].Bytes, want[k].Bytes)
			}
		}
	}
}

// TestBatchEncodingAtBlockEdges: encodings of exactly every length up to
// three blocks and around laneMax, in every count around laneMin and
// batchValues, get from a Batch (used twice) the digests and errors
// SumValues gives them.
func TestBatchEncodingAtBlockEdges(t *testing.T) {
	setLanes(t, true)
	for _, format := range []Format{FormatJSON, FormatBytes} {
		h := mustNew(t, WithFormat(format), WithMaxSize(1<<20))
		var docs [][]byte
		for _, n := range []int{0, 1, 54, 55, 56, 57, 63, 64, 65, 118, 119, 120, 121, 127, 128, 183, 184, 191, 192, laneMax - 1, laneMax, laneMax + 1} {
			var d []byte
			if format == FormatBytes {
				d = make([]byte, n)
				for j := range d {
					d[j] = byte(j * 7)
				}
			} else if d = docOfEncLen(t, h, n); d == nil {
				continue
			}
			docs = append(docs, d)
		}
		for _, count := range []int{1, 2, 3, 4, 8, 9, 63, 64, 65, 129} {
			var in [][]byte
			for i := range count {
				in = append(in, docs[i%len(docs)])
			}
			b := h.NewBatch()
			for range 2 {
				checkBatch(t, h, b, in, 0)
			}
		}
	}
}

// TestBatchPerGoroutine: goroutines sharing one Hasher, each with a Batch
// of its own, get SumValues' digests and values.
func TestBatchPerGoroutine(t *testing.T) {
	setLanes(t, true)
	h := mustNew(t, WithValues("/id"), WithIgnore("/ts"))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := h.NewBatch()
			for round := range 20 {
				var docs [][]byte
				for i := range 100 {
					docs = append(docs, []byte(fmt.Sprintf(`{"id":"g%d-%d","ts":%d,"pad":"%s"}`, g, i, round, strings.Repeat("x", (i*37+round*11)%700))))
					if i%13 == 0 {
						docs = append(docs, []byte(`{"ts":1}`))
					}
				}
				checkBatch(t, h, b, docs, 1)
			}
		}()
	}
	wg.Wait()
}

// FuzzBatch: documents split out of the input at 0xff bytes, each
// repeated to reach block edges, get from one Batch per Hasher what
// SumValues gives them.
func FuzzBatch(f *testing.F) {
	f.Add([]byte(`{"id":1}`+"\xff"+`"abc"`+"\xff\xff"+`[1,2,3]`), uint8(3))
	f.Add([]byte(`{"id":"x","ts":5}`), uint8(60))
	setLanesF := func() func() {
		old := sha256x8.Enabled
		sha256x8.Enabled = sha256x8.Supported
		return func() { sha256x8.Enabled = old }
	}
	defer setLanesF()()
	hs := []*Hasher{
		mustNew(f),
		mustNew(f, WithFormat(FormatBytes)),
		mustNew(f, WithValues("/id"), WithIgnore("/ts")),
		mustNew(f, WithFormat(FormatBytes), WithValues("/id")),
	}
	bs := make([]*Batch, len(hs))
	for i, h := range hs {
		bs[i] = h.NewBatch()
	}
	f.Fuzz(func(t *testing.T, in []byte, rep uint8) {
		var docs [][]byte
		for k, part := range bytes.Split(in, []byte{0xff}) {
			docs = append(docs, part)
			if k%3 == 0 {
				docs = append(docs, nil)
			}
			docs = append(docs, bytes.Repeat(part, int(rep)%70))
		}
		for k := 0; k < int(rep)%5; k++ {
			docs = append(docs, docs...)
		}
		for i, h := range hs {
			checkBatch(t, h, bs[i], docs, len(h.vptrs))
		}
	})
}
