package analyze_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/analyze"
	"github.com/dam-dedup/dam/config"
)

// memSource is a Source over records in memory: the benchmark measures
// the analysis, not the reading.
type memSource []*kgo.Record

func (m memSource) Read(ctx context.Context, _ []string, fn func([]*kgo.Record) (int, error)) error {
	for i := 0; i < len(m); i += 1000 {
		if _, err := fn(m[i:min(i+1000, len(m))]); err != nil {
			return nil
		}
	}
	return nil
}
func (m memSource) Rereadable() bool           { return true }
func (m memSource) Where(r *kgo.Record) string { return fmt.Sprint(r.Offset) }

// benchRecords are n records of 10000 entities, ~250 B of nested JSON,
// 30% repeating their entity's previous content, the rest changing one
// of three paths.
func benchRecords(n int) memSource {
	rng := rand.New(rand.NewPCG(1, 2))
	type entity struct{ a, b, c int }
	es := make([]entity, 10000)
	recs := make(memSource, n)
	for i := range recs {
		e := rng.IntN(len(es))
		s := &es[e]
		switch p := rng.Float64(); {
		case p < 0.3:
		case p < 0.6:
			s.a++
		case p < 0.9:
			s.b++
		default:
			s.c++
		}
		v := fmt.Sprintf(`{"id":"entity-%05d","name":"Banana %d","meta":{"generated_at":%d,"source":"pim"},"price":{"amount":"%d.00","currency":"EUR"},"items":[{"sku":"SKU-%d","qty":%d},{"sku":"SKU-2","qty":1}],"active":true}`,
			e, e, s.a, s.b, e, s.c)
		recs[i] = &kgo.Record{Topic: "t", Offset: int64(i), Key: fmt.Appendf(nil, "entity-%05d", e), Value: []byte(v)}
	}
	return recs
}

// BenchmarkAnalyze measures the analysis in memory, in records/s: the
// decisions alone (no churn), with the changed paths, and with the
// default what-if runs (each record read again with them).
func BenchmarkAnalyze(b *testing.B) {
	recs := benchRecords(100_000)
	r := config.DefaultRoute()
	r.Service, r.From, r.To = "svc", "t", "out"
	cfg := config.Default()
	cfg.Routes = []config.Route{r}
	if err := cfg.ValidateForAnalyze(); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		o    analyze.Options
	}{
		{"decide", analyze.Options{SummaryBytes: -1, WhatIf: -1}},
		{"churn", analyze.Options{WhatIf: -1}},
		{"what-if", analyze.Options{}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				rep, err := analyze.Run(context.Background(), recs, cfg.Routes, c.o)
				if err != nil || rep.Records != int64(len(recs)) {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(recs))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
