// Package serve is dam's synchronous check service (`dam serve`, seed
// 000's deduplicator): an HTTP API answering "forward or duplicate?" for a
// (service, entity, payload), on the same PostgreSQL state and with the
// same last-seen semantics as the sidecar. That is its one job.
//
// A payload is hashed with its service's route options when the
// configuration has a route of that service (format, ignore pointers,
// limits), with canon's defaults otherwise, so a service can be checked
// from both sides consistently. Decisions are dedup.Check's
// compare-and-set, run by dedup.CheckBatch: the single checks of
// concurrent requests share a transaction (group commit), a batch request
// is one transaction; decisions are linearizable per identity. A store
// outage or a request past serve.request_timeout is answered 503 with
// Retry-After, never a guess: PostgreSQL's own timeouts end a transaction
// before the request's deadline, so that the 503 means nothing was decided
// (only a connection lost during a COMMIT leaves the outcome unknown).
//
// Past capacity the service sheds the excess rather than queue it (see
// admission): the checks queued for PostgreSQL or being decided are
// bounded by serve.max_checks_in_flight, and while the oldest work queued
// for PostgreSQL's connections (a single check, a batch, a state read or
// reset: they all wait for the deciders, see combiner) has waited past
// maxStoreWait the store is behind; either way a request is answered 503
// overloaded with Retry-After at once (after admitWait at most, or
// maxStoreWait for a request within its token's fair share of the
// bound), nothing decided, while the work admitted is decided in time.
// The bound is shared among the tokens: a token flooding the service
// takes the room the others leave, never theirs. A request whose client
// went away is not the store's failure: it is neither logged nor counted
// as one.
//
// Endpoints (JSON; errors are {"code", "message"}):
//
//	POST   /v1/check                      {"service","entity","payload"} -> {"decision","digest"}
//	POST   /v1/check:batch                {"checks":[...]} -> {"results":[...]}
//	GET    /v1/state/{service}/{entity}   the stored state of an identity
//	DELETE /v1/state/{service}/{entity}   reset it: its next check is forward
//	GET    /v1/openapi.yaml               this API's OpenAPI 3.1 document (no token)
//	GET    /metrics /healthz /readyz
//
// The /v1 endpoints need "Authorization: Bearer TOKEN" (401 without a
// valid token, 403 for a token not allowed the service); tokens are
// compared in constant time and never logged.
//
// Everything a client controls is bounded: identities by dedup's limits
// (400, before the store), bodies by serve.max_body_bytes (413), the
// bodies being read or decoded at once by each token's share of
// serve.max_in_flight_bytes, taken as they arrive (see room; beyond it, a
// request waits up to serve.request_timeout, then gets 503 overloaded
// with Retry-After), a body's pace by a minimum rate (408), the
// connections by serve.max_connections and
// serve.max_connections_per_address (see connLimit: a silent connection
// holds no slot, and a connection beyond the bound takes one that serves
// no request with a valid token, or gets 503 with Retry-After within a
// quarter of a second), every phase of a connection by a timeout, the
// service label values by the configuration, the HTTP server's error log
// by a rate.
//
// Metrics (all on the registry given to New):
//
//	dam_serve_requests_total{endpoint,code}      requests by endpoint and HTTP status (499: the
//	                                             client went away before its answer)
//	dam_serve_request_seconds{endpoint}          request latency
//	dam_serve_decisions_total{service,decision}  forward and duplicate answers, by configured
//	                                             service (routes, tokens' services,
//	                                             serve.services; no other is checked)
//	dam_serve_store_errors_total                 store errors (answered 503, or 500)
//	dam_serve_in_flight                          requests being served
//	dam_serve_body_bytes_in_flight               room taken by the bodies being read or decoded
//	dam_serve_overloaded_total                   requests answered 503: no room for the body in time
//	dam_serve_shed_total                         requests answered 503 at once: the store at capacity
//	                                             (serve.max_checks_in_flight) or behind
//	dam_serve_checks_in_flight                   checks queued for the store or being decided
//	dam_serve_slow_bodies_total                  bodies ended with 408: too slow, or past request_timeout
//	dam_serve_connections                        connections being served
//	dam_serve_connections_refused_total          connections answered 503: no slot in time, or past
//	                                             serve.max_connections_per_address (closed past 4096
//	                                             such answers at once)
//	dam_serve_connections_evicted_total{state}   connections closed to make room: silent, unfinished,
//	                                             idle, untrusted
//	dam_serve_http_errors_total                  the HTTP server's errors (its log is rate-limited)
//	dam_serve_combined_checks                    single checks decided per transaction
//	dam_serve_separated_checks_total             single checks decided again one by one after the
//	                                             store refused their shared transaction
package serve

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger (default: a no-op logger).
func WithLogger(l *zap.Logger) Option { return func(s *Server) { s.log = l } }

// WithRegistry sets the registry the metrics are registered on and that
// /metrics serves (default: a new registry of the server's own metrics).
func WithRegistry(r *prometheus.Registry) Option { return func(s *Server) { s.reg = r } }

// Server is the check service. Create it with New and serve it with Run,
// or mount Handler in a server of your own between Start and Close.
type Server struct {
	cfg     config.Serve
	store   *dedup.Store
	log     *zap.Logger
	reg     *prometheus.Registry
	metrics *metrics

	hashers  map[string]*canon.Hasher // by service, from the routes
	fallback *canon.Hasher            // canon's defaults
	// known are the services the configuration names (config.Services):
	// a check of any other is refused, listing them (knownList).
	known     map[string]bool
	knownList string
	tokens    []token
	deciders  int           // combining deciders: postgres.max_conns
	admission *admission    // the checks in front of the store (serve.max_checks_in_flight)
	certs     *certReloader // nil without serve.tls
	ready     readiness
	timeouts  timeouts

	draining atomic.Bool // shutting down: not ready

	startOnce sync.Once
	combiner  atomic.Pointer[combiner] // set by Start
}

// token is a resolved bearer token: its SHA-256 (compared in constant
// time, whatever the length of the token presented) and its services.
type token struct {
	sum      [sha256.Size]byte
	any      bool
	services map[string]bool
	key      string // the configuration key it came from, for logs
	room     *room  // its share of the bodies in flight
}

// New builds the service from the configuration's serve section and
// routes. It reads token files and the TLS certificate (an error names
// the key) and does not connect to the store.
func New(cfg config.Config, store *dedup.Store, opts ...Option) (*Server, error) {
	s := &Server{cfg: cfg.Serve, store: store, log: zap.NewNop(), hashers: map[string]*canon.Hasher{},
		deciders: max(1, int(cfg.Postgres.MaxConns))}
	for _, o := range opts {
		o(s)
	}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
	}
	// The services the configuration names are the only ones checked,
	// and the only label values (config.Services).
	services := map[string]bool{}
	for _, svc := range cfg.Services() {
		services[svc] = true
	}
	s.metrics = newMetrics(s.reg, services)
	s.ready = readiness{store: store, log: s.log}
	s.admission = newAdmission(checksInFlight(cfg), admitWait, maxStoreWait, s.metrics.checksInFlight)
	s.timeouts = newTimeouts(cfg.Serve.RequestTimeout)
	var err error
	if t := cfg.Serve.TLS; t.Enabled() {
		if s.certs, err = newCertReloader(t.CertFile, t.KeyFile, s.log); err != nil {
			return nil, err
		}
	}
	if s.fallback, err = canon.New(); err != nil {
		return nil, err
	}
	s.known = services
	s.knownList = knownList(cfg.Services())
	for i, r := range cfg.Routes {
		f, err := canon.ParseFormat(r.Format)
		if err != nil {
			return nil, fmt.Errorf("routes[%d].format: %w", i, err)
		}
		h, err := canon.New(canon.WithFormat(f), canon.WithIgnore(r.Ignore...), canon.WithMaxDepth(r.MaxDepth), canon.WithMaxSize(r.MaxSize))
		if err != nil {
			return nil, fmt.Errorf("routes[%d]: %w", i, err)
		}
		s.hashers[r.Service] = h
	}
	resolved, err := cfg.Serve.ResolveTokens()
	if err != nil {
		return nil, err
	}
	if len(resolved) == 0 {
		return nil, fmt.Errorf("serve.tokens: %w: at least one token (or set %sSERVE_TOKEN)", config.ErrRequired, config.EnvPrefix)
	}
	share := tokenShare(cfg.Serve.MaxInFlightBytes, cfg.Serve.MaxBodyBytes, len(resolved))
	for _, rt := range resolved {
		t := token{sum: sha256.Sum256([]byte(rt.Token)), services: map[string]bool{}, key: rt.Key,
			room: newRoom(share, s.metrics.bodyBytes)}
		for _, svc := range rt.Services {
			if svc == config.AnyService {
				t.any = true
			}
			t.services[svc] = true
		}
		s.tokens = append(s.tokens, t)
	}
	return s, nil
}

// checksInFlight is the bound of the checks in front of the store:
// serve.max_checks_in_flight, else what the deciders take in one round
// (maxCombined per postgres.max_conns connection).
func checksInFlight(cfg config.Config) int {
	if n := cfg.Serve.MaxChecksInFlight; n > 0 {
		return n
	}
	return maxCombined * max(1, int(cfg.Postgres.MaxConns))
}

// hasher returns the hasher of service: its route's, or the defaults.
func (s *Server) hasher(service string) *canon.Hasher {
	if h, ok := s.hashers[service]; ok {
		return h
	}
	return s.fallback
}

// authenticate returns the token presented in r's Authorization header, or
// nil. Every configured token is compared, in constant time, whichever
// matches. A request with a valid token is one whose connection is not
// closed to make room for another (see connLimit.trust).
func (s *Server) authenticate(r *http.Request) *token {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return nil
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(h[len(prefix):])))
	match := -1
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(sum[:], s.tokens[i].sum[:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return nil
	}
	t := &s.tokens[match]
	trustRequest(r, t)
	return t
}

func (t *token) allows(service string) bool { return t.any || t.services[service] }

// Start starts the deciders that combine the single checks of concurrent
// requests into shared transactions (one per postgres.max_conns
// connection). Without Start, Handler decides each check in a transaction
// of its own: the same answers, more commits. Stop them with Close.
func (s *Server) Start(ctx context.Context) {
	s.startOnce.Do(func() {
		s.combiner.Store(newCombiner(ctx, s.store, s.deciders, s.cfg.RequestTimeout, s.metrics))
	})
}

// Close stops the deciders Start started, after their transactions in
// flight, and closes /readyz's connection to the store. Call it once the
// HTTP server has drained.
func (s *Server) Close() {
	if c := s.combiner.Swap(nil); c != nil {
		c.close()
	}
	s.ready.close()
}

// Handler returns the service's HTTP handler: the API, /metrics, /healthz
// and /readyz. It bounds what its requests hold (identities, bodies and
// the bodies in flight); the connection bound, TLS and the server's
// timeouts are Run's, which a server of your own must provide itself.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/check", s.instrument("check", s.handleCheck))
	mux.Handle("POST /v1/check:batch", s.instrument("check_batch", s.handleBatch))
	mux.Handle("GET /v1/state/{service}/{entity}", s.instrument("state_get", s.handleStateGet))
	mux.Handle("DELETE /v1/state/{service}/{entity}", s.instrument("state_delete", s.handleStateDelete))
	mux.Handle("GET /v1/openapi.yaml", s.instrument("openapi", handleOpenAPI))
	mux.Handle("/v1/", s.instrument("other", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, codeNotFound, fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
	}))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.handleReady)
	return mux
}

// timeouts are the HTTP server's: every phase of a connection is
// bounded, so that no client (a slow reader of /metrics, an idle
// keep-alive connection, a trickled header) holds a connection for good.
type timeouts struct {
	header time.Duration // the request line and headers
	read   time.Duration // the whole request; a body is bounded by the request's own deadline
	write  time.Duration // from the end of the headers to the end of the response
	idle   time.Duration // a keep-alive connection between requests
}

// maxHeaderBytes bounds a request's line and headers (a state path holds
// at most a 1 KiB entity, 2 KiB as hex).
const maxHeaderBytes = 16 << 10

func newTimeouts(request time.Duration) timeouts {
	const header = 5 * time.Second
	return timeouts{
		// A request reads its body (waiting for room included) within
		// serve.request_timeout, then decides within serve.request_timeout,
		// then writes its answer.
		header: header,
		read:   2*request + header,
		write:  2*request + 10*time.Second,
		idle:   2 * time.Minute,
	}
}

// Run serves on ln until ctx is canceled, then stops accepting, reports
// not-ready and lets the requests in flight finish within
// serve.shutdown_grace. It returns nil after a clean shutdown.
//
// It serves at most serve.max_connections connections at once (see
// connLimit), over TLS with serve.tls (AEAD suites only), and speaks
// HTTP/1.1 only: one request per connection at a time, so that the
// connection bound is also the bound of the requests in flight.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	var tlsConfig *tls.Config
	if s.certs != nil {
		tlsConfig = s.certs.tlsConfig()
	}
	limit := newConnLimit(ln, s.cfg.MaxConnections, s.cfg.MaxConnectionsPerAddress, len(s.tokens), tlsConfig, s.metrics)
	var served net.Listener = limit
	if tlsConfig != nil {
		served = tls.NewListener(limit, tlsConfig)
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: s.timeouts.header,
		ReadTimeout:       s.timeouts.read,
		WriteTimeout:      s.timeouts.write,
		IdleTimeout:       s.timeouts.idle,
		MaxHeaderBytes:    maxHeaderBytes,
		Protocols:         &protocols,
		ConnState:         limit.connState,
		ConnContext:       withConn,
		// Requests outlive ctx's cancellation: shutdown lets them finish.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:    newErrorLog(s.log.Named("http"), s.metrics.httpErrors),
	}
	s.Start(ctx)
	defer s.Close() // after the shutdown: no request is left to answer
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(served) }()
	s.log.Info("serve: listening", zap.String("addr", ln.Addr().String()), zap.Bool("tls", tlsConfig != nil),
		zap.Int("tokens", len(s.tokens)), zap.Int("routes", len(s.hashers)))
	select {
	case err := <-errc:
		_ = limit.Close()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.draining.Store(true)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownGrace)
	defer cancel()
	err := srv.Shutdown(sctx)
	<-errc // Serve returned ErrServerClosed
	_ = limit.Close()
	if err != nil {
		return fmt.Errorf("serve: shutdown: %w", err)
	}
	s.log.Info("serve: stopped")
	return nil
}

// isUnavailable reports a store error that is answered 503: the store is
// unreachable, the outcome unknown, or the request ran out of time.
func isUnavailable(err error) bool {
	return errors.Is(err, dedup.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// knownList names the known services for an error message, the first 20.
func knownList(names []string) string {
	if len(names) == 0 {
		return "the configuration names no service"
	}
	q := make([]string, 0, min(len(names), 20))
	for _, n := range names[:min(len(names), 20)] {
		q = append(q, strconv.Quote(n))
	}
	more := ""
	if len(names) > 20 {
		more = fmt.Sprintf(" and %d more", len(names)-20)
	}
	return "the configuration knows " + strings.Join(q, ", ") + more
}

// unknownService refuses a service the configuration does not name.
func (s *Server) unknownService(field, service string) *apiError {
	if s.known[service] {
		return nil
	}
	return badRequest(codeBadField, "%s %q: unknown service (a route, a token or serve.services names each one): %s",
		field, truncate(service, dedup.MaxServiceBytes), s.knownList)
}
