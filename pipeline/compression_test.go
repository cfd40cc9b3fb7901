package pipeline_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// codecNames are the record batch attribute's compression codecs.
var codecNames = map[int16]string{0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

// producedCodecs records, per topic, the codecs of the record batches
// produced to kc, as the broker receives them.
type producedCodecs struct {
	mu    sync.Mutex
	codec map[string][]string
}

// watchCodecs watches the produce requests to topics.
func watchCodecs(t *testing.T, kc *testkafka.Cluster, topics ...string) *producedCodecs {
	pc := &producedCodecs{codec: map[string][]string{}}
	// Produce v13 names topics by ID.
	names := map[[16]byte]string{}
	for _, topic := range topics {
		names[kc.TopicInfo(topic).TopicID] = topic
	}
	kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			topic := tp.Topic
			if topic == "" {
				topic = names[tp.TopicID]
			}
			for _, p := range tp.Partitions {
				var b kmsg.RecordBatch
				if err := b.ReadFrom(p.Records); err != nil {
					t.Errorf("produce to %s: unreadable record batch: %v", topic, err)
					continue
				}
				pc.mu.Lock()
				pc.codec[topic] = append(pc.codec[topic], codecNames[b.Attributes&0x07])
				pc.mu.Unlock()
			}
		}
		return nil, nil, false // observed, not handled: the broker stores it
	})
	return pc
}

// seen returns the distinct codecs of the batches produced to topic.
func (pc *producedCodecs) seen(topic string) []string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	s := slices.Clone(pc.codec[topic])
	slices.Sort(s)
	return slices.Compact(s)
}

// kafka.compression decides the codec of every batch dam produces,
// forwards and dead letters alike (one producer); none by default, and
// the first of a preference list the broker supports.
func TestCompression(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		setting config.Codecs
		broker  *kversion.Versions // nil: the latest
		want    string
	}{
		{nil, nil, "none"},
		{config.Codecs{"none"}, nil, "none"},
		{config.Codecs{"gzip"}, nil, "gzip"},
		{config.Codecs{"snappy"}, nil, "snappy"},
		{config.Codecs{"lz4"}, nil, "lz4"},
		{config.Codecs{"zstd"}, nil, "zstd"},
		{config.Codecs{"zstd", "gzip"}, nil, "zstd"},
		// Kafka 2.0 predates zstd (produce v7): the next preference.
		{config.Codecs{"zstd", "gzip"}, kversion.V2_0_0(), "gzip"},
	} {
		name := fmt.Sprint(tc.setting)
		if tc.broker != nil {
			name += " on Kafka 2.0"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var kc *testkafka.Cluster
			if tc.broker != nil {
				kc = testkafka.NewWith(t, 1, []string{"in", "out", "dlq"}, []kfake.Opt{kfake.MaxVersions(tc.broker)})
			} else {
				kc = testkafka.New(t, 1, "in", "out", "dlq")
			}
			pc := watchCodecs(t, kc, "out", "dlq")
			dsn := pgtest.DSN(t)
			rt := route("svc", "in", "out")
			rt.DeadLetter = "dlq"
			cfg := testConfig(t, kc, dsn, rt)
			cfg.Kafka.Compression = tc.setting
			r := start(t, cfg, openStore(t, dsn))
			// Compressible values: franz-go sends a batch that a codec
			// would not shrink uncompressed.
			text := string(slices.Repeat([]byte("dam "), 64))
			v := `{"text":"` + text + `"}`
			kc.Produce("in", rec("a", v), rec("a", v), rec("b", v), rec("c", `{"broken":"`+text))
			r.waitRecords("svc", 4)
			if got := byKey(waitOutput(t, kc, "out", 2)); len(got["a"]) != 1 || len(got["b"]) != 1 {
				t.Errorf("output %v, want one a and one b", got)
			}
			waitOutput(t, kc, "dlq", 1)
			for _, topic := range []string{"out", "dlq"} {
				if got := pc.seen(topic); !slices.Equal(got, []string{tc.want}) {
					t.Errorf("%s: batches compressed with %q, want only %s", topic, got, tc.want)
				}
			}
			r.stop()
		})
	}
}
