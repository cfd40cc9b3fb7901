package serve_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
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
	// One statement an entity: Citus refuses a SELECT ... FOR UPDATE over
	// several shards, not over one.
	for _, e := range entities {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM state WHERE service = 'a' AND entity = $1 FOR UPDATE`, []byte(e)); err != nil {
			t.Fatal(err)
		}
	}
	return func() { _ = tx.Rollback(ctx) }
}

// request sends method path with body (none if "") and tokenAll in the
// background.
func request(h *harness, method, path, body string) <-chan answer {
	return requestAs(h, tokenAll, method, path, body)
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

// A connection whose request is in the store's hands (its check queued
// for a decider or being decided) is never closed to make room for
// another, even one of a token past its share of the connections,
// however long the store takes: its check may commit, and its client
// would then read a closed connection for a check that was decided, and
// on retrying be told duplicate for its own content. Two connections,
// the share of tokenAll (two tokens: one each) and one past it, wait for
// row locks; a new connection then finds no slot but theirs.
func TestNoEvictionOfAStoredRequest(t *testing.T) {
	t.Parallel()
	h := newServer(t, func(c *config.Config) {
		c.Serve.MaxConnections = 2
		c.Postgres.MaxConns = 2
		c.Serve.RequestTimeout = 5 * time.Second
	})
	addr := h.run()
	unlock := lockRows(t, h, "locked-1", "locked-2")
	t.Cleanup(unlock)
	var conns []net.Conn
	for i := range 2 {
		body := fmt.Sprintf(`{"service":"a","entity":"locked-%d","payload":3}`, i+1)
		c := headOnly(t, addr, "", tokenAll, len(body), body)
		conns = append(conns, c)
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // past the second a request past its share is kept
	other := dialFrom(t, addr, "")
	if _, err := io.WriteString(other, "GET /healthz HTTP/1.1\r\nHost: dam\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if code, _, _, err := rawResponse(other, 3*time.Second); code != 200 && code != 503 {
		t.Errorf("the new connection: %d %v; want 200, or 503 with every slot taken", code, err)
	}
	unlock()
	for i, c := range conns {
		code, _, body, err := rawResponse(c, 5*time.Second)
		if code == 200 {
			continue
		}
		state := "not decided"
		if _, _, got := h.do("GET", fmt.Sprintf("/v1/state/a/locked-%d", i+1), tokenAll, ""); strings.Contains(got, stateDigest(t, h, "3")) {
			state = "decided"
		}
		t.Errorf("check %d, in the store as its connection was wanted: %d %s %v (its check %s); want 200", i+1, code, body, err, state)
	}
}

// stateDigest is the digest of payload for service a.
func stateDigest(t *testing.T, h *harness, payload string) string {
	t.Helper()
	code, _, out := h.do("POST", "/v1/check", tokenAll, `{"service":"a","entity":"digest-of-`+payload+`","payload":`+payload+`}`)
	if code != 200 {
		t.Fatalf("check: %d %s", code, out)
	}
	var r struct{ Decision, Digest string }
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	return r.Digest
}

// A check whose connection is closed for room as its request arrives
// (the server read the request as the slot went to a new connection) is
// not decided: its client is told 503, and a 503 means nothing was
// decided. Clients opening a connection per request, far more than
// serve.max_connections, each check a fresh identity; every one not
// answered 200 must have left no state.
func TestNoDecisionForAConnectionClosedForRoom(t *testing.T) {
	// Not parallel: its flood would slow the tests that time connections.
	h := newServer(t, func(c *config.Config) {
		c.Postgres.MaxConns = 2
		c.Serve.MaxConnections = 4
		c.Serve.RequestTimeout = 3 * time.Second
	})
	h.run()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	answers := map[string]int{}
	var notDecided []string // answered anything but a decision
	var n atomic.Int64
	began := time.Now()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(began) < 2500*time.Millisecond {
				entity := fmt.Sprint("e-", n.Add(1))
				req, _ := http.NewRequest("POST", h.url+"/v1/check", strings.NewReader(`{"service":"a","entity":"`+entity+`","payload":1}`))
				req.Header.Set("Authorization", "Bearer "+tokenAll)
				answer := "no answer"
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					answer = fmt.Sprint(resp.StatusCode)
				}
				mu.Lock()
				answers[answer]++
				if answer != "200" {
					notDecided = append(notDecided, entity)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	decided := 0
	for _, e := range notDecided {
		if _, err := h.store.Get(context.Background(), "a", []byte(e)); !errors.Is(err, dedup.ErrNotFound) {
			decided++
		}
	}
	if decided > 0 || answers["503"] == 0 {
		t.Errorf("answers %v: %d checks not answered a decision were decided; want none (and 503s: the flood is past the bound)", answers, decided)
	}
}

// A client that does not read its answer holds no room in front of the
// store: the room of a request's checks is given back once the store
// has decided them, not once the answer is written, which a client that
// stops reading makes last until the server's write timeout (20 s by
// default), while every other request is shed as past capacity. Here a
// batch of as many valid checks as the bound counts
// (serve.max_checks_in_flight 4), and thousands of checks of an unknown
// service whose errors make its answer some 10 MB long (more than the
// sockets' buffers hold), is answered to a client that reads nothing; a
// check then finds room.
func TestSlowReaderHoldsNoStoreRoom(t *testing.T) {
	t.Parallel()
	const checks = 10000
	h := newServer(t, func(c *config.Config) {
		c.Serve.MaxChecksInFlight = 4
		c.Serve.MaxBatch = checks
	})
	addr := h.run() // no contract check: it would buffer the answer
	var body strings.Builder
	body.WriteString(`{"checks":[`)
	unknown := strings.Repeat("<", dedup.MaxServiceBytes) // each quoted in its error, \u003c
	for i := range checks {
		if i > 0 {
			body.WriteString(",")
		}
		service := unknown
		if i >= checks-4 {
			service = "a"
		}
		fmt.Fprintf(&body, `{"service":"%s","entity":"unread-%d","payload":1}`, service, i)
	}
	body.WriteString(`]}`)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
	if _, err := fmt.Fprintf(c, "POST /v1/check:batch HTTP/1.1\r\nHost: dam\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", tokenAll, body.Len(), body.String()); err != nil {
		t.Fatal(err)
	}
	// Decided: its answer is being written, and not read.
	last := []byte(fmt.Sprintf("unread-%d", checks-1))
	deadline := time.Now().Add(10 * time.Second)
	for _, err := h.store.Get(context.Background(), "a", last); err != nil; _, err = h.store.Get(context.Background(), "a", last) {
		if time.Now().After(deadline) {
			t.Fatalf("the batch was not decided within 10 s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // its answer encoded long ago: being written
	_, _, m := h.do("GET", "/metrics", "", "")
	if !strings.Contains(m, "dam_serve_in_flight 1") {
		t.Fatalf("the batch's answer was written whole (the test needs it blocked):\n%s", grep(m, "in_flight"))
	}
	if code, _, out := h.do("POST", "/v1/check", tokenAll, `{"service":"a","entity":"reader","payload":1}`); code != 200 {
		t.Errorf("a check beside a client not reading its answer: %d %s; want 200", code, out)
	}
}

// The store's room is shared among the tokens (the tenants): a token
// flooding the service past serve.max_checks_in_flight takes the room
// the others leave, never theirs. Here sixteen clients of one token send
// batches that each take the whole bound, while a client of another
// token sends one check at a time: its checks are decided, each once
// the batch ahead of it is, rather than shed like the flood's excess.
func TestFairStoreRoomAmongTokens(t *testing.T) {
	// Not parallel: its flood would slow the tests that time connections.
	h := newServerPool(t, 0, func(c *config.Config) {
		c.Postgres.MaxConns = 1
		c.Serve.MaxChecksInFlight = 8
	})
	h.run() // no contract check: its cost would be the bottleneck
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	post := func(token, path, body string) string {
		req, _ := http.NewRequest("POST", h.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			return "200"
		}
		return fmt.Sprintf("%d %.100s", resp.StatusCode, b)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	flood, other := map[string]int{}, map[string]int{}
	began := time.Now()
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Since(began) < 2*time.Second; i++ {
				var checks []string
				for k := range 8 {
					checks = append(checks, fmt.Sprintf(`{"service":"b","entity":"flood-%d-%d-%d","payload":1}`, g, i, k))
				}
				a := post(tokenAll, "/v1/check:batch", `{"checks":[`+strings.Join(checks, ",")+`]}`)
				mu.Lock()
				flood[a[:3]]++
				mu.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; time.Since(began) < 2*time.Second; i++ {
			a := post(tokenA, "/v1/check", fmt.Sprintf(`{"service":"a","entity":"other-%d","payload":1}`, i))
			mu.Lock()
			other[a]++
			mu.Unlock()
		}
	}()
	wg.Wait()
	sent := 0
	for _, n := range other {
		sent += n
	}
	if flood["503"] == 0 || sent < 5 || other["200"] < sent/2 {
		t.Errorf("one check at a time beside a flood of another token: %v; want at least half decided (the flood: %v, some shed)", other, flood)
	}
}
