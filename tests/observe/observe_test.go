package observe

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.yaml.in/yaml/v3"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

const (
	chartDir  = "../../charts/dam"
	service   = "watch"
	inTopic   = "projections.watch"
	outTopic  = "delivery.watch"
	deadTopic = "delivery.watch.dlq"
	group     = "dam-observe"
)

// model is the reference last-seen model: per entity, the content last
// forwarded; it counts what dam must forward and drop.
type model struct {
	last                 map[string]string
	forwarded, duplicate int
	invalid              int
}

// stream appends n records over entities entities to the model and
// returns them. About dupShare of them repeat their entity's last content,
// with the JSON members in another order (a structural duplicate).
func (m *model) stream(rng *rand.Rand, n, entities int, dupShare float64) []*kgo.Record {
	recs := make([]*kgo.Record, 0, n)
	for range n {
		key := fmt.Sprintf("e%03d", rng.IntN(entities))
		content, seen := m.last[key]
		if !seen || rng.Float64() >= dupShare {
			content = fmt.Sprintf("%d", rng.Int64())
		}
		var value string
		if rng.IntN(2) == 0 {
			value = fmt.Sprintf(`{"id":%q,"content":%q,"updated_at":"%d"}`, key, content, rng.Int())
		} else {
			value = fmt.Sprintf(`{"updated_at":"%d", "content":%q, "id":%q}`, rng.Int(), content, key)
		}
		if seen && content == m.last[key] {
			m.duplicate++
		} else {
			m.forwarded++
		}
		m.last[key] = content
		recs = append(recs, &kgo.Record{Topic: inTopic, Key: []byte(key), Value: []byte(value)})
	}
	return recs
}

// bad returns n records dam must dead-letter (invalid JSON).
func (m *model) bad(n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: inTopic, Key: []byte(fmt.Sprintf("bad%d", i)), Value: []byte(`{"id": "bad", "id": 1}`)}
	}
	m.invalid += n
	return recs
}

func (m *model) total() int { return m.forwarded + m.duplicate + m.invalid }

// TestPrometheusEndToEnd pushes a known stream through a running dam
// scraped by a real Prometheus and checks what Prometheus reports against
// the model; then it provokes a PostgreSQL outage and a failed offset
// commit, so that every metric dam registers has a series, and checks
// every expression of the dashboard and the rules against a real scrape.
func TestPrometheusEndToEnd(t *testing.T) {
	damBin := buildDam(t)
	rulesFile, err := filepath.Abs(filepath.Join(chartDir, "alerts", "dam.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kc := testkafka.New(t, 3, inTopic, outTopic, deadTopic)
	pgTarget, rewrite := tcpproxy.PostgresDSN(t, pgtest.DSN(t))
	pgProxy := tcpproxy.New(t, pgTarget)
	httpAddr := freeAddr(t)
	cfgPath := filepath.Join(t.TempDir(), "dam.yaml")
	cfg := fmt.Sprintf(`kafka:
  brokers: [%q]
  group: %s
  start: earliest
  session_timeout: 6s
  rebalance_timeout: 40s
  transaction_timeout: 5s
postgres:
  dsn: %q
  statement_timeout: 2s
  lock_timeout: 1s
  idle_in_transaction_timeout: 2s
http:
  listen: %q
log:
  level: warn
pipeline:
  batch_size: 200
  max_in_flight: 1000
  retry_min: 50ms
  retry_max: 500ms
routes:
  - service: %s
    from: %s
    to: %s
    dead_letter: %s
    ignore: [/updated_at]
`, kc.Addr(), group, rewrite(pgProxy.Addr()), httpAddr, service, inTopic, outTopic, deadTopic)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	dam := start(t, "dam", httpAddr, damBin, "run", "--config", cfgPath)
	if err := dam.WaitReady(context.Background(), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	prom := startPrometheus(t, httpAddr, rulesFile)
	procs := []*process{dam}

	m := &model{last: map[string]string{}}
	rng := rand.New(rand.NewPCG(11, 12))

	// counted waits until dam's /metrics counts the model's every record,
	// then until Prometheus has scraped that, and returns the timestamp of
	// the scrape that did.
	counted := func(what string) time.Time {
		t.Helper()
		want := float64(m.total())
		waitFor(t, 2*time.Minute, what+": dam counts every record", procs, func() (bool, string) {
			s, err := scrape(httpAddr)
			got := s.Sum("dam_records_total")
			return err == nil && got == want, fmt.Sprintf("%v of %v (%v)", got, want, err)
		})
		var at time.Time
		waitFor(t, 30*time.Second, what+": Prometheus scrapes the counts", procs, func() (bool, string) {
			res, err := prom.query(`sum(dam_records_total)`, time.Time{})
			if err != nil || len(res) != 1 {
				return false, fmt.Sprint(res, err)
			}
			v, _ := sampleValue(res[0].Value)
			if v != want {
				return false, fmt.Sprintf("%v of %v", v, want)
			}
			// The latest raw sample: its timestamp is the scrape's.
			raw, err := prom.query(fmt.Sprintf(`dam_records_total{service=%q, outcome="forwarded"}[10s]`, service), time.Time{})
			if err != nil || len(raw) != 1 || len(raw[0].Values) == 0 {
				return false, fmt.Sprint(raw, err)
			}
			last := raw[0].Values[len(raw[0].Values)-1]
			if lv, _ := sampleValue(last); lv != float64(m.forwarded) {
				return false, fmt.Sprintf("last forwarded sample %v, want %d", lv, m.forwarded)
			}
			at = sampleTime(last)
			return true, ""
		})
		return at
	}

	// Prometheus has scraped dam before any record: dam_dead_letters_total
	// exists at 0 from the start, so the first dead letters are an
	// increase (DamDeadLetters fires on them).
	waitFor(t, 30*time.Second, "first scrape", procs, func() (bool, string) {
		v, err := prom.scalar(`sum(dam_dead_letters_total)`, time.Time{})
		return err == nil && v == 0, fmt.Sprint(v, err)
	})

	// Phase 1 creates every outcome's series, dead letters included.
	kc.Produce(inTopic, append(m.stream(rng, 400, 80, 0.4), m.bad(5)...)...)
	s0 := counted("phase 1")
	f1, d1 := m.forwarded, m.duplicate

	// Phase 2: the known stream whose duplicate rate Prometheus reports.
	kc.Produce(inTopic, m.stream(rng, 3000, 300, 0.4)...)
	s1 := counted("phase 2")
	f2, d2 := m.forwarded-f1, m.duplicate-d1
	t.Logf("model: phase 1 %d forwarded, %d duplicates, %d invalid; phase 2 %d forwarded, %d duplicates", f1, d1, m.invalid, f2, d2)

	for _, c := range []struct {
		expr string
		want float64
	}{
		{`sum(dam_records_total{outcome="forwarded"})`, float64(m.forwarded)},
		{`sum(dam_records_total{outcome="duplicate"})`, float64(m.duplicate)},
		{`sum(dam_records_total{outcome="invalid"})`, float64(m.invalid)},
		{`sum(dam_dead_letters_total)`, float64(m.invalid)},
	} {
		got, err := prom.scalar(c.expr, s1)
		if err != nil || got != c.want {
			t.Errorf("Prometheus: %s = %v (%v), want %v", c.expr, got, err, c.want)
		}
	}
	// The dashboard's duplicate-drop rate over exactly phase 2: the window
	// starts on the last scrape before it and ends on the scrape after it,
	// so every series has samples at both ends and the rate's
	// extrapolation is the same for all of them.
	window := fmt.Sprintf("%dms", s1.Sub(s0).Milliseconds()+1)
	dupRate := dashboardExpr(t, "Duplicate-drop rate", 0)
	got, err := prom.scalar(grafanaVars(dupRate, window), s1)
	want := float64(d2) / float64(f2+d2)
	if err != nil || math.Abs(got-want) > 1e-9 {
		t.Errorf("Prometheus: duplicate-drop rate %v (%v), want %v (%d of %d)", got, err, want, d2, f2+d2)
	}
	fwdIncrease, err := prom.scalar(fmt.Sprintf(`sum(increase(dam_records_total{outcome="forwarded"}[%s]))`, window), s1)
	// increase() extrapolates to the window's start, 1 ms before the first
	// sample: up to f2 × 1 ms / phase 2's length more (0.1% of a 1 s phase).
	slack := 0.001*float64(f2) + float64(f2)/float64(max(s1.Sub(s0).Milliseconds(), 1))
	if err != nil || math.Abs(fwdIncrease-float64(f2)) > slack {
		t.Errorf("Prometheus: forwarded over phase 2 %v (%v), want %d", fwdIncrease, err, f2)
	}
	// What reached Kafka is what Prometheus counted.
	if out, dead := len(kc.ReadAll(outTopic)), len(kc.ReadAll(deadTopic)); out != m.forwarded || dead != m.invalid {
		t.Errorf("%s holds %d records, %s %d; the model forwards %d and dead-letters %d", outTopic, out, deadTopic, dead, m.forwarded, m.invalid)
	}

	// Prometheus loaded every rule and fires DamDeadLetters, not DamDown.
	waitFor(t, 30*time.Second, "DamDeadLetters firing", procs, func() (bool, string) {
		a, err := prom.alerts()
		return err == nil && slices.Contains(a["DamDeadLetters"], service), fmt.Sprint(a, err)
	})
	rules, err := prom.rules()
	if err != nil || len(rules) != 7 {
		t.Errorf("Prometheus loaded rules %v (%v), want 7", rules, err)
	}
	for name, health := range rules {
		if health != "ok" {
			t.Errorf("rule %s: health %q", name, health)
		}
	}
	if a, err := prom.alerts(); err != nil || len(a["DamDown"]) > 0 || len(a["DamHalted"]) > 0 {
		t.Errorf("firing alerts %v (%v): DamDown and DamHalted must not fire", a, err)
	}

	// Phase 3: PostgreSQL cut while records arrive: store errors.
	pgProxy.Cut()
	kc.Produce(inTopic, m.stream(rng, 20, 300, 0.4)...)
	waitFor(t, time.Minute, "store errors counted", procs, func() (bool, string) {
		s, err := scrape(httpAddr)
		return err == nil && s.Sum("dam_store_errors_total") > 0, fmt.Sprint(err)
	})
	pgProxy.Restore()
	counted("phase 3")

	// Phase 4: one offset commit refused by the broker: a delivery error.
	var refused atomic.Bool
	kc.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.OffsetCommitRequest)
		if r.Group != group {
			return nil, nil, false
		}
		resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.OffsetMetadataTooLarge.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		refused.Store(true)
		return resp, nil, true
	})
	kc.Produce(inTopic, m.stream(rng, 20, 300, 0.4)...)
	waitFor(t, time.Minute, "delivery errors counted", procs, func() (bool, string) {
		s, err := scrape(httpAddr)
		return err == nil && s.Sum("dam_delivery_errors_total") > 0, fmt.Sprint(refused.Load(), err)
	})
	counted("phase 4")

	// Every metric dam registers now has a series: take the names from a
	// real scrape and check every expression against them.
	scraped, err := scrape(httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	names := scraped.SampleNames()
	for _, n := range []string{"dam_records_total", "dam_dead_letters_total", "dam_store_errors_total", "dam_delivery_errors_total",
		"dam_decision_seconds_bucket", "dam_poll_to_commit_seconds_bucket", "dam_consumer_lag", "dam_halted", "dam_state_rows",
		"dam_partitions_assigned", "dam_records_in_flight", "dam_build_info", "dam_postgres_pool_acquired_connections", "dam_postgres_pool_acquire_wait_seconds_total"} {
		if !names[n] {
			t.Errorf("the scrape has no %s", n)
		}
	}
	checkExpressions(t, prom, names)
}

// panel is a dashboard panel with its queries.
type panel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func dashboardPanels(t *testing.T) []panel {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "dam.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	return d.Panels
}

// dashboardExpr returns query i of the panel titled title.
func dashboardExpr(t *testing.T, title string, i int) string {
	t.Helper()
	for _, p := range dashboardPanels(t) {
		if p.Title == title && i < len(p.Targets) {
			return p.Targets[i].Expr
		}
	}
	t.Fatalf("no query %d in a dashboard panel %q", i, title)
	return ""
}

// grafanaVars replaces the dashboard's variables by what Grafana would
// send: every service, and rateInterval for $__rate_interval.
func grafanaVars(expr, rateInterval string) string {
	return strings.NewReplacer("$__rate_interval", rateInterval, "$service", ".*").Replace(expr)
}

// ruleExprs returns the alert rules' expressions by alert name.
func ruleExprs(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "alerts", "dam.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Expr
		}
	}
	if len(out) == 0 {
		t.Fatal("no alert rules")
	}
	return out
}

// prometheusOwn are series Prometheus makes itself, not dam.
var prometheusOwn = map[string]bool{"up": true}

// metricNames parses expr with Prometheus's parser and returns the metric
// names its selectors use; a selector without a name is an error.
func metricNames(expr string) ([]string, error) {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	var bad error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			if vs.Name == "" {
				bad = fmt.Errorf("selector %s names no metric", vs)
			}
			names = append(names, vs.Name)
		}
		return nil
	})
	return names, bad
}

// checkExpressions parses every expression of the dashboard and the rules
// and checks that each metric it names is in the scrape (names) or made
// by Prometheus; the real Prometheus must accept each one too, and each
// dashboard query must show data.
func checkExpressions(t *testing.T, prom *prometheus, names map[string]bool) {
	t.Helper()
	type source struct{ where, expr string }
	var all []source
	for _, p := range dashboardPanels(t) {
		for i, tg := range p.Targets {
			all = append(all, source{fmt.Sprintf("dashboard panel %q query %d", p.Title, i), grafanaVars(tg.Expr, "1m")})
		}
	}
	rules := ruleExprs(t)
	alerts := make([]string, 0, len(rules))
	for a := range rules {
		alerts = append(alerts, a)
	}
	sort.Strings(alerts)
	for _, a := range alerts {
		all = append(all, source{"alert " + a, rules[a]})
	}
	if len(all) < 20 {
		t.Fatalf("only %d expressions found", len(all))
	}
	used := map[string]bool{}
	for _, s := range all {
		ns, err := metricNames(s.expr)
		if err != nil {
			t.Errorf("%s: %v", s.where, err)
			continue
		}
		for _, n := range ns {
			used[n] = true
			if !names[n] && !prometheusOwn[n] {
				t.Errorf("%s uses %s, which dam does not expose", s.where, n)
			}
		}
		if _, err := prom.query(s.expr, time.Time{}); err != nil {
			t.Errorf("%s: Prometheus refuses it: %v", s.where, err)
		}
	}
	t.Logf("%d expressions use %d metrics", len(all), len(used))
	// A rate needs two samples of a series: the ones the last phase
	// created show after one more scrape.
	waitFor(t, 20*time.Second, "every dashboard query shows data", nil, func() (bool, string) {
		var empty []string
		for _, s := range all {
			if !strings.HasPrefix(s.where, "dashboard") {
				continue
			}
			if res, err := prom.query(s.expr, time.Time{}); err != nil || len(res) == 0 {
				empty = append(empty, fmt.Sprintf("%s: %s (%v)", s.where, s.expr, err))
			}
		}
		return len(empty) == 0, strings.Join(empty, "; ")
	})
}

// TestMetricNamesParser: the name extraction sees through functions,
// aggregations, binary operators and subqueries, and refuses a selector
// without a name.
func TestMetricNamesParser(t *testing.T) {
	got, err := metricNames(`histogram_quantile(0.99, sum by (le) (rate(a_bucket{x="y"}[5m]))) > 0.25 and on() max_over_time(b[1h:1m]) unless c offset 5m or absent(up{job="dam"})`)
	if err != nil || !slices.Equal(got, []string{"a_bucket", "b", "c", "up"}) {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := metricNames(`{__name__=~"dam_.*"}`); err == nil {
		t.Fatal("a selector without a name passed")
	}
	if _, err := metricNames(`sum(rate(x[5m])`); err == nil {
		t.Fatal("a syntax error passed")
	}
}
