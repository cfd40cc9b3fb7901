package canon

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
)

// shuffled returns n records like those of dam's end-to-end workload
// (internal/cmd/e2ebench/workload.go): ~500 B nested objects whose members are
// shuffled into another order in every record, so the shape of no object
// repeats its member order from the previous record.
func shuffled(n int) [][]byte {
	rng := rand.New(rand.NewPCG(7, 11))
	recs := make([][]byte, n)
	var b bytes.Buffer
	type member struct {
		name  string
		value func()
	}
	str := func(s string) func() { return func() { b.WriteString(strconv.Quote(s)) } }
	num := func(n int) func() { return func() { b.WriteString(strconv.Itoa(n)) } }
	lit := func(s string) func() { return func() { b.WriteString(s) } }
	obj := func(ms []member) func() {
		return func() {
			rng.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
			b.WriteByte('{')
			for i, m := range ms {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString(strconv.Quote(m.name))
				b.WriteByte(':')
				m.value()
			}
			b.WriteByte('}')
		}
	}
	ripeness := []string{"Green", "Mostly Green", "Mostly Yellow", "Yellow", "Spotted", "Brown"}
	for r := range recs {
		b.Reset()
		e := rng.IntN(10000)
		id := fmt.Sprintf("entity-%06d", e)
		items := rng.IntN(2) + 2
		itemVals := make([]func(), items)
		for i := range itemVals {
			sku, qty, cents := rng.IntN(100000), rng.IntN(12)+1, rng.IntN(10000)
			itemVals[i] = obj([]member{
				{"sku", str(fmt.Sprintf("SKU-%05d", sku))},
				{"qty", num(qty)},
				{"price", lit(fmt.Sprintf("%d.%02d", cents/100, cents%100))},
				{"note", str("Größe " + strconv.Itoa(i) + " – süß")},
			})
		}
		obj([]member{
			{"id", str(id)},
			{"banana_id", str(fmt.Sprintf("B-%06d", e))},
			{"name", str(fmt.Sprintf("Banana %d", e))},
			{"ripeness_level", str(ripeness[rng.IntN(len(ripeness))])},
			{"version", num(rng.IntN(100) + 1)},
			{"active", lit(strconv.FormatBool(rng.IntN(2) == 0))},
			{"discontinued", lit("null")},
			{"origin", obj([]member{
				{"country", str("EC")},
				{"farm", str(fmt.Sprintf("Finca \"La Esperanza %d\"", rng.IntN(50)))},
				{"coords", obj([]member{
					{"lat", lit(fmt.Sprintf("%.4f", -1.8+rng.Float64()))},
					{"lon", lit(fmt.Sprintf("%.4f", -78.1+rng.Float64()))},
				})},
			})},
			{"tags", lit(`["organic","fair-trade","café"]`)},
			{"items", func() {
				b.WriteByte('[')
				for i, f := range itemVals {
					if i > 0 {
						b.WriteByte(',')
					}
					f()
				}
				b.WriteByte(']')
			}},
			{"summary", obj([]member{{"count", num(items)}, {"currency", str("EUR")}})},
		})()
		recs[r] = bytes.Clone(b.Bytes())
	}
	return recs
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
	// Records like dam's end-to-end workload, members shuffled in every
	// record: ns/op is per record.
	recs := shuffled(1000)
	var total int
	for _, r := range recs {
		total += len(r)
		if _, err := h.Sum(r); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("shuffled/canon", func(b *testing.B) {
		b.SetBytes(int64(total / len(recs)))
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := h.Sum(recs[i]); err != nil {
				b.Fatal(err)
			}
			if i++; i == len(recs) {
				i = 0
			}
		}
	})
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
