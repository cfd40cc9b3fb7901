package pipeline_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
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
