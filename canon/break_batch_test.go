package canon

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/dam-dedup/dam/internal/sha256x8"
)

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

// TestBreakBatchEncodingEdges: encodings of exactly every length up to
// three blocks and around laneMax, in every count around laneMin and
// batchValues.
func TestBreakBatchEncodingEdges(t *testing.T) {
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

// TestBreakBatchConcurrent: one Hasher, a Batch per goroutine.
func TestBreakBatchConcurrent(t *testing.T) {
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

// FuzzBreakBatch: documents split out of the input at 0xff bytes, each
// repeated to reach block edges, through one Batch vs SumValues.
func FuzzBreakBatch(f *testing.F) {
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
