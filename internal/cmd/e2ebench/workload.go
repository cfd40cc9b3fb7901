package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
)

// workload generates the input stream deterministically: records keyed by
// entity id, each a ~500 B nested JSON projection that also holds the key
// at /id (for the dam-pointer variant). With probability dupRate
// an entity already seen repeats its previous content with its members in
// another order (a duplicate for dam); otherwise its content changes.
type workload struct {
	rng     *rand.Rand
	version []uint32 // per entity: current content version, 0 = not seen
	dupRate float64
	small   bool // ~190 B values: the projection's top-level fields alone
	buf     bytes.Buffer
}

func newWorkload(entities int, dupRate float64) *workload {
	return &workload{rng: rand.New(rand.NewPCG(7, 11)), version: make([]uint32, entities), dupRate: dupRate}
}

// next returns the next record's key and value (fresh slices).
func (w *workload) next() (key, value []byte) {
	e := w.rng.IntN(len(w.version))
	if w.version[e] == 0 || w.rng.Float64() >= w.dupRate {
		w.version[e]++
	}
	id := fmt.Sprintf("entity-%06d", e)
	key = []byte(id)
	value = w.render(e, id, w.version[e], w.rng.Uint64())
	return key, value
}

// member is one object member being rendered.
type member struct {
	name  string
	value func()
}

// render writes entity e's content at version v, its id (the record key)
// at /id; order seeds the member order of every object (content is
// independent of it).
func (w *workload) render(e int, id string, v uint32, order uint64) []byte {
	w.buf.Reset()
	ord := rand.New(rand.NewPCG(order, uint64(e)))
	c := rand.New(rand.NewPCG(uint64(e), uint64(v))) // content
	b := &w.buf
	str := func(s string) func() { return func() { b.WriteString(strconv.Quote(s)) } }
	num := func(n int) func() { return func() { b.WriteString(strconv.Itoa(n)) } }
	lit := func(s string) func() { return func() { b.WriteString(s) } }
	obj := func(ms []member) func() {
		return func() {
			ord.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
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
	if w.small {
		obj([]member{
			{"id", str(id)},
			{"banana_id", str(fmt.Sprintf("B-%06d", e))},
			{"name", str(fmt.Sprintf("Banana %d", e))},
			{"ripeness_level", str(ripeness[c.IntN(len(ripeness))])},
			{"version", num(int(v))},
			{"active", lit(strconv.FormatBool(c.IntN(2) == 0))},
			{"origin", obj([]member{{"country", str("EC")}, {"farm", str(fmt.Sprintf("Finca %d", c.IntN(50)))}})},
		})()
		return bytes.Clone(b.Bytes())
	}
	items := c.IntN(2) + 2
	itemVals := make([]func(), items)
	for i := range itemVals {
		sku, qty, cents := c.IntN(100000), c.IntN(12)+1, c.IntN(10000)
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
		{"ripeness_level", str(ripeness[c.IntN(len(ripeness))])},
		{"version", num(int(v))},
		{"active", lit(strconv.FormatBool(c.IntN(2) == 0))},
		{"discontinued", lit("null")},
		{"origin", obj([]member{
			{"country", str("EC")},
			{"farm", str(fmt.Sprintf("Finca \"La Esperanza %d\"", c.IntN(50)))},
			{"coords", obj([]member{
				{"lat", lit(fmt.Sprintf("%.4f", -1.8+c.Float64()))},
				{"lon", lit(fmt.Sprintf("%.4f", -78.1+c.Float64()))},
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
	return bytes.Clone(b.Bytes())
}
