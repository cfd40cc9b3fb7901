package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// Exactly-once with Kafka's committed offset C moved ahead of P by hand
// (P=10, C=22), in rounds of five records (or ten, when a round takes a
// buffered fetch whole): the catch-up rounds below C commit nothing, so C
// never goes back (to 15, then 20). A C gone back
// would let a stop after a catch-up round make the next owner forward
// records the operator skipped (decided as new from 15), and a round that
// forwards 22-24 and then fails leave a C of 20 that the decision log
// does not cover (22-24 lost).
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

	// The round holding [20, 25) (or [20, 30)) forwards 22-24 and cannot
	// deliver them.
	gate := newProduceGate(t, kc, "out")
	gate.close()
	r = start(t, cfg, store)
	waitProgressFrom(t, store, cfg, "in", 0, 25, 30)
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

// A replay in exactly-once mode never commits past an entity it owes. o1
// (k1 "A") was forwarded and not delivered, then compaction removed it,
// since o4 (k1 "A", its duplicate) supersedes it. The replay is delivered
// whole, with the commit of its end, in one transaction: a stop after the
// replay's first round leaves C where it was, and the next replay still
// owes k1 and delivers o4. (A first round committing 4 while k1 is owed
// would make the next replay begin at 4, unaware that k1 is owed: "A"
// would never be delivered.)
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

// A partition fenced while this member holds it, whose recovery then
// fails, stays assigned halted (not without a worker), and no transaction
// commits the offsets of its records, which nothing decided: a round that
// skipped them would still have End commit every polled offset.
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

// A replay held across rounds, rewound by another partition's aborted
// round, delivers each record once to read_committed readers (exactly-once
// mode, a shadow route).
//
// franz-go's GroupTransactSession keeps its own idea of the committed
// offsets: after a committed End it sets them to every offset polled
// (setOffsets(postcommit)), after an aborted one it rewinds every
// partition whose polled head differs from that idea to it
// (setOffsets(currentCommit)): the fetch cursor moves back and what is
// buffered is dropped, for partitions that were not in the aborted round
// too.
//
// A partition holding a replay (its jobs held until the replay is
// complete) is polled in rounds that end without any End (nothing to
// deliver or commit), so franz-go's polled head for it moves past its idea
// of the committed offset. The next round holds only another partition and
// aborts (here: its TxnOffsetCommit fails; a decide error or a halt does
// the same through uncommitted's End(TryAbort)). franz-go rewinds the
// replaying partition to C and it reads [C, ...) again, while its worker
// holds the replay's state, its log consumed past those offsets: a
// re-read record taken for one the log does not name would be delivered
// again on a shadow route (marked dam-duplicate), its first copy still in
// the held jobs, and both copies committed in the replay's transaction.
//
// Determinism: one record batch per fetch (FetchMaxPartitionBytes(1),
// records produced one batch each), fetch sessions off, and a kfake fault
// that answers in/0's fetches past C with NOT_LEADER_FOR_PARTITION while
// the other partition's round aborts.
func TestExactlyOnceRewoundHeldReplayDeliversOnce(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.Shadow = true
	cfg := eosConfig(t, kc, dsn, "a", rt)
	cfg.Pipeline.ShutdownGrace = 2 * time.Second
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	one(t, kc, "in", rec("k0", `0`))
	exactly(t, kc, "out", map[string][]string{"k0": {`0`}})
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
	r.stop()

	// in/0: [1, 4) decided and logged, not delivered (C = 1, P = 4).
	gate := newProduceGate(t, kc, "out")
	one(t, kc, "in", rec("k1", `1`))
	one(t, kc, "in", rec("k2", `1`))
	one(t, kc, "in", rec("k3", `1`))
	gate.close()
	r = start(t, cfg, store)
	waitProgress(t, store, cfg, "in", 0, 4)
	r.crash()
	gate.open()

	// The replay of [1, 4) reads one record per fetch; after the first,
	// in/0's fetches fail until the other partition's round has aborted.
	fault, heldOne := faultFetchPast(t, kc, "in", 0, 1)
	validate(t, &cfg)
	reg := prometheus.NewRegistry()
	pl, err := pipeline.New(cfg, store, pipeline.WithLogger(zaptest.NewLogger(t)), pipeline.WithRegisterer(reg),
		pipeline.WithKafkaOptions(kgo.FetchMaxPartitionBytes(1), kgo.DisableFetchSessions()))
	if err != nil {
		t.Fatal(err)
	}
	r = run(t, pl, reg)
	select {
	case <-heldOne: // in/0's offset 1 was polled (its replay holds it)
	case <-time.After(waitTimeout):
		t.Fatal("in/0 was never fetched past offset 1")
	}
	time.Sleep(500 * time.Millisecond)
	aborted := failNextTxnOffsetCommit(kc, nil)
	produceTo(t, kc, "in", &kgo.Record{Partition: 1, Key: []byte("b1"), Value: []byte(`1`)})
	select {
	case <-aborted:
	case <-time.After(waitTimeout):
		t.Fatal("in/1's round never came")
	}
	time.Sleep(500 * time.Millisecond)
	fault.Remove()

	want := map[string][]string{"k0": {`0`}, "k1": {`1`}, "k2": {`1`}, "k3": {`1`}, "b1": {`1`}}
	waitFor(t, "every record delivered", func() (bool, string) {
		got := byKey(kc.ReadAll("out"))
		for k := range want {
			if got[k] == nil {
				return false, fmt.Sprint(got)
			}
		}
		return true, ""
	})
	time.Sleep(2 * time.Second) // anything more the replay delivers
	out := kc.ReadAll("out")
	got := byKey(out)
	for k, vs := range want {
		if len(got[k]) != len(vs) {
			t.Errorf("%s delivered %d times to read_committed readers, want %d: %s", k, len(got[k]), len(vs), dump(out))
		}
	}
	r.stop()
}

// The rewind of TestExactlyOnceRewoundHeldReplayDeliversOnce, on a route
// without shadow, where the replay owes an entity: the entity's last
// forwarded content is delivered, and each content once. The input is
// compacted and the entity is a JSON pointer (/id), so Kafka keys and
// entities differ:
//
//	o1 key a {"id":"e","v":1}  forwarded, logged
//	o2 key b {"id":"e","v":2}  forwarded, logged; compacted away (o4)
//	o3 key c {"id":"f","v":1}  forwarded, logged
//	o4 key b {"id":"e","v":2}  o2's duplicate, not logged
//	o5 key z {"id":"z","v":1}  forwarded (keeps o4 out of the last batch)
//
// None of o1-o5 was delivered (C = 1, P = 6). The replay reads o1
// (delivers e v1), then o3: skipTo passes the unreadable o2, so e is owed
// and o4, e's next readable record, must be delivered for it. Both rounds
// hold the replay and end without End. Another partition's round aborts:
// franz-go rewinds in/0 to 1, and the replay reads o1 again, an offset its
// log no longer names (consumed). Taken for e's next readable record
// (owes), o1 (v1) would be delivered again as the owed content and the
// debt forgotten; o4 would then be a plain duplicate, and the adapter would
// get e v1 twice and never v2 (the content the store holds for e: its next
// v2 is dropped as a duplicate too).
func TestExactlyOnceRewoundHeldReplayKeepsOwedEntity(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "out")
	kc.CreateTopic("in", 2, "cleanup.policy", "compact")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.Entity = "/id"
	cfg := eosConfig(t, kc, dsn, "a", rt)
	cfg.Pipeline.ShutdownGrace = 2 * time.Second
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	one(t, kc, "in", rec("k0", `{"id":"k0","v":0}`))
	exactly(t, kc, "out", map[string][]string{"k0": {`{"id":"k0","v":0}`}})
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
	r.stop()

	gate := newProduceGate(t, kc, "out")
	one(t, kc, "in", rec("a", `{"id":"e","v":1}`))
	one(t, kc, "in", rec("b", `{"id":"e","v":2}`))
	one(t, kc, "in", rec("c", `{"id":"f","v":1}`))
	one(t, kc, "in", rec("b", `{"id":"e","v":2}`))
	one(t, kc, "in", rec("z", `{"id":"z","v":1}`))
	gate.close()
	r = start(t, cfg, store)
	waitProgress(t, store, cfg, "in", 0, 6)
	r.crash()
	gate.open()
	kc.Compact()
	if got := kc.ReadAll("in"); len(got) != 5 || got[2].Offset != 3 {
		t.Fatalf("after compaction the input holds %s; want offsets 0, 1, 3, 4, 5", dump(got))
	}

	// One record batch per fetch; in/0's fetches past offset 3 (o1, o3
	// read) fail until the other partition's round has aborted.
	fault, past := faultFetchPast(t, kc, "in", 0, 3)
	validate(t, &cfg)
	reg := prometheus.NewRegistry()
	pl, err := pipeline.New(cfg, store, pipeline.WithLogger(zaptest.NewLogger(t)), pipeline.WithRegisterer(reg),
		pipeline.WithKafkaOptions(kgo.FetchMaxPartitionBytes(1), kgo.DisableFetchSessions()))
	if err != nil {
		t.Fatal(err)
	}
	r = run(t, pl, reg)
	select {
	case <-past:
	case <-time.After(waitTimeout):
		t.Fatal("in/0 was never fetched past offset 3")
	}
	time.Sleep(500 * time.Millisecond)
	aborted := failNextTxnOffsetCommit(kc, nil)
	produceTo(t, kc, "in", &kgo.Record{Partition: 1, Key: []byte("p1"), Value: []byte(`{"id":"p1","v":1}`)})
	select {
	case <-aborted:
	case <-time.After(waitTimeout):
		t.Fatal("in/1's round never came")
	}
	time.Sleep(500 * time.Millisecond)
	fault.Remove()

	waitFor(t, "the replay delivered", func() (bool, string) {
		got := byKey(kc.ReadAll("out"))
		return got["z"] != nil && got["p1"] != nil, fmt.Sprint(got)
	})
	time.Sleep(2 * time.Second)
	var e []string
	for _, o := range kc.ReadAll("out") {
		if v := string(o.Value); strings.Contains(v, `"id":"e"`) {
			e = append(e, v)
		}
	}
	if len(e) == 0 || e[len(e)-1] != `{"id":"e","v":2}` {
		t.Errorf("entity e: delivered %q; its last forwarded content v2 never reached the adapter", e)
	}
	if len(e) > 2 {
		t.Errorf("entity e: delivered %d times, want v1 and v2 once each", len(e))
	}
	r.stop()
}
