package pipeline_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// produceGate makes the broker refuse produce requests to some topics with
// a retriable error (NOT_ENOUGH_REPLICAS) while it is closed: the producer
// keeps retrying, nothing is delivered or committed, and a stopped
// pipeline's records fail at once (their context is canceled). It can be
// closed for one producer only (by producer id), and it remembers the last
// producer id it saw.
type produceGate struct {
	closed atomic.Bool
	only   atomic.Int64 // with closed: refuse only this producer id (0: all)
	last   atomic.Int64 // the last producer id seen producing to the topics
	topics []string
	ids    [][16]byte // the topics' ids: newer produce requests name topics by id
}

func newProduceGate(t *testing.T, kc *testkafka.Cluster, topics ...string) *produceGate {
	t.Helper()
	g := &produceGate{topics: topics}
	td, err := kadm.NewClient(kc.Client()).ListTopics(context.Background(), topics...)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range td {
		if d.Err != nil {
			t.Fatalf("produce gate: topic %s: %v", d.Topic, d.Err)
		}
		g.ids = append(g.ids, d.ID)
	}
	gated := func(t kmsg.ProduceRequestTopic) bool {
		return slices.Contains(g.topics, t.Topic) || slices.Contains(g.ids, t.TopicID)
	}
	kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		preq := req.(*kmsg.ProduceRequest)
		if !slices.ContainsFunc(preq.Topics, gated) {
			return nil, nil, false
		}
		pid := producerID(preq)
		g.last.Store(pid)
		if !g.closed.Load() || (g.only.Load() != 0 && g.only.Load() != pid) {
			return nil, nil, false
		}
		kc.KeepControl()
		resp := preq.ResponseKind().(*kmsg.ProduceResponse)
		for _, t := range preq.Topics {
			rt := kmsg.NewProduceResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition = p.Partition
				rp.ErrorCode = kerr.NotEnoughReplicas.Code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})
	return g
}

func (g *produceGate) close() { g.only.Store(0); g.closed.Store(true) }
func (g *produceGate) open()  { g.closed.Store(false) }

// closeFor closes the gate for one producer id only.
func (g *produceGate) closeFor(pid int64) { g.only.Store(pid); g.closed.Store(true) }

// producerID reads the producer id of the first record batch of a produce
// request (bytes 43 to 50 of a v2 batch), or -1.
func producerID(req *kmsg.ProduceRequest) int64 {
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			if len(p.Records) >= 51 {
				return int64(binary.BigEndian.Uint64(p.Records[43:51]))
			}
		}
	}
	return -1
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

// waitProgress waits until P of partition part of topic reaches next.
func waitProgress(t *testing.T, store *dedup.Store, cfg config.Config, topic string, part int32, next int64) {
	t.Helper()
	p := dedup.Partition{Group: cfg.Kafka.Group, Topic: topic, Partition: part}
	waitFor(t, fmt.Sprintf("P of %s/%d at %d", topic, part, next), func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		prog, err := store.ReadProgress(ctx, p)
		if err != nil {
			return false, err.Error()
		}
		return prog.HasNext && prog.Next == next, fmt.Sprintf("P=%d (set %v)", prog.Next, prog.HasNext)
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

// pgProxy puts a fault-injecting proxy in front of the test schema's
// PostgreSQL; it returns the proxy, the DSN through it and the direct DSN
// (for the test's own look at the store). Statements are sent with their
// text (exec mode), so that the proxy can see a COMMIT.
func pgProxy(t *testing.T) (*tcpproxy.Proxy, string, string) {
	t.Helper()
	direct := pgtest.DSN(t)
	target, rewrite := tcpproxy.PostgresDSN(t, direct)
	proxy := tcpproxy.New(t, target)
	return proxy, withParam(rewrite(proxy.Addr()), "default_query_exec_mode", "exec"), direct
}

func withParam(dsn, k, v string) string {
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + k + "=" + v
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
