package pipeline

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// budget bounds the records polled but not yet delivered (queued, being
// decided, or decided and on their way to Kafka), shared by every partition
// of this instance: the poll loop waits while the partitions hold
// pipeline.max_in_flight records per assigned partition on average. So it
// bounds memory whatever the batch sizes.
//
// The budget is shared rather than per partition: a fetch brings a run of
// one partition at a time, and stopping every poll while one partition's
// queue was full left the others idle (throughput fell tenfold with
// max_in_flight equal to one poll's records). Memory stays bounded by the
// total: the budget plus one fetch.
type budget struct {
	perPartition int64
	queued       atomic.Int64 // records polled and not yet delivered, every partition
	partitions   atomic.Int64 // assigned partitions
	room         chan struct{}
}

func newBudget(perPartition int) *budget {
	return &budget{perPartition: int64(perPartition), room: make(chan struct{}, 1)}
}

func (b *budget) over() bool {
	n := b.partitions.Load()
	return n > 0 && b.queued.Load() >= n*b.perPartition
}

// wait blocks while the budget is used up, until ctx ends.
func (b *budget) wait(ctx context.Context) {
	for b.over() {
		t := time.NewTimer(time.Second) // a missed signal is only a delay
		select {
		case <-b.room:
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		if ctx.Err() != nil {
			return
		}
	}
}

func (b *budget) release(n int) {
	if n == 0 {
		return
	}
	b.queued.Add(-int64(n))
	b.signal()
}

// signal wakes the poll loop if it waits for room.
func (b *budget) signal() {
	select {
	case b.room <- struct{}{}:
	default:
	}
}

// pollRun is a run of n queued records polled at the same time.
type pollRun struct {
	n  int
	at time.Time
}

// queue holds one partition's polled records until its decider takes them,
// in offset order, with when they were polled (for the poll-to-commit
// latency). It never blocks the poll loop.
type queue struct {
	b      *budget
	mu     sync.Mutex
	recs   []*kgo.Record
	polls  []pollRun // oldest first
	closed bool
	wake   chan struct{}
}

func newQueue(b *budget) *queue { return &queue{b: b, wake: make(chan struct{}, 1)} }

// push appends polled records; a closed queue drops them (they are never
// committed, so whoever decides the partition next reads them again).
func (q *queue) push(recs []*kgo.Record, at time.Time) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.recs = append(q.recs, recs...)
	q.polls = append(q.polls, pollRun{n: len(recs), at: at})
	q.b.queued.Add(int64(len(recs)))
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take waits for records and returns up to n of them with the poll time of
// the oldest, or ok false once the queue is closed or ctx ends. With a
// positive wait, it returns no records (and ok true) once wait has passed
// without any. The records taken still count against the budget until the
// taker releases them (once delivered).
func (q *queue) take(ctx context.Context, n int, wait time.Duration) (recs []*kgo.Record, polled time.Time, ok bool) {
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		q.mu.Lock()
		if q.closed || ctx.Err() != nil {
			q.mu.Unlock()
			return nil, time.Time{}, false
		}
		if len(q.recs) > 0 {
			n = min(n, len(q.recs))
			recs, q.recs = q.recs[:n:n], q.recs[n:]
			polled = q.polls[0].at
			for left := n; left > 0; {
				if q.polls[0].n > left {
					q.polls[0].n -= left
					break
				}
				left -= q.polls[0].n
				q.polls = q.polls[1:]
			}
			if len(q.recs) == 0 {
				q.recs, q.polls = nil, nil
			}
			q.mu.Unlock()
			return recs, polled, true
		}
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-ctx.Done():
		case <-timeout:
			return nil, time.Time{}, true
		}
	}
}

// len is the number of records queued.
func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.recs)
}

// close drops the queued records and makes take return false.
func (q *queue) close() {
	q.mu.Lock()
	dropped := len(q.recs)
	q.closed = true
	q.recs, q.polls = nil, nil
	q.mu.Unlock()
	q.b.release(dropped)
	select {
	case q.wake <- struct{}{}:
	default:
	}
}
