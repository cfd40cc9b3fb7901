package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// produceOneBatch writes recs to partition 0 of topic in a single zstd
// record batch.
func produceOneBatch(t *testing.T, kc *testkafka.Cluster, topic string, recs ...*kgo.Record) {
	t.Helper()
	cl := kc.Client(kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(16<<20),
		kgo.ProducerLinger(time.Second), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range recs {
		r.Topic, r.Partition = topic, 0
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// A recovery replays [C, P) from the decision log. When a batch of that
// range no longer inflates within pipeline.max_decompressed_batch_bytes
// (the bound was lowered, or the batch was decided by a dam that had no
// bound), its offsets logged as forwarded cannot be delivered again as
// they were: none of their records was read. The replay never delivers a
// record standing for such an offset (no key, no value) as if it were the
// forward: it dead-letters it as bad input, or halts the partition, and
// in no case is the record lost behind a committed offset.
func TestReplayedForwardOfUndecompressableBatch(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1, "in", "out")
			dsn := pgtest.DSN(t)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			cfg.Pipeline.ShutdownGrace = time.Second
			store := openStore(t, dsn)
			gate := newProduceGate(t, kc, "out")
			gate.close()
			r := start(t, cfg, store)
			// Two records of 700 kB in one batch: 1.4 MB inflated, a few
			// kB on the wire; within the default bound (32 MiB).
			big := func(key string) *kgo.Record {
				return rec(key, `"`+strings.Repeat("a", 700_000)+`"`)
			}
			produceOneBatch(t, kc, "in", big("a"), big("b"))
			waitProgress(t, store, cfg, "in", 0, 2) // both decided, forwarded, not delivered
			r.crash()
			gate.open()

			// Restarted with the smallest bound the route allows (max_size
			// 1 MiB plus 64 KiB): the batch is now past it.
			cfg.Pipeline.MaxDecompressedBatchBytes = 1<<20 + 64<<10
			r = start(t, cfg, store)
			waitFor(t, "the replay delivered or halted", func() (bool, string) {
				if errors.Is(r.pl.Ready(), pipeline.ErrHalted) {
					return true, ""
				}
				out := kc.ReadAll("out")
				return len(out) >= 2, dump(out)
			})
			time.Sleep(2 * time.Second)
			for _, o := range kc.ReadAll("out") {
				if o.Key == nil && o.Value == nil {
					t.Errorf("the replay delivered an empty record (%v) in place of a logged forward of the undecompressable batch; committed past it: %s",
						headers(o), committedOf(t, kc, cfg.Kafka.Group, "in", 0))
				}
			}
			if err := r.pl.Ready(); !errors.Is(err, pipeline.ErrHalted) || !strings.Contains(err.Error(), "raise pipeline.max_decompressed_batch_bytes") {
				t.Errorf("replay of forwards it cannot read: %v, want a halt naming the bound to raise", err)
			}
			r.stop()

			// The bound raised back: the replay delivers both forwards.
			cfg.Pipeline.MaxDecompressedBatchBytes = config.Default().Pipeline.MaxDecompressedBatchBytes
			r = start(t, cfg, store)
			waitFor(t, "a and b delivered once the bound is raised", func() (bool, string) {
				got := byKey(kc.ReadAll("out"))
				return len(got["a"]) == 1 && len(got["b"]) == 1, fmt.Sprint(len(got["a"]), len(got["b"]))
			})
			r.stop()
		})
	}
}

// committedOf describes the group's committed offset of topic/part.
func committedOf(t *testing.T, kc *testkafka.Cluster, group, topic string, part int32) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(kc.Client()).FetchOffsets(ctx, group)
	if err != nil {
		return err.Error()
	}
	o, ok := offs.Lookup(topic, part)
	if !ok {
		return "none"
	}
	return fmt.Sprint(o.At)
}

// A dead letter of an undecompressable batch's offset that a recovery
// delivers again (the first never went out) names the same cause, the
// decompression bound, even when the bound was raised meanwhile (what an
// operator does on seeing such dead letters) and the record now reads
// fine: the decision log keeps the cause of each invalid entry.
func TestReplayedUndecompressableDeadLetterKeepsItsCause(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc, dsn, cfg := deadLetterRig(t, delivery)
			cfg.Pipeline.ShutdownGrace = time.Second
			cfg.Pipeline.MaxDecompressedBatchBytes = 1<<20 + 64<<10
			store := openStore(t, dsn)
			gate := newProduceGate(t, kc, "out", "dlq")
			gate.close()
			r := start(t, cfg, store)
			big := func(key string) *kgo.Record {
				return rec(key, `"`+strings.Repeat("a", 700_000)+`"`)
			}
			produceOneBatch(t, kc, "in", big("a"), big("b"))
			waitProgress(t, store, cfg, "in", 0, 2) // both dead-lettered, not delivered
			r.crash()
			gate.open()

			cfg.Pipeline.MaxDecompressedBatchBytes = 32 << 20
			r = start(t, cfg, store)
			dl := waitOutput(t, kc, "dlq", 2)
			for _, d := range dl {
				if h := headers(d)[pipeline.HeaderError]; !strings.Contains(h, "max_decompressed_batch_bytes") {
					t.Errorf("replayed dead letter of offset %s says %q, want the decompression bound", headers(d)[pipeline.HeaderSourceOffset], h)
				}
			}
			r.stop()
		})
	}
}
