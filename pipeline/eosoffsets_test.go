package pipeline_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pgtest"
	"github.com/dam-dedup/dam/internal/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// Issue 18, items 1 and 2: exactly-once with Kafka's committed offset C
// moved ahead of P by hand (P=10, C=22), in rounds of five records. The
// catch-up rounds below C commit nothing: C never goes back (it went to 15,
// then 20), so that neither a stop after a catch-up round makes the next
// owner forward records the operator skipped (they were decided as new
// from 15), nor does a round that forwards 22-24 and then fails leave a
// C of 20 that the decision log does not cover (22-24 were lost).
func TestExactlyOnceCatchUpNeverCommitsBelowC(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	commits := watchTxnCommits(kc)
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	cfg.Pipeline.BatchSize, cfg.Pipeline.MaxBatch, cfg.Pipeline.MaxInFlight = 5, 5, 5
	cfg.Pipeline.ShutdownGrace = 2 * time.Second
	store := openStore(t, dsn)

	r := start(t, cfg, store)
	want := map[string][]string{}
	var first []*kgo.Record
	for i := range 10 {
		k, v := fmt.Sprintf("k%02d", i), fmt.Sprintf(`"v%d"`, i)
		first = append(first, rec(k, v))
		want[k] = []string{v}
	}
	one(t, kc, "in", first...)
	exactly(t, kc, "out", want)
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 10)
	r.stop()

	var rest []*kgo.Record
	for i := 10; i < 30; i++ {
		k, v := fmt.Sprintf("k%02d", i), fmt.Sprintf(`"v%d"`, i)
		rest = append(rest, rec(k, v))
		if i >= 22 {
			want[k] = []string{v}
		}
	}
	one(t, kc, "in", rest...)
	commitByHand(t, kc, cfg.Kafka.Group, "in", 22)
	mark := commits.count("in/0")

	// The round holding [20, 25) forwards 22-24 and cannot deliver them.
	gate := newProduceGate(t, kc, "out")
	gate.close()
	r = start(t, cfg, store)
	waitProgress(t, store, cfg, "in", 0, 25)
	r.crash()
	gate.open()
	r = start(t, cfg, store)
	exactly(t, kc, "out", want)
	r.stop()
	for _, c := range commits.since("in/0", mark) {
		if c < 22 {
			t.Errorf("committed %d after C was moved to 22 (all: %v)", c, commits.since("in/0", mark))
			break
		}
	}
}

// Issue 18, item 3: a replay in exactly-once mode never commits past an
// entity it owes. o1 (k1 "A") was forwarded and not delivered, then
// compaction removed it, since o4 (k1 "A", its duplicate) supersedes it.
// The replay is delivered whole, with the commit of its end, in one
// transaction: a stop after the replay's first round leaves C where it
// was, and the next replay still owes k1 and delivers o4. (The first round
// used to commit 4 while k1 was owed; the next replay began at 4, no longer
// knew k1 was owed, and "A" was never delivered.)
func TestExactlyOnceReplayKeepsOwedEntity(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "out")
	kc.CreateTopic("in", 1, "cleanup.policy", "compact")
	gate := newProduceGate(t, kc, "out")
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	cfg.Pipeline.BatchSize, cfg.Pipeline.MaxBatch, cfg.Pipeline.MaxInFlight = 2, 2, 5
	cfg.Pipeline.ShutdownGrace = 2 * time.Second
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	one(t, kc, "in", rec("k0", `"Z"`))
	exactly(t, kc, "out", map[string][]string{"k0": {`"Z"`}}) // C = 1
	r.stop()
	// One round decides o1-o5 (P = 6) and cannot deliver them.
	one(t, kc, "in", rec("k1", `"A"`)) // o1: forwarded, not delivered; compacted away below
	one(t, kc, "in", rec("k2", `"B"`)) // o2
	one(t, kc, "in", rec("k3", `"C"`)) // o3
	one(t, kc, "in", rec("k1", `"A"`)) // o4: o1's duplicate
	one(t, kc, "in", rec("k9", `"-"`)) // o5: keeps o4 out of the last batch, which compaction never touches
	gate.close()
	r = start(t, cfg, store)
	waitProgress(t, store, cfg, "in", 0, 6)
	r.crash()
	kc.Compact()
	if got := kc.ReadAll("in"); len(got) != 5 || got[1].Offset != 2 {
		t.Fatalf("after compaction the input holds %s; want offsets 0, 2, 3, 4, 5", dump(got))
	}
	gate.open()

	// The replay runs in rounds of two records; the first replay stops
	// after its first transaction.
	cfg.Pipeline.MaxInFlight = 2
	validate(t, &cfg)
	var stopped atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hook := func(s pipeline.Step, _ string, _ int32) {
		if s == pipeline.StepAcked && stopped.CompareAndSwap(false, true) {
			cancel()
		}
	}
	pl, err := pipeline.New(cfg, store, pipeline.WithLogger(zaptest.NewLogger(t)), pipeline.WithRegisterer(prometheus.NewRegistry()), pipeline.WithStepHook(hook))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- pl.Run(ctx) }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the first transaction after the restart never came")
	}

	r = start(t, cfg, store)
	exactly(t, kc, "out", map[string][]string{"k0": {`"Z"`}, "k1": {`"A"`}, "k2": {`"B"`}, "k3": {`"C"`}, "k9": {`"-"`}})
	r.stop()
}

// Issue 18, item 6: a partition fenced while this member holds it, whose
// recovery then fails, stays assigned halted (not without a worker), and no
// transaction commits the offsets of its records, which nothing decided.
// (The round used to skip them while End committed every polled offset.)
func TestExactlyOnceFailedRecoveryCommitsNothing(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	commits := watchTxnCommits(kc)
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	inspect := openStore(t, dsn)
	r := start(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("k1", `"A"`))
	exactly(t, kc, "out", map[string][]string{"k1": {`"A"`}})
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)

	// Another owner's recovery fences this member; then the store refuses
	// this member's own recovery.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := inspect.Acquire(ctx, dedup.Partition{Group: cfg.Kafka.Group, Topic: "in", Partition: 0}); err != nil {
		t.Fatal(err)
	}
	failAcquire(t, dsn, cfg.Kafka.Group)
	one(t, kc, "in", rec("k1", `"B"`), rec("k2", `"X"`))
	waitFor(t, "the partition halted", func() (bool, string) {
		err := r.pl.Ready()
		return err != nil && (contains(err.Error(), "halted") || contains(err.Error(), "fenced") || contains(err.Error(), "acquire refused")), fmt.Sprint(err)
	})
	one(t, kc, "in", rec("k3", `"Y"`))
	time.Sleep(3 * time.Second) // rounds go by
	for _, c := range commits.since("in/0", 0) {
		if c > 1 {
			t.Errorf("committed %d for in/0, whose records from 1 on were never decided (all: %v)", c, commits.since("in/0", 0))
			break
		}
	}
	if out := kc.ReadAll("out"); len(out) != 1 {
		t.Errorf("delivered %s, want k1=A alone", dump(out))
	}
	r.stop()
}

// A shutdown ends a recovery of fenced partitions (run again when the
// group settles) that retries a transient refusal of the store: the group's
// callback running it has the client's context, which lives until Run has
// returned, so Run waited for the store for good.
func TestShutdownDuringReRecoveryRetries(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	cfg.Pipeline.ShutdownGrace = 3 * time.Second
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	inspect := openStore(t, dsn)
	r := start(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("k1", `"A"`))
	exactly(t, kc, "out", map[string][]string{"k1": {`"A"`}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := inspect.Acquire(ctx, dedup.Partition{Group: cfg.Kafka.Group, Topic: "in", Partition: 0}); err != nil {
		t.Fatal(err)
	}
	failAcquireWith(t, dsn, cfg.Kafka.Group, "40001") // serialization_failure: retried
	one(t, kc, "in", rec("k1", `"B"`))
	time.Sleep(3 * time.Second) // fenced, then recovered again: retrying
	began := time.Now()
	r.stop()
	if took := time.Since(began); took > cfg.Pipeline.ShutdownGrace+time.Second {
		t.Errorf("shutdown took %s while a recovery retried, above shutdown_grace %s", took, cfg.Pipeline.ShutdownGrace)
	}
}

var _ = config.DeliveryExactlyOnce
