package serve_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/serve"
)

// /readyz costs the store at most one round trip a second, however many
// ask: its answer is the last probe's, refreshed at most once a second,
// so that an unauthenticated flood of /readyz cannot take the store from
// the checks.
func TestReadyzFlood(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	if code, _, out := h.do("GET", "/readyz", "", ""); code != 200 || out != "ready\n" {
		t.Fatalf("readyz: %d %q", code, out)
	}
	before := serve.ReadyProbes(h.srv)
	began := time.Now()
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(began) < 1500*time.Millisecond {
				resp, err := http.Get(h.url + "/readyz")
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("readyz during the flood: %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	// 1.5 s: the first probe and at most two refreshes, with room for
	// scheduling.
	if n := serve.ReadyProbes(h.srv) - before; n > 4 {
		t.Fatalf("%d store round trips for 1.5 s of /readyz flood, want at most one a second", n)
	}
}

// /readyz says why it is not ready in generic words; the detail, which
// names hosts, users and databases, goes to the log only.
func TestReadyzGenericReason(t *testing.T) {
	t.Parallel()
	var proxy *tcpproxy.Proxy
	h := newHarness(t, func(c *config.Config) {
		target, rewrite := tcpproxy.PostgresDSN(t, c.Postgres.DSN)
		proxy = tcpproxy.New(t, target)
		c.Postgres.DSN = rewrite(proxy.Addr())
	})
	proxy.Cut()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _, out := h.do("GET", "/readyz", "", "")
		if code == 503 {
			if out != "store unavailable\n" {
				t.Fatalf("readyz during an outage: %q, want only %q", out, "store unavailable\n")
			}
			for _, secret := range []string{proxy.Addr(), "127.0.0.1", "user=", "database", "failed to connect"} {
				if strings.Contains(out, secret) {
					t.Fatalf("readyz tells %q: %q", secret, out)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz still %d %q 10 s into the outage", code, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
