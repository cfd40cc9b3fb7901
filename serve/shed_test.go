package serve_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// Past what the store can take, the excess is answered 503 overloaded
// with Retry-After at once, nothing decided for it, while the checks
// admitted before it are decided once the store moves again: past
// serve.max_checks_in_flight (a single check and a batch alike), and,
// whatever that bound, while the oldest check queued has waited a
// quarter of a second for the store. The store is stopped by a row lock
// that the one decider waits on.
func TestShedPastCapacity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		inFlight int           // serve.max_checks_in_flight (0: the default)
		pause    time.Duration // after the admitted checks, before the excess
		message  string        // of the excess's 503
	}{
		{"past serve.max_checks_in_flight", 4, 50 * time.Millisecond, "serve.max_checks_in_flight"},
		{"the store behind", 0, 600 * time.Millisecond, "the store is behind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *config.Config) {
				c.Postgres.MaxConns = 1
				c.Serve.MaxChecksInFlight = tc.inFlight
				c.Serve.RequestTimeout = 5 * time.Second
			})
			release := blockDecider(t, h) // the blocked check: one in flight
			var admitted []<-chan answer
			for i := range 3 { // with it, four in flight
				admitted = append(admitted, send(h, tokenAll, fmt.Sprintf(`{"service":"a","entity":"admitted-%d","payload":1}`, i)))
			}
			time.Sleep(tc.pause)
			var excess []<-chan answer
			for i := range 10 {
				excess = append(excess, send(h, tokenAll, fmt.Sprintf(`{"service":"a","entity":"excess-%d","payload":1}`, i)))
			}
			excess = append(excess, sendBatch(h, `{"checks":[{"service":"a","entity":"excess-batch","payload":1}]}`))
			for i, c := range excess {
				select {
				case a := <-c:
					if a.code != 503 || a.retryAfter == "" || !strings.Contains(a.body, `"overloaded"`) || !strings.Contains(a.body, tc.message) || a.took > time.Second {
						t.Errorf("excess request %d: %v; want 503 overloaded (%s) with Retry-After at once", i, a, tc.message)
					}
				case <-time.After(3 * time.Second):
					t.Errorf("excess request %d: no answer within 3s while the store was stopped; want 503 at once", i)
				}
			}
			if r := release(); !strings.HasPrefix(r, "200 ") {
				t.Errorf("the blocked check: %s", r)
			}
			for i, c := range admitted {
				if a := <-c; a.code != 200 {
					t.Errorf("admitted check %d: %v; want 200 once the store moved", i, a)
				}
			}
			for i := range 10 {
				if _, err := h.store.Get(context.Background(), "a", []byte(fmt.Sprintf("excess-%d", i))); !errors.Is(err, dedup.ErrNotFound) {
					t.Errorf("excess check %d was decided: %v", i, err)
				}
			}
			_, _, metrics := h.do("GET", "/metrics", "", "")
			for _, want := range []string{"dam_serve_shed_total 11", "dam_serve_checks_in_flight 0", "dam_serve_store_errors_total 0"} {
				if !strings.Contains(metrics, want) {
					t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "dam_serve_"))
				}
			}
		})
	}
}

// sendBatch posts body to /v1/check:batch with tokenAll in the background.
func sendBatch(h *harness, body string) <-chan answer {
	return requestAs(h, tokenAll, "POST", "/v1/check:batch", body)
}
