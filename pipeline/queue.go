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
// pipeline.max_in_flight records per assigned partition on average, or
// pipeline.max_in_flight_bytes in all. So it bounds memory whatever the
// batch sizes and whatever the record sizes.
//
// The budget is shared rather than per partition: a fetch brings a run of
// one partition at a time, and stopping every poll while one partition's
// queue was full left the others idle (throughput fell tenfold with
// max_in_flight equal to one poll's records). Memory stays bounded by the
// total: the budget plus one fetch.
//
// Each worker takes and gives back its records through an account, never
// the budget directly: whatever path ends a worker (a halt, a fence, a
// lost partition, a grace period overrun), closing its account gives back
// exactly what it still holds, so that no failure can leave the poll loop
// waiting for room that nothing will free.
type budget struct {
	perPartition int64
	maxBytes     int64
	queued       atomic.Int64 // records polled and not yet delivered, every partition
	bytes        atomic.Int64 // their size (recordBytes)
	partitions   atomic.Int64 // assigned partitions
	room         chan struct{}
}

func newBudget(perPartition, maxBytes int) *budget {
	return &budget{perPartition: int64(perPartition), maxBytes: int64(maxBytes), room: make(chan struct{}, 1)}
}

func (b *budget) over() bool {
	n := b.partitions.Load()
	return n > 0 && (b.queued.Load() >= n*b.perPartition || b.bytes.Load() >= b.maxBytes)
}

// waitWhile blocks while over reports the budget used up, until ctx ends;
// each giving back wakes it to ask again.
func (b *budget) waitWhile(ctx context.Context, over func() bool) {
	for over() {
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

// add counts n records of size bytes in (n, size > 0) or out (< 0).
func (b *budget) add(n, size int64) {
	b.queued.Add(n)
	b.bytes.Add(size)
	if n < 0 || size < 0 {
		b.signal()
	}
}

// signal wakes the poll loop if it waits for room.
func (b *budget) signal() {
	select {
	case b.room <- struct{}{}:
	default:
	}
}

// inFlightOverhead approximates what a polled record takes beyond its key,
// value and headers (the kgo.Record, its output record, the job's entry).
const inFlightOverhead = 256

// recordBytes is what a polled record counts against the byte budget.
func recordBytes(r *kgo.Record) int64 {
	n := inFlightOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// recordsBytes is recordBytes summed over recs.
func recordsBytes(recs []*kgo.Record) int64 {
	var n int64
	for _, r := range recs {
		n += recordBytes(r)
	}
	return n
}

// account is one worker's share of the budget: the records it has taken
// and not given back. Every record is given back exactly once: when it is
// delivered (give), or when the worker ends (close), whichever comes
// first; a closed account takes nothing more.
type account struct {
	b       *budget
	mu      sync.Mutex
	records int64
	bytes   int64
	closed  bool
}

func newAccount(b *budget) *account { return &account{b: b} }

// take counts n records of size bytes against the budget, or reports
// false once the account is closed (the caller then drops them).
func (a *account) take(n int, size int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	a.records += int64(n)
	a.bytes += size
	a.b.add(int64(n), size)
	return true
}

// give returns n records of size bytes, no more than the account holds.
func (a *account) give(n int, size int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rn, rb := min(int64(n), a.records), min(size, a.bytes)
	if rn == 0 && rb == 0 {
		return
	}
	a.records -= rn
	a.bytes -= rb
	a.b.add(-rn, -rb)
}

// giveAll returns everything the account holds; it stays open.
func (a *account) giveAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked()
}

// close returns everything the account holds and takes nothing more.
func (a *account) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	a.releaseLocked()
}

func (a *account) releaseLocked() {
	if a.records != 0 || a.bytes != 0 {
		a.b.add(-a.records, -a.bytes)
		a.records, a.bytes = 0, 0
	}
	a.b.signal()
}

// held is what the account holds: records and bytes.
func (a *account) held() (int64, int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.records, a.bytes
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
	acct   *account
	mu     sync.Mutex
	recs   []*kgo.Record
	polls  []pollRun // oldest first
	closed bool
	wake   chan struct{}
}

func newQueue(acct *account) *queue { return &queue{acct: acct, wake: make(chan struct{}, 1)} }

// push appends polled records; a closed queue drops them (they are never
// committed, so whoever decides the partition next reads them again).
func (q *queue) push(recs []*kgo.Record, at time.Time) {
	q.mu.Lock()
	if q.closed || !q.acct.take(len(recs), recordsBytes(recs)) {
		q.mu.Unlock()
		return
	}
	q.recs = append(q.recs, recs...)
	q.polls = append(q.polls, pollRun{n: len(recs), at: at})
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
// taker gives them back (once delivered) or the account closes.
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
	dropped := q.recs
	q.closed = true
	q.recs, q.polls = nil, nil
	q.mu.Unlock()
	q.acct.give(len(dropped), recordsBytes(dropped))
	select {
	case q.wake <- struct{}{}:
	default:
	}
}
