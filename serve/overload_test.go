package serve_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/config"
)

// lockRows stores a state for each entity of service a, then holds their
// row locks in a transaction on a connection of its own (not the
// store's pool) until the returned function (or the test's end) releases
// them: checks of those identities wait on the locks meanwhile.
func lockRows(t *testing.T, h *harness, entities ...string) (release func()) {
	t.Helper()
	ctx := context.Background()
	for _, e := range entities {
		h.check("a", e, "1")
	}
	conn, err := pgx.Connect(ctx, h.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM state WHERE service = 'a' AND entity = ANY($1) FOR UPDATE`, entities); err != nil {
		t.Fatal(err)
	}
	return func() { _ = tx.Rollback(ctx) }
}

// request sends method path with body (none if "") and tokenAll in the
// background.
func request(h *harness, method, path, body string) <-chan answer {
	c := make(chan answer, 1)
	go func() {
		began := time.Now()
		req, _ := http.NewRequest(method, h.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tokenAll)
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

// While the store is behind, every request that needs it is answered 503
// overloaded at once, nothing decided: batches, state reads and resets as
// well as single checks. They all wait for the same PostgreSQL
// connections (postgres.max_conns, the pool `dam serve` opens); were they
// let through, they would queue for a connection until
// serve.request_timeout and fail after it, logged and counted as store
// errors, while the store decided work whose clients had given up. Here
// the only connection waits on a row lock, with a batch, a state read
// and a reset admitted behind it; the excess comes after they have
// waited past a quarter of a second, and the admitted work is decided
// once the lock goes.
func TestShedEveryRequestWhileTheStoreIsBehind(t *testing.T) {
	t.Parallel()
	h := newHarnessPool(t, 0, func(c *config.Config) {
		c.Postgres.MaxConns = 1
		c.Serve.RequestTimeout = 5 * time.Second
	})
	unlock := lockRows(t, h, "locked")
	t.Cleanup(unlock)
	blocked := request(h, "POST", "/v1/check", `{"service":"a","entity":"locked","payload":2}`)
	time.Sleep(200 * time.Millisecond) // the connection waits on the lock
	admitted := []<-chan answer{
		request(h, "POST", "/v1/check:batch", `{"checks":[{"service":"a","entity":"admitted-batch","payload":1}]}`),
		request(h, "GET", "/v1/state/a/admitted-get", ""),
		request(h, "DELETE", "/v1/state/a/admitted-delete", ""),
	}
	time.Sleep(600 * time.Millisecond)
	kinds := []struct{ method, path, body string }{
		{"POST", "/v1/check:batch", `{"checks":[{"service":"a","entity":"excess-batch","payload":1}]}`},
		{"GET", "/v1/state/a/excess-get", ""},
		{"DELETE", "/v1/state/a/excess-delete", ""},
		{"POST", "/v1/check", `{"service":"a","entity":"excess-check","payload":1}`},
	}
	var excess []<-chan answer
	for _, k := range kinds {
		excess = append(excess, request(h, k.method, k.path, k.body))
	}
	for i, c := range excess {
		select {
		case a := <-c:
			if a.code != 503 || a.retryAfter == "" || !strings.Contains(a.body, `"overloaded"`) || !strings.Contains(a.body, "the store is behind") {
				t.Errorf("excess %s %s: %v; want 503 overloaded (the store is behind) at once", kinds[i].method, kinds[i].path, a)
			}
		case <-time.After(3 * time.Second):
			t.Errorf("excess %s %s: no answer within 3s while the store was behind; want 503 overloaded at once", kinds[i].method, kinds[i].path)
		}
	}
	unlock()
	if a := <-blocked; a.code != 200 {
		t.Errorf("the blocked check: %v", a)
	}
	for i, want := range []int{200, 404, 200} {
		if a := <-admitted[i]; a.code != want {
			t.Errorf("admitted request %d: %v; want %d once the store moved", i, a, want)
		}
	}
	if _, _, body := h.do("GET", "/v1/state/a/excess-batch", tokenAll, ""); !strings.Contains(body, "not_found") {
		t.Errorf("the excess batch was decided: %s", body)
	}
	_, _, metrics := h.do("GET", "/metrics", "", "")
	for _, want := range []string{"dam_serve_shed_total 4", "dam_serve_checks_in_flight 0", "dam_serve_store_errors_total 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "dam_serve_"))
		}
	}
}

// /readyz says whether PostgreSQL answers, not whether the service is
// busy: with every connection of the store's pool taken by work that
// waits (here on a row lock, for longer than a probe may take), the
// store still answers and the service is ready. An overloaded service
// answering 503 overloaded is one to keep routing to: were every
// replica reported not ready under load, none would be left.
func TestReadyWhileEveryConnectionIsBusy(t *testing.T) {
	t.Parallel()
	h := newHarnessPool(t, 0, func(c *config.Config) {
		c.Postgres.MaxConns = 1
		c.Serve.RequestTimeout = 5 * time.Second
	})
	unlock := lockRows(t, h, "locked")
	t.Cleanup(unlock)
	blocked := request(h, "POST", "/v1/check", `{"service":"a","entity":"locked","payload":2}`)
	time.Sleep(200 * time.Millisecond) // the pool's one connection waits on the lock
	if code, _, out := h.do("GET", "/readyz", "", ""); code != 200 || out != "ready\n" {
		t.Errorf("readyz with every store connection busy: %d %q; want 200 ready", code, out)
	}
	unlock()
	if a := <-blocked; a.code != 200 {
		t.Errorf("the blocked check: %v", a)
	}
}
