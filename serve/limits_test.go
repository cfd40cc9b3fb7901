package serve_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
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

// checkOfSize is a valid check whose body is exactly n bytes.
func checkOfSize(entity string, n int) string {
	head := `{"service":"a","entity":"` + entity + `","payload":"`
	return head + strings.Repeat("x", n-len(head)-2) + `"}`
}

// The bodies in flight are bounded by each token's share of
// serve.max_in_flight_bytes, taken as the bodies arrive: a client that
// sent part of its body holds room for that part, not for its
// Content-Length; a body that does not fit beside it waits for room
// (taking none while that would leave a body unable to finish), while a
// small check is answered at once, and another token's bodies have a
// share of their own. A body that stalls is ended with 408 (the minimum
// rate); one announced larger than serve.max_body_bytes gets 413 without
// being read, one sent chunked past it 413 once read to the limit.
func TestBodyRoom(t *testing.T) {
	t.Parallel()
	const unit = 64 << 10
	const timeout = 3 * time.Second
	h := newServer(t, func(c *config.Config) {
		c.Serve.MaxBodyBytes = unit
		c.Serve.MaxInFlightBytes = unit
		c.Serve.RequestTimeout = timeout
	})
	addr := h.run()
	// A first check opens the store's connections (on Citus, the
	// coordinator's to its workers) before the timeline starts.
	h.check("a", "warm", "1")

	// A slow client sends 40 KiB of a 64 KiB body, then nothing: it holds
	// room for what it sent until it is ended for its slowness (the
	// minimum rate's grace, 1 s, and 40 KiB at 64 KiB/s: about 1.6 s).
	began := time.Now()
	holder := rawRequest(t, addr, unit, checkOfSize("holder", unit)[:40<<10])
	time.Sleep(300 * time.Millisecond)
	whole := send(h, tokenAll, checkOfSize("whole", unit)) // does not fit beside it
	small := send(h, tokenAll, `{"service":"a","entity":"small","payload":1}`)
	other := send(h, tokenA, checkOfSize("other", unit))

	if a := <-small; a.code != 200 || a.took > 700*time.Millisecond {
		t.Errorf("a small check beside the holder: %v; want 200 at once", a)
	}
	if a := <-other; a.code != 200 || a.took > 700*time.Millisecond {
		t.Errorf("a whole body of another token beside the holder: %v; want 200 at once", a)
	}
	code, _, body, err := rawResponse(holder, 5*time.Second)
	if held := time.Since(began); code != 408 || !strings.Contains(body, `"body_timeout"`) || !strings.Contains(body, "slower than") || held > timeout {
		t.Errorf("the holder: %d %s %v after %s; want 408 body_timeout for its slowness, before serve.request_timeout", code, body, err, held)
	}
	if a := <-whole; a.code != 200 || a.took < 700*time.Millisecond {
		t.Errorf("a body that waited for room: %v; want 200 once the holder's room was given back", a)
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
	for _, want := range []string{"dam_serve_body_bytes_in_flight 0", "dam_serve_slow_bodies_total 1"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "dam_serve_"))
		}
	}
}

// unfinished opens a connection from the loopback address from and
// sends the start of a request's headers.
func unfinished(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	c := dialFrom(t, addr, from)
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: dam\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

// At most serve.max_connections connections are served at once. A new
// connection beyond it takes the slot of one that is not serving a
// request with a valid token: the one that has not finished its request
// the longest (answered 503 with Retry-After), else the longest idle
// keep-alive one. When every slot serves a request with a valid token, it
// waits a quarter of a second for one to end, then gets 503 with
// Retry-After.
func TestConnectionLimit(t *testing.T) {
	t.Parallel()
	h := newServer(t, func(c *config.Config) {
		c.Serve.MaxConnections = 2
		c.Serve.RequestTimeout = 3 * time.Second
	})
	addr := h.run()
	get := func() (int, string, string, time.Duration) {
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		began := time.Now()
		resp, err := client.Get(h.url + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(body), time.Since(began)
	}

	// Two connections in the middle of their headers hold both slots; a
	// third is served at once, the first of them answered 503.
	busy := []net.Conn{unfinished(t, addr, "127.0.0.2")}
	time.Sleep(50 * time.Millisecond)
	busy = append(busy, unfinished(t, addr, "127.0.0.3"))
	time.Sleep(100 * time.Millisecond)
	if code, _, body, took := get(); code != 200 || took > time.Second {
		t.Fatalf("beside two unfinished requests: %d after %s: %s; want 200 at once", code, took, body)
	}
	code, retry, body, err := rawResponse(busy[0], 2*time.Second)
	if code != 503 || retry == "" || !strings.Contains(body, "serve.max_connections") {
		t.Errorf("the longest unfinished request: %d Retry-After %q %s %v; want 503 with Retry-After", code, retry, body, err)
	}
	for _, c := range busy {
		c.Close()
	}

	// Two requests with a valid token hold both slots (their bodies come
	// slowly); a third connection gets 503 with Retry-After after a
	// quarter of a second.
	time.Sleep(100 * time.Millisecond)
	var hogs []net.Conn
	for _, from := range []string{"127.0.0.2", "127.0.0.3"} {
		hogs = append(hogs, headOnly(t, addr, from, tokenAll, 100, `{"service":"a",`))
	}
	time.Sleep(100 * time.Millisecond)
	if code, retry, body, took := get(); code != 503 || retry == "" || !strings.Contains(body, "serve.max_connections") ||
		took < 200*time.Millisecond || took > 900*time.Millisecond {
		t.Errorf("beside two requests with a valid token: %d Retry-After %q after %s: %s; want 503 with Retry-After after a quarter of a second", code, retry, took, body)
	}
	for _, c := range hogs {
		if code, _, body, err := rawResponse(c, 3*time.Second); code != 408 {
			t.Errorf("a slow body: %d %s %v; want 408", code, body, err)
		}
	}

	// Two idle keep-alive connections hold both slots; a third is served
	// at once, one of the idle ones being closed for it.
	idle := twoIdle(t, addr)
	if code, _, _, took := get(); code != 200 || took >= time.Second {
		t.Fatalf("beside two idle connections: %d after %s; want 200 at once", code, took)
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
	for _, want := range []string{"dam_serve_connections_refused_total 1", `dam_serve_connections_evicted_total{state="unfinished"} 1`,
		`dam_serve_connections_evicted_total{state="idle"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "dam_serve_connections"))
		}
	}
}

// Past serve.max_connections_per_address, a connection gets 503 with
// Retry-After at once, whatever the connections of its address do; other
// addresses are served.
func TestConnectionsPerAddress(t *testing.T) {
	t.Parallel()
	h := newServer(t, func(c *config.Config) { c.Serve.MaxConnectionsPerAddress = 2 })
	addr := h.run()
	dialFrom(t, addr, "127.0.0.4")
	dialFrom(t, addr, "127.0.0.4")
	c := dialFrom(t, addr, "127.0.0.4")
	began := time.Now()
	if code, retry, body, err := rawResponse(c, 2*time.Second); code != 503 || retry == "" ||
		!strings.Contains(body, "serve.max_connections_per_address") || time.Since(began) > 500*time.Millisecond {
		t.Errorf("a third connection of one address: %d Retry-After %q %s %v; want 503 with Retry-After at once", code, retry, body, err)
	}
	if got := h.check("a", "other-address", "1"); got != "forward" {
		t.Errorf("a check from another address: %s", got)
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

// Clients opening a connection per request past serve.max_connections,
// more of them at once than the refusals that wait for a slot, are each
// served or answered 503 with Retry-After: none is closed unanswered or
// reset.
func TestConnectionPerRequestPastTheLimit(t *testing.T) {
	t.Parallel()
	h := newServer(t, func(c *config.Config) {
		c.Serve.MaxConnections = 2
		c.Serve.RequestTimeout = 3 * time.Second
	})
	addr := h.run()
	// Two requests with a valid token hold both slots (their bodies come
	// slowly, ended with 408 after a second or so).
	for _, from := range []string{"127.0.0.2", "127.0.0.3"} {
		headOnly(t, addr, from, tokenAll, 100, `{"service":"a",`)
	}
	time.Sleep(100 * time.Millisecond)
	const clients = 400 // more than the refusals that wait for a slot (256)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := "no connection"
			defer func() {
				mu.Lock()
				codes[got]++
				mu.Unlock()
			}()
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				got = "dial: " + err.Error()
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: dam\r\nConnection: close\r\n\r\n"); err != nil {
				got = "write: " + err.Error()
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				got = "no answer: " + err.Error()
				return
			}
			resp.Body.Close()
			got = fmt.Sprint(resp.StatusCode)
			if resp.StatusCode == 503 && resp.Header.Get("Retry-After") == "" {
				got = "503 without Retry-After"
			}
		}()
	}
	wg.Wait()
	if codes["200"]+codes["503"] != clients {
		t.Errorf("answers to %d clients opening a connection each past the limit: %v; want each 200 or 503 with Retry-After", clients, codes)
	}
	if codes["503"] == 0 {
		t.Errorf("answers: %v; want 503s: the slots were held", codes)
	}
}

// A connection closed for room as the longest silent (past twice
// serve.max_connections, at least 1,024, waiting for their first byte) is
// answered 503 with Retry-After on plain HTTP after a last wait for its
// request: a client that opened a connection per request and is slow to
// send it reads a refusal, not a reset.
func TestLongestSilentAnswered(t *testing.T) {
	t.Parallel()
	h := newServer(t, func(c *config.Config) { c.Serve.MaxConnections = 2 })
	addr := h.run()
	for attempt := 1; ; attempt++ {
		first := dialFrom(t, addr, "")
		began := time.Now()
		time.Sleep(50 * time.Millisecond) // the longest silent
		var wg sync.WaitGroup
		for range 16 { // 1,024 more: the silent bound, max(2 x 2, 1024)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 64 {
					c, err := net.DialTimeout("tcp", addr, 5*time.Second)
					if err != nil {
						t.Error(err)
						return
					}
					t.Cleanup(func() { c.Close() })
				}
			}()
		}
		wg.Wait()
		if time.Since(began) > 800*time.Millisecond && attempt < 3 {
			// The first may have been silent for its whole second, and
			// closed for that (unanswered: it sent nothing), not for room.
			continue
		}
		code, retry, body, err := rawResponse(first, 3*time.Second)
		if code != 503 || retry == "" || !strings.Contains(body, "serve.max_connections") {
			t.Fatalf("the longest silent connection, closed for room: %d Retry-After %q %s %v; want 503 with Retry-After", code, retry, body, err)
		}
		return
	}
}

// A body sent chunked whose JSON value has arrived whole but whose end
// (the last chunk) never does is ended for its slowness, 408: it is not
// a body with data after its value. Whitespace after the value, in a
// later chunk, is not data either.
func TestBodyWhoseEndNeverArrivesIsTimedOut(t *testing.T) {
	t.Parallel()
	h := newServer(t, func(c *config.Config) { c.Serve.RequestTimeout = 3 * time.Second })
	addr := h.run()
	value := `{"service":"a","entity":"end-never","payload":1}`

	c := rawRequest(t, addr, -1, fmt.Sprintf("%x\r\n%s\r\n", len(value), value))
	if code, _, body, err := rawResponse(c, 5*time.Second); code != 408 || !strings.Contains(body, `"body_timeout"`) {
		t.Errorf("a whole value whose body never ends: %d %s %v; want 408 body_timeout", code, body, err)
	}

	c = rawRequest(t, addr, -1, fmt.Sprintf("%x\r\n%s\r\n", len(value), value))
	if _, err := io.WriteString(c, "3\r\n \r\n\r\n0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if code, _, body, err := rawResponse(c, 5*time.Second); code != 200 {
		t.Errorf("a value, then whitespace in a chunk of its own: %d %s %v; want 200", code, body, err)
	}

	c = rawRequest(t, addr, -1, fmt.Sprintf("%x\r\n%s\r\n", len(value), value))
	if _, err := io.WriteString(c, "3\r\n {}\r\n0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if code, _, body, err := rawResponse(c, 5*time.Second); code != 400 || !strings.Contains(body, "data after the JSON value") {
		t.Errorf("a value, then another in a later chunk: %d %s %v; want 400 naming the data after it", code, body, err)
	}
}

// chunkedBody frames parts as one chunk each (without the last chunk).
func chunkedBody(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		fmt.Fprintf(&b, "%x\r\n%s\r\n", len(p), p)
	}
	return b.String()
}

// A body sent chunked whose last chunk has arrived but whose final CRLF
// (the end of its empty trailer) is late is ended for its slowness, 408
// body_timeout: it is not a malformed body (400 bad_json). So is one
// whose trailer's fields arrive and whose end is late.
func TestChunkedBodyWhoseTrailerIsLateIs408(t *testing.T) {
	t.Parallel()
	h := newServer(t, func(c *config.Config) { c.Serve.RequestTimeout = 3 * time.Second })
	addr := h.run()
	value := `{"service":"a","entity":"late-trailer","payload":1}`
	for _, tail := range []string{"0\r\n", "0\r\n\r", "0\r\nX-Late: 1\r\n"} {
		began := time.Now()
		c := rawRequest(t, addr, -1, chunkedBody(value)+tail)
		code, _, body, err := rawResponse(c, 5*time.Second)
		if code != 408 || !strings.Contains(body, `"body_timeout"`) {
			t.Errorf("a whole value, then %q and nothing more: %d %s %v after %s; want 408 body_timeout",
				tail, code, strings.TrimSpace(body), err, time.Since(began).Round(time.Millisecond))
		}
	}
	_, _, metrics := h.do("GET", "/metrics", "", "")
	for _, want := range []string{"dam_serve_slow_bodies_total 3", "dam_serve_body_bytes_in_flight 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s: %s", want, grep(grep(metrics, strings.Fields(want)[0]+" "), "_total"))
		}
	}
}

// roomForOneBody runs a check service whose bodies are at most max bytes
// and whose tokens' share of the room is one such body, its store's
// connections opened.
func roomForOneBody(t *testing.T, max int) (*harness, string) {
	t.Helper()
	h := newServer(t, func(c *config.Config) {
		c.Serve.MaxBodyBytes = max
		c.Serve.MaxInFlightBytes = max
		c.Serve.RequestTimeout = 3 * time.Second
	})
	addr := h.run()
	h.check("a", "warm", "1")
	return h, addr
}

// roomGivenBack fails t unless no body holds room any more.
func roomGivenBack(t *testing.T, h *harness) {
	t.Helper()
	if _, _, metrics := h.do("GET", "/metrics", "", ""); !strings.Contains(metrics, "dam_serve_body_bytes_in_flight 0") {
		t.Errorf("room not given back:\n%s", grep(metrics, "dam_serve_body_bytes"))
	}
}

// A body at exactly serve.max_body_bytes is read whole, 200, however it
// is sent: chunked with its value ending at a chunk boundary, with a
// trailer, or with whitespace up to the limit, and with Content-Length;
// one byte more (whitespace) is 413. Every body's room is given back.
func TestBodyAtTheLimitIs200(t *testing.T) {
	t.Parallel()
	const max = 64 << 10
	h, addr := roomForOneBody(t, max)
	full := checkOfSize("at-max", max)
	short := checkOfSize("at-max-ws", max-100)
	for _, tc := range []struct {
		name   string
		length int
		body   string
		want   int
	}{
		{"chunked, the value ending at a chunk boundary at the limit", -1, chunkedBody(full[:max/2], full[max/2:]) + "0\r\n\r\n", 200},
		{"chunked, the value at the limit, a trailer", -1, chunkedBody(full) + "0\r\nX-A: b\r\n\r\n", 200},
		{"chunked, whitespace up to the limit", -1, chunkedBody(short, strings.Repeat(" ", 100)) + "0\r\n\r\n", 200},
		{"chunked, whitespace one byte past the limit", -1, chunkedBody(short, strings.Repeat(" ", 101)) + "0\r\n\r\n", 413},
		{"chunked, the value at the limit, one space past it", -1, chunkedBody(full, " ") + "0\r\n\r\n", 413},
		{"Content-Length at the limit", max, checkOfSize("cl-at-max", max), 200},
		{"Content-Length at the limit, whitespace", max, checkOfSize("cl-at-max-ws", max-100) + strings.Repeat("\n", 100), 200},
	} {
		c := rawRequest(t, addr, tc.length, tc.body)
		if code, _, body, err := rawResponse(c, 5*time.Second); code != tc.want {
			t.Errorf("%s: %d %.200s %v; want %d", tc.name, code, body, err, tc.want)
		}
	}
	roomGivenBack(t, h)
}

// A client that sends Expect: 100-continue gets 100 Continue, then its
// answer, with Content-Length and chunked.
func TestExpectContinueBodyIs200(t *testing.T) {
	t.Parallel()
	h := newServer(t, func(c *config.Config) { c.Serve.RequestTimeout = 3 * time.Second })
	addr := h.run()
	for i, te := range []bool{false, true} {
		value := fmt.Sprintf(`{"service":"a","entity":"expect-%d","payload":1}`, i)
		c := dialFrom(t, addr, "")
		head := "POST /v1/check HTTP/1.1\r\nHost: dam\r\nAuthorization: Bearer " + tokenAll + "\r\nExpect: 100-continue\r\n"
		body := value
		if te {
			head += "Transfer-Encoding: chunked\r\n"
			body = chunkedBody(value) + "0\r\n\r\n"
		} else {
			head += fmt.Sprintf("Content-Length: %d\r\n", len(value))
		}
		if _, err := io.WriteString(c, head+"\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		br := bufio.NewReader(c)
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
			t.Fatalf("chunked %v: first line %q %v; want 100 Continue", te, line, err)
		}
		_, _ = br.ReadString('\n')
		if _, err := io.WriteString(c, body); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("chunked %v: %v", te, err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("chunked %v after 100 Continue: %d %s; want 200", te, resp.StatusCode, out)
		}
	}
}

// Many small checks of one token sent chunked at once, each whole, in a
// share of the room as small as a body of the largest size (each may come
// to that size, so they take turns), are all answered 200 in time, and
// their room is given back.
func TestManyChunkedBodiesOfOneTokenAreAllAnswered(t *testing.T) {
	t.Parallel()
	const max = 64 << 10
	h, addr := roomForOneBody(t, max)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := fmt.Sprintf(`{"service":"a","entity":"many-%d","payload":%d}`, i, i)
			var c net.Conn = rawRequest(t, addr, -1, chunkedBody(v)+"0\r\n\r\n")
			code, _, _, _ := rawResponse(c, 8*time.Second)
			mu.Lock()
			codes[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[200] != 40 {
		t.Errorf("40 chunked checks of one token at once: %v; want 40 200s", codes)
	}
	roomGivenBack(t, h)
}
