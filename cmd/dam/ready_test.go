package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// The sidecar's /readyz is unauthenticated: while PostgreSQL does not
// answer it says so in fixed words, never with PostgreSQL's error text
// (which names the user, the database and the host), and the log keeps
// that detail. A halted partition is named with its topic and partition.
func TestSidecarReadyzNamesNoInfrastructure(t *testing.T) {
	kc := testkafka.New(t, 1, "in", "out")
	target, rewrite := tcpproxy.PostgresDSN(t, pgtest.DSN(t))
	proxy := tcpproxy.New(t, target)
	cfg := sidecarConfig(t, kc, rewrite(proxy.Addr()), nil)
	addr, logs := startSidecar(t, cfg)
	readyz := func() (int, string) { t.Helper(); return readyz(t, addr) }
	waitReadyz := func(what string, ok func(code int, body string) bool) (int, string) {
		t.Helper()
		var code int
		var body string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if code, body = readyz(); ok(code, body) {
				return code, body
			}
		}
		t.Fatalf("%s: /readyz still %d %q", what, code, body)
		return 0, ""
	}
	waitReadyz("ready", func(code int, _ string) bool { return code == http.StatusOK })

	// PostgreSQL down, with records waiting: every 503 meanwhile (from the
	// probe or from a paused partition) names nothing of the server.
	proxy.Cut()
	kc.Produce("in", &kgo.Record{Key: []byte("k"), Value: []byte(`{"v":1}`)})
	waitReadyz("PostgreSQL down", func(code int, _ string) bool { return code == http.StatusServiceUnavailable })
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		code, body := readyz()
		for _, leak := range []string{proxy.Addr(), "user=", "database=", "failed to connect", "dial"} {
			if strings.Contains(body, leak) {
				t.Fatalf("/readyz %d %q names %q", code, body, leak)
			}
		}
		if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "pipeline: not ready: ") {
			t.Fatalf("/readyz while PostgreSQL is down: %d %q", code, body)
		}
	}
	if code, body := readyz(); !strings.Contains(body, "postgres unreachable") && !strings.Contains(body, "in/0: paused") {
		t.Errorf("/readyz while PostgreSQL is down: %d %q, want it to say so", code, body)
	}
	detail := false
	for _, e := range logs.FilterMessage("readyz: not ready").All() {
		detail = detail || strings.Contains(fmt.Sprint(e.ContextMap()["error"]), proxy.Addr())
	}
	if !detail {
		t.Errorf("no log line gives /readyz's detail naming the server %s: %v", proxy.Addr(), logs.FilterMessage("readyz: not ready").All())
	}

	proxy.Restore()
	waitReadyz("ready again", func(code int, _ string) bool { return code == http.StatusOK })
	if n := logs.FilterMessage("readyz: ready").Len(); n == 0 {
		t.Error("the return to ready is not logged")
	}

	// A halted partition is named, without the record's detail.
	kc.Produce("in", &kgo.Record{Key: []byte("k"), Value: []byte(`not json`)})
	_, body := waitReadyz("halted", func(code int, _ string) bool { return code == http.StatusServiceUnavailable })
	if want := "pipeline: not ready: in/0: halted"; !strings.HasPrefix(body, want) || strings.Contains(body, "offset") {
		t.Errorf("/readyz of a halted partition: %q, want %q and no detail", body, want)
	}
}
