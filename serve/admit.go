package serve

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// admission bounds the store work the requests hold at once: the checks
// queued for the store or being decided (a single check is one, a batch
// its valid checks, a state read or reset one). Past capacity, requests
// would otherwise queue for the store (the combiner's queue, the pool's)
// until serve.request_timeout, and fail after it, while the store decided
// checks whose clients had given up: the service would collapse instead
// of shedding the excess.
//
// A request that finds no room waits for it, first come first served, at
// most admitWait (and at most as many as the bound wait so); it is then
// answered 503 with Retry-After (see errShed). The bound is the most the
// store is asked to hold; what it can decide in time is less when it is
// slow, which Server.admit tells from the combiner's queue (see
// maxStoreWait).
type admission struct {
	limit int
	wait  time.Duration
	gauge prometheus.Gauge

	mu      sync.Mutex
	used    int
	waiters list.List // *admitWaiter, oldest first
}

const (
	// admitWait is the most a request waits for room in front of the
	// store before its 503: long enough for the room of a transaction
	// committing to be given to it, short enough that the excess is told
	// at once.
	admitWait = 20 * time.Millisecond
	// maxStoreWait is how long store work may wait for a decider: while
	// the oldest queued (a single check, a batch, a state read or reset)
	// has waited longer, the store is behind (past capacity, or slowed),
	// and a request is answered 503 at once rather than queued behind it.
	// Work admitted is thus taken by a decider within about this much,
	// whatever the store's pace, and the queue holds what the store
	// decides in that time: the bound adapts to it.
	maxStoreWait = 250 * time.Millisecond
)

// errShed: no room in front of the store within admitWait.
var errShed = errors.New("the store is at capacity")

// admitWaiter is a request waiting for room.
type admitWaiter struct {
	n       int
	ready   chan struct{} // closed once granted
	granted bool          // under admission.mu
}

func newAdmission(limit int, wait time.Duration, gauge prometheus.Gauge) *admission {
	return &admission{limit: max(1, limit), wait: wait, gauge: gauge}
}

// weight is what n checks take: at most the whole bound, so that a batch
// larger than the bound is admitted alone rather than never.
func (a *admission) weight(n int) int { return min(max(1, n), a.limit) }

// acquire takes room for n checks, waiting up to a.wait for it: nil once
// taken (give it back with release(n)), errShed past the wait, or ctx's
// error when the request ends first.
func (a *admission) acquire(ctx context.Context, n int) error {
	n = a.weight(n)
	a.mu.Lock()
	if a.waiters.Len() == 0 && a.used+n <= a.limit {
		a.takeLocked(n)
		a.mu.Unlock()
		return nil
	}
	if a.wait <= 0 || a.waiters.Len() >= a.limit {
		a.mu.Unlock()
		return errShed
	}
	w := &admitWaiter{n: n, ready: make(chan struct{})}
	e := a.waiters.PushBack(w)
	a.mu.Unlock()
	t := time.NewTimer(a.wait)
	defer t.Stop()
	err := errShed
	select {
	case <-w.ready:
		return nil
	case <-t.C:
	case <-ctx.Done():
		err = ctx.Err()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.granted { // granted as the wait ended: keep it
		return nil
	}
	a.waiters.Remove(e)
	a.grantLocked() // the next one may fit where this one did not
	return err
}

// release gives back the room of n checks taken by acquire.
func (a *admission) release(n int) {
	n = a.weight(n)
	a.mu.Lock()
	a.used -= n
	a.gauge.Sub(float64(n))
	a.grantLocked()
	a.mu.Unlock()
}

// takeLocked takes room for n. a.mu is held.
func (a *admission) takeLocked(n int) {
	a.used += n
	a.gauge.Add(float64(n))
}

// grantLocked gives room to the waiters in order, while the oldest fits.
// a.mu is held.
func (a *admission) grantLocked() {
	for e := a.waiters.Front(); e != nil; e = a.waiters.Front() {
		w := e.Value.(*admitWaiter)
		if a.used+w.n > a.limit {
			return
		}
		a.takeLocked(w.n)
		w.granted = true
		a.waiters.Remove(e)
		close(w.ready)
	}
}
