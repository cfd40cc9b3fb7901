package serve_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/serve"
)

// Every phase of a connection has a timeout (a WriteTimeout among them,
// so that slow readers of a large /metrics cannot hold a connection for
// good): an idle keep-alive connection is closed after the idle timeout.
func TestServerTimeouts(t *testing.T) {
	t.Parallel()
	h := newServer(t, func(c *config.Config) { c.Serve.RequestTimeout = 2 * time.Second })
	header, read, write, idle := serve.HTTPTimeouts(h.srv)
	if header <= 0 || read <= 2*time.Second || write <= 2*time.Second || idle <= 0 {
		t.Fatalf("timeouts: header %s, read %s, write %s, idle %s", header, read, write, idle)
	}
	serve.SetIdleTimeout(h.srv, 300*time.Millisecond)
	addr := h.run()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: dam\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	began := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadByte(); err != io.EOF || time.Since(began) > 2*time.Second {
		t.Fatalf("an idle keep-alive connection: %v after %s; want it closed after the idle timeout", err, time.Since(began))
	}
}
