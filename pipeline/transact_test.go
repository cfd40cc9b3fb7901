package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// stream is a random last-seen workload: records over entities, about a
// third of them repeats of the entity's last value, with the model of what
// must be forwarded (each entity's changes, in order).
func stream(n, entities int, seed uint64) ([]*kgo.Record, map[string][]string) {
	rng := rand.New(rand.NewPCG(seed, 9))
	last := map[string]string{}
	want := map[string][]string{}
	var in []*kgo.Record
	for i := range n {
		k := fmt.Sprintf("e%02d", rng.IntN(entities))
		v, ok := last[k]
		if !ok || rng.IntN(3) > 0 {
			v = fmt.Sprintf(`{"v":%d}`, rng.IntN(5))
		}
		if !ok || v != last[k] {
			want[k] = append(want[k], v)
		}
		last[k] = v
		_ = i
		in = append(in, rec(k, v))
	}
	return in, want
}

// Exactly-once: the output, read read_committed, is the model exactly, with
// every kind of job in it (forwards, dead letters, a replay after a crash).
func TestExactlyOnce(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 3, "in", "out", "dlq")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	cfg := eosConfig(t, kc, dsn, "a", rt)
	cfg.Pipeline.BatchSize = 7
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	in, want := stream(600, 40, 1)
	for chunk := range slices.Chunk(in, 100) {
		kc.Produce("in", chunk...)
	}
	kc.Produce("in", rec("bad", `{bad`))
	r.waitRecords("svc", len(in)+1)
	exactly(t, kc, "out", want)
	if dl := kc.ReadAll("dlq"); len(dl) != 1 {
		t.Errorf("dead letters: %s, want one", dump(dl))
	}
	r.stop()
}

// A crash in the middle of a transaction (here: a stop that cannot finish
// it, the produce being refused) leaves an open or aborted transaction;
// recovery replays the decisions, and a read_committed reader sees each
// forward once.
func TestExactlyOnceCrashMidTransaction(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	gate := newProduceGate(t, kc, "out")
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	cfg.Pipeline.ShutdownGrace = 2 * time.Second
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	one(t, kc, "in", rec("k1", `"A"`))
	exactly(t, kc, "out", map[string][]string{"k1": {`"A"`}})
	gate.close()
	one(t, kc, "in", rec("k1", `"B"`), rec("k2", `"X"`), rec("k1", `"B"`))
	waitProgress(t, store, cfg, "in", 0, 4)
	r.crash()
	gate.open()
	r = start(t, cfg, store)
	one(t, kc, "in", rec("k2", `"Y"`))
	exactly(t, kc, "out", map[string][]string{"k1": {`"A"`, `"B"`}, "k2": {`"X"`, `"Y"`}})
	r.stop()
}

// A reply lost after the broker handled it (franz-go issues #1052 and
// #1207: End reports an error for a transaction that committed). The
// round's partitions read C again from Kafka (require-stable) and find the
// commit: nothing is delivered twice. Covered for EndTxn (the commit
// happened) and TxnOffsetCommit (the transaction aborts).
func TestExactlyOnceAmbiguousReplies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		key  kmsg.Key
	}{{"EndTxn", kmsg.EndTxn}, {"TxnOffsetCommit", kmsg.TxnOffsetCommit}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1, "in", "out")
			dsn := pgtest.DSN(t)
			cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
			validate(t, &cfg)
			reg := prometheus.NewRegistry()
			pl, err := pipeline.New(cfg, openStore(t, dsn), pipeline.WithLogger(zaptest.NewLogger(t)), pipeline.WithRegisterer(reg),
				pipeline.WithKafkaOptions(kgo.RequestTimeoutOverhead(time.Second), kgo.RetryTimeout(2*time.Second)))
			if err != nil {
				t.Fatal(err)
			}
			r := run(t, pl, reg)
			one(t, kc, "in", rec("k1", `"A"`))
			exactly(t, kc, "out", map[string][]string{"k1": {`"A"`}})

			// For the next 5 s, the replies of this kind come 3 s late: after
			// the client gave up (1 s), its retries too (2 s). The broker
			// still handles each request.
			var delayed atomic.Bool
			var until atomic.Int64
			kc.ControlKey(int16(tc.key), func(kmsg.Request) (kmsg.Response, error, bool) {
				kc.KeepControl()
				if !delayed.Swap(true) {
					until.Store(time.Now().Add(5 * time.Second).UnixNano())
				}
				if time.Now().UnixNano() < until.Load() {
					kc.SleepControl(func() { time.Sleep(3 * time.Second) })
				}
				return nil, nil, false
			})
			one(t, kc, "in", rec("k1", `"B"`), rec("k2", `"X"`))
			one(t, kc, "in", rec("k2", `"Y"`))
			exactly(t, kc, "out", map[string][]string{"k1": {`"A"`, `"B"`}, "k2": {`"X"`, `"Y"`}})
			if !delayed.Load() {
				t.Error("no request was delayed")
			}
			if n := r.counter("dam_delivery_errors_total", "svc"); n == 0 {
				t.Error("the delayed reply did not fail a transaction")
			}
			r.stop()
		})
	}
}

// The group session breaks (a heartbeat fails) after a round polled and
// before it ends. franz-go's manage loop then waits for AllowRebalance
// (BlockRebalanceOnPoll), which dam calls after End, while End waits for a
// heartbeat that only that loop sends (franz-go issue #1053: the loss is
// only reported after AllowRebalance): without a bound on End, the
// partition stalls for good. With it, End gives up after the transaction
// timeout, the round aborts and replays, and the output stays exact.
func TestExactlyOnceGroupSessionBreaksBeforeEnd(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	validate(t, &cfg)

	var armed atomic.Bool
	broke := make(chan struct{})
	hook := func(s pipeline.Step, _ string, _ int32) {
		if s != pipeline.StepAcked || !armed.CompareAndSwap(true, false) {
			return
		}
		// The next heartbeat fails: the coordinator forgot this member.
		kc.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
			resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
			resp.ErrorCode = kerr.UnknownMemberID.Code
			close(broke)
			return resp, nil, true
		})
		select {
		case <-broke:
			time.Sleep(100 * time.Millisecond) // the manage loop reaches its wait
		case <-time.After(15 * time.Second):
			t.Error("no heartbeat within 15 s")
		}
	}
	reg := prometheus.NewRegistry()
	pl, err := pipeline.New(cfg, openStore(t, dsn), pipeline.WithLogger(zaptest.NewLogger(t)),
		pipeline.WithRegisterer(reg), pipeline.WithStepHook(hook))
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, pl, reg)
	one(t, kc, "in", rec("k1", `"A"`))
	exactly(t, kc, "out", map[string][]string{"k1": {`"A"`}})

	armed.Store(true)
	one(t, kc, "in", rec("k1", `"B"`), rec("k2", `"X"`))
	one(t, kc, "in", rec("k2", `"Y"`))
	exactly(t, kc, "out", map[string][]string{"k1": {`"A"`, `"B"`}, "k2": {`"X"`, `"Y"`}})
	if armed.Load() {
		t.Error("the fault was never injected")
	}
	r.stop()
}

// The known franz-go issue itself (#1052, #1207): the broker commits the
// transaction but its EndTxn reply is lost; dam reads C again from Kafka,
// finds the commit, and delivers nothing twice.
func TestExactlyOnceCommittedReplyLost(t *testing.T) {
	t.Parallel()
	lossy := &lossyFaults{}
	kc := testkafka.NewWith(t, 1, []string{"in", "out"}, []kfake.Opt{kfake.ListenFn(lossy.listen)})
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	r := start(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("k1", `"A"`))
	exactly(t, kc, "out", map[string][]string{"k1": {`"A"`}})
	lossy.loseNext(kmsg.EndTxn)
	one(t, kc, "in", rec("k1", `"B"`), rec("k2", `"X"`))
	one(t, kc, "in", rec("k2", `"Y"`))
	exactly(t, kc, "out", map[string][]string{"k1": {`"A"`, `"B"`}, "k2": {`"X"`, `"Y"`}})
	if lossy.lost.Load() != 1 {
		t.Errorf("%d EndTxn replies lost, want 1", lossy.lost.Load())
	}
	r.stop()
}

// Two live instances given the same transactional id: the newer fences
// the older, which stops with an error saying so; the output stays exact.
func TestExactlyOnceSameTransactionalID(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "same", route("svc", "in", "out"))
	a := start(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("k1", `"A"`))
	exactly(t, kc, "out", map[string][]string{"k1": {`"A"`}})
	b := start(t, cfg, openStore(t, dsn))
	waitFor(t, "B owning a partition", func() (bool, string) {
		n := b.gauge("dam_partitions_assigned", "svc")
		return n > 0, fmt.Sprint(n)
	})
	// B's producer takes the transactional id at its first transaction
	// (franz-go initializes it then): one record on each partition makes
	// sure B has one, and A's next transaction comes after it. (Without
	// this, A could commit its next round just before B's first one and,
	// idle after, never learn it was fenced.)
	produceTo(t, kc, "in", &kgo.Record{Partition: 0, Key: []byte("k3"), Value: []byte(`"Z"`)}, &kgo.Record{Partition: 1, Key: []byte("k2"), Value: []byte(`"X"`)})
	exactly(t, kc, "out", map[string][]string{"k1": {`"A"`}, "k2": {`"X"`}, "k3": {`"Z"`}})
	produceTo(t, kc, "in", &kgo.Record{Partition: 0, Key: []byte("k1"), Value: []byte(`"B"`)}, &kgo.Record{Partition: 1, Key: []byte("k2"), Value: []byte(`"W"`)})
	var err error
	select {
	case err = <-a.errc:
		a.done = true
	case <-time.After(waitTimeout):
		t.Fatal("the fenced instance did not stop")
	}
	if err == nil || !strings.Contains(err.Error(), "transactional id") {
		t.Fatalf("the fenced instance returned %v, want an error naming the transactional id", err)
	}
	exactly(t, kc, "out", map[string][]string{"k1": {`"A"`, `"B"`}, "k2": {`"X"`, `"W"`}, "k3": {`"Z"`}})
	b.stop()
}

// Bad input without a dead-letter topic halts its partition in
// exactly-once mode too: nothing of it is committed past what was
// delivered, and the other partitions go on.
func TestExactlyOnceHalt(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	produceTo(t, kc, "in", &kgo.Record{Partition: 0, Key: []byte("a"), Value: []byte(`1`)})
	exactly(t, kc, "out", map[string][]string{"a": {`1`}})
	produceTo(t, kc, "in", &kgo.Record{Partition: 0, Key: []byte("bad"), Value: []byte(`{bad`)}, &kgo.Record{Partition: 0, Key: []byte("b"), Value: []byte(`2`)})
	var err error
	waitFor(t, "in/0 halted", func() (bool, string) {
		err = r.pl.Ready()
		return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
	})
	produceTo(t, kc, "in", &kgo.Record{Partition: 1, Key: []byte("c"), Value: []byte(`3`)})
	exactly(t, kc, "out", map[string][]string{"a": {`1`}, "c": {`3`}})
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
	time.Sleep(time.Second) // a few more rounds
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
	r.stop()
	_ = context.Background
}

// A round lasts as long as its slowest partition decides, retries through
// a lock or an outage included, and that is no bound: a partition that
// decides for longer than kafka.transaction_timeout after another of its
// round was decided must not make the broker time out the round's
// transaction (which fences the producer, and so stops the instance).
// Here the partition decided second ends its decide 11 s after the
// other's, in one round; the transaction timeout is 8 s. The instance
// keeps running, and the output is exactly the input's, with no round
// failed.
func TestExactlyOnceRoundOutlastsTheTransactionTimeout(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	validate(t, &cfg)
	store := openStore(t, dsn)
	want := map[string][]string{}
	// The records are produced before each start, so that the first fetch,
	// and so the first round, usually holds both partitions; the hook
	// tells whether it did, and else the attempt is made again.
	for attempt := 1; attempt <= 8; attempt++ {
		var (
			first   atomic.Int32 // the partition decided first, plus one
			slowed  atomic.Bool
			spanned atomic.Bool // the other decided in its round, past the timeout
			acked   [2]atomic.Bool
		)
		hook := func(s pipeline.Step, _ string, part int32) {
			switch s {
			case pipeline.StepAcked:
				acked[part].Store(true)
			case pipeline.StepDecided:
				if first.CompareAndSwap(0, part+1) {
					return
				}
				if f := first.Load() - 1; f != part && slowed.CompareAndSwap(false, true) {
					time.Sleep(cfg.Kafka.TransactionTimeout + 3*time.Second)
					spanned.Store(!acked[f].Load())
				}
			}
		}
		v := fmt.Sprint(attempt)
		produceTo(t, kc, "in", &kgo.Record{Partition: 0, Key: []byte("a"), Value: []byte(v)}, &kgo.Record{Partition: 1, Key: []byte("b"), Value: []byte(v)})
		want["a"], want["b"] = append(want["a"], v), append(want["b"], v)
		reg := prometheus.NewRegistry()
		pl, err := pipeline.New(cfg, store, pipeline.WithLogger(zaptest.NewLogger(t)), pipeline.WithRegisterer(reg), pipeline.WithStepHook(hook))
		if err != nil {
			t.Fatal(err)
		}
		r := run(t, pl, reg)
		deadline := time.Now().Add(waitTimeout)
		for !slowed.Load() || len(kc.ReadAll("out")) < 2*len(want["a"]) {
			select {
			case err := <-r.errc:
				r.done = true
				t.Fatalf("attempt %d: the instance stopped while partition 1 decided slowly: %v", attempt, err)
			case <-time.After(100 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("attempt %d: timed out; out holds %s", attempt, dump(kc.ReadAll("out")))
			}
		}
		exactly(t, kc, "out", want)
		failed := r.counter("dam_delivery_errors_total", "svc")
		r.stop()
		if spanned.Load() {
			if failed != 0 {
				t.Fatalf("dam_delivery_errors_total = %v: a round failed because one partition decided slowly", failed)
			}
			return
		}
		t.Logf("attempt %d: partitions 0 and 1 were not decided in one round; again", attempt)
	}
	t.Fatal("partitions 0 and 1 were never decided in one round")
}
