package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
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
	b := newBudget(100, 1<<30)
	a := newAccount(b)
	q := newQueue(a)
	t0 := time.Unix(1000, 0)
	q.push(recs(3), t0)
	q.push(recs(4), t0.Add(time.Second))
	q.push(recs(2), t0.Add(2*time.Second))
	for i, want := range []struct {
		n      int
		polled time.Time
	}{
		{2, t0},                      // within the first run
		{2, t0},                      // the first run's last record, then the second's
		{4, t0.Add(time.Second)},     // the rest of the second run and the third
		{5, t0.Add(2 * time.Second)}, // what is left: one record
	} {
		got, polled, ok := q.take(context.Background(), want.n, 0)
		if !ok || !polled.Equal(want.polled) {
			t.Fatalf("take %d: %d records, polled %v, ok %v; want polled %v", i, len(got), polled, ok, want.polled)
		}
	}
	// Taken records still count until they are delivered (released).
	if len(q.recs) != 0 || len(q.polls) != 0 || b.queued.Load() != 9 {
		t.Fatalf("queue %d, polls %v, budget %d after taking everything", len(q.recs), q.polls, b.queued.Load())
	}
	a.give(9, 9*inFlightOverhead)
	if b.queued.Load() != 0 || b.bytes.Load() != 0 {
		t.Fatalf("budget %d after releasing everything", b.queued.Load())
	}
}

// TestTakeWait: with a wait, take returns empty-handed when nothing comes.
func TestTakeWait(t *testing.T) {
	q := newQueue(newAccount(newBudget(10, 1<<30)))
	start := time.Now()
	got, _, ok := q.take(context.Background(), 5, 50*time.Millisecond)
	if len(got) != 0 || !ok || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("take with a wait on an empty queue: %d records, ok %v after %v", len(got), ok, time.Since(start))
	}
}

// TestOverBudget: polling stops only when the queues hold max_in_flight
// records per partition in total, however they are spread; closing a queue
// gives its records back.
func TestOverBudget(t *testing.T) {
	b := newBudget(10, 1<<30)
	if b.over() {
		t.Fatal("no partitions: over budget")
	}
	b.partitions.Store(3)
	q0, q1 := newQueue(newAccount(b)), newQueue(newAccount(b))
	q0.push(recs(25), time.Now()) // one partition far over its share
	if b.over() {
		t.Fatal("25 of 30 queued: over budget")
	}
	q1.push(recs(5), time.Now())
	if !b.over() {
		t.Fatal("30 of 30 queued: not over budget")
	}
	q0.close()
	if b.over() || b.queued.Load() != 5 {
		t.Fatalf("after closing the full queue: over %v, queued %d", b.over(), b.queued.Load())
	}
	q0.push(recs(50), time.Now()) // dropped: closed
	if b.queued.Load() != 5 {
		t.Fatalf("a closed queue took records: queued %d", b.queued.Load())
	}
	if _, _, ok := q0.take(context.Background(), 1, 0); ok {
		t.Fatal("take on a closed queue returned records")
	}
}

// TestOverBudgetBytes: polling stops when the records in flight take
// pipeline.max_in_flight_bytes, however few they are.
func TestOverBudgetBytes(t *testing.T) {
	b := newBudget(1000, 3<<20)
	b.partitions.Store(1)
	q := newQueue(newAccount(b))
	big := func() []*kgo.Record { return []*kgo.Record{{Value: make([]byte, 1<<20)}} }
	q.push(big(), time.Now())
	q.push(big(), time.Now())
	if b.over() {
		t.Fatalf("2 MiB of 3 in flight: over budget")
	}
	q.push(big(), time.Now())
	if !b.over() {
		t.Fatalf("3 records of 1 MiB against a 3 MiB budget: not over (bytes %d)", b.bytes.Load())
	}
	q.close()
	if b.over() || b.bytes.Load() != 0 || b.queued.Load() != 0 {
		t.Fatalf("after closing: over %v, %d records, %d bytes", b.over(), b.queued.Load(), b.bytes.Load())
	}
}

// TestAccountGivesBackOnce: an account gives back each record once,
// whichever of delivery and closing comes first, and takes nothing once
// closed, so that the budget returns to zero on every path.
func TestAccountGivesBackOnce(t *testing.T) {
	b := newBudget(10, 1<<30)
	a := newAccount(b)
	a.take(7, 700)
	a.give(3, 300) // delivered
	a.close()      // the worker ends with 4 undelivered
	a.give(4, 400) // a late delivery: already given back
	a.take(5, 500) // a late push: refused
	a.giveAll()    // and again
	if b.queued.Load() != 0 || b.bytes.Load() != 0 {
		t.Fatalf("budget after every path: %d records, %d bytes; want 0, 0", b.queued.Load(), b.bytes.Load())
	}
	if ok := a.take(1, 1); ok {
		t.Fatal("a closed account took records")
	}
}
