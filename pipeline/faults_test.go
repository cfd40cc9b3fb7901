package pipeline_test

import (
	"context"
	"encoding/binary"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dam-dedup/dam/internal/pgtest"
	"github.com/dam-dedup/dam/internal/tcpproxy"
	"github.com/dam-dedup/dam/internal/testkafka"
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
