package pipeline_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// waitTimeout bounds every wait for the pipeline's output.
const waitTimeout = 60 * time.Second

// route returns config.DefaultRoute with a service and its topics.
func route(service, from, to string) config.Route {
	r := config.DefaultRoute()
	r.Service, r.From, r.To = service, from, to
	return r
}

var nonWord = regexp.MustCompile(`[^A-Za-z0-9]+`)

// testConfig is config.Default for one test's kfake cluster and schema:
// start at earliest, no HTTP endpoint, a unique group and timeouts short
// enough for tests (still ordered as Validate requires).
func testConfig(t *testing.T, kc *testkafka.Cluster, dsn string, routes ...config.Route) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Kafka.Brokers = []string{kc.Addr()}
	cfg.Kafka.Group = "dam-" + strings.Trim(nonWord.ReplaceAllString(t.Name(), "-"), "-")
	cfg.Kafka.Start = config.StartEarliest
	cfg.Kafka.SessionTimeout = 10 * time.Second
	cfg.Kafka.RebalanceTimeout = 10 * time.Second
	cfg.Kafka.TransactionTimeout = 8 * time.Second
	cfg.Postgres.DSN = dsn
	cfg.Postgres.LockTimeout = 2 * time.Second
	cfg.Postgres.IdleInTransactionTimeout = 5 * time.Second
	cfg.HTTP.Listen = ""
	cfg.Pipeline.ShutdownGrace = 8 * time.Second
	cfg.Pipeline.RetryMax = time.Second
	cfg.Routes = routes
	return cfg
}

// validate fills the parsed fields of cfg, failing the test on a problem.
func validate(t *testing.T, cfg *config.Config) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
}

// openStore opens the store on dsn, closed at cleanup.
func openStore(t *testing.T, dsn string) *dedup.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := dedup.Open(ctx, dsn, dedup.Config{})
	if err != nil {
		t.Fatalf("dedup.Open: %v", err)
	}
	t.Cleanup(st.Close)
	return st
}

// running is a pipeline running in a goroutine.
type running struct {
	t      *testing.T
	pl     *pipeline.Pipeline
	reg    *prometheus.Registry
	cancel context.CancelFunc
	errc   chan error
	done   bool
}

// start validates cfg, builds the pipeline and runs it until stop (or the
// end of the test).
func start(t *testing.T, cfg config.Config, store *dedup.Store) *running {
	t.Helper()
	validate(t, &cfg)
	reg := prometheus.NewRegistry()
	pl, err := pipeline.New(cfg, store, pipeline.WithLogger(zaptest.NewLogger(t)), pipeline.WithRegisterer(reg))
	if err != nil {
		t.Fatalf("pipeline.New: %v", err)
	}
	return run(t, pl, reg)
}

// run runs a pipeline whose metrics go to reg until stop (or the end of the
// test).
func run(t *testing.T, pl *pipeline.Pipeline, reg *prometheus.Registry) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, pl: pl, reg: reg, cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- pl.Run(ctx) }()
	t.Cleanup(func() {
		if !r.done {
			r.cancel()
			select {
			case <-r.errc:
			case <-time.After(60 * time.Second):
				t.Errorf("pipeline did not stop within 60s of the end of the test")
			}
		}
	})
	return r
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// stop cancels the pipeline's context and requires Run to return nil.
func (r *running) stop() {
	r.t.Helper()
	r.cancel()
	r.done = true
	select {
	case err := <-r.errc:
		if err != nil {
			r.t.Fatalf("Run returned %v after cancel, want nil", err)
		}
	case <-time.After(60 * time.Second):
		r.t.Fatalf("Run did not return within 60s of cancel")
	}
}

// records sums dam_records_total, for service (any if "") and the given
// outcomes (any if none).
func (r *running) records(service string, outcomes ...string) int {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatalf("gather: %v", err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "dam_records_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if service != "" && labels["service"] != service {
				continue
			}
			if len(outcomes) > 0 && !slices.Contains(outcomes, labels["outcome"]) {
				continue
			}
			total += m.GetCounter().GetValue()
		}
	}
	return int(total)
}

// gauge returns the value of a gauge with the given service label.
func (r *running) gauge(name, service string) float64 {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "service" && l.GetValue() == service {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// gauge0 returns the value of a gauge without labels.
func (r *running) gauge0(name string) float64 {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	r.t.Fatalf("no gauge %s", name)
	return 0
}

// histogram returns the sample count and sum of a histogram with the given
// service label.
func (r *running) histogram(name, service string) (count uint64, sum float64) {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "service" && l.GetValue() == service {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0
}

// waitRecords waits until the pipeline has delivered (and committed) the
// outcome of n input records of service ("" for all services): after that,
// the output topics hold everything those records produce.
func (r *running) waitRecords(service string, n int) {
	r.t.Helper()
	waitFor(r.t, fmt.Sprintf("%d input records of service %q decided and delivered", n, service), func() (bool, string) {
		select {
		case err := <-r.errc:
			r.done = true
			r.t.Fatalf("Run returned early: %v", err)
		default:
		}
		got := r.records(service)
		if got > n {
			r.t.Fatalf("dam_records_total for %q is %d, more than the %d input records", service, got, n)
		}
		return got == n, fmt.Sprintf("dam_records_total=%d", got)
	})
}

// waitFor polls cond until it holds, failing after waitTimeout with what
// was awaited and the last state cond reported.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	var last string
	for {
		var ok bool
		ok, last = cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last seen: %s", waitTimeout, what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitOutput polls topic until it holds n records and returns them.
func waitOutput(t *testing.T, kc *testkafka.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	var recs []*kgo.Record
	waitFor(t, fmt.Sprintf("%d records on %s", n, topic), func() (bool, string) {
		recs = kc.ReadAll(topic)
		if len(recs) > n {
			t.Fatalf("%s holds %d records, more than the %d expected: %s", topic, len(recs), n, dump(recs))
		}
		return len(recs) == n, fmt.Sprintf("%d records: %s", len(recs), dump(recs))
	})
	return recs
}

// kv is a record's key and value as text; a nil value (tombstone) is
// "<nil>".
type kv struct{ Key, Value string }

func (x kv) String() string { return x.Key + "=" + x.Value }

// short cuts s to n bytes for messages.
func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:n], len(s))
}

const tombstone = "<nil>"

func kvOf(r *kgo.Record) kv {
	v := string(r.Value)
	if r.Value == nil {
		v = tombstone
	}
	return kv{string(r.Key), v}
}

func dump(recs []*kgo.Record) string {
	var b strings.Builder
	for i, r := range recs {
		if i > 0 {
			b.WriteString(", ")
		}
		if i == 20 {
			fmt.Fprintf(&b, "... (%d more)", len(recs)-20)
			break
		}
		x := kvOf(r)
		fmt.Fprintf(&b, "%d/%d %s=%s", r.Partition, r.Offset, short(x.Key, 40), short(x.Value, 60))
	}
	return b.String()
}

// byKey groups records by key, each key's records in the topic's order
// (records of one key share a partition).
func byKey(recs []*kgo.Record) map[string][]string {
	m := map[string][]string{}
	for _, r := range recs {
		x := kvOf(r)
		m[x.Key] = append(m[x.Key], x.Value)
	}
	return m
}

// rec builds an input record.
func rec(key, value string) *kgo.Record {
	r := &kgo.Record{Value: []byte(value)}
	if key != "" {
		r.Key = []byte(key)
	}
	return r
}

// tomb builds a tombstone.
func tomb(key string) *kgo.Record { return &kgo.Record{Key: []byte(key)} }

// produceTo writes records to explicit partitions (Record.Partition),
// synchronously; Partition and Offset are set on return.
func produceTo(t *testing.T, kc *testkafka.Cluster, topic string, recs ...*kgo.Record) {
	t.Helper()
	cl := kc.Client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for _, r := range recs {
		r.Topic = topic
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// deadLetterRig is route svc from "in" (one partition) to "out" with the
// dead-letter topic "dlq", in the given delivery mode, on a kfake cluster
// and a schema of the test's own.
func deadLetterRig(t *testing.T, delivery string) (*testkafka.Cluster, string, config.Config) {
	t.Helper()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	return kc, dsn, inMode(testConfig(t, kc, dsn, rt), delivery)
}
