package serve

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/dedup"
)

const (
	// readyInterval is how long a store probe's result answers /readyz:
	// however many ask, the store sees at most one ping per interval.
	readyInterval = time.Second
	// readyTimeout bounds a store probe.
	readyTimeout = 2 * time.Second
	// notReady is /readyz's answer while the store does not answer: the
	// reason names hosts, users and databases, which the log keeps.
	notReady = "store unavailable"
)

// readiness is /readyz's view of the store: one ping at a time, whose
// result answers every /readyz for readyInterval; while a probe is in
// flight the previous result answers (the first probe is waited for).
// The reason of a failure is logged when readiness changes, never
// answered: /readyz is unauthenticated.
//
// The ping goes over a connection of its own, not one of the store's
// pool: under load every connection of the pool may be busy (deciding,
// or waiting on a row lock) for longer than a probe may take, and a
// service whose store answers is ready however busy; reported not ready
// under load, every replica would be taken out of service at once.
type readiness struct {
	store  *dedup.Store
	log    *zap.Logger
	probes atomic.Int64 // pings sent

	cmu    sync.Mutex
	conn   *pgx.Conn // the probe's connection between probes; nil until connected, after a failure, or in use
	closed bool

	mu      sync.Mutex
	err     error
	at      time.Time     // when the last probe ended; zero before the first
	probing chan struct{} // closed when the probe in flight ends; nil without one
}

// check returns the store's readiness: nil, or why it is not ready.
func (r *readiness) check(ctx context.Context) error {
	r.mu.Lock()
	fresh := !r.at.IsZero() && time.Since(r.at) < readyInterval
	if fresh || (r.probing != nil && !r.at.IsZero()) {
		err := r.err
		r.mu.Unlock()
		return err
	}
	if ch := r.probing; ch != nil { // the first probe is in flight
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.err
	}
	ch := make(chan struct{})
	r.probing = ch
	r.mu.Unlock()

	// The probe answers every asker, not only this request: it runs to
	// its own timeout whatever happens to this request.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyTimeout)
	err := r.ping(pctx)
	cancel()

	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err != nil && (r.err == nil || r.at.IsZero()):
		r.log.Warn("serve: not ready: the store does not answer", zap.Error(err))
	case err == nil && r.err != nil:
		r.log.Info("serve: ready: the store answers again")
	}
	r.err, r.at, r.probing = err, time.Now(), nil
	close(ch)
	return err
}

// errReadinessClosed: the server is closed.
var errReadinessClosed = errors.New("closed")

// ping pings the store over the probe's connection, connecting it first
// when there is none; a connection that fails is closed, and the next
// probe connects anew.
func (r *readiness) ping(ctx context.Context) error {
	r.cmu.Lock()
	c, closed := r.conn, r.closed
	r.conn = nil
	r.cmu.Unlock()
	if closed {
		return errReadinessClosed
	}
	r.probes.Add(1)
	var err error
	if c == nil {
		if c, err = pgx.ConnectConfig(ctx, r.store.Pool().Config().ConnConfig.Copy()); err != nil {
			return err
		}
	}
	if err = c.Ping(ctx); err != nil {
		closeConn(c)
		return err
	}
	r.cmu.Lock()
	if r.closed {
		r.cmu.Unlock()
		closeConn(c)
		return errReadinessClosed
	}
	r.conn = c
	r.cmu.Unlock()
	return nil
}

// close closes the probe's connection (or has the probe in flight close
// it); probes fail from then on.
func (r *readiness) close() {
	r.cmu.Lock()
	c := r.conn
	r.conn, r.closed = nil, true
	r.cmu.Unlock()
	if c != nil {
		closeConn(c)
	}
}

// closeConn closes c, waiting at most a second for the server to hear.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	if err := s.ready.check(r.Context()); err != nil {
		http.Error(w, notReady, http.StatusServiceUnavailable) // with a newline
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}
