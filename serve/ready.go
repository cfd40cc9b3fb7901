package serve

import (
	"context"
	"net/http"
	"sync"
	"time"

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
type readiness struct {
	store *dedup.Store
	log   *zap.Logger

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
	err := r.store.Ping(pctx)
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
