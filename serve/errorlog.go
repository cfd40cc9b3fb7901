package serve

import (
	"log"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

const (
	// errorLogBurst is how many of the HTTP server's error lines are
	// logged in a row before the rate applies.
	errorLogBurst = 10
	// errorLogEvery is the rate of the lines logged past the burst: one
	// per errorLogEvery.
	errorLogEvery = 6 * time.Second
)

// errorLimiter is the HTTP server's error log (TLS handshake errors,
// panics): every line is counted (dam_serve_http_errors_total), at most
// errorLogBurst are logged at once and then one per errorLogEvery, so
// that clients (plaintext to the TLS port, handshakes given up) cannot
// flood the log. A logged line says how many were left out before it.
type errorLimiter struct {
	log    *zap.Logger
	errors prometheus.Counter

	mu      sync.Mutex
	tokens  float64
	last    time.Time
	skipped int
}

func newErrorLog(l *zap.Logger, errors prometheus.Counter) *log.Logger {
	return log.New(&errorLimiter{log: l, errors: errors, tokens: errorLogBurst, last: time.Now()}, "", 0)
}

func (e *errorLimiter) Write(p []byte) (int, error) {
	e.errors.Inc()
	e.mu.Lock()
	now := time.Now()
	e.tokens = min(errorLogBurst, e.tokens+float64(now.Sub(e.last))/float64(errorLogEvery))
	e.last = now
	if e.tokens < 1 {
		e.skipped++
		e.mu.Unlock()
		return len(p), nil
	}
	e.tokens--
	skipped := e.skipped
	e.skipped = 0
	e.mu.Unlock()
	var fields []zap.Field
	if skipped > 0 {
		fields = append(fields, zap.Int("left_out_before", skipped))
	}
	e.log.Info(strings.TrimSpace(string(p)), fields...)
	return len(p), nil
}
