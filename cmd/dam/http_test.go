package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// The sidecar's HTTP server bounds every phase of a connection (header,
// read, write and idle, so that no connection is held for good): an idle
// keep-alive connection is closed after the idle timeout.
func TestSidecarHTTPTimeouts(t *testing.T) {
	if s := sidecarHTTP; s.header <= 0 || s.read <= 0 || s.write <= 0 || s.idle <= 0 {
		t.Fatalf("sidecar HTTP timeouts %+v: every one must be set", s)
	}
	saved := sidecarHTTP
	sidecarHTTP.idle = 300 * time.Millisecond
	t.Cleanup(func() { sidecarHTTP = saved })

	kc := testkafka.New(t, 1, "in", "out")
	cfg := config.Default()
	cfg.Kafka.Brokers, cfg.Kafka.Group = []string{kc.Addr()}, "g"
	cfg.Postgres.DSN = pgtest.DSN(t)
	cfg.HTTP.Listen = "127.0.0.1:0"
	r := config.DefaultRoute()
	r.Service, r.From, r.To = "s", "in", "out"
	cfg.Routes = []config.Route{r}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- runSidecar(ctx, cfg, zaptest.NewLogger(t), prometheus.NewRegistry(), &sidecarHooks{
			started: func(_ *pipeline.Pipeline, addr string) { addrc <- addr },
		})
	}()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("sidecar: %v", err)
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatalf("sidecar: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the sidecar did not start")
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: dam\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("metrics: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	began := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF || time.Since(began) > 2*time.Second {
		t.Fatalf("an idle keep-alive connection: %v after %s; want it closed after the idle timeout", err, time.Since(began))
	}
}
