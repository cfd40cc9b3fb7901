package serve

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// room bounds the request bodies of one token held in memory at once:
// the token's share of serve.max_in_flight_bytes (see tokenShare), so
// that one tenant's bodies never take another's room. A body takes room
// as it arrives (see bodyReader), not from its Content-Length before a
// byte came: a request that announces a large body and sends nothing
// holds next to nothing. It keeps what it read until the request gives it
// all back (once the payloads are hashed).
//
// Bodies taking room bit by bit could each hold part of the room and all
// wait for more, none able to finish. So room is granted only while every
// body being read can still finish (the banker's rule, for one resource):
// ordered by what each may still need (the rest of its Content-Length, or
// of serve.max_body_bytes without one), each fits in the free room plus
// what the bodies before it hold and give back once read. A grant that
// would break this waits. A small check that arrives whole fits whenever
// its size is free: it never queues behind a large body.
type room struct {
	mu     sync.Mutex
	size   int64
	used   int64
	bodies map[*claim]struct{}
	freed  chan struct{} // closed (and replaced) whenever room is given back or a body is read
	gauge  prometheus.Gauge
}

// claim is one body's account in a room.
type claim struct {
	limit int64 // the most the body may come to
	held  int64 // room it holds
}

func newRoom(size int64, gauge prometheus.Gauge) *room {
	return &room{size: size, bodies: map[*claim]struct{}{}, freed: make(chan struct{}), gauge: gauge}
}

// open registers a body that may come to limit bytes.
func (r *room) open(limit int64) *claim {
	c := &claim{limit: min(limit, r.size)}
	r.mu.Lock()
	r.bodies[c] = struct{}{}
	r.mu.Unlock()
	return c
}

// grow takes n more bytes of room for c, waiting until they can be
// granted safely or ctx ends (its error is returned).
func (r *room) grow(ctx context.Context, c *claim, n int64) error {
	for {
		r.mu.Lock()
		if r.safe(c, n) {
			c.held += n
			r.used += n
			r.gauge.Add(float64(n))
			r.mu.Unlock()
			return nil
		}
		freed := r.freed
		r.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// safe reports whether granting n more bytes to c leaves every body able
// to finish. r.mu is held.
func (r *room) safe(c *claim, n int64) bool {
	free := r.size - r.used - n
	if free < 0 {
		return false
	}
	need := func(b *claim) int64 {
		if b == c {
			return b.limit - b.held - n
		}
		return b.limit - b.held
	}
	most := int64(0)
	for b := range r.bodies {
		most = max(most, need(b))
	}
	if most <= free { // any of them can finish: the usual case
		return true
	}
	type account struct{ need, held int64 }
	all := make([]account, 0, len(r.bodies))
	for b := range r.bodies {
		held := b.held
		if b == c {
			held += n
		}
		all = append(all, account{need(b), held})
	}
	slices.SortFunc(all, func(a, b account) int { return cmp.Compare(a.need, b.need) })
	for _, a := range all {
		if a.need > free {
			return false
		}
		free += a.held
	}
	return true
}

// shrink gives back n bytes of c's room (taken for bytes that did not
// come).
func (r *room) shrink(c *claim, n int64) {
	if n == 0 {
		return
	}
	r.mu.Lock()
	c.held -= n
	r.used -= n
	r.gauge.Sub(float64(n))
	r.wake()
	r.mu.Unlock()
}

// finish records that c's body was read whole: it needs no more room.
func (r *room) finish(c *claim) {
	r.mu.Lock()
	c.limit = c.held
	r.wake()
	r.mu.Unlock()
}

// close gives back all of c's room.
func (r *room) close(c *claim) {
	r.mu.Lock()
	delete(r.bodies, c)
	r.used -= c.held
	r.gauge.Sub(float64(c.held))
	c.held, c.limit = 0, 0
	r.wake()
	r.mu.Unlock()
}

// wake wakes the bodies waiting for room. r.mu is held.
func (r *room) wake() {
	close(r.freed)
	r.freed = make(chan struct{})
}

// tokenShare is the room of each token: serve.max_in_flight_bytes shared
// equally among the tokens, and at least a body of the largest size
// (serve.max_body_bytes, and the byte past it that tells a body too large).
// The bodies in flight are thus bounded by the larger of
// serve.max_in_flight_bytes and the number of tokens times
// serve.max_body_bytes.
func tokenShare(inFlight, maxBody, tokens int) int64 {
	return max(int64(inFlight)/int64(max(1, tokens)), int64(maxBody)+1)
}

const (
	// minBodyRate is the slowest a body may arrive, in bytes a second, once
	// bodyGrace has passed: a slower one is ended with 408, whatever is
	// left of serve.request_timeout. Time spent waiting for room does not
	// count.
	minBodyRate = 64 << 10
	// bodyGrace is how long a body may take to start arriving (and the
	// slack it keeps over minBodyRate).
	bodyGrace = time.Second
	// minChunk is the least room taken for a read; a read takes at most a
	// quarter of what the body brought so far, so that a body waiting for
	// its next bytes holds at most a quarter more than what arrived.
	minChunk = 4 << 10
)

// Why a body was ended before its end.
var (
	errNoRoom   = errors.New("no room for the body in time")
	errSlowBody = errors.New("the body arrives slower than the minimum rate")
)

// bodyReader reads a request body, taking room for it as it arrives and
// bounding its pace: every read must bring a byte before the body's
// deadline (serve.request_timeout from its start) and before the minimum
// rate's (bodyGrace, plus the time waited for room, plus what arrived at
// minBodyRate).
type bodyReader struct {
	body     io.Reader
	room     *room
	claim    *claim
	rc       *http.ResponseController
	ctx      context.Context // ends at the body's deadline
	deadline time.Time
	start    time.Time
	waited   time.Duration // waiting for room
	received int64
	readBy   time.Time // the read deadline set last
	slow     bool      // it is the minimum rate's
	cut      error     // errNoRoom, errSlowBody or os.ErrDeadlineExceeded, once ended
	eof      bool
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if len(p) == 0 || b.cut != nil {
		return 0, b.cut
	}
	want := min(int64(len(p)), max(minChunk, b.received/4), b.claim.limit-b.claim.held)
	if want <= 0 {
		// All the body may come to has arrived (its Content-Length): this
		// read can only find its end.
		n, err := b.body.Read(p[:1])
		if n > 0 { // not an end: past the limit, which the caller refuses
			b.room.mu.Lock()
			b.claim.held += int64(n)
			b.room.used += int64(n)
			b.room.gauge.Add(float64(n))
			b.room.mu.Unlock()
		}
		return n, b.ended(err)
	}
	began := time.Now()
	if err := b.room.grow(b.ctx, b.claim, want); err != nil {
		b.cut = errNoRoom
		return 0, b.cut
	}
	b.waited += time.Since(began)
	d := b.start.Add(b.waited + bodyGrace + time.Duration(float64(b.received)/minBodyRate*float64(time.Second)))
	b.slow = d.Before(b.deadline)
	if !b.slow {
		d = b.deadline
	}
	_ = b.rc.SetReadDeadline(d)
	b.readBy = d
	n, err := b.body.Read(p[:want])
	b.room.shrink(b.claim, want-int64(n))
	b.received += int64(n)
	return n, b.ended(err)
}

// ended notes how a read ended the body, if it did.
func (b *bodyReader) ended(err error) error {
	if err != nil && err != io.EOF && !b.readBy.IsZero() && !time.Now().Before(b.readBy) {
		// The read deadline passed: net/http reports one that fires inside
		// a chunked body's trailer as a malformed trailer ("unexpected EOF
		// reading trailer"), not as the timeout it is.
		err = os.ErrDeadlineExceeded
	}
	switch {
	case err == io.EOF:
		b.eof = true
		b.room.finish(b.claim)
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.cut = os.ErrDeadlineExceeded
		if b.slow {
			b.cut = errSlowBody
		}
		return b.cut
	}
	return err
}
