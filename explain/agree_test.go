package explain_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/explain"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// agreeRoute is one route of TestAgreesWithSidecar: its settings and how
// its input records are made.
type agreeRoute struct {
	service string
	yaml    func(r *config.Route)
	record  func(rng *rand.Rand) *kgo.Record
}

// The waves of input are agreeGap apart, so that refreshes and windows
// (agreeSpan) fall due between waves and never inside one.
const (
	agreeSpan  = time.Second
	agreeGap   = 1500 * time.Millisecond
	agreeWaves = 3
	agreeWave  = 8 // records per route and wave
)

// pick returns one of xs.
func pick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

func agreeRoutes() []agreeRoute {
	content := func(rng *rand.Rand) *kgo.Record {
		key := pick(rng, "a", "b", "c")
		switch rng.IntN(12) {
		case 0:
			return &kgo.Record{Key: []byte(key)} // a tombstone
		case 1:
			return &kgo.Record{Key: []byte(key), Value: []byte(`{"v":`)} // bad input
		}
		v := fmt.Sprintf(`{"v":%d,"ts":%d}`, rng.IntN(2), rng.IntN(1000))
		if rng.IntN(2) == 0 {
			v = fmt.Sprintf(`{"ts":%d, "v":%d}`, rng.IntN(1000), rng.IntN(2))
		}
		return &kgo.Record{Key: []byte(key), Value: []byte(v)}
	}
	message := func(rng *rand.Rand) *kgo.Record {
		r := &kgo.Record{Key: []byte("k"), Value: []byte(fmt.Sprintf(`{"amount":%d}`, rng.IntN(3)))}
		if rng.IntN(10) > 0 { // else bad input: no id
			r.Headers = []kgo.RecordHeader{{Key: "Idempotency-Key", Value: []byte(pick(rng, "A", "B", "C"))}}
		}
		return r
	}
	return []agreeRoute{
		{"last-seen", func(r *config.Route) { r.Ignore = []string{"/ts"} }, content},
		{"refresh", func(r *config.Route) { r.Ignore, r.RefreshAfter = []string{"/ts"}, agreeSpan }, content},
		{"shadow", func(r *config.Route) { r.Ignore, r.Shadow = []string{"/ts"}, true }, content},
		{"window", func(r *config.Route) { r.Mode, r.Window = config.ModeWindow, agreeSpan }, message},
		{"sliding", func(r *config.Route) { r.Mode, r.Window, r.Sliding = config.ModeWindow, agreeSpan, true }, message},
		{"version", func(r *config.Route) { r.Mode = config.ModeVersion }, func(rng *rand.Rand) *kgo.Record {
			v := strconv.Itoa(rng.IntN(5))
			if rng.IntN(10) == 0 {
				v = `"x"` // bad input
			}
			return &kgo.Record{Key: []byte(pick(rng, "E", "F")), Value: []byte(`{"version":` + v + `}`)}
		}},
	}
}

// TestAgreesWithSidecar runs the sidecar (package pipeline) on kfake and
// PostgreSQL over a route of every mode, then explains every input offset
// and compares with what the sidecar did: what it delivered, dead-lettered
// or marked (shadow), and its count of each outcome.
//
// While the sidecar runs, the decision log is kept whole (a rule of the
// test's schema turns the pruning into nothing), so that every offset is
// explained from it and must get the sidecar's exact decision. Then the
// log is pruned: explanations from the state and the input may be less
// sure ("unknown"), but must never contradict the sidecar.
func TestAgreesWithSidecar(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 21))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("input made with seed %d", seed)
		}
	})
	routes := agreeRoutes()
	var topics []string
	for _, r := range routes {
		topics = append(topics, "in."+r.service, "out."+r.service, "dlq."+r.service)
	}
	kc := testkafka.New(t, 1, topics...)
	dsn := pgtest.DSN(t)
	store, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.Pool().Exec(context.Background(), `CREATE RULE keep_log AS ON DELETE TO decision_log DO INSTEAD NOTHING`); err != nil {
		t.Fatal(err)
	}

	cfg := config.Default()
	cfg.Kafka.Brokers, cfg.Kafka.Group, cfg.Kafka.Start = []string{kc.Addr()}, "dam-agree", config.StartEarliest
	cfg.Postgres.DSN = dsn
	cfg.HTTP.Listen = ""
	for _, r := range routes {
		rc := config.DefaultRoute()
		rc.Service, rc.From, rc.To, rc.DeadLetter = r.service, "in."+r.service, "out."+r.service, "dlq."+r.service
		r.yaml(&rc)
		cfg.Routes = append(cfg.Routes, rc)
	}
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
	errc := make(chan error, 1)
	go func() { errc <- pl.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("sidecar: %v", err)
			}
		}
	}
	defer stop()

	// Waves of input, each decided before the next, agreeGap apart.
	produced := 0
	for w := range agreeWaves {
		if w > 0 {
			time.Sleep(agreeGap)
		}
		for _, r := range routes {
			var recs []*kgo.Record
			for i := range agreeWave {
				rec := r.record(rng)
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "n", Value: []byte(strconv.Itoa(produced + i))})
				recs = append(recs, rec)
			}
			kc.Produce("in."+r.service, recs...)
		}
		produced += agreeWave
		waitCounted(t, reg, routes, produced)
	}
	stop()

	for i, r := range routes {
		route, err := pipeline.CompileRoute(cfg.Routes[i])
		if err != nil {
			t.Fatal(err)
		}
		a := sidecarDid(t, kc, r.service, cfg.Routes[i].Shadow)
		ex := explain.New(store, kc.Client(), cfg.Kafka.Group)
		explained := map[string]int{}
		for off := range int64(produced) {
			res, err := ex.Offset(context.Background(), route, 0, off)
			if err != nil {
				t.Fatalf("%s@%d: %v", r.service, off, err)
			}
			explained[res.Decision]++
			a.check(t, res, true)
		}
		// The sidecar's count of each outcome is the explanations'.
		for outcome, decision := range map[string]string{"forwarded": "forward", "refreshed": "refresh", "duplicate": "duplicate", "stale": "stale", "invalid": "invalid"} {
			if got, want := explained[decision], counted(t, reg, r.service)[outcome]; got != want {
				t.Errorf("%s: %d explained %s, the sidecar counted %d %s (explained: %v)", r.service, got, decision, want, outcome, explained)
			}
		}
	}

	// The log pruned, as delivery does: less sure, never contradicting.
	if _, err := store.Pool().Exec(context.Background(), `DROP RULE keep_log ON decision_log`); err != nil {
		t.Fatal(err)
	}
	for i, r := range routes {
		p := dedup.Partition{Group: cfg.Kafka.Group, Topic: "in." + r.service}
		if _, err := store.PruneLog(context.Background(), p, int64(produced)); err != nil {
			t.Fatal(err)
		}
		route, err := pipeline.CompileRoute(cfg.Routes[i])
		if err != nil {
			t.Fatal(err)
		}
		a := sidecarDid(t, kc, r.service, cfg.Routes[i].Shadow)
		ex := explain.New(store, kc.Client(), cfg.Kafka.Group)
		for off := range int64(produced) {
			res, err := ex.Offset(context.Background(), route, 0, off)
			if err != nil {
				t.Fatalf("%s@%d, log pruned: %v", r.service, off, err)
			}
			a.check(t, res, false)
		}
	}
}

// waitCounted waits until the sidecar has counted n records of every
// route in dam_records_total: decided, delivered and committed (a batch is
// counted once its offset is committed).
func waitCounted(t *testing.T, reg *prometheus.Registry, routes []agreeRoute, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, r := range routes {
		for {
			total := 0
			for _, c := range counted(t, reg, r.service) {
				total += c
			}
			if total >= n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d records counted, want %d", r.service, total, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// did is what the sidecar did with each input offset of one route.
type did struct {
	service   string
	shadow    bool
	forwarded map[int64]bool // delivered (shadow: delivered unmarked)
	marked    map[int64]bool // shadow: delivered marked dam-duplicate
	dead      map[int64]bool // dead-lettered
}

// sidecarDid reads what the sidecar delivered and dead-lettered for
// service. Every input record carries its number in header "n", which its
// delivery keeps.
func sidecarDid(t *testing.T, kc *testkafka.Cluster, service string, shadow bool) *did {
	t.Helper()
	d := &did{service: service, shadow: shadow, forwarded: map[int64]bool{}, marked: map[int64]bool{}, dead: map[int64]bool{}}
	offsets := map[string]int64{}
	for _, r := range kc.ReadAll("in." + service) {
		offsets[header(r, "n")] = r.Offset
	}
	for _, r := range kc.ReadAll("out." + service) {
		off, ok := offsets[header(r, "n")]
		if !ok {
			t.Fatalf("%s: output %q/%q matches no input", service, r.Key, r.Value)
		}
		if shadow && header(r, pipeline.HeaderDuplicate) == "true" {
			d.marked[off] = true
		} else {
			d.forwarded[off] = true
		}
	}
	for _, r := range kc.ReadAll("dlq." + service) {
		off, err := strconv.ParseInt(header(r, pipeline.HeaderSourceOffset), 10, 64)
		if err != nil {
			t.Fatalf("%s: dead letter without its source offset: %v", service, err)
		}
		d.dead[off] = true
	}
	return d
}

func header(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

// check requires the explanation to agree with what the sidecar did; sure:
// the decision log covers the offset, so the explanation must be exact.
func (d *did) check(t *testing.T, res *explain.OffsetExplanation, sure bool) {
	t.Helper()
	off := res.Offset
	var agrees bool
	switch res.Decision {
	case "forward", "refresh":
		agrees = d.forwarded[off]
	case "duplicate", "stale":
		agrees = !d.forwarded[off] && !d.dead[off] && d.marked[off] == d.shadow
	case "invalid":
		agrees = d.dead[off]
	case "dropped", "unknown":
		agrees = !sure && !d.dead[off]
	}
	if !agrees {
		t.Errorf("%s@%d: explained %s (%s), but the sidecar forwarded %v, marked %v, dead-lettered %v",
			d.service, off, res.Decision, res.Reason, d.forwarded[off], d.marked[off], d.dead[off])
	}
}

// counted reads dam_records_total of service, by outcome, from its
// exposition text.
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
		var n int
		if _, err := fmt.Sscanf(line, "dam_records_total{outcome=%q,service="+strconv.Quote(service)+"} %d", &outcome, &n); err == nil {
			counts[outcome] = n
		}
	}
	return counts
}
