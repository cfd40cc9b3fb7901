package pipeline_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

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

// TestBreakSlabShadowDeadLetters: shadow mode with dead letters, batches
// large enough that one slab holds hundreds of forwards (and the job's
// slice is sized from the counts), at least once and exactly once.
func TestBreakSlabShadowDeadLetters(t *testing.T) {
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

// TestBreakSlabUndecided: on_store_failure: forward with the store cut
// off: every batch is forwarded undecided from the slab (none marked),
// bad input dead-lettered beside it; then the store comes back and the
// pending batches are written.
func TestBreakSlabUndecided(t *testing.T) {
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
