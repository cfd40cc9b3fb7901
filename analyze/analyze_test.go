package analyze_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/analyze"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// TestIdentityLimitStops: the reading stops before the record that would
// hold one identity too many, the report says so and where, and the
// what-if runs read the same records.
func TestIdentityLimitStops(t *testing.T) {
	t.Parallel()
	var lines []string
	for i := range 10 {
		lines = append(lines, fmt.Sprintf("k%d\t{\"n\":%d,\"at\":%d}", i%5, i/5, i))
	}
	rep := run(t, analyze.NewFileSource(writeFile(t, lines...), "t", 1<<20), routeOf(t, nil), analyze.Options{MaxIdentities: 3})
	r := rep.Routes[0]
	if rep.Records != 3 || r.Identities != 3 || !strings.Contains(rep.Stopped, "limit of 3 identities") || !strings.Contains(rep.Stopped, ":4") {
		t.Fatalf("records %d, identities %d, stopped %q", rep.Records, r.Identities, rep.Stopped)
	}
	rep = run(t, analyze.NewFileSource(writeFile(t, lines...), "t", 1<<20), routeOf(t, nil), analyze.Options{MaxRecords: 7})
	if rep.Records != 7 || !strings.Contains(rep.Stopped, "--max-records 7") {
		t.Fatalf("records %d, stopped %q", rep.Records, rep.Stopped)
	}
	for _, p := range rep.Routes[0].Churn.Paths {
		if p.WhatIf == nil || p.WhatIf.Dropped > 7 {
			t.Errorf("%s: what-if %+v over more than the 7 records read", p.Path, p.WhatIf)
		}
	}
}

// TestWhatIfIsARunWithThePathIgnored: each what-if rate is the drop rate
// of an analysis of the route configured with that path ignored too;
// paths are reported as ignore pointers (array indices as "*", names
// escaped), and the whole value is never offered as one.
func TestWhatIfIsARunWithThePathIgnored(t *testing.T) {
	t.Parallel()
	var lines []string
	for i := range 60 {
		lines = append(lines, fmt.Sprintf(`e%d	{"a/b":%d,"meta":{"at":%d},"items":[{"ts":%d},{"ts":0}],"x":%d}`, i%4, i%3, i/2, i%5, i/20))
	}
	lines = append(lines, "e0\t7", "e0\t8") // a scalar: the whole value changes
	path := writeFile(t, lines...)
	rep := run(t, analyze.NewFileSource(path, "t", 1<<20), routeOf(t, nil), analyze.Options{WhatIf: 10})
	r := rep.Routes[0]
	seen := map[string]bool{}
	for _, p := range r.Churn.Paths {
		seen[p.Path] = true
		if p.Path == "" {
			if p.WhatIf != nil {
				t.Errorf("the whole value has a what-if: %+v", p.WhatIf)
			}
			continue
		}
		alone := run(t, analyze.NewFileSource(path, "t", 1<<20), routeOf(t, func(rc *config.Route) { rc.Ignore = []string{p.Path} }), analyze.Options{WhatIf: -1})
		if p.WhatIf == nil || p.WhatIf.Dropped != alone.Routes[0].Dropped || p.WhatIf.DropRate != alone.Routes[0].DropRate {
			t.Errorf("%s: what-if %+v, a run with it ignored drops %d (%.2f%%)", p.Path, p.WhatIf, alone.Routes[0].Dropped, alone.Routes[0].DropRate)
		}
	}
	for _, want := range []string{"/a~1b", "/meta/at", "/items/*/ts", "/x", ""} {
		if !seen[want] {
			t.Errorf("changed paths %v lack %q", r.Churn.Paths, want)
		}
	}
	if rep.Passes != 2 {
		t.Errorf("%d passes, want 2 (the what-if runs read together)", rep.Passes)
	}
}

// TestWhatIfPassesFitTheLimit: what-if runs that would hold more
// identities together than the limit are read in several passes.
func TestWhatIfPassesFitTheLimit(t *testing.T) {
	t.Parallel()
	var lines []string
	for i := range 40 {
		lines = append(lines, fmt.Sprintf(`e%d	{"a":%d,"b":%d,"c":%d}`, i%4, i/4%2, i/8%2, i/4%3))
	}
	rep := run(t, analyze.NewFileSource(writeFile(t, lines...), "t", 1<<20), routeOf(t, nil), analyze.Options{MaxIdentities: 8, WhatIf: 3})
	if rep.Stopped != "" || rep.Passes != 3 { // 4 identities each: two runs a pass
		t.Fatalf("stopped %q, %d passes; want 3 passes", rep.Stopped, rep.Passes)
	}
	for _, p := range rep.Routes[0].Churn.Paths {
		if p.WhatIf == nil {
			t.Errorf("%s: no what-if", p.Path)
		}
	}
}

// TestSummaryBudget: past the churn's memory budget, forwards are counted
// as not compared, and the report says so.
func TestSummaryBudget(t *testing.T) {
	t.Parallel()
	var lines []string
	for i := range 200 {
		lines = append(lines, fmt.Sprintf(`e%d	{"a":%d}`, i%50, i))
	}
	rep := run(t, analyze.NewFileSource(writeFile(t, lines...), "t", 1<<20), routeOf(t, nil), analyze.Options{SummaryBytes: 1000})
	c := rep.Routes[0].Churn
	if c.NotCompared == 0 || c.Compared == 0 || c.First != 50 || len(rep.Notes) == 0 || !strings.Contains(rep.Notes[0], "budget") {
		t.Fatalf("churn %+v, notes %q", c, rep.Notes)
	}
}

// TestStandardInputHasNoWhatIf: standard input is read once: the report
// has the decisions and the changed paths, and says why no what-if rate.
func TestStandardInputHasNoWhatIf(t *testing.T) {
	t.Parallel()
	in := strings.NewReader("a\t{\"v\":1}\na\t{\"v\":2}\na\t{\"v\":2}\n")
	rep := run(t, analyze.NewReaderSource(in, "t", 1<<20), routeOf(t, nil), analyze.Options{})
	r := rep.Routes[0]
	if r.Forwarded != 2 || r.Dropped != 1 || len(r.Churn.Paths) != 1 || r.Churn.Paths[0].WhatIf != nil || len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "standard input") {
		t.Fatalf("report %+v, churn %+v, notes %q", r, r.Churn, rep.Notes)
	}
}

// TestDeadLettersByReasonAndTopEntities: bad records are counted under
// the error they wrap innermost, with the first's place; the top
// entities are those with the most drops, exactly counted.
func TestDeadLettersByReasonAndTopEntities(t *testing.T) {
	t.Parallel()
	var lines []string
	for i := range 30 {
		lines = append(lines, fmt.Sprintf("e%d\t{\"v\":1}", i%6)) // e0..e5: 4 drops each
	}
	for range 6 {
		lines = append(lines, "hot\t{\"v\":1}") // 5 drops
	}
	lines = append(lines, `{"v":`, "x\t{\"v\":}", "y\t[1,]", "\xff\t{\"v\":1}")
	rep := run(t, analyze.NewFileSource(writeFile(t, lines...), "t", 1<<20), routeOf(t, nil), analyze.Options{TopEntities: 2})
	r := rep.Routes[0]
	want := []analyze.Reason{{Reason: "canon: syntax error", Count: 2}, {Reason: "missing entity", Count: 1}}
	if r.DeadLetters != 3 || len(r.BadRecords) != 2 {
		t.Fatalf("dead letters %d by reason %+v", r.DeadLetters, r.BadRecords)
	}
	for i, b := range r.BadRecords {
		if b.Reason != want[i].Reason || b.Count != want[i].Count {
			t.Errorf("reason %d: %+v, want %+v", i, b, want[i])
		}
	}
	if at := r.BadRecords[0].At; !strings.HasSuffix(at, ":38") {
		t.Errorf("the first syntax error at %q, want line 38", at)
	}
	if len(r.TopEntities) != 2 || r.TopEntities[0] != (analyze.EntityDrops{Entity: "hot", Drops: 5}) || r.TopEntities[1].Drops != 4 {
		t.Errorf("top entities %+v", r.TopEntities)
	}
	if r.Identities != 8 { // e0..e5, hot and the key 0xff
		t.Errorf("%d identities, want 8", r.Identities)
	}
	if !r.Halts {
		t.Errorf("a route without dead_letter: its bad records would halt, the report says %v", r.Halts)
	}
}

// TestKafkaUndecompressableBatch: a batch that inflates past the bound is
// bad input for each of its offsets, as for the sidecar, and the reading
// goes on after it.
func TestKafkaUndecompressableBatch(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "t")
	cl := kc.Client(kgo.ProducerBatchCompression(kgo.GzipCompression()), kgo.ProducerLinger(0))
	big := `{"v":"` + strings.Repeat("x", 100<<10) + `"}`
	var recs []*kgo.Record
	for range 3 {
		recs = append(recs, &kgo.Record{Topic: "t", Key: []byte("k"), Value: []byte(big)})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	kc.Produce("t", &kgo.Record{Key: []byte("k"), Value: []byte(`{"v":1}`)})
	src := analyze.NewKafkaSource([]kgo.Opt{kgo.SeedBrokers(kc.Addr())}, []string{"t"}, analyze.Start{}, 64<<10)
	rep := run(t, src, routeOf(t, func(r *config.Route) { r.DeadLetter = "dlq" }), analyze.Options{})
	r := rep.Routes[0]
	if rep.Records != 4 || r.DeadLetters != 3 || r.Forwarded != 1 || len(r.BadRecords) != 1 || r.BadRecords[0].Reason != pipeline.ErrUndecompressable.Error() {
		t.Fatalf("records %d, dead letters %d %+v, forwarded %d", rep.Records, r.DeadLetters, r.BadRecords, r.Forwarded)
	}
}

// pastHook counts the records a client buffers at or past an offset.
type pastHook struct {
	from int64
	n    atomic.Int64
}

func (h *pastHook) OnFetchRecordBuffered(r *kgo.Record) {
	if r.Offset >= h.from {
		h.n.Add(1)
	}
}

// TestKafkaReadsToTheEndOfItsSpan: a partition whose last offsets hold no
// record (a transaction's marker, an aborted transaction) is read to its
// end, and the analysis ends; one stopped (--max-records) at a record
// after a gap in the offsets (compaction's) fixes its span at the records
// it took, and its what-if runs read no further (not the rest of the
// partition, and not forever).
func TestKafkaReadsToTheEndOfItsSpan(t *testing.T) {
	t.Parallel()
	// The entity is /id: compaction, by Kafka key, leaves every record
	// but a superseded x.
	value := func(i int) []byte { return fmt.Appendf(nil, `{"id":"e%d","b":%d}`, i%2, i%3) }
	txn := func(t *testing.T, kc *testkafka.Cluster, commit kgo.TransactionEndTry, keys ...string) {
		tx := kc.Client(kgo.TransactionalID("analyze-"+t.Name()), kgo.ProducerLinger(0))
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i, k := range keys {
			if err := tx.ProduceSync(context.Background(), &kgo.Record{Topic: "t", Key: []byte(k), Value: value(i)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.EndTransaction(context.Background(), commit); err != nil {
			t.Fatal(err)
		}
	}
	// produce produces a record a batch.
	produce := func(t *testing.T, kc *testkafka.Cluster, keys ...string) {
		cl := kc.Client(kgo.ProducerLinger(0))
		for i, k := range keys {
			if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "t", Key: []byte(k), Value: value(i)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	const tail = 200
	tailKeys := make([]string, tail)
	for i := range tailKeys {
		tailKeys[i] = fmt.Sprintf("t%d", i)
	}
	for _, c := range []struct {
		name    string
		input   func(t *testing.T, kc *testkafka.Cluster)
		o       analyze.Options
		records int64
		past    int64 // the first offset past the span
	}{
		{"a transaction's marker last", func(t *testing.T, kc *testkafka.Cluster) {
			txn(t, kc, kgo.TryCommit, "k0", "k1", "k0")
		}, analyze.Options{}, 3, -1},
		{"an aborted transaction last", func(t *testing.T, kc *testkafka.Cluster) {
			txn(t, kc, kgo.TryCommit, "k0", "k1", "k0")
			txn(t, kc, kgo.TryAbort, "k0", "k2")
		}, analyze.Options{}, 3, -1},
		{"a stop after a compacted gap", func(t *testing.T, kc *testkafka.Cluster) {
			produce(t, kc, "k0", "k1", "k2", "k3", "k4", "x") // x at 5, superseded by x at 6
			produce(t, kc, append([]string{"x"}, tailKeys...)...)
			kc.Compact()
		}, analyze.Options{MaxRecords: 5}, 5, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1)
			kc.CreateTopic("t", 1, "cleanup.policy", "compact")
			c.input(t, kc)
			h := &pastHook{from: c.past}
			opts := []kgo.Opt{kgo.SeedBrokers(kc.Addr()), kgo.WithHooks(h), kgo.FetchMaxWait(100 * time.Millisecond)}
			if c.past >= 0 { // a batch a fetch, to count those past the span
				opts = append(opts, kgo.FetchMaxBytes(1), kgo.FetchMaxPartitionBytes(1))
			}
			src := analyze.NewKafkaSource(opts, []string{"t"}, analyze.Start{}, 1<<20)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rep, err := analyze.Run(ctx, src, []config.Route{routeOf(t, func(r *config.Route) { r.Entity = "/id" })}, c.o)
			if err != nil {
				t.Fatalf("the analysis does not end: %v", err)
			}
			if rep.Records != c.records || rep.Passes < 2 {
				t.Fatalf("records %d, passes %d: want %d and what-if runs", rep.Records, rep.Passes, c.records)
			}
			// Each pass may fetch a batch or two past the span.
			if n := h.n.Load(); c.past >= 0 && n > tail/2 {
				t.Fatalf("%d records past the span read, of the %d after it", n, tail)
			}
		})
	}
}
