package serve

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

// combiner decides the single checks of concurrent requests together
// (group commit): a fixed set of deciders each take every check waiting,
// up to maxCombined, and decide them in one dedup.CheckBatch transaction,
// one round trip and one commit for all. An idle decider takes a check as
// soon as it arrives, so a lone request waits for nothing; under load the
// commits, not the requests, are what PostgreSQL counts.
//
// Each check takes effect when its batch commits, inside its request's
// time, so decisions stay linearizable per identity. When the store
// refuses a batch for a reason that is not an outage (a check it cannot
// take although it passed dam's own limits), the batch's checks are
// decided again one by one, each in its own transaction: one client's
// check never fails another's. A check whose request
// ends (timeout, client gone) before a decider took it is withdrawn: no
// decision is made. Once taken, it is answered by its batch, which runs
// with the earliest deadline of its checks.
//
// The deciders run the rest of the store work too (a batch request, a
// state read or reset: a job, see do), one job at a time, in the order
// of the queue: they are the only users of the store's connections, so
// that every request waiting for PostgreSQL waits in this one queue,
// whose oldest entry tells how far the store is behind (see oldest).
type combiner struct {
	base    context.Context // the deciders' context: never canceled, values only
	store   *dedup.Store
	max     int
	timeout time.Duration
	metrics *metrics

	mu    sync.Mutex
	queue []*waiter
	ready chan struct{} // one token per decider that may have work
	stop  chan struct{}
	wg    sync.WaitGroup
}

// maxCombined bounds the checks of one combined transaction.
const maxCombined = 256

// waiter is one check waiting for its decision, or one job.
type waiter struct {
	item dedup.CheckItem
	// job, when set, is store work of a request of its own, run alone
	// with ctx (the request's) instead of item.
	job      func(context.Context) error
	ctx      context.Context
	deadline time.Time
	queued   time.Time // when it joined the queue
	taken    bool      // a decider has it: it will be answered
	done     chan struct{}
	decision dedup.Decision
	err      error
}

// newCombiner starts n deciders; stop them with close. A batch runs to its
// deadline whatever happens to ctx (shutdown lets the batches in flight
// finish).
func newCombiner(ctx context.Context, store *dedup.Store, n int, timeout time.Duration, m *metrics) *combiner {
	c := &combiner{base: context.WithoutCancel(ctx), store: store, max: maxCombined, timeout: timeout, metrics: m,
		ready: make(chan struct{}, n), stop: make(chan struct{})}
	for range n {
		c.wg.Add(1)
		go c.decider()
	}
	return c
}

// close stops the deciders after their batches in flight and waits for
// them. Checks still queued are answered ErrUnavailable (none are, once
// the HTTP server has drained).
func (c *combiner) close() {
	close(c.stop)
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.queue {
		w.err = dedup.ErrUnavailable
		close(w.done)
	}
	c.queue = nil
}

// check decides item, combined with the checks of concurrent requests.
func (c *combiner) check(ctx context.Context, item dedup.CheckItem) (dedup.Decision, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(c.timeout)
	}
	w := &waiter{item: item, deadline: deadline, queued: time.Now(), done: make(chan struct{})}
	return c.wait(ctx, w)
}

// do runs job with ctx on a decider, in its turn, and returns its error;
// ctx's error, with job not run, when ctx ends before a decider took it.
func (c *combiner) do(ctx context.Context, job func(context.Context) error) error {
	w := &waiter{job: job, ctx: ctx, queued: time.Now(), done: make(chan struct{})}
	_, err := c.wait(ctx, w)
	return err
}

// wait queues w for a decider and waits for its answer.
func (c *combiner) wait(ctx context.Context, w *waiter) (dedup.Decision, error) {
	c.mu.Lock()
	c.queue = append(c.queue, w)
	c.mu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default: // every decider already has a token: one of them takes it
	}
	select {
	case <-w.done:
		return w.decision, w.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if !w.taken {
		c.queue = slices.DeleteFunc(c.queue, func(x *waiter) bool { return x == w })
		c.mu.Unlock()
		return 0, ctx.Err() // withdrawn: nothing was decided
	}
	c.mu.Unlock()
	<-w.done // its batch runs until the earliest deadline of its checks
	return w.decision, w.err
}

// oldest is how long the oldest check or job not yet taken has waited (0
// when none waits): how far the deciders are behind.
func (c *combiner) oldest() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		return 0
	}
	return time.Since(c.queue[0].queued)
}

// take removes the job first in the queue, or up to max waiting checks
// before the first job, marking them taken.
func (c *combiner) take() []*waiter {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := min(len(c.queue), c.max)
	if n == 0 {
		return nil
	}
	for i, w := range c.queue[:n] {
		if w.job != nil {
			n = max(1, i)
			break
		}
	}
	batch := slices.Clone(c.queue[:n])
	c.queue = slices.Delete(c.queue, 0, n)
	for _, w := range batch {
		w.taken = true
	}
	return batch
}

func (c *combiner) decider() {
	defer c.wg.Done()
	var items []dedup.CheckItem
	var out []dedup.Decision
	for {
		batch := c.take()
		if batch == nil {
			select {
			case <-c.ready:
				continue
			case <-c.stop:
				return
			}
		}
		if w := batch[0]; w.job != nil {
			w.err = w.job(w.ctx)
			close(w.done)
			continue
		}
		deadline := batch[0].deadline
		items = items[:0]
		for _, w := range batch {
			items = append(items, w.item)
			if w.deadline.Before(deadline) {
				deadline = w.deadline
			}
		}
		// The batch belongs to no single request: it runs to the earliest
		// deadline of its checks, not to any request's cancellation.
		ctx, cancel := context.WithDeadline(c.base, deadline)
		var err error
		out, err = c.store.CheckBatch(ctx, items, out)
		c.metrics.combined.Observe(float64(len(batch)))
		if err != nil && !isUnavailable(err) && len(batch) > 1 {
			// The store refused the shared transaction for a reason no
			// retry fixes, perhaps because of one check: decide them
			// one by one, so that only that check fails.
			c.metrics.separated.Add(float64(len(batch)))
			for _, w := range batch {
				w.decision, w.err = checkOne(ctx, c.store, w.item)
				close(w.done)
			}
			cancel()
			continue
		}
		cancel()
		for i, w := range batch {
			if err != nil {
				w.err = err
			} else {
				w.decision = out[i]
			}
			close(w.done)
		}
	}
}

// checkOne decides item in a transaction of its own.
func checkOne(ctx context.Context, store *dedup.Store, item dedup.CheckItem) (dedup.Decision, error) {
	out, err := store.CheckBatch(ctx, []dedup.CheckItem{item}, nil)
	if err != nil {
		return 0, err
	}
	return out[0], nil
}
