package canon

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"testing"
)

// projection returns a deterministic, realistic projection document of
// about size bytes: nested objects, an array of objects, strings with
// escapes and non-ASCII text, numbers, booleans, nulls and timestamps.
func projection(size int) []byte {
	if size < 400 {
		// The small projection a narrow adapter gets: about 200 bytes.
		return []byte(`{"banana_id":"B-007","name":"Mr. Banana","ripeness_level":"Mostly Yellow",` +
			`"updated_at":"2026-11-21T19:43:21Z","version":42,"active":true,"ref":null,` +
			`"origin":{"country":"EC","lat":-1.8312},"tags":["caf\u00e9","Grün"]}`)
	}
	var b bytes.Buffer
	b.WriteString(`{"banana_id":"B-007","name":"Mr. Banana","ripeness_level":"Mostly Yellow",` +
		`"updated_at":"2026-11-21T19:43:21.123456Z","version":42,"active":true,"discontinued":null,` +
		`"origin":{"country":"EC","farm":"Finca \"La Esperanza\"","coords":{"lat":-1.8312,"lon":-78.1834}},` +
		`"tags":["organic","fair-trade","caf\u00e9","Gr\u00fcn"],"items":[`)
	for i := 0; b.Len() < size-40; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"SKU-%05d","qty":%d,"price":%d.%02d,"ts":"2026-11-%02dT10:%02d:00Z",`+
			`"note":"Größe %d \u2013 süß","gift":%t,"ref":null}`,
			i*7919%100000, i%13+1, 1+i%97, i%100, 1+i%28, i%60, i, i%3 == 0)
	}
	b.WriteString(`],"summary":{"count":3,"currency":"EUR"}}`)
	return b.Bytes()
}

// naiveSum is the baseline: decode into any, re-marshal (sorted keys), hash.
func naiveSum(value []byte) ([32]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return [32]byte{}, err
	}
	out, err := json.Marshal(v)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(out), nil
}

var benchPayloads = []struct {
	name string
	size int
}{{"200B", 200}, {"2KB", 2048}, {"64KB", 64 << 10}}

// BenchmarkSum measures canon against the naive hash and a plain SHA-256
// of the same bytes; "values" is SumValues reading the entity (/banana_id)
// in the same pass, to compare with "canon".
func BenchmarkSum(b *testing.B) {
	h, err := New()
	if err != nil {
		b.Fatal(err)
	}
	hv, err := New(WithValues("/banana_id"))
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range benchPayloads {
		in := projection(p.size)
		if _, err := h.Sum(in); err != nil {
			b.Fatal(err)
		}
		b.Run(p.name+"/canon", func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := h.Sum(in); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(p.name+"/values", func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			var vals [1]Value
			var arena []byte
			for b.Loop() {
				var err error
				if _, arena, err = hv.SumValues(in, arena[:0], vals[:]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(p.name+"/naive", func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := naiveSum(in); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(p.name+"/sha256", func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				sha256.Sum256(in)
			}
		})
	}
}
