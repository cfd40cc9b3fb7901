package serve

import (
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/dam-dedup/dam/dedup"
)

type metrics struct {
	requests       *prometheus.CounterVec
	seconds        *prometheus.HistogramVec
	decisions      *prometheus.CounterVec
	storeErrors    prometheus.Counter
	inFlight       prometheus.Gauge
	combined       prometheus.Histogram
	separated      prometheus.Counter
	bodyBytes      prometheus.Gauge
	overloaded     prometheus.Counter
	shed           prometheus.Counter
	checksInFlight prometheus.Gauge
	conns          prometheus.Gauge
	connsRefused   prometheus.Counter
	connsEvicted   *prometheus.CounterVec
	slowBodies     prometheus.Counter
	httpErrors     prometheus.Counter

	// services are the service label values besides "other": the
	// configured services (config.Services: routes, tokens' services,
	// serve.services), the only ones checked.
	services map[string]bool
}

// otherService is the service label of a service that is not configured
// (none is checked: a guard, so that a name a client sends never becomes
// a series of its own).
const otherService = "other"

func newMetrics(reg prometheus.Registerer, services map[string]bool) *metrics {
	f := promauto.With(reg)
	return &metrics{
		services: services,
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dam_serve_requests_total",
			Help: "API requests by endpoint and HTTP status code.",
		}, []string{"endpoint", "code"}),
		seconds: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dam_serve_request_seconds",
			Help:    "API request latency by endpoint.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"endpoint"}),
		decisions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dam_serve_decisions_total",
			Help: "Check answers by service and decision (forward, duplicate).",
		}, []string{"service", "decision"}),
		storeErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "dam_serve_store_errors_total",
			Help: "PostgreSQL errors met by API requests (answered 503 or 500).",
		}),
		inFlight: f.NewGauge(prometheus.GaugeOpts{
			Name: "dam_serve_in_flight",
			Help: "API requests being served.",
		}),
		combined: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "dam_serve_combined_checks",
			Help:    "Single checks decided together in one transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9),
		}),
		bodyBytes: f.NewGauge(prometheus.GaugeOpts{
			Name: "dam_serve_body_bytes_in_flight",
			Help: "Room taken by the request bodies being read or decoded (serve.max_in_flight_bytes).",
		}),
		overloaded: f.NewCounter(prometheus.CounterOpts{
			Name: "dam_serve_overloaded_total",
			Help: "Requests answered 503 because their body found no room within serve.request_timeout.",
		}),
		shed: f.NewCounter(prometheus.CounterOpts{
			Name: "dam_serve_shed_total",
			Help: "Requests answered 503 overloaded at once because the store was at capacity: no room within serve.max_checks_in_flight in time, or checks queued for it over a quarter of a second.",
		}),
		checksInFlight: f.NewGauge(prometheus.GaugeOpts{
			Name: "dam_serve_checks_in_flight",
			Help: "Checks queued for the store or being decided (serve.max_checks_in_flight).",
		}),
		conns: f.NewGauge(prometheus.GaugeOpts{
			Name: "dam_serve_connections",
			Help: "Connections being served (serve.max_connections).",
		}),
		connsRefused: f.NewCounter(prometheus.CounterOpts{
			Name: "dam_serve_connections_refused_total",
			Help: "Connections answered 503 (or, past 4096 answers being written at once, closed): no connection to close for room within serve.max_connections, or past serve.max_connections_per_address.",
		}),
		connsEvicted: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dam_serve_connections_evicted_total",
			Help: "Connections closed to make room for a new one, by what they were doing: unfinished (no complete request yet: a silent or slow client, a TLS handshake), idle (keep-alive), untrusted (a request without a valid token, or past its token's share, for more than a second).",
		}, []string{"state"}),
		slowBodies: f.NewCounter(prometheus.CounterOpts{
			Name: "dam_serve_slow_bodies_total",
			Help: "Request bodies ended with 408: slower than the minimum rate, or not whole within serve.request_timeout.",
		}),
		httpErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "dam_serve_http_errors_total",
			Help: "Errors of the HTTP server (TLS handshakes, panics); its log of them is rate-limited.",
		}),
		separated: f.NewCounter(prometheus.CounterOpts{
			Name: "dam_serve_separated_checks_total",
			Help: "Single checks decided again one by one because the store refused their shared transaction.",
		}),
	}
}

func (m *metrics) decision(service string, d dedup.Decision) {
	if !m.services[service] {
		service = otherService
	}
	m.decisions.WithLabelValues(service, d.String()).Inc()
}

// statusWriter remembers the status code written, and closes the
// connection after an answer written before the request's body was read
// to its end (a 401 before the body, a 413, 408 or 503 that gives it up):
// the server would otherwise read what is left of the body, at the
// client's pace, before the next request, holding the connection.
type statusWriter struct {
	http.ResponseWriter
	status int
	body   *eofReader // nil without a body
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		if w.body != nil && !w.body.eof {
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection (the body's
// read deadline).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// eofReader is a request body that notes when it was read to its end.
type eofReader struct {
	io.ReadCloser
	eof bool
}

func (r *eofReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err == io.EOF {
		r.eof = true
	}
	return n, err
}

// instrument counts and times an endpoint's requests.
func (s *Server) instrument(endpoint string, h http.HandlerFunc) http.Handler {
	seconds := s.metrics.seconds.WithLabelValues(endpoint)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		s.metrics.inFlight.Inc()
		sw := &statusWriter{ResponseWriter: w}
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			sw.body = &eofReader{ReadCloser: r.Body}
			r.Body = sw.body
		}
		h(sw, r)
		s.metrics.inFlight.Dec()
		seconds.Observe(time.Since(start).Seconds())
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		s.metrics.requests.WithLabelValues(endpoint, strconv.Itoa(sw.status)).Inc()
	})
}
