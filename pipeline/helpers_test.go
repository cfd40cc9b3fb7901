package pipeline_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// Configuration: a route, the test's configuration in each delivery mode,
// the Kafka clusters that need more than testkafka.New.

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

// eosConfig is testConfig in exactly-once mode with a transactional id of
// its own.
func eosConfig(t *testing.T, kc *testkafka.Cluster, dsn, id string, routes ...config.Route) config.Config {
	t.Helper()
	cfg := testConfig(t, kc, dsn, routes...)
	cfg.Kafka.Delivery = config.DeliveryExactlyOnce
	cfg.Kafka.TransactionalID = cfg.Kafka.Group + "-" + id
	return cfg
}

// deliveries are the delivery modes a test runs in.
var deliveries = []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce}

// inMode sets cfg's delivery mode (with a transactional id of its own in
// exactly-once mode).
func inMode(cfg config.Config, delivery string) config.Config {
	cfg.Kafka.Delivery = delivery
	if delivery == config.DeliveryExactlyOnce {
		cfg.Kafka.TransactionalID = cfg.Kafka.Group + "-tx"
	}
	return cfg
}

// modeRoute is a route of the given mode (with its required settings) and
// a dead-letter topic, on topics named after the service.
func modeRoute(service, mode string) config.Route {
	rt := route(service, "in."+service, "out."+service)
	rt.DeadLetter = "dlq." + service
	rt.Mode = mode
	if mode == config.ModeWindow {
		rt.Window = time.Hour
	}
	return rt
}

// modeTopics lists the input, output and dead-letter topics of
// modeRoute's services.
func modeTopics(services ...string) []string {
	var ts []string
	for _, s := range services {
		ts = append(ts, "in."+s, "out."+s, "dlq."+s)
	}
	return ts
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

// The harness authenticates as a superuser; dam as its own user.
const (
	adminUser, adminPass = "admin", "admin-secret"
	damUser, damPass     = "dam", "dam-secret"
)

// adminAuth is the harness's SASL login to a secured kfake.
func adminAuth() kgo.Opt {
	return kgo.SASL(scram.Auth{User: adminUser, Pass: adminPass}.AsSha256Mechanism())
}

// saslCluster starts kfake requiring SASL, with the harness's superuser,
// dam's user for every mechanism, and the topics in and out.
func saslCluster(t *testing.T, more ...kfake.Opt) *testkafka.Cluster {
	t.Helper()
	opts := []kfake.Opt{kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", adminUser, adminPass)}
	for _, m := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		opts = append(opts, kfake.User(m, damUser, damPass))
	}
	return testkafka.NewWith(t, 2, []string{"in", "out"}, append(opts, more...), adminAuth())
}

// The store.

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

// Running a pipeline: start, stop, crash, with its log recorded or read.

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

// crash stops the pipeline the way a crash would leave Kafka and
// PostgreSQL: with a short grace period, what could not be delivered is
// abandoned (its records fail; nothing more is committed).
func (r *running) crash() {
	r.t.Helper()
	r.cancel()
	r.done = true
	select {
	case <-r.errc:
	case <-time.After(60 * time.Second):
		r.t.Fatalf("Run did not return within 60s of cancel")
	}
}

// startLogged is start with the pipeline's log also recorded in logs.
func startLogged(t *testing.T, cfg config.Config, store *dedup.Store) (*running, *logLines) {
	t.Helper()
	validate(t, &cfg)
	lines := &logLines{}
	log := zaptest.NewLogger(t, zaptest.WrapOptions(zap.Hooks(func(e zapcore.Entry) error {
		lines.add(e.Message)
		return nil
	})))
	reg := prometheus.NewRegistry()
	pl, err := pipeline.New(cfg, store, pipeline.WithLogger(log), pipeline.WithRegisterer(reg))
	if err != nil {
		t.Fatalf("pipeline.New: %v", err)
	}
	return run(t, pl, reg), lines
}

// logLines are the messages a pipeline logged.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(s string) {
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
}

func (l *logLines) has(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.lines, func(s string) bool { return strings.Contains(s, sub) })
}

// startObserved starts a pipeline whose log the test reads.
func startObserved(t *testing.T, cfg config.Config) (*running, *observer.ObservedLogs) {
	t.Helper()
	validate(t, &cfg)
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
	reg := prometheus.NewRegistry()
	pl, err := pipeline.New(cfg, openStore(t, cfg.Postgres.DSN), pipeline.WithLogger(log), pipeline.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	return run(t, pl, reg), logs
}

// Metrics a running pipeline reports.

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

// counter sums a counter's series with the given service label.
func (r *running) counter(name, service string) float64 {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatalf("gather: %v", err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "service" && l.GetValue() == service {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
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

// Input: records built and produced, offsets committed as an operator does.

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

// hrec builds an input record with headers given as name, value pairs.
func hrec(key, value string, headers ...string) *kgo.Record {
	r := rec(key, value)
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
	}
	return r
}

// keyed builds n records of partition part with keys prefix-0 ... prefix-n-1.
func keyed(part int32, prefix string, n int) []*kgo.Record {
	out := make([]*kgo.Record, n)
	for i := range out {
		out[i] = rec(fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf(`{"n":%d}`, i))
		out[i].Partition = part
	}
	return out
}

// bigKeyed is a record whose value fits max_size but which, with a large
// header, is larger than the output topic accepts. (Not with a large key:
// an entity above dedup.MaxEntityBytes is bad input.)
func bigKeyed(valueBytes int) *kgo.Record {
	r := rec("big", `"`+strings.Repeat("v", valueBytes-2)+`"`)
	r.Headers = []kgo.RecordHeader{{Key: "h", Value: []byte(strings.Repeat("H", 70_000))}}
	return r
}

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

// one produces records to partition 0 of topic in one request (one record
// batch: the pipeline fetches and decides them together).
func one(t *testing.T, kc *testkafka.Cluster, topic string, recs ...*kgo.Record) {
	t.Helper()
	for _, r := range recs {
		r.Partition = 0
	}
	produceTo(t, kc, topic, recs...)
}

// commitByHand commits offset for topic/0 as an operator would, while the
// group is empty.
func commitByHand(t *testing.T, kc *testkafka.Cluster, group, topic string, offset int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(kc.Client()).CommitOffsets(ctx, group, kadm.Offsets{topic: {0: {Topic: topic, Partition: 0, At: offset, LeaderEpoch: -1}}})
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("committing %s/0 at %d by hand: %v", topic, offset, err)
	}
}

// Output: records read as text.

// kv is a record's key and value as text; a nil value (tombstone) is
// "<nil>".
type kv struct{ Key, Value string }

func (x kv) String() string { return x.Key + "=" + x.Value }

const tombstone = "<nil>"

// kvOf is r's key and value as text.
func kvOf(r *kgo.Record) kv {
	v := string(r.Value)
	if r.Value == nil {
		v = tombstone
	}
	return kv{string(r.Key), v}
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

// values returns the values of recs, marked "(dup)" when they carry the
// shadow header.
func values(recs []*kgo.Record) []string {
	var vs []string
	for _, r := range recs {
		v := string(r.Value)
		if headers(r)[pipeline.HeaderDuplicate] == "true" {
			v += "(dup)"
		}
		vs = append(vs, v)
	}
	return vs
}

func headers(r *kgo.Record) map[string]string {
	h := map[string]string{}
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	return h
}

// dump lists records for a message: partition/offset key=value, the
// first 20, each cut short.
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

// short cuts s to n bytes for messages.
func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:n], len(s))
}

// contains is strings.Contains, short for conditions.
func contains(s, sub string) bool { return strings.Contains(s, sub) }

// Waiting for the pipeline: records decided, output delivered, offsets
// committed, progress written.

// waitTimeout bounds every wait for the pipeline's output.
const waitTimeout = 60 * time.Second

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

// waitDelivered waits until "out" holds the n records keyed prefix-0 ...
// prefix-n-1.
func waitDelivered(t *testing.T, kc *testkafka.Cluster, prefix string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d records %s-* delivered", n, prefix), func() (bool, string) {
		got := byKey(kc.ReadAll("out"))
		k := 0
		for i := range n {
			if got[fmt.Sprintf("%s-%d", prefix, i)] != nil {
				k++
			}
		}
		return k == n, fmt.Sprintf("%d of %d delivered", k, n)
	})
}

// waitModel waits until topic holds, for every key of want, the key's
// values in want's order as their first occurrences (re-deliveries are
// allowed: at-least-once), and ends on the last of them; then it checks that
// nothing else was delivered.
func waitModel(t *testing.T, kc *testkafka.Cluster, topic string, want map[string][]string) []*kgo.Record {
	t.Helper()
	var out []*kgo.Record
	waitFor(t, fmt.Sprintf("%s to hold %v", topic, want), func() (bool, string) {
		out = kc.ReadAll(topic)
		firsts, last := map[string][]string{}, map[string]string{}
		seen := map[string]bool{}
		for _, r := range out {
			x := kvOf(r)
			last[x.Key] = x.Value
			if !seen[x.String()] {
				seen[x.String()] = true
				firsts[x.Key] = append(firsts[x.Key], x.Value)
			}
		}
		for k, vs := range want {
			if !slices.Equal(firsts[k], vs) || last[k] != vs[len(vs)-1] {
				return false, fmt.Sprintf("key %s: first deliveries %q, last %q; all: %s", k, firsts[k], last[k], dump(out))
			}
		}
		for k := range firsts {
			if _, ok := want[k]; !ok {
				return false, fmt.Sprintf("unexpected key %s: %s", k, dump(out))
			}
		}
		return true, ""
	})
	return out
}

// exactly checks that topic, read read_committed, holds each key's model
// values exactly once each, in order: no loss, no duplicate.
func exactly(t *testing.T, kc *testkafka.Cluster, topic string, want map[string][]string) {
	t.Helper()
	n := 0
	for _, vs := range want {
		n += len(vs)
	}
	out := waitOutput(t, kc, topic, n)
	got := byKey(out)
	for k, vs := range want {
		if !slices.Equal(got[k], vs) {
			t.Errorf("key %s: delivered %q, want exactly %q", k, got[k], vs)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d keys delivered, want %d", len(got), len(want))
	}
}

// waitCommitted waits until the group's committed offset of topic/part is
// want.
func waitCommitted(t *testing.T, kc *testkafka.Cluster, group, topic string, part int32, want int64) {
	t.Helper()
	adm := kadm.NewClient(kc.Client())
	waitFor(t, fmt.Sprintf("committed offset %d on %s/%d", want, topic, part), func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		offs, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return false, err.Error()
		}
		o, ok := offs.Lookup(topic, part)
		if !ok {
			return false, "no commit"
		}
		return o.At == want, fmt.Sprintf("committed %d", o.At)
	})
}

// waitProgress waits until P of partition part of topic reaches next.
func waitProgress(t *testing.T, store *dedup.Store, cfg config.Config, topic string, part int32, next int64) {
	t.Helper()
	waitProgressFrom(t, store, cfg, topic, part, next, next)
}

// waitProgressFrom waits until P of the partition is in [from, to]: where
// how many records a round takes is franz-go's to say (a round takes a
// buffered fetch whole when it can).
func waitProgressFrom(t *testing.T, store *dedup.Store, cfg config.Config, topic string, part int32, from, to int64) {
	t.Helper()
	p := dedup.Partition{Group: cfg.Kafka.Group, Topic: topic, Partition: part}
	waitFor(t, fmt.Sprintf("P of %s/%d in [%d, %d]", topic, part, from, to), func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		prog, err := store.ReadProgress(ctx, p)
		if err != nil {
			return false, err.Error()
		}
		return prog.HasNext && prog.Next >= from && prog.Next <= to, fmt.Sprintf("P=%d (set %v)", prog.Next, prog.HasNext)
	})
}
