package pipeline_test

// Regression tests from an adversarial review of the fix for issue 18:
// a reviewer with a fresh context was given the code and one order, break
// it (lose, duplicate, stall, exhaust). Each TestBreak* test failed on the
// code it names (the comments say how it broke, BREAK n); each passes
// since the fix that followed: a refused dead letter bounded and checked
// again (3, 4), records forwarded undecided decided apart (2), replans
// ended by a shutdown (1), re-read records dropped and positions put back
// after franz-go rewinds them (5, 6), the delivered offset consulted when
// C moved back (7), the transact session ended after every revocation
// (8), a failed first recovery held halted (9).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pgtest"
	"github.com/dam-dedup/dam/internal/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// BREAK 1 (stall: shutdown outlives shutdown_grace; issue 18 item 4).
//
// docs/delivery.md: "A shutdown ends within pipeline.shutdown_grace in
// both modes." In exactly-once mode a round that does not commit sets its
// partitions to be planned again (uncommitted -> w.eos.replanning), and
// transactLoop runs replanPending() before the next poll. replan() reads
// P with storeCtx(w.dctx): bounded only by the store timeout
// (2 x statement_timeout + lock_timeout + 5 s = 17 s here) and by the
// worker's own context, which the shutdown cancels only later, in
// p.shutdown(), after transactLoop has returned. The process context is
// not looked at inside replanPending. So a shutdown that comes while
// PostgreSQL does not answer (a network partition: Blackhole, not a
// refused connection) waits for the store timeout, once per partition
// being planned again, and the process is SIGKILLed by its orchestrator.
//
// Interleaving: a round's TxnOffsetCommit fails (abort) and, at that
// moment, PostgreSQL stops answering; the loop sleeps its backoff, then
// replanPending -> replan -> ReadProgress hangs; SIGTERM.
// Code: pipeline/transact.go replanPending / replan (storeCtx(w.dctx),
// fetchCommitted with TransactionTimeout+5s), transactLoop (ctx checked
// only after replanPending returns).
func TestBreakShutdownDuringReplanInStoreBlackhole(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	proxy, dsn, _ := pgProxy(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	cfg.Pipeline.ShutdownGrace = 3 * time.Second
	cfg.Pipeline.RetryMin = 50 * time.Millisecond
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	r := start(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("k", `"A"`))
	exactly(t, kc, "out", map[string][]string{"k": {`"A"`}})

	failed := failNextTxnOffsetCommit(kc, proxy.Blackhole)
	one(t, kc, "in", rec("k", `"B"`))
	select {
	case <-failed:
	case <-time.After(waitTimeout):
		t.Fatal("no TxnOffsetCommit came")
	}
	// The abort, the backoff (at most 200 ms), and replanPending is
	// waiting for PostgreSQL.
	time.Sleep(1500 * time.Millisecond)
	began := time.Now()
	r.stop()
	took := time.Since(began)
	proxy.Restore()
	if took > cfg.Pipeline.ShutdownGrace+time.Second {
		t.Errorf("shutdown took %s while PostgreSQL did not answer, above shutdown_grace %s", took.Round(100*time.Millisecond), cfg.Pipeline.ShutdownGrace)
	} else {
		t.Logf("shutdown took %s", took)
	}
}

// BREAK 2 (stall: a halt of a partition that has a dead-letter topic,
// caused by one record the store refuses; issue 18 item 10: "No error from
// the store about one record may halt a partition that has a dead-letter
// topic").
//
// With on_store_failure: forward, a record decided while PostgreSQL is
// down is forwarded undecided and its batch kept in w.pending, to be
// written back (flush) once the store answers. If the store then refuses
// that record (SQLSTATE class 22/54: the case decideApart was written
// for), flush() returns the store's error as is, and nothing decides the
// pending batch apart: decideLoop parks the partition on it (idle
// partition: decideLoop's flush; a partition with new records: decide()
// returns the flush error as the new batch's, decideApart then decides the
// *new* batch from the wrong start and is fenced). The partition halts,
// not ready, with the raw store error, naming no offset, until a restart.
// Code: pipeline/decide.go flush() and decideLoop (w.park on flush's
// error); decideBatch only tries decideApart for the batch at hand.
func TestBreakStoreRefusedRecordForwardedUndecidedHalts(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	proxy, dsn, direct := pgProxy(t)
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	rt.OnStoreFailure = config.OnStoreFailureForward
	cfg := testConfig(t, kc, dsn, rt)
	cfg.Pipeline.RetryMin = 50 * time.Millisecond
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	r := start(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("a", `1`))
	r.waitRecords("svc", 1)
	storeRefuses(t, direct)

	proxy.Cut()
	one(t, kc, "in", rec("poison", `1`)) // forwarded undecided
	r.waitRecords("svc", 2)
	proxy.Restore()
	time.Sleep(2 * time.Second) // the write-back of the undecided batch
	one(t, kc, "in", rec("a", `2`))
	var last error
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if last = r.pl.Ready(); last == nil && r.records("svc") == 3 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last != nil || r.records("svc") != 3 {
		t.Errorf("a partition with a dead-letter topic is halted by one record the store refuses: Ready() = %v, %d of 3 records through", last, r.records("svc"))
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

// BREAK 3 (stall: a halt of a partition that has a dead-letter topic,
// caused by one hostile record; at-least-once mode). DESIGN §2: "A record
// Kafka refuses for good: dead letter without its value ..., or a halt of
// that partition alone when the route has no dead-letter topic"; docs:
// identities longer than 1 KiB are bad input, dead-lettered.
//
// The record's dead letter is the record plus dam's headers: larger than
// the dead-letter topic accepts (same default limit as the input).
// precheck replaces it with the refused letter, which drops the 1-byte
// value but keeps the 1 MB key (route.refusedLetter) and adds a longer
// dam-error: still too large, and precheck does not check a refused
// letter again (o.outcome == outcomeRefused). The broker refuses it;
// produce() -> refuse() returns false for an outcomeRefused record, so
// the job is stuck and the partition halts with "Kafka refused the record
// for good and route svc has no dead_letter topic", although it has one.
// A restart halts there again: one record from any producer stops the
// partition for good.
// Code: pipeline/route.go refusedLetter (keeps r.Key); pipeline/deliver.go
// precheck (skips outcomeRefused) and refuse.
func TestBreakHugeKeyDeadLetterHalts(t *testing.T) {
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

// BREAK 4 (stall of every partition of the instance, without a halt;
// exactly-once mode). Same hostile record as BREAK 3.
//
// In a round, precheck turns the too-large dead letter into the refused
// letter and, as above, never checks that again. The broker refuses it;
// the round's produce callback only records refusedAt[offset] and fails
// the round: abort, replan, replay. The replay's precheck finds
// refusedAt[offset], replaces the dead letter by the same refused letter
// (and skips it, outcomeRefused), the broker refuses it again: abort. For
// ever, with backoff: nothing is ever halted (Ready says "produce to dlq"
// as a pause), nothing of the partition is delivered again, not even the
// records before the hostile one; and since one transaction carries every
// partition of the round, another partition's records abort with it
// whenever they share a round (they get through in the rounds between:
// in/1 is checked to show it is in/0 alone that stalls).
// Code: pipeline/transact.go round (Produce callback: refusedAt, never
// j.stuck for a refused letter), pipeline/deliver.go precheck.
func TestBreakHugeKeyExactlyOnceLoops(t *testing.T) {
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

// BREAK 5 (duplicate in exactly-once mode: a forward delivered twice to
// read_committed readers).
//
// franz-go's GroupTransactSession keeps its own idea of the committed
// offsets: after a committed End it sets them to every offset polled
// (setOffsets(postcommit)), after an aborted one it rewinds every
// partition whose polled head differs from that idea to it
// (setOffsets(currentCommit)): the fetch cursor moves back and what is
// buffered is dropped. dam's worker knows nothing of that rewind unless
// the partition was in the aborted round (then it is planned again).
//
// A partition holding a replay (w.plan.replay, its jobs held in w.eos.round
// until the replay is complete) is polled in a round that ends without
// any End (round: "Only held replays and catch-up: nothing to deliver or
// commit"), so franz-go's polled head for it moves past its idea of the
// committed offset. The next round holds only another partition and
// aborts (here: its TxnOffsetCommit fails; a decide error or a halt does
// the same through uncommitted's End(TryAbort)). franz-go rewinds the
// replaying partition to C and it reads [C, ...) again, while its worker
// still holds the replay's state: rp.log has been consumed past those
// offsets, so each re-read record is taken for one the log does not name
// and goes through replay()'s other branches: on a shadow route it is
// delivered again (marked dam-duplicate), with its first copy still in
// the held jobs; both copies are committed in the replay's transaction.
// (On a route without shadow, the same re-read makes owes() deliver an
// older record of an owed entity as its owed content and forget the debt:
// the entity's last content is never delivered.)
//
// Determinism: one record batch per fetch (FetchMaxPartitionBytes(1),
// records produced one batch each), fetch sessions off, and a kfake fault
// that answers in/0's fetches past C with NOT_LEADER_FOR_PARTITION while
// the other partition's round aborts.
// Code: pipeline/transact.go round (the no-End return for held replays;
// uncommitted replans only the round's parts), decideRound/replay (held
// state kept across rounds), franz-go txn.go End (setOffsets).
func TestBreakHeldReplayRewoundByAnotherPartitionsAbort(t *testing.T) {
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
	td, err := kadm.NewClient(kc.Client()).ListTopics(context.Background(), "in")
	if err != nil {
		t.Fatal(err)
	}
	inID := td["in"].ID
	heldOne := make(chan struct{}, 1)
	fault := kc.Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.Fetch}, Topic: "in", TopicID: inID, Partitions: []int32{0}, Count: -1,
		Err: kerr.NotLeaderForPartition,
		When: func(req kmsg.Request) bool {
			for _, t := range req.(*kmsg.FetchRequest).Topics {
				if t.Topic != "in" && t.TopicID != inID {
					continue
				}
				for _, p := range t.Partitions {
					if p.Partition == 0 && p.FetchOffset > 1 {
						select {
						case heldOne <- struct{}{}:
						default:
						}
						return true
					}
				}
			}
			return false
		},
	})
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

// BREAK 6 (loss, exactly-once mode): the same rewind as BREAK 5, on a
// route without shadow, where the replay owes an entity. The input is
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
// franz-go rewinds in/0 to 1. The replay reads o1 again: the log no longer
// names offset 1 (consumed), so owes() takes it as e's next readable
// record and delivers o1 (v1) again as the owed content, and forgets the
// debt; o4 is then a plain duplicate. The adapter gets e v1 twice and
// never v2 (the content the store holds for e: its next v2 is dropped as
// a duplicate too). A forward is lost for good, and one delivered twice.
// Code: as BREAK 5, and pipeline/recover.go replay/owes (a record below
// the replay's read position taken as the owed entity's next record).
func TestBreakHeldReplayRewoundLosesOwedEntity(t *testing.T) {
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

// BREAK 7 (duplicate in exactly-once mode, beyond the in-flight bound in
// at-least-once mode): offsets moved back by hand. docs/delivery.md: "C <
// P, no log (offsets moved back by hand): continue from P: dam forwards
// changes only; to re-deliver on purpose, reset the state". But the log is
// pruned below C only now and then (pruneEvery, 5 s) and not at a clean
// stop, so right after a stop it still covers the last batches delivered.
// An operator who moves the group's offset back (kafka-consumer-groups
// --reset-offsets --shift-by -2) makes recovery take C < P with the log
// covering [C, P) for a crash, and deliver those batches again, though
// the store knows they were delivered: progress.delivered, recorded for
// this very purpose (issue 18 item 8), is at P and is consulted only when
// Kafka has no committed offset.
// Code: pipeline/plan.go planRecovery (C below P: the replay starts at
// max(C, the delivered offset)).
func TestBreakOffsetsMovedBackReplaysDelivered(t *testing.T) {
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

// BREAK 8 (a partition kept by a member that no longer owns it;
// exactly-once mode). franz-go's GroupTransactSession calls the
// application's OnPartitionsRevoked only for the first revocation between
// two End calls (its wrapper returns early while s.revoked is set, and
// only End clears it). dam calls End only for rounds that deliver or
// commit something, so an idle member that loses partitions in two
// rebalances never hears of the second: the workers of those partitions
// stay registered (dam_partitions_assigned, the poll budget
// max_in_flight x partitions, /readyz), and a worker left waiting to be
// planned again is planned against the new owner's epoch: fenced, it
// forces a rebalance, and onJoined "recovers" a partition this member
// does not hold, bumping the epoch under its real owner.
// Code: pipeline/pipeline.go onRevoked (never called), transact.go
// (End only when there is something to deliver or commit); franz-go
// txn.go NewGroupTransactSession's onRevoked wrapper.
func TestBreakSecondRevocationUnseen(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 4, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	a := start(t, cfg, openStore(t, dsn))
	waitFor(t, "a owning the 4 partitions", func() (bool, string) {
		n := a.gauge("dam_partitions_assigned", "svc")
		return n == 4, fmt.Sprint(n)
	})
	cfgB := cfg
	cfgB.Kafka.TransactionalID = cfg.Kafka.Group + "-b"
	b := start(t, cfgB, openStore(t, dsn))
	waitFor(t, "a giving 2 partitions to b", func() (bool, string) {
		n, m := a.gauge("dam_partitions_assigned", "svc"), b.gauge("dam_partitions_assigned", "svc")
		return n == 2 && m == 2, fmt.Sprint(n, m)
	})
	b.stop()
	waitFor(t, "a owning the 4 partitions again", func() (bool, string) {
		n := a.gauge("dam_partitions_assigned", "svc")
		return n == 4, fmt.Sprint(n)
	})
	cfgC := cfg
	cfgC.Kafka.TransactionalID = cfg.Kafka.Group + "-c"
	c := start(t, cfgC, openStore(t, dsn))
	waitFor(t, "c owning 2 partitions", func() (bool, string) {
		m := c.gauge("dam_partitions_assigned", "svc")
		return m == 2, fmt.Sprint(m)
	})
	time.Sleep(3 * time.Second)
	if n := a.gauge("dam_partitions_assigned", "svc"); n != 2 {
		t.Errorf("a reports %v partitions assigned (workers registered) while it holds 2 and c holds the other 2", n)
	}
	c.stop()
	a.stop()
}

// BREAK 9 (stall without a clear halt): recovery that fails for good at a
// partition's first assignment. Issue 18 item 6 made a failed re-recovery
// (onJoined) register halted workers (holdUnrecovered); the first
// assignment's path does not. onAssigned returns recovery's permanent
// error (here: the store refuses the epoch bump, as a revoked grant or a
// broken schema would) to franz-go's AdjustFetchOffsetsFn, having stopped
// and unregistered what it started. franz-go ends the group session and
// rejoins, recovery fails again, and so on: the partition has no worker,
// nothing is consumed, and /readyz says ready (joined, no partition
// halted: Ready() iterates the workers, and there are none), dam_halted
// is 0. A silent stall, and the member keeps rebalancing the whole group.
// Code: pipeline/pipeline.go onAssigned (fail: no holdUnrecovered),
// Ready/haltedCounts (only registered workers count).
func TestBreakFirstRecoveryFailsSilently(t *testing.T) {
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
