package canon

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
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
