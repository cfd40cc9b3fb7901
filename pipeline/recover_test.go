package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// Batches forwarded undecided while PostgreSQL was down (on_store_failure:
// forward) are written back with their decision log, so that a crash
// before their offsets are committed finds the log covering [C, P) and
// re-delivers every forward, the logged batches around them included.
// (Written without a log, they would leave a gap recovery reads as "not
// covered": it would continue from P, losing A1 B1 C2 A2 B3 D3 below.)
func TestUndecidedBatchesAreLogged(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	gate := newProduceGate(t, kc, "out")
	proxy, dsn, direct := pgProxy(t)
	rt := route("svc", "in", "out")
	rt.OnStoreFailure = config.OnStoreFailureForward
	cfg := testConfig(t, kc, dsn, rt)
	cfg.Pipeline.BatchSize = 2
	cfg.Pipeline.ShutdownGrace = 300 * time.Millisecond
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	inspect := openStore(t, direct)
	r := start(t, cfg, openStore(t, dsn))

	one(t, kc, "in", rec("k0", `"Z0"`))
	r.waitRecords("svc", 1) // delivered and committed: C = 1
	gate.close()
	one(t, kc, "in", rec("k1", `"A1"`), rec("k2", `"B1"`)) // decided and logged, not delivered
	waitProgress(t, inspect, cfg, "in", 0, 3)

	proxy.Cut()
	one(t, kc, "in", rec("k3", `"C2"`), rec("k1", `"A2"`)) // forwarded undecided, not delivered
	waitFor(t, "a failed decide", func() (bool, string) {
		n := r.counter("dam_store_errors_total", "svc")
		return n > 0, fmt.Sprint(n)
	})
	proxy.Restore()
	one(t, kc, "in", rec("k2", `"B3"`), rec("k4", `"D3"`)) // the undecided batch written back, then this one decided
	waitProgress(t, inspect, cfg, "in", 0, 7)
	r.crash()

	gate.open()
	r = start(t, cfg, openStore(t, dsn))
	waitModel(t, kc, "out", map[string][]string{
		"k0": {`"Z0"`}, "k1": {`"A1"`, `"A2"`}, "k2": {`"B1"`, `"B3"`}, "k3": {`"C2"`}, "k4": {`"D3"`},
	})
	r.stop()
}

// When compaction removed a logged forward (o1: k1 "A") because a later
// record has the same key (o2: k1 "A", logged as its duplicate), recovery
// delivers o2: the entity's next readable record in [C, P). (Resetting
// k1's state alone would leave "A" never delivered to the adapter.)
func TestUnreadableForwardDeliversNextRecord(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "out")
	kc.CreateTopic("in", 1, "cleanup.policy", "compact")
	gate := newProduceGate(t, kc, "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.ShutdownGrace = 300 * time.Millisecond
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	store := openStore(t, dsn)
	r := start(t, cfg, store)

	one(t, kc, "in", rec("k0", `"Z"`))
	r.waitRecords("svc", 1) // C = 1
	gate.close()
	one(t, kc, "in", rec("k1", `"A"`)) // o1: forwarded, not delivered
	one(t, kc, "in", rec("k1", `"A"`)) // o2: its duplicate
	one(t, kc, "in", rec("k2", `"B"`)) // o3: keeps o2 out of the last batch, which compaction never touches
	waitProgress(t, store, cfg, "in", 0, 4)
	r.crash()

	kc.Compact()
	if got := kc.ReadAll("in"); len(got) != 3 || got[1].Offset != 2 {
		t.Fatalf("after compaction the input holds %s; want offsets 0, 2, 3", dump(got))
	}
	gate.open()
	r = start(t, cfg, store)
	waitModel(t, kc, "out", map[string][]string{"k0": {`"Z"`}, "k1": {`"A"`}, "k2": {`"B"`}})
	// k1's state still holds "A": a later repeat is a duplicate.
	one(t, kc, "in", rec("k1", `"A"`), rec("k5", `"E"`))
	waitModel(t, kc, "out", map[string][]string{"k0": {`"Z"`}, "k1": {`"A"`}, "k2": {`"B"`}, "k5": {`"E"`}})
	r.stop()
	if n := len(kc.ReadAll("out")); n != 4 {
		t.Errorf("%d records delivered, want 4: %s", n, dump(kc.ReadAll("out")))
	}
}

// An unreadable logged forward whose entity has no later record in [C, P):
// the entity's state is reset, so that its next record is forwarded (a
// possible duplicate, never a loss).
func TestUnreadableForwardResetsEntity(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "out")
	kc.CreateTopic("in", 1, "cleanup.policy", "compact")
	gate := newProduceGate(t, kc, "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.ShutdownGrace = 300 * time.Millisecond
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	store := openStore(t, dsn)
	r := start(t, cfg, store)

	one(t, kc, "in", rec("k0", `"Z"`))
	r.waitRecords("svc", 1)
	gate.close()
	one(t, kc, "in", rec("k1", `"A"`)) // forwarded, not delivered, then compacted away
	waitProgress(t, store, cfg, "in", 0, 2)
	r.crash()
	one(t, kc, "in", rec("k1", `"A"`)) // after P: compaction keeps it, the state says duplicate
	one(t, kc, "in", rec("k9", `"-"`))
	kc.Compact()
	gate.open()
	r = start(t, cfg, store)
	waitModel(t, kc, "out", map[string][]string{"k0": {`"Z"`}, "k1": {`"A"`}, "k9": {`"-"`}})
	r.stop()
}

// With kafka.start latest, P is set when the partition is assigned, so
// records produced while the process is down, before it decided anything,
// are not skipped. (A P set only from the first record decided would make
// a restart start at the end again.)
func TestStartLatestSetsProgressAtAssignment(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	one(t, kc, "in", rec("old", `"before dam"`)) // before the first start: skipped by latest
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Kafka.Start = config.StartLatest
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	waitProgress(t, store, cfg, "in", 0, 1)
	r.crash()
	one(t, kc, "in", rec("k1", `"while down"`))
	r = start(t, cfg, store)
	waitModel(t, kc, "out", map[string][]string{"k1": {`"while down"`}})
	r.stop()
}

// Without a committed offset (it never existed or expired), recovery
// replays the decision log instead of continuing from P, which would drop
// batches decided but not delivered.
func TestNoCommittedOffsetReplaysLog(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	gate := newProduceGate(t, kc, "out")
	gate.close()
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.ShutdownGrace = 300 * time.Millisecond
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	one(t, kc, "in", rec("k1", `"A"`), rec("k2", `"B"`), rec("k1", `"A"`))
	waitProgress(t, store, cfg, "in", 0, 3)
	r.crash() // nothing was ever committed
	adm := kadm.NewClient(kc.Client())
	if offs, err := adm.FetchOffsets(context.Background(), cfg.Kafka.Group); err != nil || len(offs) != 0 {
		t.Fatalf("committed offsets %v (%v), want none", offs, err)
	}
	gate.open()
	r = start(t, cfg, store)
	waitModel(t, kc, "out", map[string][]string{"k1": {`"A"`}, "k2": {`"B"`}})
	r.stop()
}

// When the input is recreated under dam (its offsets start again below
// P), franz-go reports data loss; the partition halts with an error naming
// it instead of skipping the new records as "below the decided progress".
func TestInputRecreatedHalts(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	r := start(t, cfg, openStore(t, dsn))
	for i := range 5 {
		one(t, kc, "in", rec(fmt.Sprintf("k%d", i), `"v"`))
	}
	r.waitRecords("svc", 5)

	adm := kadm.NewClient(kc.Client())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.DeleteTopic(ctx, "in"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the topic gone", func() (bool, string) {
		td, err := adm.ListTopics(ctx, "in")
		return err == nil && !td.Has("in"), fmt.Sprint(td, err)
	})
	kc.CreateTopic("in", 1)
	one(t, kc, "in", rec("new", `"after the recreation"`))

	var err error
	waitFor(t, "the partition halted on data loss", func() (bool, string) {
		err = r.pl.Ready()
		return errors.Is(err, pipeline.ErrDataLoss), fmt.Sprint(err)
	})
	if !strings.Contains(err.Error(), "in/0") {
		t.Errorf("Ready: %v, want the partition named", err)
	}
	if h := r.gauge("dam_halted", "svc"); h != 1 {
		t.Errorf("dam_halted = %v, want 1", h)
	}
	r.stop()
}

// A lost COMMIT reply followed by an outage that also fails the read of
// P. The outcome must be learned from P (retrying the read) before
// deciding again: the batch did commit, so deciding it again would be
// fenced and the partition parked for good. Decide does not run again as
// soon as the read fails.
func TestLostCommitReplyDuringOutage(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	proxy, dsn, _ := pgProxy(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.RetryMin = 50 * time.Millisecond
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	r, logs := startLogged(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("k1", `"A"`))
	r.waitRecords("svc", 1)

	// The next COMMIT goes through, its reply is lost, and then nothing
	// answers (a failover in progress): the read of P hangs until the
	// blackhole ends with a reset, and the store answers again at once.
	lost := make(chan struct{})
	proxy.LoseNextCommitReply(func() { proxy.Blackhole(); close(lost) })
	one(t, kc, "in", rec("k1", `"B"`))
	select {
	case <-lost:
	case <-time.After(waitTimeout):
		t.Fatal("no COMMIT seen by the proxy")
	}
	time.Sleep(time.Second)
	proxy.Reset()
	one(t, kc, "in", rec("k1", `"C"`))
	waitModel(t, kc, "out", map[string][]string{"k1": {`"A"`, `"B"`, `"C"`}})
	waitFor(t, "ready", func() (bool, string) {
		err := r.pl.Ready()
		return err == nil, fmt.Sprint(err)
	})
	if logs.has("fenced") {
		t.Error("the partition was fenced by its own committed batch")
	}
	r.stop()
}

// The input topic deleted and recreated while dam was stopped halts the
// partition at recovery with an error naming it, in both delivery modes:
// whether the new topic has fewer records than dam's progress (its end is
// below P) or more (only its id tells), and with a progress from before
// dam recorded topic ids: then Kafka's committed offset, deleted with the
// old topic, is missing too, and dam cannot tell a new topic from the old
// one, so it does not bind the new one's id to the old progress (skipping
// [0, P) of it) but halts.
func TestInputRecreatedWhileStoppedHalts(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		for _, c := range []struct {
			name    string
			newRecs int
			noID    bool
		}{{"shorter", 3, false}, {"longer", 8, false}, {"shorter, no topic id recorded", 3, true}, {"longer, no topic id recorded", 8, true}} {
			t.Run(delivery+" "+c.name, func(t *testing.T) {
				t.Parallel()
				kc := testkafka.New(t, 1, "in", "out")
				dsn := pgtest.DSN(t)
				cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
				store := openStore(t, dsn)
				r := start(t, cfg, store)
				for i := range 5 {
					one(t, kc, "in", rec(fmt.Sprintf("k%d", i), `"v"`))
				}
				r.waitRecords("svc", 5)
				waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 5)
				r.stop()
				if c.noID {
					if _, err := store.Pool().Exec(context.Background(), `UPDATE progress SET topic_id = NULL`); err != nil {
						t.Fatal(err)
					}
				}

				adm := kadm.NewClient(kc.Client())
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if _, err := adm.DeleteTopic(ctx, "in"); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the topic gone", func() (bool, string) {
					td, err := adm.ListTopics(ctx, "in")
					return err == nil && !td.Has("in"), fmt.Sprint(td, err)
				})
				kc.CreateTopic("in", 1)
				for i := range c.newRecs {
					one(t, kc, "in", rec(fmt.Sprintf("new%d", i), `"after the recreation"`))
				}

				r = start(t, cfg, store)
				var err error
				waitFor(t, "the partition halted on data loss", func() (bool, string) {
					err = r.pl.Ready()
					return errors.Is(err, pipeline.ErrDataLoss), fmt.Sprint(err)
				})
				if !strings.Contains(err.Error(), "in/0") {
					t.Errorf("Ready: %v, want the partition named", err)
				}
				if h := r.gauge("dam_halted", "svc"); h != 1 {
					t.Errorf("dam_halted = %v, want 1", h)
				}
				time.Sleep(time.Second)
				r.stop()
				if out := kc.ReadAll("out"); len(out) != 5 {
					t.Errorf("delivered %s, want the 5 records of the first topic alone", dump(out))
				}
			})
		}
	}
}

// A progress recorded without the topic's id, and no committed offset in
// Kafka, is what a topic recreated under a stopped dam from before topic
// ids were recorded looks like, and also what expired offsets look like:
// the partition halts with an error giving the statement that records the
// topic's id. Run once the operator knows the topic is the same, it lets
// the partition go on from P, nothing skipped or delivered twice.
func TestUnboundProgressWithoutOffsetsHaltsUntilBound(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	one(t, kc, "in", rec("a", `1`), rec("b", `1`), rec("c", `1`))
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 3)
	r.stop()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := store.Pool().Exec(ctx, `UPDATE progress SET topic_id = NULL`); err != nil {
		t.Fatal(err)
	}
	if _, err := kadm.NewClient(kc.Client()).DeleteGroup(ctx, cfg.Kafka.Group); err != nil {
		t.Fatal(err)
	}
	r = start(t, cfg, store)
	var err error
	waitFor(t, "the partition halted", func() (bool, string) {
		err = r.pl.Ready()
		return errors.Is(err, pipeline.ErrDataLoss), fmt.Sprint(err)
	})
	r.stop()
	bind := regexp.MustCompile(`UPDATE progress SET topic_id = '[0-9a-f-]{36}' WHERE grp = '[^']+' AND topic = 'in' AND part = 0`).FindString(err.Error())
	if bind == "" || !strings.Contains(err.Error(), "in/0") {
		t.Fatalf("Ready: %v; want the partition named and the statement that binds the topic", err)
	}
	if _, err := store.Pool().Exec(ctx, bind); err != nil {
		t.Fatalf("%s: %v", bind, err)
	}

	r = start(t, cfg, store)
	one(t, kc, "in", rec("d", `1`))
	waitModel(t, kc, "out", map[string][]string{"a": {"1"}, "b": {"1"}, "c": {"1"}, "d": {"1"}})
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 4)
	r.stop()
	if out := kc.ReadAll("out"); len(out) != 4 {
		t.Errorf("delivered %s, want each record once", dump(out))
	}
}

// When the group's committed offsets are gone (they expired while the
// group sat empty), recovery replays the decision log from the committed
// offset dam recorded, not from the log's first row: after a clean stop
// nothing delivered is delivered again, in either delivery mode. (The log
// rows of the last seconds before the stop are not yet pruned: replayed,
// they would be repeats past the in-flight bound, and in exactly-once
// mode.)
func TestOffsetsExpiredReplaysNothingDelivered(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1, "in", "out")
			dsn := pgtest.DSN(t)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			store := openStore(t, dsn)
			r := start(t, cfg, store)
			one(t, kc, "in", rec("a", `1`), rec("b", `1`), rec("c", `1`))
			waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 3)
			one(t, kc, "in", rec("a", `2`), rec("d", `1`))
			waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 5)
			r.stop()

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			adm := kadm.NewClient(kc.Client())
			if _, err := adm.DeleteGroup(ctx, cfg.Kafka.Group); err != nil {
				t.Fatal(err)
			}
			if offs, err := adm.FetchOffsets(ctx, cfg.Kafka.Group); (err != nil && !errors.Is(err, kerr.GroupIDNotFound)) || len(offs) != 0 {
				t.Fatalf("committed offsets %v (%v), want none", offs, err)
			}
			r = start(t, cfg, store)
			one(t, kc, "in", rec("e", `1`))
			waitModel(t, kc, "out", map[string][]string{"a": {"1", "2"}, "b": {"1"}, "c": {"1"}, "d": {"1"}, "e": {"1"}})
			r.stop()
			if out := kc.ReadAll("out"); len(out) != 6 {
				t.Errorf("delivered %d records, want 6 (nothing twice): %s", len(out), dump(out))
			}
		})
	}
}

// A record dead-lettered when decided, replayed after the route's
// dead_letter was removed, halts its partition with an error saying so,
// in both delivery modes, rather than being counted and dropped.
func TestReplayedDeadLetterWithoutDeadLetterTopicHalts(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc, dsn, cfg := deadLetterRig(t, delivery)
			cfg.Pipeline.ShutdownGrace = time.Second
			store := openStore(t, dsn)
			r := start(t, cfg, store)
			one(t, kc, "in", rec("a", `1`))
			waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
			r.stop()
			one(t, kc, "in", rec("b", `1`), rec("bad", `{bad`), rec("c", `1`))
			gate := newProduceGate(t, kc, "out", "dlq")
			gate.close()
			r = start(t, cfg, store)
			waitProgress(t, store, cfg, "in", 0, 4)
			r.crash()
			gate.open()

			cfg.Routes[0].DeadLetter = ""
			r = start(t, cfg, store)
			var err error
			waitFor(t, "the partition halted", func() (bool, string) {
				err = r.pl.Ready()
				return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
			})
			for _, s := range []string{"in/0 offset 2", "dead-lettered when decided", "no dead_letter"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Ready: %v; want it to say %q", err, s)
				}
			}
			r.stop()
			if got := byKey(kc.ReadAll("out")); got["c"] != nil {
				t.Errorf("c, after the halt, was delivered: %v", got)
			}
		})
	}
}

// In version mode, the record a replay delivers for an entity whose
// logged forward was compacted away is never a stale version: o1 (k1
// version 5) was forwarded and not delivered, o2 (k1 version 3, stale)
// superseded it in compaction. The replay does not deliver o2; the
// entity's state is reset, so its next record is forwarded.
func TestVersionReplayDeliversNoStaleVersion(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "out.v", "dlq.v")
	kc.CreateTopic("in.v", 1, "cleanup.policy", "compact")
	gate := newProduceGate(t, kc, "out.v")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, modeRoute("v", config.ModeVersion))
	cfg.Pipeline.ShutdownGrace = 300 * time.Millisecond
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	one(t, kc, "in.v", rec("k0", `{"version":1}`))
	r.waitRecords("v", 1)
	gate.close()
	one(t, kc, "in.v", rec("k1", `{"version":5}`)) // o1: forwarded, not delivered
	one(t, kc, "in.v", rec("k1", `{"version":3}`)) // o2: stale; supersedes o1 in compaction
	one(t, kc, "in.v", rec("k9", `{"version":1}`)) // o3: keeps o2 out of the last batch
	waitProgress(t, store, cfg, "in.v", 0, 4)
	r.crash()
	kc.Compact()
	if got := kc.ReadAll("in.v"); len(got) != 3 || got[1].Offset != 2 {
		t.Fatalf("after compaction the input holds %s; want offsets 0, 2, 3", dump(got))
	}
	gate.open()
	r = start(t, cfg, store)
	waitModel(t, kc, "out.v", map[string][]string{"k0": {`{"version":1}`}, "k9": {`{"version":1}`}})
	one(t, kc, "in.v", rec("k1", `{"version":4}`)) // the state was reset: forwarded
	waitModel(t, kc, "out.v", map[string][]string{"k0": {`{"version":1}`}, "k1": {`{"version":4}`}, "k9": {`{"version":1}`}})
	r.stop()
	for _, o := range kc.ReadAll("out.v") {
		if string(o.Key) == "k1" && string(o.Value) == `{"version":3}` {
			t.Errorf("delivered the stale version 3 of k1: %s", dump(kc.ReadAll("out.v")))
		}
	}
}

// With decision_log.keep 0, the decision log is pruned below the committed
// offset as batches are delivered (by the pruning loop, off the delivery
// path), in both delivery modes: it holds what may be undelivered, not the
// history.
func TestLogPrunedBelowCommitted(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1, "in", "out")
			dsn := pgtest.DSN(t)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			cfg.DecisionLog.Keep = 0
			store := openStore(t, dsn)
			r := start(t, cfg, store)
			one(t, kc, "in", rec("a", `1`), rec("b", `1`))
			waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 2)
			waitFor(t, "the log pruned below 2", func() (bool, string) {
				var n int
				err := store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM decision_log WHERE end_offset <= 2`).Scan(&n)
				return err == nil && n == 0, fmt.Sprint(n, err)
			})
			r.stop()
		})
	}
}

// Offsets moved back by hand right after a clean stop replay nothing
// already delivered, in both delivery modes (a duplicate in exactly-once
// mode, one beyond the in-flight bound in at-least-once mode).
// docs/delivery.md: "C < P, no log (offsets moved back by hand): continue
// from P: dam forwards changes only; to re-deliver on purpose, reset the
// state". The log is pruned below C only now and then, and not at a clean
// stop, so right after a stop it still covers the last batches delivered.
// An operator who moves the group's offset back (kafka-consumer-groups
// --reset-offsets --shift-by -2) makes recovery find C < P with the log
// covering [C, P), as after a crash; the offset the store recorded as
// delivered, at P, tells it those batches were delivered: the replay
// starts at max(C, the delivered offset) (plan.go planRecovery).
func TestOffsetsMovedBackReplaysNothingDelivered(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1, "in", "out")
			dsn := pgtest.DSN(t)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			store := openStore(t, dsn)
			r := start(t, cfg, store)
			// Two batches within pruneEvery: the log of the second is kept.
			one(t, kc, "in", rec("a", `1`))
			waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
			one(t, kc, "in", rec("b", `1`), rec("c", `1`))
			waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 3)
			r.stop()
			prog, err := store.ReadProgress(context.Background(), dedup.Partition{Group: cfg.Kafka.Group, Topic: "in", Partition: 0})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("after the stop: P=%d, delivered=%d", prog.Next, prog.Delivered)
			commitByHand(t, kc, cfg.Kafka.Group, "in", 1) // moved back by hand
			r = start(t, cfg, store)
			one(t, kc, "in", rec("d", `1`))
			waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 4)
			r.stop()
			got := byKey(kc.ReadAll("out"))
			for _, k := range []string{"a", "b", "c", "d"} {
				if len(got[k]) != 1 {
					t.Errorf("%s delivered %d times, want once (offsets moved back by hand: continue from P)", k, len(got[k]))
				}
			}
		})
	}
}

// A recovery that fails for good at a partition's first assignment (here
// the store refuses the epoch bump, as a revoked grant or a broken schema
// would) leaves the partition halted, and says so: Ready() reports it and
// dam_halted counts it, in both delivery modes, as after a failed
// re-recovery (holdUnrecovered registers halted workers for both). A
// partition left without a worker would stall silently: nothing consumed,
// /readyz ready (Ready() looks at the workers, and there would be none),
// dam_halted 0, and the member rebalancing the whole group each time
// franz-go rejoins and recovery fails again.
func TestFailedFirstRecoveryHalts(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1, "in", "out")
			dsn := pgtest.DSN(t)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			store := openStore(t, dsn)
			// The partition has a progress row already (a restart), and
			// the store now refuses to bump its epoch.
			if _, err := store.Acquire(context.Background(), dedup.Partition{Group: cfg.Kafka.Group, Topic: "in", Partition: 0}); err != nil {
				t.Fatal(err)
			}
			failAcquire(t, dsn, cfg.Kafka.Group)
			r := start(t, cfg, store)
			one(t, kc, "in", rec("k", `1`))
			time.Sleep(8 * time.Second)
			err := r.pl.Ready()
			halted := r.gauge("dam_halted", "svc")
			if err == nil || halted == 0 {
				t.Errorf("in/0 cannot be recovered and consumes nothing, yet Ready() = %v and dam_halted = %v (delivered: %d records)", err, halted, len(kc.ReadAll("out")))
			}
			r.stop()
		})
	}
}
