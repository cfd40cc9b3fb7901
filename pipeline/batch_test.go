package pipeline_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// TestBacklogBatchesAndBudget: a partition with a backlog decides in
// batches bigger than batch_size (up to max_batch), and the records of the
// batches decided but not yet delivered still count against max_in_flight,
// so that a stalled delivery stops the polling instead of letting up to
// four max_batch batches pile up beyond the budget.
func TestBacklogBatchesAndBudget(t *testing.T) {
	t.Parallel()
	const (
		n           = 6000
		batchSize   = 100
		maxBatch    = 1000
		maxInFlight = 1000
	)
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.BatchSize = batchSize
	cfg.Pipeline.MaxBatch = maxBatch
	cfg.Pipeline.MaxInFlight = maxInFlight

	// ~1 KiB records: a fetch of one partition brings at most about a
	// thousand (franz-go's 1 MiB per partition).
	pad := strings.Repeat("x", 1000)
	in := make([]*kgo.Record, n)
	for i := range in {
		in[i] = rec(fmt.Sprintf("e-%d", i), fmt.Sprintf(`{"i":%d,"pad":%q}`, i, pad))
	}
	kc.Produce("in", in...)

	// The first delivery waits until released: the backlog is polled and
	// decided meanwhile, as far as the budget lets it.
	release := make(chan struct{})
	var once sync.Once
	hook := func(s pipeline.Step, _ string, _ int32) {
		if s == pipeline.StepProducing {
			once.Do(func() { <-release })
		}
	}
	validate(t, &cfg)
	reg := prometheus.NewRegistry()
	pl, err := pipeline.New(cfg, openStore(t, dsn), pipeline.WithLogger(zaptest.NewLogger(t)),
		pipeline.WithRegisterer(reg), pipeline.WithStepHook(hook))
	if err != nil {
		t.Fatalf("pipeline.New: %v", err)
	}
	r := run(t, pl, reg)
	var unblocked sync.Once
	unblock := func() { unblocked.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before run's cleanup stops the pipeline

	// While the delivery is stalled, what is decided and what is in
	// flight settle within the budget plus one fetch. Before the budget
	// counted decided batches, the decider went on deciding (up to four
	// batches of max_batch waiting for delivery) and polling went on.
	var peak float64
	var decided float64
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		peak = max(peak, r.gauge0("dam_records_in_flight"))
		_, decided = r.histogram("dam_batch_records", "svc")
		time.Sleep(20 * time.Millisecond)
	}
	const limit = maxInFlight + 1100
	if peak == 0 || decided == 0 {
		t.Fatalf("in flight %.0f, decided %.0f while the backlog waited: want both above 0", peak, decided)
	}
	if peak > limit || decided > limit {
		t.Errorf("while delivery was stalled, %.0f records were decided and dam_records_in_flight reached %.0f: want both at most max_in_flight plus one fetch (%d)", decided, peak, limit)
	}
	unblock()

	r.waitRecords("svc", n)
	waitFor(t, "dam_records_in_flight back to 0", func() (bool, string) {
		v := r.gauge0("dam_records_in_flight")
		return v == 0, fmt.Sprint(v)
	})
	count, sum := r.histogram("dam_batch_records", "svc")
	if sum != n {
		t.Errorf("dam_batch_records sums to %v records, want %d", sum, n)
	}
	// batch_size alone would take n/batch_size = 60 batches.
	if count >= n/batchSize/2 {
		t.Errorf("%d batches for a backlog of %d (%.0f records each): want batches above batch_size %d, up to max_batch %d", count, n, sum/float64(count), batchSize, maxBatch)
	}
	t.Logf("%d batches, %.0f records each, peak in flight %.0f", count, sum/float64(count), peak)
	r.stop()
}

// TestDigestsAgreeAcrossBatchCompositions: the same values decided once
// in one large batch (hashed in lanes) and again in batches of one or two
// (hashed one at a time, below laneMin), in the other order and mixed with
// bad input: every second copy is a duplicate, so "out" holds exactly the
// first round's valid records. Lengths straddle block edges and laneMax.
func TestDigestsAgreeAcrossBatchCompositions(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.Entity = "/id"
	rt.DeadLetter = "dlq"
	cfg := testConfig(t, kc, dsn, rt)
	r := start(t, cfg, openStore(t, dsn))

	var valid []*kgo.Record
	var first []*kgo.Record
	bad := 0
	for i := range 90 {
		n := i * 3
		if i >= 80 {
			n = 8<<10 - 40 + (i-80)*9 // around laneMax
		}
		v := fmt.Sprintf(`{"id":"e%d","pad":%q}`, i, strings.Repeat("p", n))
		valid = append(valid, rec(fmt.Sprintf("k%d", i), v))
		first = append(first, rec(fmt.Sprintf("k%d", i), v))
		switch i % 9 {
		case 2:
			first = append(first, rec("bad", `{"pad":1}`)) // no /id
			bad++
		case 5:
			first = append(first, rec("bad", `{"id":`)) // invalid
			bad++
		case 7:
			first = append(first, tomb("bad")) // tombstone on a pointer route
			bad++
		}
	}
	one(t, kc, "in", first...)
	r.waitRecords("svc", len(first))
	waitOutput(t, kc, "out", len(valid))

	total := len(first)
	for i := len(valid) - 1; i >= 0; i -= 2 {
		batch := []*kgo.Record{rec(string(valid[i].Key), string(valid[i].Value))}
		if i > 0 {
			batch = append(batch, rec(string(valid[i-1].Key), string(valid[i-1].Value)))
		}
		one(t, kc, "in", batch...)
		total += len(batch)
		r.waitRecords("svc", total)
	}
	if got := kc.ReadAll("out"); len(got) != len(valid) {
		t.Fatalf("out holds %d records, want %d (the second copies are duplicates)", len(got), len(valid))
	}
	if got := kc.ReadAll("dlq"); len(got) != bad {
		t.Fatalf("dlq holds %d records, want %d", len(got), bad)
	}
}

// slabStream is a shadow workload: n records over a few keys, values
// repeating, one in eleven bad input, each with a header "seq" naming its
// position; and, per seq, whether a shadow route marks it a duplicate
// (-1: bad input, a dead letter).
func slabStream(n int, seed uint64) ([]*kgo.Record, []int) {
	rng := rand.New(rand.NewPCG(seed, 3))
	last := map[string]string{}
	var in []*kgo.Record
	var want []int
	for i := range n {
		k := fmt.Sprintf("e%02d", rng.IntN(30))
		v := fmt.Sprintf(`{"v":%d}`, rng.IntN(3))
		r := rec(k, v)
		if i%11 == 5 {
			r.Value = []byte(`{bad`)
			want = append(want, -1)
		} else if last[k] == v {
			want = append(want, 1)
		} else {
			want = append(want, 0)
			last[k] = v
		}
		r.Headers = []kgo.RecordHeader{{Key: "seq", Value: []byte(strconv.Itoa(i))}, {Key: "dam-duplicate", Value: []byte("forged")}}
		in = append(in, r)
	}
	return in, want
}

// checkSlab: every valid input is on out once, with its own value and key,
// its own seq header, the duplicate marker exactly when a duplicate, no
// forged dam-* header; every bad one is on dlq once.
func checkSlab(t *testing.T, kc *testkafka.Cluster, in []*kgo.Record, want []int) {
	t.Helper()
	nDLQ := len(want) - countValid(want)
	nOut := countValid(want)
	out := waitOutput(t, kc, "out", nOut)
	checkSlabRecs(t, out, in, want)
	dl := waitOutput(t, kc, "dlq", nDLQ)
	for _, d := range dl {
		seq, _ := strconv.Atoi(headers(d)["seq"])
		if want[seq] != -1 {
			t.Errorf("dead letter of seq %d (want %d)", seq, want[seq])
		}
	}
}

func checkSlabRecs(t *testing.T, out, in []*kgo.Record, want []int) {
	t.Helper()
	seen := map[int]bool{}
	for _, o := range out {
		h := headers(o)
		seq, err := strconv.Atoi(h["seq"])
		if err != nil || seq < 0 || seq >= len(in) {
			t.Fatalf("output %s without a valid seq: %v", kvOf(o), h)
		}
		if seen[seq] {
			t.Errorf("seq %d forwarded twice", seq)
		}
		seen[seq] = true
		src := in[seq]
		if string(o.Key) != string(src.Key) || string(o.Value) != string(src.Value) {
			t.Errorf("seq %d: output %s, input %s", seq, kvOf(o), kvOf(src))
		}
		dup, marked := h[pipeline.HeaderDuplicate]
		if want[seq] < 0 || marked != (want[seq] == 1) || marked && dup != "true" {
			t.Errorf("seq %d (want %d): headers %v", seq, want[seq], h)
		}
		if len(o.Headers) != len(h) {
			t.Errorf("seq %d: headers repeated: %v", seq, o.Headers)
		}
	}
	if len(seen) != countValid(want) {
		t.Errorf("%d distinct forwards, want %d", len(seen), countValid(want))
	}
}

// TestLargeBatchShadowForwardsAndDeadLetters: shadow mode with dead letters, batches
// large enough that one slab holds hundreds of forwards (and the job's
// slice is sized from the counts), at least once and exactly once.
func TestLargeBatchShadowForwardsAndDeadLetters(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("eos=%v", eos), func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 2, "in", "out", "dlq")
			dsn := pgtest.DSN(t)
			rt := route("svc", "in", "out")
			rt.DeadLetter = "dlq"
			rt.Shadow = true
			rt.Partitioning = config.PartitioningPreserve
			cfg := testConfig(t, kc, dsn, rt)
			if eos {
				cfg = eosConfig(t, kc, dsn, "slab", rt)
			}
			cfg.Pipeline.BatchSize = 300
			in, want := slabStream(1500, 7)
			// Produced before the start: the first polls find a backlog.
			// Each key on one partition: the model holds per key.
			for _, r := range in {
				k, _ := strconv.Atoi(string(r.Key[1:]))
				r.Partition = int32(k % 2)
			}
			produceTo(t, kc, "in", in...)
			r := start(t, cfg, openStore(t, dsn))
			r.waitRecords("svc", len(in))
			checkSlab(t, kc, in, want)
			r.stop()
		})
	}
}

// TestLargeBatchForwardedUndecided: on_store_failure: forward with the store cut
// off: every batch is forwarded undecided from the slab (none marked),
// bad input dead-lettered beside it; then the store comes back and the
// pending batches are written.
func TestLargeBatchForwardedUndecided(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	target, rewrite := tcpproxy.PostgresDSN(t, pgtest.DSN(t))
	proxy := tcpproxy.New(t, target)
	dsn := rewrite(proxy.Addr())
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	rt.Shadow = true
	rt.OnStoreFailure = config.OnStoreFailureForward
	cfg := testConfig(t, kc, dsn, rt)
	cfg.Pipeline.BatchSize = 200
	r := start(t, cfg, openStore(t, dsn))
	first := rec("zz", `"warm"`)
	first.Headers = []kgo.RecordHeader{{Key: "seq", Value: []byte("-1")}}
	produceTo(t, kc, "in", first)
	r.waitRecords("svc", 1)
	proxy.Cut()
	in, want := slabStream(800, 9)
	for i := range want {
		if want[i] == 1 {
			want[i] = 0 // undecided: forwarded unmarked
		}
	}
	produceTo(t, kc, "in", in...)
	r.waitRecords("svc", 1+len(in))
	if n := r.records("svc", "undecided"); n == 0 {
		t.Fatalf("nothing forwarded undecided")
	}
	proxy.Restore()
	recs := waitOutput(t, kc, "out", 1+countValid(want))
	var rest []*kgo.Record
	for _, o := range recs {
		if headers(o)["seq"] != "-1" {
			rest = append(rest, o)
		}
	}
	checkSlabRecs(t, rest, in, want)
	r.stop()
}

func countValid(want []int) int {
	n := 0
	for _, w := range want {
		if w >= 0 {
			n++
		}
	}
	return n
}
