package serve_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/serve"
)

// A store outage is answered 503 with Retry-After and a JSON error, never
// a decision; readiness says so; the service answers again once the store
// is back, with the state it had.
func TestStoreOutage(t *testing.T) {
	t.Parallel()
	var proxy *tcpproxy.Proxy
	h := newHarness(t, func(c *config.Config) {
		target, rewrite := tcpproxy.PostgresDSN(t, c.Postgres.DSN)
		proxy = tcpproxy.New(t, target)
		c.Postgres.DSN = rewrite(proxy.Addr())
		c.Serve.RequestTimeout = 2 * time.Second
	})
	if got := h.check("a", "e", `{"v":1}`); got != "forward" {
		t.Fatal(got)
	}
	proxy.Cut()
	for _, ep := range []struct{ method, path, body string }{
		{"POST", "/v1/check", `{"service":"a","entity":"e","payload":{"v":2}}`},
		{"POST", "/v1/check:batch", `{"checks":[{"service":"a","entity":"e","payload":{"v":2}}]}`},
		{"GET", "/v1/state/a/e", ""},
		{"DELETE", "/v1/state/a/e", ""},
	} {
		start := time.Now()
		code, hdr, out := h.do(ep.method, ep.path, tokenAll, ep.body)
		c, _ := errorCode(t, out)
		if code != http.StatusServiceUnavailable || c != "unavailable" || hdr.Get("Retry-After") == "" {
			t.Errorf("%s %s during the outage: %d %q Retry-After %q", ep.method, ep.path, code, out, hdr.Get("Retry-After"))
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s %s took %v: must answer within serve.request_timeout", ep.method, ep.path, d)
		}
	}
	if code, _, out := h.do("GET", "/readyz", "", ""); code != 503 {
		t.Errorf("readyz during the outage: %d %q", code, out)
	}
	if code, _, _ := h.do("GET", "/healthz", "", ""); code != 200 {
		t.Errorf("healthz during the outage: %d", code)
	}
	proxy.Restore()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _, _ := h.do("GET", "/readyz", "", "")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not ready after the outage")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Nothing was decided during the outage: {"v":2} is still a change.
	if got := h.check("a", "e", `{"v":2}`); got != "forward" {
		t.Fatalf("after the outage: %s", got)
	}
	_, _, out := h.do("GET", "/metrics", "", "")
	if !strings.Contains(out, `dam_serve_requests_total{code="503",endpoint="check"} 1`) || strings.Contains(out, "dam_serve_store_errors_total 0") {
		t.Errorf("metrics do not count the outage:\n%s", out)
	}
}

// Run stops on cancel: a request in flight (here waiting on a row lock)
// finishes with its answer, new connections are refused, Run returns nil.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	srv, err := serve.New(testConfig(""), h.store)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln) }()
	url := "http://" + ln.Addr().String()

	// Hold the identity's row lock so that the check waits.
	if got := h.check("a", "e", "1"); got != "forward" {
		t.Fatal(got)
	}
	tx, err := h.store.Pool().Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(context.Background(), `SELECT 1 FROM state WHERE service = 'a' AND entity = 'e' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		code int
		err  error
	}
	inFlight := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest("POST", url+"/v1/check", strings.NewReader(`{"service":"a","entity":"e","payload":2}`))
		req.Header.Set("Authorization", "Bearer "+tokenAll)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			inFlight <- result{err: err}
			return
		}
		resp.Body.Close()
		inFlight <- result{code: resp.StatusCode}
	}()
	time.Sleep(300 * time.Millisecond) // the check is waiting on the lock
	cancel()
	time.Sleep(300 * time.Millisecond) // shutdown has begun
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Error("a new connection was accepted during shutdown")
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := <-inFlight; r.err != nil || r.code != 200 {
		t.Fatalf("the request in flight: %d %v", r.code, r.err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
