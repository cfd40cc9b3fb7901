package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// bombBytes is what each compression bomb inflates to: 8 MiB of one byte,
// a few hundred bytes of zstd on the wire.
const bombBytes = 8 << 20

// produceBatches writes each record to topic (to its Partition) in a record batch of its own,
// compressed with zstd, in order.
func produceBatches(t *testing.T, kc *testkafka.Cluster, topic string, recs ...*kgo.Record) {
	t.Helper()
	cl := kc.Client(kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(16<<20), kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range recs {
		r.Topic = topic
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

// bomb is a record whose batch inflates to bombBytes.
func bomb(key string, part int32) *kgo.Record {
	return &kgo.Record{Key: []byte(key), Value: make([]byte, bombBytes), Partition: part}
}

// bombConfig bounds a batch at 2 MiB: every bomb is past it, every other
// record far within.
func bombConfig(t *testing.T, kc *testkafka.Cluster, dsn string, rt config.Route, delivery string) config.Config {
	cfg := inMode(testConfig(t, kc, dsn, rt), delivery)
	cfg.Pipeline.MaxDecompressedBatchBytes = 2 << 20
	cfg.Pipeline.MaxDecompressedFetchBytes = 4 << 20
	return cfg
}

// A record batch that inflates past pipeline.max_decompressed_batch_bytes
// is bad input for its offsets: each gets a dead letter naming the bound,
// the batch's offsets and where it came from, without key or value; the
// records around it, and the other partition, are delivered; nothing of
// the bomb is inflated past the bound.
func TestUndecompressableBatchDeadLettered(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 2, "in", "out", "dlq")
			dsn := pgtest.DSN(t)
			rt := route("svc", "in", "out")
			rt.DeadLetter = "dlq"
			cfg := bombConfig(t, kc, dsn, rt, delivery)
			a, b, c := rec("a", `1`), rec("b", `2`), rec("c", `3`)
			a.Partition, b.Partition, c.Partition = 0, 0, 1
			produceBatches(t, kc, "in", a, bomb("x", 0), bomb("y", 0), b, c)
			r := start(t, cfg, openStore(t, dsn))
			r.waitRecords("svc", 5)

			if got := byKey(kc.ReadAll("out")); len(got) != 3 || got["a"] == nil || got["b"] == nil || got["c"] == nil {
				t.Errorf("delivered %v, want a, b and c", got)
			}
			dl := kc.ReadAll("dlq")
			if len(dl) != 2 {
				t.Fatalf("dead letters: %s, want two", dump(dl))
			}
			seen := map[string]bool{}
			for _, d := range dl { // (spread over the dead-letter topic's partitions)
				h := headers(d)
				off := h[pipeline.HeaderSourceOffset]
				seen[off] = true
				if d.Key != nil || d.Value != nil || h[pipeline.HeaderSourcePartition] != "0" ||
					h[pipeline.HeaderValueDropped] != "unknown" ||
					!strings.Contains(h[pipeline.HeaderError], fmt.Sprintf("offsets [%s, ", off)) ||
					!strings.Contains(h[pipeline.HeaderError], "max_decompressed_batch_bytes") {
					t.Errorf("dead letter of offset %s: key %q, %d value bytes, headers %v", off, d.Key, len(d.Value), h)
				}
			}
			if !seen["1"] || !seen["2"] {
				t.Errorf("dead letters of offsets %v, want 1 and 2", seen)
			}
			if n := r.records("svc", "invalid"); n != 2 {
				t.Errorf("invalid counted %d, want 2", n)
			}
			r.stop()
		})
	}
}

// Without a dead-letter topic, the bomb halts its partition alone, with an
// error naming topic, partition and offsets; the record before it is
// delivered and committed, and the other partition goes on.
func TestUndecompressableBatchHaltsItsPartition(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 2, "in", "out")
			dsn := pgtest.DSN(t)
			cfg := bombConfig(t, kc, dsn, route("svc", "in", "out"), delivery)
			a, after := rec("a", `1`), rec("after", `2`)
			a.Partition, after.Partition = 0, 0
			produceBatches(t, kc, "in", a, bomb("x", 0), after)
			r := start(t, cfg, openStore(t, dsn))
			var err error
			waitFor(t, "in/0 halted", func() (bool, string) {
				err = r.pl.Ready()
				return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
			})
			for _, s := range []string{"in/0 offset 1", "offsets [1, 2)", "max_decompressed_batch_bytes"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("halt %q does not say %q", err, s)
				}
			}
			produceBatches(t, kc, "in", keyed(1, "b", 20)...)
			waitDelivered(t, kc, "b", 20)
			if got := byKey(kc.ReadAll("out")); got["after"] != nil {
				t.Errorf("the record after the bomb was delivered past the halt: %v", got)
			}
			r.stop()
		})
	}
}
