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
// A request that finds no room waits for it at most admitWait (and at
// most as many of one tenant as the bound wait so); it is then answered
// 503 with Retry-After (see errShed). The room is shared among the
// tenants (the tokens): as room is given back, it goes to the waiting
// request of the tenant that holds the least, the oldest of its requests
// first; and while several tenants hold or wait for room, a request
// within its tenant's fair share (the bound divided among them) is not
// the excess: it waits for its turn up to fairWait (maxStoreWait), the
// time the room held by the others takes to be decided. A tenant flooding the service
// thus takes the room the others leave, never theirs: one with a check
// at a time is served however many the others send. The bound is the
// most the store is asked to hold; what it can decide in time is less
// when it is slow, which Server.admit tells from the combiner's queue
// (see maxStoreWait).
type admission struct {
	limit    int
	wait     time.Duration // past its tenant's fair share
	fairWait time.Duration // within it
	gauge    prometheus.Gauge

	mu      sync.Mutex
	used    int
	held    map[any]int        // room held, by tenant
	waiters map[any]*list.List // *admitWaiter by tenant, oldest first
	waiting int                // in all of waiters
	seq     uint64             // of the last waiter
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
	tenant  any
	n       int
	seq     uint64        // arrival order
	ready   chan struct{} // closed once granted
	granted bool          // under admission.mu
}

func newAdmission(limit int, wait, fairWait time.Duration, gauge prometheus.Gauge) *admission {
	return &admission{limit: max(1, limit), wait: wait, fairWait: fairWait, gauge: gauge, held: map[any]int{}, waiters: map[any]*list.List{}}
}

// weight is what n checks take: at most the whole bound, so that a batch
// larger than the bound is admitted alone rather than never.
func (a *admission) weight(n int) int { return min(max(1, n), a.limit) }

// acquire takes room for n checks of tenant (any comparable value: the
// token), waiting for it up to a.fairWait within tenant's fair share,
// a.wait past it: nil once taken (give it back with release(tenant, n)),
// errShed past the wait, or ctx's error when the request ends first.
func (a *admission) acquire(ctx context.Context, tenant any, n int) error {
	n = a.weight(n)
	a.mu.Lock()
	if a.waiting == 0 && a.used+n <= a.limit {
		a.takeLocked(tenant, n)
		a.mu.Unlock()
		return nil
	}
	q := a.waiters[tenant]
	wait := a.wait
	if share, tenants := a.fairShareLocked(tenant); tenants > 1 && a.held[tenant]+n <= share {
		wait = max(wait, a.fairWait)
	}
	if wait <= 0 || (q != nil && q.Len() >= a.limit) {
		a.mu.Unlock()
		return errShed
	}
	if q == nil {
		q = list.New()
		a.waiters[tenant] = q
	}
	a.seq++
	w := &admitWaiter{tenant: tenant, n: n, seq: a.seq, ready: make(chan struct{})}
	e := q.PushBack(w)
	a.waiting++
	a.grantLocked() // first in line, it may fit where the others did not
	a.mu.Unlock()
	t := time.NewTimer(wait)
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
	a.removeLocked(q, e)
	a.grantLocked() // the next one may fit where this one did not
	return err
}

// release gives back the room of n checks of tenant taken by acquire.
func (a *admission) release(tenant any, n int) {
	n = a.weight(n)
	a.mu.Lock()
	a.used -= n
	if a.held[tenant] -= n; a.held[tenant] <= 0 {
		delete(a.held, tenant)
	}
	a.gauge.Sub(float64(n))
	a.grantLocked()
	a.mu.Unlock()
}

// fairShareLocked is the room of each tenant holding or waiting for room,
// tenant one of them, shared equally, and their number. a.mu is held.
func (a *admission) fairShareLocked(tenant any) (share, tenants int) {
	tenants = len(a.held)
	for t := range a.waiters {
		if _, ok := a.held[t]; !ok {
			tenants++
		}
	}
	if _, ok := a.held[tenant]; !ok {
		if _, ok := a.waiters[tenant]; !ok {
			tenants++
		}
	}
	return a.limit / tenants, tenants
}

// takeLocked takes room for n of tenant. a.mu is held.
func (a *admission) takeLocked(tenant any, n int) {
	a.used += n
	a.held[tenant] += n
	a.gauge.Add(float64(n))
}

// removeLocked takes e out of tenant's waiters q. a.mu is held.
func (a *admission) removeLocked(q *list.List, e *list.Element) {
	w := q.Remove(e).(*admitWaiter)
	a.waiting--
	if q.Len() == 0 {
		delete(a.waiters, w.tenant)
	}
}

// grantLocked gives room to the waiters, while the first in line fits:
// the oldest waiter of the tenant holding the least room (the oldest
// such waiter among tenants holding as little). a.mu is held.
func (a *admission) grantLocked() {
	for a.waiting > 0 {
		var first *admitWaiter
		var fq *list.List
		for tenant, q := range a.waiters {
			w := q.Front().Value.(*admitWaiter)
			if first == nil || a.held[tenant] < a.held[first.tenant] ||
				(a.held[tenant] == a.held[first.tenant] && w.seq < first.seq) {
				first, fq = w, q
			}
		}
		if a.used+first.n > a.limit {
			return
		}
		a.takeLocked(first.tenant, first.n)
		first.granted = true
		a.removeLocked(fq, fq.Front())
		close(first.ready)
	}
}
