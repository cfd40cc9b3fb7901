package serve_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/serve"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	tokenAll = "all-services-token-0123456789"
	tokenA   = "service-a-token-0123456789"
)

// testConfig has a route for service "a" that ignores /ts, services
// checked without a route, a token for every service and one for "a" only.
func testConfig(dsn string) config.Config {
	c := config.Default()
	c.Postgres.DSN = dsn
	c.Kafka.Brokers, c.Kafka.Group = []string{"127.0.0.1:1"}, "g"
	r := config.DefaultRoute()
	r.Service, r.From, r.To = "a", "in.a", "out.a"
	r.Ignore = []string{"/ts"}
	c.Routes = []config.Route{r}
	c.Serve.Token = tokenAll
	c.Serve.Tokens = []config.ServeToken{{Token: tokenA, Services: []string{"a"}}}
	// The services the tests check without a route (canon's defaults).
	c.Serve.Services = []string{"b", "raw", "nul", "evil", "t", "customer-2", "svc"}
	return c
}

type harness struct {
	t      *testing.T
	url    string
	dsn    string // postgres.dsn
	store  *dedup.Store
	srv    *serve.Server
	client *http.Client
}

// newHarness serves cfg (testConfig on a fresh schema, changed by mutate)
// on an httptest server, every exchange checked against the OpenAPI
// document (contract_test.go).
func newHarness(t *testing.T, mutate func(*config.Config), opts ...serve.Option) *harness {
	t.Helper()
	return newHarnessPool(t, 8, mutate, opts...)
}

// newHarnessPool is newHarness with a store pool of poolConns connections
// (0: postgres.max_conns, as `dam serve` opens it).
func newHarnessPool(t *testing.T, poolConns int32, mutate func(*config.Config), opts ...serve.Option) *harness {
	t.Helper()
	h := newServerPool(t, poolConns, mutate, opts...)
	h.srv.Start(context.Background())
	t.Cleanup(h.srv.Close) // after the HTTP server's close (cleanups run last first)
	ts := httptest.NewServer(validated(t, h.srv.Handler()))
	t.Cleanup(ts.Close)
	h.url = ts.URL
	return h
}

// newServer builds the server of testConfig on a fresh schema, changed by
// mutate, with opts, without serving it.
func newServer(t *testing.T, mutate func(*config.Config), opts ...serve.Option) *harness {
	t.Helper()
	return newServerPool(t, 8, mutate, opts...)
}

// newServerPool is newServer with a store pool of poolConns connections
// (0: postgres.max_conns, as `dam serve` opens it).
func newServerPool(t *testing.T, poolConns int32, mutate func(*config.Config), opts ...serve.Option) *harness {
	t.Helper()
	dsn := pgtest.DSN(t)
	cfg := testConfig(dsn)
	if mutate != nil {
		mutate(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if poolConns == 0 {
		poolConns = cfg.Postgres.MaxConns
	}
	store, err := dedup.Open(context.Background(), cfg.Postgres.DSN, dedup.Config{MaxConns: poolConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	srv, err := serve.New(cfg, store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, dsn: cfg.Postgres.DSN, store: store, srv: srv, client: http.DefaultClient}
}

// run serves h with Run (its connection limit, TLS, its server's
// timeouts) on a port of 127.0.0.1 until the test ends, and returns the
// address.
func (h *harness) run() string {
	h.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.Run(ctx, ln) }()
	h.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			h.t.Errorf("Run: %v", err)
		}
	})
	h.url = "http://" + ln.Addr().String()
	return ln.Addr().String()
}

// do sends a request with token (none if "") and returns the status, the
// headers and the body.
func (h *harness) do(method, path, token, body string) (int, http.Header, string) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// check posts one check with tokenAll and returns its decision, failing
// on anything but 200.
func (h *harness) check(service, entity, payload string) string {
	h.t.Helper()
	body, _ := json.Marshal(map[string]any{"service": service, "entity": entity, "payload": json.RawMessage(payload)})
	code, _, out := h.do("POST", "/v1/check", tokenAll, string(body))
	if code != http.StatusOK {
		h.t.Fatalf("check %s %s %s: %d %s", service, entity, payload, code, out)
	}
	var r struct{ Decision, Digest string }
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Digest) != 66 {
		h.t.Fatalf("response %q: %v", out, err)
	}
	return r.Decision
}

// errorCode decodes a JSON error body.
func errorCode(t *testing.T, body string) (code, message string) {
	t.Helper()
	var e struct{ Code, Message string }
	dec := json.NewDecoder(bytes.NewReader([]byte(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Code == "" || e.Message == "" {
		t.Fatalf("not a JSON error body: %q (%v)", body, err)
	}
	return e.Code, e.Message
}

// grep returns the lines of text that hold word.
func grep(text, word string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// headOnly opens a connection to addr from the loopback address from
// ("" for the default) and sends a check's request line and headers with
// token, announcing a body of length bytes, then part of the body; the
// rest is left to the caller.
func headOnly(t *testing.T, addr, from, token string, length int, part string) net.Conn {
	t.Helper()
	c := dialFrom(t, addr, from)
	head := fmt.Sprintf("POST /v1/check HTTP/1.1\r\nHost: dam\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", token, length)
	if _, err := io.WriteString(c, head+part); err != nil {
		t.Fatal(err)
	}
	return c
}

// dialFrom connects to addr from the loopback address from ("" for any),
// closing the connection when the test ends.
func dialFrom(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawResponse reads the response on c: its status and Retry-After and
// body, or an error (within limit).
func rawResponse(c net.Conn, limit time.Duration) (int, string, string, error) {
	_ = c.SetReadDeadline(time.Now().Add(limit))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b), nil
}

// answer is a response read by send.
type answer struct {
	code       int
	retryAfter string
	body       string
	err        error
	took       time.Duration
}

func (a answer) String() string {
	return fmt.Sprintf("%d Retry-After %q after %s: %.200s %v", a.code, a.retryAfter, a.took.Round(time.Millisecond), a.body, a.err)
}

// send posts body to /v1/check with token in the background.
func send(h *harness, token, body string) <-chan answer {
	return requestAs(h, token, "POST", "/v1/check", body)
}

// requestAs sends method path with body and token in the background; the
// answer (or the client's error) comes on the channel, with how long it
// took.
func requestAs(h *harness, token, method, path, body string) <-chan answer {
	c := make(chan answer, 1)
	go func() {
		began := time.Now()
		req, _ := http.NewRequest(method, h.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := h.client.Do(req)
		if err != nil {
			c <- answer{err: err, took: time.Since(began)}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		c <- answer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b), took: time.Since(began)}
	}()
	return c
}

// blockDecider holds the row lock of a/blocked in a transaction of its
// own and starts a check of it, so that the one decider (max_conns 1)
// waits on the lock while the checks sent meanwhile queue up and are
// taken together as soon as the returned function releases the lock.
func blockDecider(t *testing.T, h *harness) (release func() string) {
	t.Helper()
	ctx := context.Background()
	h.check("a", "blocked", "1")
	tx, err := h.store.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SELECT 1 FROM state WHERE service = 'a' AND entity = 'blocked' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	go func() {
		code, _, out := h.do("POST", "/v1/check", tokenAll, `{"service":"a","entity":"blocked","payload":2}`)
		first <- fmt.Sprint(code, " ", out)
	}()
	time.Sleep(200 * time.Millisecond) // the decider took it and waits on the lock
	return func() string {
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		return <-first
	}
}
