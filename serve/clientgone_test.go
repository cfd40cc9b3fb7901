package serve_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/serve"
)

// A client that gives up its request while the store works on it is not
// the store failing: no "store unavailable" is logged and no store error
// counted, whether its batch was waiting on a row lock or its check was
// queued for a decider (and withdrawn); the request is counted with
// status 499. Two deciders: one waits on the row lock from the start,
// the other takes the batch, then a check that waits on the lock too.
func TestClientGoneIsNotAStoreError(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewRegistry()
	h := newHarness(t, func(c *config.Config) { c.Postgres.MaxConns = 2 }, serve.WithLogger(zap.New(core)), serve.WithRegistry(reg))
	release := blockDecider(t, h)
	var second <-chan answer
	for _, tc := range []struct{ name, path, body string }{
		{"a batch waiting on the row lock", "/v1/check:batch", `{"checks":[{"service":"a","entity":"blocked","payload":3}]}`},
		{"a single check queued for the deciders", "/v1/check", `{"service":"a","entity":"queued","payload":1}`},
	} {
		if second == nil && tc.path == "/v1/check" {
			second = send(h, tokenAll, `{"service":"a","entity":"blocked","payload":4}`)
			time.Sleep(200 * time.Millisecond) // the other decider waits on the lock
		}
		ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "POST", h.url+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+tokenAll)
		if resp, err := h.client.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("%s: answered %d while the store was blocked", tc.name, resp.StatusCode)
		}
		cancel()
	}
	// The server sees the clients go and ends their requests.
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(metricsText(t, reg), `dam_serve_requests_total{code="499",endpoint="check"} 1`) ||
		!strings.Contains(metricsText(t, reg), `dam_serve_requests_total{code="499",endpoint="check_batch"} 1`) {
		if time.Now().After(deadline) {
			t.Fatalf("the requests whose clients went away were not counted as 499:\n%s", grep(metricsText(t, reg), "dam_serve_requests_total"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := release(); !strings.HasPrefix(r, "200 ") {
		t.Errorf("the blocked check: %s", r)
	}
	if a := <-second; a.code != 200 {
		t.Errorf("the second blocked check: %v", a)
	}
	if n := logs.FilterMessage("serve: store unavailable").Len(); n > 0 {
		t.Errorf("%d requests whose clients went away were logged as the store unavailable: %v", n, logs.FilterMessage("serve: store unavailable").All()[0].ContextMap())
	}
	if m := metricsText(t, reg); !strings.Contains(m, "dam_serve_store_errors_total 0") {
		t.Errorf("store errors counted for clients that went away:\n%s", grep(m, "dam_serve_store_errors_total"))
	}
}

// metricsText is reg's metrics in the text format.
func metricsText(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := mf.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				fmt.Fprintf(&b, "%s %v\n", name, m.GetCounter().GetValue())
			case m.Gauge != nil:
				fmt.Fprintf(&b, "%s %v\n", name, m.GetGauge().GetValue())
			}
		}
	}
	return b.String()
}
