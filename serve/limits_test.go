package serve_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
)

// rawRequest opens a connection to addr and sends a check's request line
// and headers announcing a body of length bytes (chunked when length is
// negative), then the first part of the body; the rest is left to the
// caller.
func rawRequest(t *testing.T, addr string, length int, part string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := "POST /v1/check HTTP/1.1\r\nHost: dam\r\nAuthorization: Bearer " + tokenAll + "\r\n"
	if length >= 0 {
		head += fmt.Sprintf("Content-Length: %d\r\n", length)
	} else {
		head += "Transfer-Encoding: chunked\r\n"
	}
	if _, err := io.WriteString(c, head+"\r\n"+part); err != nil {
		t.Fatal(err)
	}
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

// checkOfSize is a valid check whose body is exactly n bytes.
func checkOfSize(entity string, n int) string {
	head := `{"service":"a","entity":"` + entity + `","payload":"`
	return head + strings.Repeat("x", n-len(head)-2) + `"}`
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

// send posts body to /v1/check with tokenAll in the background.
func send(h *harness, body string) <-chan answer {
	c := make(chan answer, 1)
	go func() {
		began := time.Now()
		req, _ := http.NewRequest("POST", h.url+"/v1/check", strings.NewReader(body))
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

// The bodies in flight are bounded by serve.max_in_flight_bytes: a
// request takes room for its body before reading it and waits for room
// until serve.request_timeout, then gets 503 overloaded with Retry-After;
// a request that gets room in time is answered as usual. A body that does
// not arrive within serve.request_timeout of finding room gets 408, one
// announced larger than serve.max_body_bytes gets 413 without being read.
func TestBodyRoom(t *testing.T) {
	t.Parallel()
	const unit = 64 << 10
	// The timeline is in fractions of the timeout: what a request that
	// waited would take differs from an answer at once by a good part of
	// it, even on a loaded machine (the first check on Citus, under -race
	// beside the other packages' tests, took 651 ms with a 1 s timeout).
	const timeout = 2 * time.Second
	h := newServer(t, func(c *config.Config) {
		c.Serve.MaxBodyBytes = unit
		c.Serve.MaxInFlightBytes = unit
		c.Serve.RequestTimeout = timeout
	})
	addr := h.run()
	// A first check opens the store's connections (on Citus, the
	// coordinator's to its workers) before the timeline starts.
	h.check("a", "warm", "1")
	start := time.Now()
	of := func(f float64) time.Duration { return time.Duration(f * float64(timeout)) }
	at := func(f float64) { time.Sleep(time.Until(start.Add(of(f)))) }

	// Two slow clients hold half of the room each, over [0, T] and
	// [T/2, 1.5T] (T = the timeout): from 0.2T to 1.2T a body of the room's
	// whole size never fits.
	h1 := rawRequest(t, addr, unit/2, `{"service":"a",`)
	at(0.2)
	whole := send(h, checkOfSize("whole", unit))
	at(0.3)
	small := send(h, `{"service":"a","entity":"small","payload":1}`) // fits beside one holder: at once
	at(0.5)
	h2 := rawRequest(t, addr, unit/2, `{"service":"a",`)
	at(1.3)
	waits := send(h, checkOfSize("waits", unit)) // gets room when h2 gives it back at 1.5T

	// (Sent at 0.3T: had it waited for a holder, it would end after T,
	// taking 0.7T; behind the whole body, after 1.2T.)
	if a := <-small; a.code != 200 || a.took > of(0.5) {
		t.Errorf("a small check beside the holders: %v; want 200 well before %s", a, of(0.5))
	}
	if a := <-whole; a.code != 503 || a.retryAfter == "" || !strings.Contains(a.body, `"overloaded"`) ||
		!strings.Contains(a.body, "serve.max_in_flight_bytes") || a.took < of(0.8) {
		t.Errorf("a body that found no room within serve.request_timeout: %v; want 503 overloaded with Retry-After after about %s", a, timeout)
	}
	for i, c := range []net.Conn{h1, h2} {
		code, _, body, err := rawResponse(c, 3*time.Second)
		if code != 408 || !strings.Contains(body, `"body_timeout"`) {
			t.Errorf("slow body %d: %d %s %v; want 408 body_timeout", i+1, code, body, err)
		}
	}
	if a := <-waits; a.code != 200 || a.took < of(0.1) {
		t.Errorf("a body that waited for room: %v; want 200 once the room was given back", a)
	}

	// Too large, announced: refused before a byte of the body is read.
	c := rawRequest(t, addr, 10<<20, "")
	if code, _, body, err := rawResponse(c, 2*time.Second); code != 413 || !strings.Contains(body, "serve.max_body_bytes") {
		t.Errorf("10 MB announced: %d %s %v; want 413 at once", code, body, err)
	}
	// Too large, chunked: read up to the limit.
	c = rawRequest(t, addr, -1, "")
	go func() {
		chunk := fmt.Sprintf("%x\r\n%s\r\n", 16<<10, strings.Repeat(" ", 16<<10))
		for range 8 {
			if _, err := io.WriteString(c, chunk); err != nil {
				return
			}
		}
	}()
	if code, _, body, err := rawResponse(c, 3*time.Second); code != 413 || !strings.Contains(body, "body_too_large") {
		t.Errorf("128 KiB chunked: %d %s %v; want 413", code, body, err)
	}
	_, _, metrics := h.do("GET", "/metrics", "", "")
	for _, want := range []string{"dam_serve_body_bytes_in_flight 0", "dam_serve_overloaded_total 1"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "dam_serve_"))
		}
	}
}

// At most serve.max_connections connections are served at once. Another
// waits, unread, for one of them to close until serve.request_timeout,
// then gets 503 with Retry-After; while it waits, an idle keep-alive
// connection is closed to make room for it.
func TestConnectionLimit(t *testing.T) {
	t.Parallel()
	h := newServer(t, func(c *config.Config) {
		c.Serve.MaxConnections = 2
		c.Serve.RequestTimeout = time.Second
	})
	addr := h.run()
	// Two connections in the middle of their headers hold both slots, for
	// the header timeout (5s).
	var busy []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: dam\r\n"); err != nil {
			t.Fatal(err)
		}
		busy = append(busy, c)
	}
	time.Sleep(100 * time.Millisecond)
	client := &http.Client{Transport: &http.Transport{}}
	began := time.Now()
	resp, err := client.Get(h.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if took := time.Since(began); resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(body), "serve.max_connections") || took < 800*time.Millisecond || took > 3*time.Second {
		t.Fatalf("a third connection: %d Retry-After %q after %s: %s; want 503 with Retry-After after about 1s",
			resp.StatusCode, resp.Header.Get("Retry-After"), took, body)
	}
	for _, c := range busy {
		c.Close()
	}

	// Two idle keep-alive connections hold both slots; a third is served
	// at once, one of the idle ones being closed for it.
	idle := twoIdle(t, addr)
	began = time.Now()
	resp, err = client.Get(h.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if took := time.Since(began); resp.StatusCode != 200 || took >= time.Second { // (waiting, it would get 503 after 1s)
		t.Fatalf("beside two idle connections: %d after %s; want 200 at once", resp.StatusCode, took)
	}
	closed := 0
	for _, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			closed++
		}
	}
	if closed != 1 {
		t.Fatalf("%d idle connections closed for the new one, want 1", closed)
	}
	_, _, metrics := h.do("GET", "/metrics", "", "")
	if !strings.Contains(metrics, "dam_serve_connections_refused_total 1") {
		t.Errorf("metrics:\n%s", grep(metrics, "dam_serve_connections"))
	}
}

// twoIdle returns two keep-alive connections that each made a request and
// are idle, both alive. While the slots of closed connections are being
// freed, a connection may have to wait, and a waiting connection closes the
// longest idle one (which may be one of these): the pair is made again
// until, after the waits are over (serve.request_timeout), both answer.
func twoIdle(t *testing.T, addr string) []net.Conn {
	t.Helper()
	request := func(c net.Conn) bool {
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: dam\r\n\r\n"); err != nil {
			return false
		}
		code, _, _, _ := rawResponse(c, 3*time.Second)
		return code == 200
	}
	deadline := time.Now().Add(15 * time.Second)
	var idle []net.Conn
	for {
		for len(idle) < 2 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			if request(c) {
				idle = append(idle, c)
				continue
			}
			c.Close()
			if time.Now().After(deadline) {
				t.Fatal("no idle connection could be made")
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(1200 * time.Millisecond) // the waits of the attempts are over
		alive := idle[:0]
		for _, c := range idle {
			if request(c) {
				alive = append(alive, c)
			} else {
				c.Close()
			}
		}
		if idle = alive; len(idle) == 2 {
			return idle
		}
		if time.Now().After(deadline) {
			t.Fatal("two idle connections could not be kept")
		}
	}
}
