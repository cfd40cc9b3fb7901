package analyze_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/analyze"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// modeCase is a route of one mode and how its input is made.
type modeCase struct {
	name  string
	route func(r *config.Route)
	input func(rng *rand.Rand, n int) []*kgo.Record
}

// modeCases covers every mode, each with changes at several paths (so
// that ignoring one raises the drop rate by its own share), repeats,
// member order changes and bad input.
func modeCases() []modeCase {
	return []modeCase{
		{config.ModeLastSeen, func(r *config.Route) { r.Ignore = []string{"/trace"} }, contentStream(false)},
		{"refresh", func(r *config.Route) { r.Ignore, r.RefreshAfter = []string{"/trace"}, span }, contentStream(false)},
		{config.ModeVersion, func(r *config.Route) { r.Mode, r.Entity = config.ModeVersion, "/id" }, contentStream(true)},
		{config.ModeWindow, func(r *config.Route) { r.Mode, r.Window = config.ModeWindow, span }, func(rng *rand.Rand, n int) []*kgo.Record {
			recs := contentStream(false)(rng, n)
			for _, r := range recs {
				id := fmt.Sprintf("m-%d", rng.IntN(n/4))
				r.Key = []byte(id) // one partition per id: decided in order
				if rng.IntN(40) > 0 {
					r.Headers = []kgo.RecordHeader{{Key: "Idempotency-Key", Value: []byte(id)}}
				}
			}
			return recs
		}},
	}
}

// contentStream makes n records of 12 entities: each record changes its
// entity's /v rarely, /meta/at often, /items/*/ts sometimes, /trace
// always (the last-seen route ignores it); with versions, /version mostly
// goes up, sometimes repeats and sometimes goes back.
func contentStream(versions bool) func(rng *rand.Rand, n int) []*kgo.Record {
	return func(rng *rand.Rand, n int) []*kgo.Record {
		type entity struct{ v, at, ts, version int }
		es := make([]entity, 12)
		var recs []*kgo.Record
		for i := range n {
			e := rng.IntN(len(es))
			key := fmt.Sprintf("e-%d", e)
			s := &es[e]
			if rng.IntN(10) == 0 {
				s.v++
			}
			if rng.IntN(2) == 0 {
				s.at++
			}
			if rng.IntN(4) == 0 {
				s.ts++
			}
			version := s.version
			switch p := rng.IntN(10); {
			case p < 5:
				s.version++
				version = s.version
			case p == 5:
				version = max(0, s.version-1-rng.IntN(2))
			}
			r := &kgo.Record{Key: []byte(key)}
			switch rng.IntN(30) {
			case 0:
				r.Value = []byte(`{"id":"` + key + `", "v":`) // bad input
			case 1:
				if !versions {
					break // a tombstone (no /id to take in version mode)
				}
				fallthrough
			default:
				members := []string{
					fmt.Sprintf(`"id":%q`, key),
					fmt.Sprintf(`"v":%d`, s.v),
					fmt.Sprintf(`"meta":{"at":%d,"source":"x"}`, s.at),
					fmt.Sprintf(`"items":[{"ts":%d,"n":1},{"ts":%d,"n":2}]`, s.ts, s.ts/2),
					fmt.Sprintf(`"trace":"%d"`, i),
				}
				if versions {
					members = append(members, fmt.Sprintf(`"version":%d`, version))
				}
				rng.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
				r.Value = []byte("{" + strings.Join(members, ",") + "}")
			}
			recs = append(recs, r)
		}
		return recs
	}
}

// The input comes in waves wavesGap apart, each decided by the sidecar
// before the next, so that windows and refreshes (span) fall due between
// waves, never inside one: the analysis, on the records' timestamps, and
// the sidecar, on the database's clock, see the same expiries.
const (
	span     = time.Second
	waveGap  = 1500 * time.Millisecond
	waves    = 3
	perWave  = 150
	recordsN = waves * perWave
)

// candidatePaths are the paths the input changes: the sidecar runs the
// route once more with each ignored too, so that whichever the analysis
// picks for its what-if runs has its real run.
var candidatePaths = []string{"/id", "/v", "/meta/at", "/meta/source", "/items/*/ts", "/items/*/n", "/trace", "/version"}

// TestCountsMatchSidecar decides the same records with dam analyze and with
// the sidecar (package pipeline on kfake and PostgreSQL), in every mode:
// the analysis's forwarded, duplicate, stale and dead-letter counts are
// the sidecar's. And each what-if rate is what the sidecar drops of the
// same records with that path added to the route's ignore list.
func TestCountsMatchSidecar(t *testing.T) {
	t.Parallel()
	for _, mc := range modeCases() {
		t.Run(mc.name, func(t *testing.T) {
			t.Parallel()
			seed := uint64(time.Now().UnixNano())
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("input made with seed %d", seed)
				}
			})
			topics := []string{"in", "out", "dlq"}
			base := config.DefaultRoute()
			base.Service, base.From, base.To, base.DeadLetter = "svc", "in", "out", "dlq"
			mc.route(&base)
			routes := []config.Route{base}
			for i, p := range candidatePaths {
				w := base
				w.Service, w.From, w.To, w.DeadLetter = fmt.Sprintf("w%d", i), fmt.Sprintf("in.w%d", i), fmt.Sprintf("out.w%d", i), fmt.Sprintf("dlq.w%d", i)
				w.Ignore = append(append([]string(nil), base.Ignore...), p)
				routes = append(routes, w)
				topics = append(topics, w.From, w.To, w.DeadLetter)
			}
			kc := testkafka.New(t, 2, topics...)
			rng := rand.New(rand.NewPCG(seed, 36))
			counts := runSidecar(t, kc, routes, func(wave int) {
				input := mc.input(rng, perWave)
				for _, r := range routes {
					kc.Produce(r.From, clones(input)...)
				}
			})

			cfg := config.Default()
			cfg.Routes = []config.Route{base}
			if err := cfg.ValidateForAnalyze(); err != nil {
				t.Fatal(err)
			}
			src := analyze.NewKafkaSource([]kgo.Opt{kgo.SeedBrokers(kc.Addr())}, []string{"in"}, analyze.Start{}, cfg.Pipeline.MaxDecompressedBatchBytes)
			rep, err := analyze.Run(context.Background(), src, cfg.Routes, analyze.Options{WhatIf: len(candidatePaths)})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Records != recordsN || len(rep.Routes) != 1 {
				t.Fatalf("read %d records, %d routes; want %d, 1", rep.Records, len(rep.Routes), recordsN)
			}
			got := rep.Routes[0]
			want := counts["svc"]
			if got.Forwarded != int64(want["forwarded"]+want["refreshed"]) || got.Refreshed != int64(want["refreshed"]) ||
				got.Duplicates != int64(want["duplicate"]) || got.Stale != int64(want["stale"]) || got.DeadLetters != int64(want["invalid"]) {
				t.Errorf("analysis: forwarded %d (refreshed %d), duplicates %d, stale %d, dead letters %d; the sidecar: %v",
					got.Forwarded, got.Refreshed, got.Duplicates, got.Stale, got.DeadLetters, want)
			}
			checked := 0
			for _, p := range got.Churn.Paths {
				i := slices.Index(candidatePaths, p.Path)
				if p.Path == "" || i < 0 {
					continue // a tombstone's whole value, replaced or replacing
				}
				if p.WhatIf == nil {
					t.Errorf("changed path %s: no what-if", p.Path)
					continue
				}
				c := counts[fmt.Sprintf("w%d", i)]
				if dropped := int64(c["duplicate"] + c["stale"]); p.WhatIf.Dropped != dropped || p.WhatIf.DropRate != 100*float64(dropped)/recordsN {
					t.Errorf("ignoring %s too: the what-if drops %d (%.2f%%), the sidecar %d: %v", p.Path, p.WhatIf.Dropped, p.WhatIf.DropRate, dropped, c)
				}
				checked++
			}
			if checked == 0 {
				t.Fatalf("no what-if rate checked: %+v", got.Churn)
			}
			if mc.route == nil || mc.name == config.ModeLastSeen {
				if top := got.Churn.Paths[0]; !(top.WhatIf.DropRate > got.DropRate) {
					t.Errorf("ignoring the most changed path %s leaves the drop rate at %.1f%% (from %.1f%%)", top.Path, top.WhatIf.DropRate, got.DropRate)
				}
			}
			t.Logf("%s: %d compared forwards, drop rate %.1f%%, what-if: %s", mc.name, got.Churn.Compared, got.DropRate, whatIfs(got))
		})
	}
}

func whatIfs(r analyze.RouteReport) string {
	var s []string
	for _, p := range r.Churn.Paths {
		if p.WhatIf != nil {
			s = append(s, fmt.Sprintf("%s %.1f%%", p.Path, p.WhatIf.DropRate))
		}
	}
	return strings.Join(s, ", ")
}

func clones(recs []*kgo.Record) []*kgo.Record {
	out := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		out[i] = &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers}
	}
	return out
}

// runSidecar runs the sidecar over routes while produce makes waves of
// input (each counted by every route before the next, waveGap apart), and
// returns its dam_records_total by service and outcome.
func runSidecar(t *testing.T, kc *testkafka.Cluster, routes []config.Route, produce func(wave int)) map[string]map[string]int {
	t.Helper()
	dsn := pgtest.DSN(t)
	// A connection for each route's window cleanup, which runs at start,
	// and room for the partitions' decides beside them.
	store, err := dedup.Open(context.Background(), dsn, dedup.Config{MaxConns: int32(2*len(routes) + 4)})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	cfg := config.Default()
	cfg.Kafka.Brokers, cfg.Kafka.Group, cfg.Kafka.Start = []string{kc.Addr()}, "dam-analyze", config.StartEarliest
	cfg.Postgres.DSN = dsn
	cfg.HTTP.Listen = ""
	cfg.Routes = routes
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pl, err := pipeline.New(cfg, store, pipeline.WithLogger(zaptest.NewLogger(t)), pipeline.WithRegisterer(reg),
		pipeline.WithKafkaOptions(kgo.FetchMaxWait(50*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- pl.Run(ctx) }()
	counts := map[string]map[string]int{}
	for w := range waves {
		if w > 0 {
			time.Sleep(waveGap)
		}
		produce(w)
		deadline := time.Now().Add(90 * time.Second)
		for _, r := range routes {
			for {
				counts[r.Service] = counted(t, reg, r.Service)
				total := 0
				for _, c := range counts[r.Service] {
					total += c
				}
				if total >= (w+1)*perWave {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: the sidecar counted %d records, want %d", r.Service, total, (w+1)*perWave)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("sidecar: %v", err)
	}
	return counts
}

// counted reads dam_records_total of service, by outcome.
func counted(t *testing.T, reg *prometheus.Registry, service string) map[string]int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	for _, mf := range mfs {
		if mf.GetName() == "dam_records_total" {
			if _, err := expfmt.MetricFamilyToText(&text, mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	counts := map[string]int{}
	for _, line := range strings.Split(text.String(), "\n") {
		var outcome string
		var c int
		if _, err := fmt.Sscanf(line, "dam_records_total{outcome=%q,service="+strconv.Quote(service)+"} %d", &outcome, &c); err == nil {
			counts[outcome] = c
		}
	}
	return counts
}
