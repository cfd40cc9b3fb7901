package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
)

func recs(n int) []*kgo.Record {
	out := make([]*kgo.Record, n)
	for i := range out {
		out[i] = &kgo.Record{Offset: int64(i)}
	}
	return out
}

// TestTakePollTimes: a batch reports when its oldest record was polled, and
// records left behind keep their own poll time, so that poll-to-commit
// latency is not inflated under a sustained backlog.
func TestTakePollTimes(t *testing.T) {
	cfg := config.Default()
	pl := &Pipeline{cfg: cfg, room: make(chan struct{}, 1), workers: map[string]map[int32]*worker{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &worker{pl: pl, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1)}
	t0 := time.Unix(1000, 0)
	w.push(recs(3), t0)
	w.push(recs(4), t0.Add(time.Second))
	w.push(recs(2), t0.Add(2*time.Second))
	for i, want := range []struct {
		n      int
		polled time.Time
	}{
		{2, t0},                      // within the first run
		{2, t0},                      // the first run's last record, then the second's
		{4, t0.Add(time.Second)},     // the rest of the second run and the third
		{5, t0.Add(2 * time.Second)}, // what is left: one record
	} {
		got, polled, ok := w.take(want.n)
		if !ok || !polled.Equal(want.polled) {
			t.Fatalf("take %d: %d records, polled %v, ok %v; want polled %v", i, len(got), polled, ok, want.polled)
		}
	}
	if len(w.queue) != 0 || len(w.polls) != 0 {
		t.Fatalf("queue %d, polls %v after taking everything", len(w.queue), w.polls)
	}
}

// TestOverBudget: polling stops only when the queues hold max_in_flight
// records per partition in total, however they are spread.
func TestOverBudget(t *testing.T) {
	cfg := config.Default()
	cfg.Pipeline.MaxInFlight = 10
	pl := &Pipeline{cfg: cfg, room: make(chan struct{}, 1), workers: map[string]map[int32]*worker{}}
	if pl.overBudget() {
		t.Fatal("no partitions: over budget")
	}
	ws := map[int32]*worker{}
	for p := range int32(3) {
		ws[p] = &worker{pl: pl, wake: make(chan struct{}, 1)}
	}
	pl.workers["in"] = ws
	ws[0].push(recs(25), time.Now()) // one partition far over its share
	if pl.overBudget() {
		t.Fatal("25 of 30 queued: over budget")
	}
	ws[1].push(recs(5), time.Now())
	if !pl.overBudget() {
		t.Fatal("30 of 30 queued: not over budget")
	}
}
