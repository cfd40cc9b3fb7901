// Package testkafka wraps franz-go's in-process broker (kfake, which speaks
// the real Kafka wire protocol) for tests: a cluster on a loopback TCP port
// closed at cleanup, and helpers to produce and to read a topic whole.
package testkafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Cluster is a kfake broker for one test.
type Cluster struct {
	*kfake.Cluster
	t testing.TB
	// opts are given to every client the Cluster makes (credentials, TLS).
	opts []kgo.Opt
}

// New starts a broker on 127.0.0.1 with the topics created, each with
// partitions partitions, and closes it when the test ends.
func New(t testing.TB, partitions int32, topics ...string) *Cluster {
	t.Helper()
	return NewWith(t, partitions, topics, nil)
}

// NewWith is New with more kfake options (kfake.EnableSASL, kfake.TLS),
// and with clientOpts given to every client the Cluster makes, so that its
// helpers get past the broker's authentication.
func NewWith(t testing.TB, partitions int32, topics []string, kfakeOpts []kfake.Opt, clientOpts ...kgo.Opt) *Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.SeedTopics(partitions, topics...)}, kfakeOpts...)...)
	if err != nil {
		t.Fatalf("testkafka: starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return &Cluster{Cluster: c, t: t, opts: clientOpts}
}

// Addr is the broker's host:port.
func (c *Cluster) Addr() string { return c.ListenAddrs()[0] }

// Client returns a client of the cluster, closed at cleanup.
func (c *Cluster) Client(opts ...kgo.Opt) *kgo.Client {
	c.t.Helper()
	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(c.Addr())}, c.opts...), opts...)...)
	if err != nil {
		c.t.Fatalf("testkafka: client: %v", err)
	}
	c.t.Cleanup(cl.Close)
	return cl
}

// CreateTopic creates a topic after the start, with topic configs
// (name=value pairs, e.g. "cleanup.policy", "compact").
func (c *Cluster) CreateTopic(topic string, partitions int32, configs ...string) {
	c.t.Helper()
	if len(configs)%2 != 0 {
		c.t.Fatalf("testkafka: create topic %s: configs must be name, value pairs", topic)
	}
	var cfg map[string]*string
	for i := 0; i < len(configs); i += 2 {
		if cfg == nil {
			cfg = map[string]*string{}
		}
		cfg[configs[i]] = &configs[i+1]
	}
	adm := kadm.NewClient(c.Client())
	resp, err := adm.CreateTopic(context.Background(), partitions, 1, cfg, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		c.t.Fatalf("testkafka: create topic %s: %v", topic, err)
	}
}

// Produce writes records synchronously, failing the test on any error.
// Records without a topic go to topic.
func (c *Cluster) Produce(topic string, recs ...*kgo.Record) {
	c.t.Helper()
	cl := c.Client()
	for _, r := range recs {
		if r.Topic == "" {
			r.Topic = topic
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		c.t.Fatalf("testkafka: produce: %v", err)
	}
}

// ReadAll reads every committed record of topic, all partitions, from the
// start to the high watermark as of the call (read_committed).
func (c *Cluster) ReadAll(topic string) []*kgo.Record {
	c.t.Helper()
	recs, err := ReadAll(c.Addr(), topic, c.opts...)
	if err != nil {
		c.t.Fatalf("testkafka: read %s: %v", topic, err)
	}
	return recs
}

// ReadAll reads every committed record of topic from brokers, all
// partitions, from the start to the end offsets as of the call; opts are
// given to its clients (credentials, TLS).
func ReadAll(brokers, topic string, opts ...kgo.Opt) ([]*kgo.Record, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers)}, opts...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	want := map[int32]int64{}
	total := int64(0)
	ends.Each(func(o kadm.ListedOffset) {
		s, _ := starts.Lookup(topic, o.Partition)
		if o.Offset > s.Offset {
			want[o.Partition] = o.Offset
			total += o.Offset - s.Offset
		}
	})
	if total == 0 {
		return nil, nil
	}
	parts := map[int32]kgo.Offset{}
	for p := range want {
		parts[p] = kgo.NewOffset().AtStart()
	}
	// Control records (transaction markers) are kept, to be recognised:
	// the last offset of a transactional topic is a marker.
	rd, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords()}, opts...)...)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	var out []*kgo.Record
	done := map[int32]bool{}
	for len(done) < len(want) {
		fs := rd.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return out, err
		}
		fs.EachError(func(_ string, _ int32, err error) {})
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < want[r.Partition] && !r.Attrs.IsControl() {
				out = append(out, r)
			}
			if r.Offset+1 >= want[r.Partition] {
				done[r.Partition] = true
			}
		})
	}
	return out, nil
}
