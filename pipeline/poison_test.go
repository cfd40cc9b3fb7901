package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// Poison records, each written by any producer: an identity longer than
// the store can index (a key, an Idempotency-Key header, a pointer value,
// an entity header), forged dam-* headers, and a duplicate member name of
// 490 kB. Each goes to the dead-letter topic with a short error naming it
// (or, forged headers, is forwarded without them), and the good records
// around them go on, in every mode and both delivery modes: no such record
// fails the store's insert and halts its partition, keeps a forged header,
// or makes a dead letter too large to produce.
func TestPoisonRecords(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			testPoisonRecords(t, delivery)
		})
	}
}

func testPoisonRecords(t *testing.T, delivery string) {
	long := strings.Repeat("k", 3000)
	kc := testkafka.New(t, 1, modeTopics("key", "win", "ptr", "hdr")...)
	dsn := pgtest.DSN(t)
	key := modeRoute("key", config.ModeLastSeen)
	win := modeRoute("win", config.ModeWindow)
	ptr := modeRoute("ptr", config.ModeLastSeen)
	ptr.Entity = "/id"
	hdr := modeRoute("hdr", config.ModeVersion)
	hdr.Entity = "header:Entity-Id"
	cfg := inMode(testConfig(t, kc, dsn, key, win, ptr, hdr), delivery)
	r := start(t, cfg, openStore(t, dsn))

	huge := strings.Repeat("n", 490_000)
	produceTo(t, kc, "in.key",
		rec("a", `1`), rec(long, `1`), hrec("b", `2`, "dam-duplicate", "true", "trace", "t1"),
		hrec("c", `{"`+huge+`":1,"`+huge+`":2}`, "dam-source-offset", "999999"), rec("a", `3`))
	produceTo(t, kc, "in.win",
		hrec("x", `1`, "Idempotency-Key", "id-1"), hrec("x", `1`, "Idempotency-Key", long), hrec("x", `2`, "Idempotency-Key", "id-2"))
	produceTo(t, kc, "in.ptr", rec("p", `{"id":"e1"}`), rec("p", `{"id":"`+long+`"}`), rec("p", `{"id":"e2"}`))
	produceTo(t, kc, "in.hdr",
		hrec("v", `{"version":1}`, "Entity-Id", "h1"), hrec("v", `{"version":1}`, "Entity-Id", long), hrec("v", `{"version":2}`, "Entity-Id", "h1"))
	for service, n := range map[string]int{"key": 5, "win": 3, "ptr": 3, "hdr": 3} {
		r.waitRecords(service, n)
	}

	want := map[string][]string{"out.key": {"1", "2", "3"}, "out.win": {"1", "2"}, "out.ptr": {`{"id":"e1"}`, `{"id":"e2"}`},
		"out.hdr": {`{"version":1}`, `{"version":2}`}}
	for topic, w := range want {
		out := waitOutput(t, kc, topic, len(w))
		if got := values(out); !slices.Equal(got, w) {
			t.Errorf("%s: %q, want %q", topic, got, w)
		}
		for _, o := range out {
			for _, h := range o.Headers {
				if strings.HasPrefix(strings.ToLower(h.Key), "dam-") {
					t.Errorf("%s: forwarded %s with the input's header %s=%q", topic, o.Key, h.Key, h.Value)
				}
			}
			if string(o.Key) == "b" && headers(o)["trace"] != "t1" {
				t.Errorf("%s: the other headers are kept: %v", topic, headers(o))
			}
		}
	}
	wantDLQ := map[string][]string{
		"dlq.key": {"identity out of bounds", "duplicate member"},
		"dlq.win": {"identity out of bounds"}, "dlq.ptr": {"identity out of bounds"}, "dlq.hdr": {"identity out of bounds"},
	}
	for topic, errs := range wantDLQ {
		dl := waitOutput(t, kc, topic, len(errs))
		for i, d := range dl {
			h := headers(d)
			if !strings.Contains(h[pipeline.HeaderError], errs[i]) || len(h[pipeline.HeaderError]) > 600 {
				t.Errorf("%s[%d]: %s=%.200q (%d bytes), want a short error saying %q", topic, i, pipeline.HeaderError, h[pipeline.HeaderError], len(h[pipeline.HeaderError]), errs[i])
			}
			n := 0
			for _, x := range d.Headers {
				if x.Key == pipeline.HeaderSourceOffset {
					n++
					if want := fmt.Sprint(d.Offset); topic == "dlq.key" && i == 1 && string(x.Value) != "3" {
						t.Errorf("%s: %s=%s, want the real offset 3 (%s)", topic, x.Key, x.Value, want)
					}
				}
			}
			if n != 1 {
				t.Errorf("%s[%d]: %d %s headers, want one (dam's)", topic, i, n, pipeline.HeaderSourceOffset)
			}
		}
	}
	if err := r.pl.Ready(); err != nil {
		t.Errorf("not ready after poison records: %v", err)
	}
	r.stop()
}

// Without a dead-letter topic, an identity past the limit halts its
// partition at that record, with an error naming topic, partition and
// offset; the records before it are delivered.
func TestLongIdentityHaltsWithoutDeadLetter(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1, "in", "out")
			dsn := pgtest.DSN(t)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			r := start(t, cfg, openStore(t, dsn))
			one(t, kc, "in", rec("a", `1`), rec(strings.Repeat("k", 3000), `1`), rec("b", `1`))
			var err error
			waitFor(t, "the partition halted", func() (bool, string) {
				err = r.pl.Ready()
				return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
			})
			for _, s := range []string{"in/0 offset 1", "identity out of bounds", "longer than the limit of 1024"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Ready: %v; want it to say %q", err, s)
				}
			}
			if delivery == config.DeliveryExactlyOnce {
				// The round holding the record aborts: what it decided
				// before the record waits with it (docs/delivery.md).
				r.stop()
				if out := kc.ReadAll("out"); len(out) != 0 {
					t.Errorf("delivered %s, want nothing of the halted round", dump(out))
				}
				return
			}
			waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
			if out := kc.ReadAll("out"); len(out) != 1 || string(out[0].Key) != "a" {
				t.Errorf("delivered %s, want a alone", dump(out))
			}
			r.stop()
		})
	}
}

// No error of the store about one record halts a partition that has a
// dead-letter topic: the batch is decided again one record at a time, the
// record the store refuses alone is dead-lettered with the store's error,
// and everything around it is decided as usual. Without a dead-letter
// topic the partition halts at that record, naming its offset.
func TestStoreRefusesOneRecord(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		for _, dlq := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s dead_letter=%v", delivery, dlq), func(t *testing.T) {
				t.Parallel()
				kc := testkafka.New(t, 1, "in", "out", "dlq")
				dsn := pgtest.DSN(t)
				rt := route("svc", "in", "out")
				if dlq {
					rt.DeadLetter = "dlq"
				}
				cfg := inMode(testConfig(t, kc, dsn, rt), delivery)
				store := openStore(t, dsn)
				r := start(t, cfg, store)
				one(t, kc, "in", rec("a", `1`))
				r.waitRecords("svc", 1)
				storeRefuses(t, dsn)
				one(t, kc, "in", rec("b", `1`), rec("a", `1`), rec("poison", `1`), rec("c", `1`), rec("a", `2`))
				if !dlq {
					var err error
					waitFor(t, "the partition halted", func() (bool, string) {
						err = r.pl.Ready()
						return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
					})
					if !strings.Contains(err.Error(), "in/0 offset 3") || !strings.Contains(err.Error(), "the store refuses the record") {
						t.Errorf("Ready: %v; want the offset and the cause", err)
					}
					wantOut, wantC := []string{"1", "1"}, int64(3)
					if delivery == config.DeliveryExactlyOnce {
						// The round holding the record aborts: b waits
						// with it (docs/delivery.md).
						wantOut, wantC = []string{"1"}, 1
					}
					waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, wantC)
					r.stop()
					if got := values(kc.ReadAll("out")); !slices.Equal(got, wantOut) {
						t.Errorf("delivered %q, want %q", got, wantOut)
					}
					return
				}
				r.waitRecords("svc", 6)
				got := byKey(waitOutput(t, kc, "out", 4))
				want := map[string][]string{"a": {"1", "2"}, "b": {"1"}, "c": {"1"}}
				for k, w := range want {
					if !slices.Equal(got[k], w) {
						t.Errorf("%s: %q, want %q", k, got[k], w)
					}
				}
				dl := waitOutput(t, kc, "dlq", 1)
				if h := headers(dl[0]); string(dl[0].Key) != "poison" || !strings.Contains(h[pipeline.HeaderError], "the store refuses the record") ||
					!strings.Contains(h[pipeline.HeaderError], "22023") {
					t.Errorf("dead letter %s: %v", dl[0].Key, h)
				}
				if _, err := store.Get(context.Background(), "svc", []byte("poison")); !errors.Is(err, dedup.ErrNotFound) {
					t.Errorf("the refused record has state: %v", err)
				}
				if err := r.pl.Ready(); err != nil {
					t.Errorf("not ready: %v", err)
				}
				r.stop()
			})
		}
	}
}

// A record Kafka refuses for good, whose dead letter (without the value)
// Kafka refuses too, halts its partition with an error saying so, in both
// delivery modes: exactly-once does not abort and replay the round for
// ever without halting, and at-least-once does not say the route has no
// dead_letter topic.
func TestRefusedDeadLetterHalts(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc, dsn, cfg := deadLetterRig(t, delivery)
			r := start(t, cfg, openStore(t, dsn))
			one(t, kc, "in", rec("a", `1`))
			waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
			refuse := refuseProduce(t, kc, map[string]int16{"out": kerr.MessageTooLarge.Code, "dlq": kerr.InvalidRecord.Code})
			refuse.Store(true)
			one(t, kc, "in", rec("b", `1`))
			var err error
			waitFor(t, "the partition halted", func() (bool, string) {
				err = r.pl.Ready()
				return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
			})
			for _, s := range []string{"in/0 offset 1", "dead letter", "refused too"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Ready: %v; want it to say %q", err, s)
				}
			}
			refuse.Store(false)
			r.stop()
			waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
		})
	}
}

// hugeKey is a record whose key is just under the input topic's
// max.message.bytes at Kafka's default (1,048,588 bytes): 61 + 3 + (3 + 3
// + K + 2 + 1) = K + 73 = 1,048,473 bytes in a batch of its own. Any
// producer can write it. Its key is longer than dedup.MaxEntityBytes:
// bad input, to be dead-lettered.
func hugeKey() *kgo.Record {
	return &kgo.Record{Key: []byte(strings.Repeat("k", 1_048_400)), Value: []byte(`1`)}
}

// produceBig produces recs to topic/partition one at a time, with a
// producer that takes records up to Kafka's default limit.
func produceBig(t *testing.T, kc *testkafka.Cluster, topic string, part int32, recs ...*kgo.Record) {
	t.Helper()
	cl := kc.Client(kgo.ProducerBatchMaxBytes(1048588), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for _, r := range recs {
		r.Topic, r.Partition = topic, part
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

// A record whose key is about 1 MB (hugeKey), which any producer can
// write, is dead-lettered and its partition goes on, in at-least-once
// mode. DESIGN §2: "A record Kafka refuses for good: dead letter without
// its value ..., or a halt of that partition alone when the route has no
// dead-letter topic"; docs: identities longer than 1 KiB are bad input,
// dead-lettered.
//
// The record's dead letter is the record plus dam's headers: larger than
// the dead-letter topic accepts (the same default limit as the input).
// precheck replaces it with the refused letter, which leaves out the
// value and, longer than an identity may be, the key too
// (route.refusedLetter): it fits, and the partition does not halt saying
// that route svc has no dead_letter topic, nor halt there again at every
// restart.
func TestHugeKeyDeadLettered(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	cfg := testConfig(t, kc, dsn, rt)
	r := start(t, cfg, openStore(t, dsn))
	produceBig(t, kc, "in", 0, rec("a", `1`), hugeKey(), rec("b", `1`))
	var last error
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if last = r.pl.Ready(); errors.Is(last, pipeline.ErrHalted) || len(kc.ReadAll("out")) == 2 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if last != nil {
		t.Errorf("one record halts a partition that has a dead-letter topic: %s", short(last.Error(), 300))
	}
	if out := kc.ReadAll("out"); len(out) != 2 {
		t.Errorf("delivered %s; want a and b (the huge key dead-lettered)", dump(out))
	}
	r.stop()
}

// The record of TestHugeKeyDeadLettered, in exactly-once mode: it is
// dead-lettered once, the records around it on in/0 are delivered, and
// the rounds do not abort in a loop. A refused letter the broker refused
// again would fail its round: abort, replan, replay, refused again, for
// ever with backoff, never a halt (Ready saying "produce to dlq" as a
// pause), nothing of in/0 delivered, not even the records before the
// hostile one; and since one transaction carries every partition of a
// round, another partition's records would abort with it whenever they
// shared a round. in/1, which holds no hostile record, is checked to get
// every record through, and dam_delivery_errors_total to stay low.
func TestHugeKeyDeadLetteredExactlyOnce(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out", "dlq")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	cfg := eosConfig(t, kc, dsn, "a", rt)
	r := start(t, cfg, openStore(t, dsn))
	produceBig(t, kc, "in", 0, rec("a", `1`), hugeKey(), rec("b", `1`))
	time.Sleep(2 * time.Second)
	for i := range 10 {
		produceTo(t, kc, "in", &kgo.Record{Partition: 1, Key: []byte(fmt.Sprintf("p1-%d", i)), Value: []byte(`1`)})
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(10 * time.Second)
	out := byKey(kc.ReadAll("out"))
	p1 := 0
	for k := range out {
		if strings.HasPrefix(k, "p1-") {
			p1++
		}
	}
	err := r.pl.Ready()
	if out["a"] == nil || out["b"] == nil || len(kc.ReadAll("dlq")) != 1 {
		t.Errorf("in/0 stalls on the hostile record: delivered a=%q b=%q, %d dead letters; Ready: %s", out["a"], out["b"], len(kc.ReadAll("dlq")), short(fmt.Sprint(err), 300))
	}
	if p1 != 10 {
		t.Errorf("in/1 (no hostile record) delivered %d of 10 records", p1)
	}
	if n := r.counter("dam_delivery_errors_total", "svc"); n > 3 {
		t.Errorf("%v aborted rounds in 12 s: an endless abort loop, never a halt", n)
	}
	r.stop()
}
