package pipeline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// A partition revoked while its owner is shutting down (a rolling deploy:
// the new pod joins as the old one drains) is released only once the old
// owner has finished it: its late produce cannot land after the new
// owner's record. Here the old owner A cannot deliver v1 (its producer is
// refused) when B joins; B receives a newer v2. Whatever partition B
// takes, the adapter must end on v2 (a partition released at once would
// let B deliver v2 and A's v1 land after it).
func TestRevokedWhileShuttingDownFinishesFirst(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out")
	gate := newProduceGate(t, kc, "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.ShutdownGrace = 8 * time.Second
	a := start(t, cfg, openStore(t, dsn))
	produceTo(t, kc, "in", &kgo.Record{Partition: 0, Key: []byte("p0"), Value: []byte(`"v0"`)}, &kgo.Record{Partition: 1, Key: []byte("p1"), Value: []byte(`"v0"`)})
	a.waitRecords("svc", 2)
	gate.closeFor(gate.last.Load()) // A's producer from now on

	produceTo(t, kc, "in", &kgo.Record{Partition: 0, Key: []byte("p0"), Value: []byte(`"v1"`)}, &kgo.Record{Partition: 1, Key: []byte("p1"), Value: []byte(`"v1"`)})
	store := openStore(t, dsn)
	waitProgress(t, store, cfg, "in", 0, 2)
	waitProgress(t, store, cfg, "in", 1, 2)

	go a.cancel() // A starts shutting down: it cannot deliver v1 for now
	a.done = true
	time.Sleep(200 * time.Millisecond)
	b := start(t, cfg, openStore(t, dsn))
	waitFor(t, "B owning a partition", func() (bool, string) {
		n := b.gauge("dam_partitions_assigned", "svc")
		return n > 0, fmt.Sprint(n)
	})
	produceTo(t, kc, "in", &kgo.Record{Partition: 0, Key: []byte("p0"), Value: []byte(`"v2"`)}, &kgo.Record{Partition: 1, Key: []byte("p1"), Value: []byte(`"v2"`)})
	time.Sleep(2 * time.Second) // B delivers v2 for what it owns, if it owns anything A has not finished
	gate.open()                 // A's v1 goes out now, if A still runs
	waitModel(t, kc, "out", map[string][]string{"p0": {`"v0"`, `"v1"`, `"v2"`}, "p1": {`"v0"`, `"v1"`, `"v2"`}})
	select {
	case <-a.errc:
	case <-time.After(30 * time.Second):
		t.Fatal("A did not stop")
	}
	b.stop()
}

// A shutdown during a broker outage exits within pipeline.shutdown_grace
// (plus a little): the produce that cannot finish is abandoned and the
// next owner delivers what the decision log holds.
func TestShutdownDuringBrokerOutage(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	gate := newProduceGate(t, kc, "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.ShutdownGrace = 3 * time.Second
	r := start(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("k", `"A"`))
	r.waitRecords("svc", 1)
	gate.close()
	one(t, kc, "in", rec("k", `"B"`))
	waitProgress(t, openStore(t, dsn), cfg, "in", 0, 2)
	kc.Close() // no broker any more
	began := time.Now()
	r.stop()
	if took := time.Since(began); took > cfg.Pipeline.ShutdownGrace+time.Second {
		t.Errorf("shutdown took %s during a broker outage, above shutdown_grace %s", took, cfg.Pipeline.ShutdownGrace)
	} else {
		t.Logf("shutdown took %s", took)
	}
}

// A shutdown while PostgreSQL is down ends within pipeline.shutdown_grace,
// in both delivery modes, and an exactly-once round retrying its decide
// through the outage gives the group's rebalance its poll back: the
// round's retries end with the shutdown, so the process does not outlive
// the grace period (to be killed), nor does a rebalance wait for the
// outage to end.
func TestShutdownDuringStoreOutage(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 2, "in", "out")
			proxy, dsn, _ := pgProxy(t)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			cfg.Pipeline.ShutdownGrace = 3 * time.Second
			cfg.Pipeline.RetryMax = 200 * time.Millisecond
			r := start(t, cfg, openStore(t, dsn))
			one(t, kc, "in", rec("k", `"A"`))
			r.waitRecords("svc", 1)
			proxy.Cut()
			one(t, kc, "in", rec("k", `"B"`))
			waitFor(t, "a failed decide", func() (bool, string) {
				n := r.counter("dam_store_errors_total", "svc")
				return n > 0, fmt.Sprint(n)
			})
			if delivery == config.DeliveryExactlyOnce {
				// A second member joins: the rebalance must not wait for
				// the outage to end (the first member gives a partition
				// up; the second recovers it once the store is back).
				b := start(t, cfg, openStore(t, dsn))
				waitFor(t, "the first member giving a partition up", func() (bool, string) {
					n := r.gauge("dam_partitions_assigned", "svc")
					return n == 1, fmt.Sprint(n)
				})
				b.stop()
			}
			began := time.Now()
			r.stop()
			if took := time.Since(began); took > cfg.Pipeline.ShutdownGrace+time.Second {
				t.Errorf("shutdown took %s during a store outage, above shutdown_grace %s", took, cfg.Pipeline.ShutdownGrace)
			} else {
				t.Logf("shutdown took %s", took)
			}
		})
	}
}

// A stop in time lets the decide in flight finish, so that what it decided
// is delivered and committed with the rest: a clean stop leaves C = P. (A
// decide whose COMMIT the server had done when the stop came was given up,
// its batch decided and never delivered by this owner: the chaos row
// 'offsets moved forward' found C < P after a clean stop, and an operator
// moving the offset forward from there skipped records dam had decided to
// forward.) Here the stop comes while the COMMIT's reply is on its way.
func TestStopLetsTheDecideInFlightFinish(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	proxy, dsn, direct := pgProxy(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.ShutdownGrace = 5 * time.Second
	inspect := openStore(t, direct)
	r := start(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("a", `1`))
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)

	stopping := make(chan struct{})
	release := proxy.HoldNextCommitReply(func() { close(stopping) })
	defer release()
	one(t, kc, "in", rec("b", `1`))
	select {
	case <-stopping:
	case <-time.After(waitTimeout):
		t.Fatal("no COMMIT seen by the proxy")
	}
	go func() {
		time.Sleep(300 * time.Millisecond) // the stop has begun
		release()
	}()
	r.stop()
	waitProgress(t, inspect, cfg, "in", 0, 2)
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 2)
	if got := byKey(kc.ReadAll("out")); len(got["b"]) != 1 {
		t.Errorf("delivered %v, want b once", got)
	}
}

// A shutdown ends a recovery that waits for the store: a partition
// assigned while PostgreSQL is down retries its acquire until the store
// answers (TestShutdownDuringReRecoveryRetries: the recovery run again for
// fenced partitions).
func TestShutdownDuringRecoveryStoreOutage(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 2, "in", "out")
			proxy, dsn, _ := pgProxy(t)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			cfg.Pipeline.ShutdownGrace = 3 * time.Second
			cfg.Pipeline.RetryMax = 200 * time.Millisecond
			store := openStore(t, dsn)
			if _, err := store.Distributed(context.Background()); err != nil { // before the outage
				t.Fatal(err)
			}
			proxy.Cut()
			r := start(t, cfg, store)
			time.Sleep(3 * time.Second) // the group forms; recovery waits for the store
			began := time.Now()
			r.stop()
			if took := time.Since(began); took > cfg.Pipeline.ShutdownGrace+time.Second {
				t.Errorf("shutdown took %s while recovery waited for the store, above shutdown_grace %s", took, cfg.Pipeline.ShutdownGrace)
			} else {
				t.Logf("shutdown took %s", took)
			}
		})
	}
}

// A shutdown ends within pipeline.shutdown_grace (docs/delivery.md: "A
// shutdown ends within pipeline.shutdown_grace in both modes.") while an
// exactly-once partition waits to be planned again and PostgreSQL does not
// answer (a network partition: Blackhole, not a refused connection). A
// round that does not commit marks its partitions to be planned again
// (uncommitted), and transactLoop runs replanPending before the next poll;
// replan reads P from the store, which hangs. The shutdown ends that wait:
// the store timeout (2 x statement_timeout + lock_timeout + 5 s = 17 s
// here, once per partition planned again) would outlast the grace period,
// and the orchestrator would SIGKILL the process.
//
// Interleaving: a round's TxnOffsetCommit fails (abort) and, at that
// moment, PostgreSQL stops answering; the loop sleeps its backoff, then
// replanPending -> replan -> ReadProgress waits; then the shutdown.
func TestShutdownDuringReplanInStoreBlackhole(t *testing.T) {
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

// A shutdown ends a recovery of fenced partitions (run again when the
// group settles) that retries a transient refusal of the store: that
// recovery runs in the group's callback, under the client's context,
// which lives until Run has returned, so the shutdown must end its
// retries itself or Run would wait for the store for good.
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
