package pipeline_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// A record the store refuses is dead-lettered with the store's error, and
// a recovery that delivers the dead letter again (the first delivery never
// went out) says the same: the decision log keeps each dead letter's cause,
// and the replay does not guess it from the record's content, which has
// nothing wrong with it. In both delivery modes.
func TestReplayedDeadLetterKeepsItsCause(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc, dsn, cfg := deadLetterRig(t, delivery)
			cfg.Pipeline.ShutdownGrace = time.Second
			store := openStore(t, dsn)
			storeRefuses(t, dsn)
			gate := newProduceGate(t, kc, "out", "dlq")
			gate.close()
			r := start(t, cfg, store)
			one(t, kc, "in", rec("b", `1`), rec("poison", `1`), rec("c", `1`))
			waitProgress(t, store, cfg, "in", 0, 3)
			r.crash()
			gate.open()

			r = start(t, cfg, store)
			dl := waitOutput(t, kc, "dlq", 1)
			h := headers(dl[0])
			if string(dl[0].Key) != "poison" || h[pipeline.HeaderSourceOffset] != "1" {
				t.Errorf("dead letter %s at offset %s, want poison at 1", dl[0].Key, h[pipeline.HeaderSourceOffset])
			}
			for _, s := range []string{"the store refuses the record", "22023"} {
				if !strings.Contains(h[pipeline.HeaderError], s) {
					t.Errorf("replayed dead letter's %s: %q, want it to say %q", pipeline.HeaderError, h[pipeline.HeaderError], s)
				}
			}
			waitModel(t, kc, "out", map[string][]string{"b": {"1"}, "c": {"1"}})
			waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 3)
			r.stop()
		})
	}
}

// With on_store_failure: forward and no dead-letter topic, a record that
// went out undecided while the store was down, and that the store then
// refuses when the batch is written back, is logged as what it was: a
// forward. A crash before its offset is committed replays it as a forward;
// the partition does not halt on a dead letter that never was. Its
// entity's state, which cannot hold it, is reset: a later return to the
// content stored before is forwarded, not dropped as a duplicate of what
// the adapter no longer has.
func TestReplayedUndecidedForwardTheStoreRefuses(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	proxy, dsn, direct := pgProxy(t)
	rt := route("svc", "in", "out")
	rt.OnStoreFailure = config.OnStoreFailureForward
	cfg := testConfig(t, kc, dsn, rt)
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	cfg.Pipeline.ShutdownGrace = time.Second
	store := openStore(t, direct)
	r, logs := startLogged(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("a", `1`), rec("poison", `0`))
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 2)
	storeRefuses(t, direct)

	gate := newProduceGate(t, kc, "out")
	gate.close() // nothing more is delivered, so nothing more is committed
	proxy.Cut()
	one(t, kc, "in", rec("b", `1`), rec("poison", `1`), rec("c", `1`))
	waitFor(t, "the records forwarded undecided", func() (bool, string) {
		return logs.has("forwarding undecided"), ""
	})
	proxy.Restore()
	waitProgress(t, store, cfg, "in", 0, 5) // written back, poison apart
	r.crash()
	gate.open()

	r = start(t, cfg, openStore(t, dsn))
	waitFor(t, "the replay delivered", func() (bool, string) {
		if err := r.pl.Ready(); errors.Is(err, pipeline.ErrHalted) {
			t.Fatalf("halted on a record that went out as a forward: %v", err)
		}
		out := kc.ReadAll("out")
		return len(out) >= 5, dump(out)
	})
	waitModel(t, kc, "out", map[string][]string{"a": {"1"}, "b": {"1"}, "poison": {"0", "1"}, "c": {"1"}})
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 5)
	if err := r.pl.Ready(); err != nil {
		t.Errorf("not ready after the replay: %v", err)
	}

	dropTrigger(t, store, `DROP TRIGGER refuse_poison ON state`)
	one(t, kc, "in", rec("poison", `0`))
	out := waitOutput(t, kc, "out", 6)
	if last := kvOf(out[5]); last.Key != "poison" || last.Value != "0" {
		t.Errorf("delivered %s, want poison=0 last", dump(out))
	}
	r.stop()
}
