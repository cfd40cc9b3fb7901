package explain_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/explain"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// t0 is the decision time the mode tests start from: the clock is given
// (Batch.Now, and the Explainer's clock), so boundaries are exact to the
// microsecond.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

const us = time.Microsecond

// env is a kfake cluster with the input topic "in" (one partition), a
// schema, and a configuration whose route "svc" reads "in", for group "g".
// Tests decide records as the sidecar does (the route's Identify and rule,
// logged batches) and ask an Explainer.
type env struct {
	t     *testing.T
	kc    *testkafka.Cluster
	cfg   config.Config
	store *dedup.Store
	route *pipeline.Route // svc's, compiled as the sidecar runs it
	p     dedup.Partition
	epoch int64
	next  int64 // P
	clock func(context.Context) (time.Time, error)
}

// newEnv: route "svc" has the settings routeYAML (lines indented for a
// route's keys); more holds further routes ("  - service: ..." items).
func newEnv(t *testing.T, routeYAML string, more ...string) *env {
	t.Helper()
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	path := filepath.Join(t.TempDir(), "dam.yaml")
	body := fmt.Sprintf("kafka:\n  brokers: [%s]\n  group: g\npostgres:\n  dsn: %q\nroutes:\n  - service: svc\n    from: in\n    to: out\n%s%s",
		kc.Addr(), dsn, routeYAML, strings.Join(more, ""))
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	e := &env{t: t, kc: kc, cfg: cfg, store: store, p: dedup.Partition{Group: "g", Topic: "in", Partition: 0}}
	e.route = e.compiled("svc")
	pr, err := store.Acquire(context.Background(), e.p)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.InitProgress(context.Background(), e.p, pr.Epoch, 0); err != nil {
		t.Fatal(err)
	}
	e.epoch = pr.Epoch
	return e
}

// compiled returns service's route compiled as the sidecar runs it, nil
// when the configuration has none.
func (e *env) compiled(service string) *pipeline.Route {
	e.t.Helper()
	for _, rc := range e.cfg.Routes {
		if rc.Service == service {
			r, err := pipeline.CompileRoute(rc)
			if err != nil {
				e.t.Fatal(err)
			}
			return r
		}
	}
	return nil
}

// produce writes records (key, value) to "in".
func (e *env) produce(kv ...string) {
	e.t.Helper()
	var recs []*kgo.Record
	for i := 0; i < len(kv); i += 2 {
		recs = append(recs, &kgo.Record{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
	}
	e.kc.Produce("in", recs...)
}

// hrec builds an input record with headers given as name, value pairs.
func hrec(key, value string, headers ...string) *kgo.Record {
	r := &kgo.Record{Key: []byte(key), Value: []byte(value)}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
	}
	return r
}

// decide decides the next n records of "in" on the database's clock.
func (e *env) decide(n int) string {
	e.t.Helper()
	return e.decideAt(time.Time{}, n)
}

// decideAt decides the next n records of "in" as the sidecar does (the
// route's Identify and rule, one batch, logged) at now (zero: the
// database's clock), and returns the decisions.
func (e *env) decideAt(now time.Time, n int) string {
	e.t.Helper()
	ctx := context.Background()
	recs := e.kc.ReadAll("in")
	b := &dedup.Batch{Service: "svc", Rule: e.route.Rule(), Now: now, Partition: e.p, Epoch: e.epoch, Start: e.next, End: e.next + int64(n)}
	for _, r := range recs[e.next : e.next+int64(n)] {
		id, v, d, err := e.route.Identify(r)
		b.Records = append(b.Records, dedup.Record{Offset: r.Offset, Entity: id, Version: v, Digest: d, Invalid: err != nil})
	}
	out, err := e.store.Decide(ctx, b, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if !now.IsZero() {
		// The sidecar logs a batch at its decide transaction's start, a
		// moment before it reads its decision time: a batch decided at a
		// given time is logged at that time.
		if _, err := e.store.Pool().Exec(ctx, `UPDATE decision_log SET logged_at = $1 WHERE grp = $2 AND topic = $3 AND part = $4 AND first_offset = $5`,
			now, e.p.Group, e.p.Topic, e.p.Partition, b.Start); err != nil {
			e.t.Fatal(err)
		}
	}
	e.next = b.End
	var s []string
	for _, d := range out {
		s = append(s, d.String())
	}
	return strings.Join(s, " ")
}

// at stops the Explainer's clock at now for the rest of the test, to
// explain exactly at a boundary.
func (e *env) at(now time.Time) {
	e.clock = func(context.Context) (time.Time, error) { return now, nil }
}

// explainer returns an Explainer of the environment's group.
func (e *env) explainer(opts ...explain.Option) *explain.Explainer {
	if e.clock != nil {
		opts = append(opts, explain.WithClock(e.clock))
	}
	return explain.New(e.store, e.kc.Client(), "g", opts...)
}

// offsetErr explains the record of "in" at offset with route svc, reading
// lookback records before it (-1: the default).
func (e *env) offsetErr(offset, lookback int64) (*explain.OffsetExplanation, error) {
	var opts []explain.Option
	if lookback >= 0 {
		opts = append(opts, explain.WithLookback(lookback))
	}
	return e.explainer(opts...).Offset(context.Background(), e.route, 0, offset)
}

// offset is offsetErr with the default lookback; it fails the test on an
// error.
func (e *env) offset(offset int64) *explain.OffsetExplanation {
	e.t.Helper()
	return e.offsetLookback(offset, -1)
}

func (e *env) offsetLookback(offset, lookback int64) *explain.OffsetExplanation {
	e.t.Helper()
	res, err := e.offsetErr(offset, lookback)
	if err != nil {
		e.t.Fatalf("explain offset %d: %v", offset, err)
	}
	return res
}

// payloadErr asks whether value (nil: none) would be forwarded now for
// (service, entity), headers given as name, value pairs.
func (e *env) payloadErr(service, entity string, value *string, headers ...string) (*explain.PayloadExplanation, error) {
	q := explain.Query{Service: service, Entity: []byte(entity), Headers: hrec("", "", headers...).Headers}
	if r := e.compiled(service); r != nil {
		q.Route = r
	}
	if value != nil {
		q.Value, q.HasValue = []byte(*value), true
	}
	return e.explainer().Payload(context.Background(), q)
}

func (e *env) payload(service, entity string, value *string, headers ...string) *explain.PayloadExplanation {
	e.t.Helper()
	res, err := e.payloadErr(service, entity, value, headers...)
	if err != nil {
		e.t.Fatalf("explain %s %s: %v", service, entity, err)
	}
	return res
}

// text is a payload for payload and payloadErr.
func text(s string) *string { return &s }

// deleteRecords deletes the records of "in" below offset (retention).
func (e *env) deleteRecords(below int64) {
	e.t.Helper()
	to := kadm.Offsets{}
	to.AddOffset("in", 0, below, -1)
	if _, err := kadm.NewClient(e.kc.Client()).DeleteRecords(context.Background(), to); err != nil {
		e.t.Fatal(err)
	}
}

// pruneLog prunes the decision log below offset, as delivery does.
func (e *env) pruneLog(below int64) {
	e.t.Helper()
	if _, err := e.store.PruneLog(context.Background(), e.p, below); err != nil {
		e.t.Fatal(err)
	}
}

// diffText is an offset explanation's difference as dam explain prints it.
func diffText(res *explain.OffsetExplanation) string {
	if res.Difference == nil {
		return "(none)"
	}
	return fmt.Sprintf("%s (offset %d -> %d)", res.Difference, res.DifferenceFrom, res.Offset)
}

// sumOf is value's digest under canon's defaults.
func sumOf(t *testing.T, value string) canon.Digest {
	t.Helper()
	h, err := canon.New()
	if err != nil {
		t.Fatal(err)
	}
	d, err := h.Sum([]byte(value))
	if err != nil {
		t.Fatal(err)
	}
	return d
}
