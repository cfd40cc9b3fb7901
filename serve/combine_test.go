package serve_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// Concurrent single checks are decided together: with one decider busy,
// the checks arriving meanwhile share its next transaction.
func TestChecksCombine(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) { c.Postgres.MaxConns = 1 })
	ctx := context.Background()
	h.check("a", "blocked", "1")
	tx, err := h.store.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM state WHERE service = 'a' AND entity = 'blocked' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([]string, 21)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			entity := fmt.Sprint("e-", i)
			if i == 0 {
				entity = "blocked" // taken first, waits on the lock
			}
			body, _ := json.Marshal(map[string]any{"service": "a", "entity": entity, "payload": 2})
			code, _, out := h.do("POST", "/v1/check", tokenAll, string(body))
			results[i] = fmt.Sprint(code, " ", out)
		}()
		if i == 0 {
			time.Sleep(200 * time.Millisecond)
		}
	}
	time.Sleep(300 * time.Millisecond) // the others are queued
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, r := range results {
		if !strings.HasPrefix(r, "200 ") || !strings.Contains(r, `"forward"`) {
			t.Errorf("check %d: %s", i, r)
		}
	}
	_, _, metrics := h.do("GET", "/metrics", "", "")
	// 22 checks: the warm-up, the blocked one and the 20 queued behind it,
	// which the decider takes together (some of them at least, whatever
	// the scheduling): some transaction decided more than 4.
	if !strings.Contains(metrics, "dam_serve_combined_checks_sum 22") || strings.Contains(metrics, `dam_serve_combined_checks_bucket{le="4"} `+countOf(metrics)) {
		t.Fatalf("the queued checks were not combined:\n%s", grep(metrics, "dam_serve_combined_checks"))
	}
}

// A check still queued when its request ends is withdrawn: nothing is
// decided for it. A check whose transaction outlives its timeout gets 503
// with Retry-After, and nothing is decided either.
func TestQueuedCheckWithdrawn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) {
		c.Postgres.MaxConns = 1
		c.Serve.RequestTimeout = 700 * time.Millisecond
	})
	ctx := context.Background()
	h.check("a", "blocked", "1")
	tx, err := h.store.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM state WHERE service = 'a' AND entity = 'blocked' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	go func() {
		code, hdr, out := h.do("POST", "/v1/check", tokenAll, `{"service":"a","entity":"blocked","payload":2}`)
		first <- fmt.Sprint(code, " ", hdr.Get("Retry-After"), " ", out)
	}()
	time.Sleep(200 * time.Millisecond)
	// The client gives up while its check is queued behind the blocked one.
	client := &http.Client{Timeout: 300 * time.Millisecond}
	req, _ := http.NewRequest("POST", h.url+"/v1/check", strings.NewReader(`{"service":"a","entity":"queued","payload":1}`))
	req.Header.Set("Authorization", "Bearer "+tokenAll)
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the queued check was answered %d while the decider was blocked", resp.StatusCode)
	}
	if r := <-first; !strings.HasPrefix(r, "503 1 ") {
		t.Fatalf("blocked check past its timeout: %s", r)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.Get(ctx, "a", []byte("queued")); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("the withdrawn check was decided: %v", err)
	}
	if got := h.check("a", "blocked", "2"); got != "forward" {
		t.Fatalf("the timed-out check was decided: %s", got)
	}
	if code, _, _ := h.do("GET", "/readyz", "", ""); code != http.StatusOK {
		t.Fatalf("readyz: %d", code)
	}
}

// countOf returns dam_serve_combined_checks_count's value as text.
func countOf(metrics string) string {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, "dam_serve_combined_checks_count "); ok {
			return v
		}
	}
	return "?"
}
