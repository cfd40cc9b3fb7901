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
	"github.com/dam-dedup/dam/internal/pgtest"
	"github.com/dam-dedup/dam/internal/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// one produces records to partition 0 of topic in one request (one record
// batch: the pipeline fetches and decides them together).
func one(t *testing.T, kc *testkafka.Cluster, topic string, recs ...*kgo.Record) {
	t.Helper()
	for _, r := range recs {
		r.Partition = 0
	}
	produceTo(t, kc, topic, recs...)
}

// Finding 1: batches forwarded undecided while PostgreSQL was down
// (on_store_failure: forward) are written back with their decision log, so
// that a crash before their offsets are committed finds the log covering
// [C, P) and re-delivers every forward, the logged batches around them
// included. (They used to be written without a log: recovery read the gap as
// "not covered" and continued from P, losing A1 B1 C2 A2 B3 D3 below.)
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

// Finding 2: when compaction removed a logged forward (o1: k1 "A") because a
// later record has the same key (o2: k1 "A", logged as its duplicate),
// recovery delivers o2: the entity's next readable record in [C, P). (It
// used to reset k1's state only, so "A" never reached the adapter.)
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

// Finding 8, first window: with kafka.start latest, P is set when the
// partition is assigned, so records produced while the process is down,
// before it decided anything, are not skipped. (P used to be set only from
// the first record decided: a restart started at the end again.)
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

// Finding 8, second window: without a committed offset (it never existed
// or expired), recovery replays the decision log instead of continuing from
// P, which dropped batches decided but not delivered.
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

// Finding 8, third window: when the input is recreated under dam (its
// offsets start again below P), franz-go reports data loss; the partition
// halts with an error naming it instead of skipping the new records as
// "below the decided progress".
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

// Finding 5: a lost COMMIT reply followed by an outage that also fails the
// read of P. The outcome must be learned from P (retrying the read) before
// deciding again: the batch did commit, so deciding it again would be
// fenced and the partition parked for good. (Decide used to run again as
// soon as the read failed.)
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
