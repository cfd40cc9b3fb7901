package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// A valid record above franz-go's default batch limit (1,000,012 bytes)
// but within max_size is delivered once: the producer's limit follows the
// output topic's max.message.bytes, so the record is not refused, retried
// for ever and produced again with every retry.
func TestRecordAboveProducerDefault(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	r := start(t, cfg, openStore(t, dsn))
	big := `"` + strings.Repeat("x", 1_020_000) + `"`
	cl := kc.Client(kgo.ProducerBatchMaxBytes(1048588), kgo.DefaultProduceTopic("in"))
	if err := cl.ProduceSync(context.Background(), rec("small", `1`), rec("big", big), rec("small2", `2`)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	r.waitRecords("svc", 3)
	out := kc.ReadAll("out")
	if len(out) != 3 || len(out[1].Value) != len(big) {
		t.Fatalf("delivered %d records (%s), want the 3 once each", len(out), dump(out))
	}
	r.stop()
}

// A record Kafka refuses for good goes to the dead-letter topic without
// its value, with headers saying it was dropped and why; the records
// around it are delivered exactly once (never produced again).
func TestRefusedRecordDeadLettered(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "dlq")
	kc.CreateTopic("out", 1, "max.message.bytes", "200000")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	rt.MaxSize = 150_000
	cfg := testConfig(t, kc, dsn, rt)
	r := start(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("a", `1`), bigKeyed(140_000), rec("b", `2`))
	r.waitRecords("svc", 3)

	out := kc.ReadAll("out")
	if got := byKey(out); len(out) != 2 || got["a"][0] != "1" || got["b"][0] != "2" {
		t.Errorf("delivered %s, want a and b once each", dump(out))
	}
	dl := kc.ReadAll("dlq")
	if len(dl) != 1 {
		t.Fatalf("dead letters: %s, want one", dump(dl))
	}
	h := headers(dl[0])
	if dl[0].Value != nil || h[pipeline.HeaderValueDropped] != "140000" || !strings.Contains(h[pipeline.HeaderError], "MESSAGE_TOO_LARGE") ||
		h[pipeline.HeaderSourceOffset] != "1" || string(dl[0].Key) != "big" || h["h"] != "" {
		t.Errorf("dead letter: value %d bytes, headers %v", len(dl[0].Value), h)
	}
	if n := r.records("svc", "refused"); n != 1 {
		t.Errorf("refused counted %d, want 1", n)
	}
	if n := r.records("svc", "forwarded"); n != 2 {
		t.Errorf("forwarded counted %d, want 2", n)
	}
	r.stop()
}

// Without a dead-letter topic, a refused record halts its partition
// alone, committed up to it (a restart halts there again), while the
// other partitions go on.
func TestRefusedRecordHaltsWithoutDeadLetter(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in")
	kc.CreateTopic("out", 2, "max.message.bytes", "200000")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.MaxSize = 150_000
	cfg := testConfig(t, kc, dsn, rt)
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	p0 := []*kgo.Record{rec("a", `1`), bigKeyed(140_000), rec("b", `2`)}
	for _, x := range p0 {
		x.Partition = 0
	}
	produceTo(t, kc, "in", p0...)
	produceTo(t, kc, "in", &kgo.Record{Partition: 1, Key: []byte("c"), Value: []byte(`3`)})

	var err error
	waitFor(t, "in/0 halted", func() (bool, string) {
		err = r.pl.Ready()
		return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
	})
	for _, s := range []string{"in/0 offset 1", "MESSAGE_TOO_LARGE", "no dead_letter"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Ready error %q does not say %q", err, s)
		}
	}
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 1, 1)
	if got := byKey(kc.ReadAll("out")); len(got) != 2 || got["a"] == nil || got["c"] == nil {
		t.Errorf("delivered %v, want a (before the refused record) and c (the other partition)", got)
	}
	r.stop()

	r = start(t, cfg, store)
	waitFor(t, "in/0 halted again after a restart", func() (bool, string) {
		err := r.pl.Ready()
		return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
	})
	r.stop()
	if got := byKey(kc.ReadAll("out")); got["b"] != nil {
		t.Errorf("b, after the refused record, was delivered: %v", got)
	}
}

// max_size must fit in a record of the output topic: checked at start,
// with an error naming the key and the topic's limit.
func TestMaxSizeCheckedAtStart(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in")
	kc.CreateTopic("out", 1, "max.message.bytes", "200000")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out")) // default max_size: 1 MiB less 1 KiB
	validate(t, &cfg)
	pl, err := pipeline.New(cfg, openStore(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = pl.Run(ctx)
	if !errors.Is(err, pipeline.ErrConfig) || !strings.Contains(err.Error(), "routes[0].max_size") || !strings.Contains(err.Error(), "200000") {
		t.Fatalf("Run = %v, want a configuration error naming routes[0].max_size and the topic's limit", err)
	}
}
