package serve_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// queued sends each body concurrently while the decider is blocked, then
// releases it, and returns each answer as "CODE BODY".
func queued(t *testing.T, h *harness, token string, bodies []string) []string {
	t.Helper()
	release := blockDecider(t, h)
	out := make([]string, len(bodies))
	var wg sync.WaitGroup
	for i, b := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, body := h.do("POST", "/v1/check", token, b)
			out[i] = fmt.Sprint(code, " ", strings.TrimSpace(body))
		}()
	}
	time.Sleep(300 * time.Millisecond) // all of them queued behind the blocked check
	if r := release(); !strings.HasPrefix(r, "200 ") {
		t.Errorf("the blocked check: %s", r)
	}
	wg.Wait()
	return out
}

// A check whose identity the store cannot hold (an entity past the
// sidecar's identity limit, a service name with NUL or too long) is a 400
// naming its field, decided alone before it reaches the store: the checks
// of other clients combined with it in one transaction are decided as if
// it had not been sent, never failed with it (500).
func TestBadIdentityFailsAlone(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) { c.Postgres.MaxConns = 1 })
	long := strings.Repeat("ab", 1500) // 1,500 bytes: past dedup.MaxEntityBytes
	poison := []struct{ body, field string }{
		{`{"service":"b","entity_hex":"` + long + `","payload":1}`, "entity_hex"},
		{`{"service":"b","entity":"` + strings.Repeat("x", dedup.MaxEntityBytes+1) + `","payload":1}`, "entity"},
		{`{"service":"b\u0000c","entity":"e","payload":1}`, "service"},
		{`{"service":"` + strings.Repeat("s", dedup.MaxServiceBytes+1) + `","entity":"e","payload":1}`, "service"},
		{`{"service":"evil\u001b]0;pwned\u0007","entity":"e","payload":1}`, "service"},
	}
	var bodies []string
	for i := range 12 {
		bodies = append(bodies, fmt.Sprintf(`{"service":"a","entity":"good-%d","payload":1}`, i))
		if i < len(poison) {
			bodies = append(bodies, poison[i].body)
		}
	}
	answers := queued(t, h, tokenAll, bodies)
	p := 0
	for i, a := range answers {
		if strings.Contains(bodies[i], `"service":"a"`) {
			if !strings.HasPrefix(a, "200 ") || !strings.Contains(a, `"forward"`) {
				t.Errorf("good check %s beside bad identities: %s", bodies[i], a)
			}
			continue
		}
		want := poison[p]
		p++
		code, msg := "", ""
		if len(a) > 4 {
			code, msg = errorCode(t, a[4:])
		}
		if !strings.HasPrefix(a, "400 ") || code != "bad_field" || !strings.HasPrefix(msg, want.field+": ") {
			t.Errorf("bad identity (%s): %.200s; want 400 bad_field naming %s", want.field, a, want.field)
		}
	}

	// A batch: each bad identity is its check's own error, the rest is
	// decided.
	code, _, out := h.do("POST", "/v1/check:batch", tokenAll, `{"checks":[
		{"service":"a","entity":"batch-1","payload":1},
		{"service":"a","entity_hex":"`+long+`","payload":1},
		{"service":"nul\u0000","entity":"e","payload":1},
		{"service":"a","entity":"batch-2","payload":1}]}`)
	if code != 200 {
		t.Fatalf("batch with bad identities: %d %.300s", code, out)
	}
	var resp struct {
		Results []struct {
			Decision string
			Error    *struct{ Code, Message string }
		}
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp.Results) != 4 {
		t.Fatalf("batch: %v %.300s", err, out)
	}
	for i, want := range []string{"forward", "bad_field checks[1].entity_hex: ", "bad_field checks[2].service: ", "forward"} {
		r := resp.Results[i]
		got := r.Decision
		if r.Error != nil {
			got = r.Error.Code + " " + r.Error.Message
		}
		if !strings.HasPrefix(got, want) {
			t.Errorf("batch result %d: %q, want %q...", i, got, want)
		}
	}

	// The state endpoints refuse them too, naming the path's part.
	for _, path := range []string{"/v1/state/b%00c/e", "/v1/state/b/" + long + "?encoding=hex", "/v1/state/" + strings.Repeat("s", 200) + "/e"} {
		for _, method := range []string{"GET", "DELETE"} {
			code, _, out := h.do(method, path, tokenAll, "")
			if c, _ := errorCode(t, out); code != 400 || c != "bad_field" {
				t.Errorf("%s %.60s: %d %s", method, path, code, out)
			}
		}
	}
	if code, _, out := h.do("GET", "/metrics", "", ""); code != 200 || strings.Contains(out, `code="500"`) {
		t.Errorf("a 500 was answered:\n%s", grep(out, "dam_serve_requests_total"))
	}
}

// poisonTrigger makes PostgreSQL refuse, with an error that no retry
// fixes, any write of state for the entity "poison": a check that passes
// every limit of dam's own but that the store still rejects. (On Citus the
// trigger goes on every shard, which Citus allows once told so; elsewhere
// the setting is a placeholder nothing reads.)
func poisonTrigger(t *testing.T, h *harness) {
	t.Helper()
	ctx := context.Background()
	conn, err := h.store.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// One statement per Exec: Citus propagates a function to the workers
	// with the text of the query that created it.
	for _, sql := range []string{
		`SET citus.enable_unsafe_triggers TO on`,
		`CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.entity = 'poison'::bytea THEN
				RAISE EXCEPTION 'poison refused';
			END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON state FOR EACH ROW EXECUTE FUNCTION refuse_poison()`,
		`RESET citus.enable_unsafe_triggers`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
}

// When the store refuses a shared transaction for a reason that is not an
// outage, its checks are decided again one by one: only the check the
// store refuses fails (500), the others are answered as if it had not
// been there, in single checks combined by the deciders and in a batch.
func TestStoreRefusalFailsAlone(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) { c.Postgres.MaxConns = 1 })
	poisonTrigger(t, h)
	var bodies []string
	for i := range 10 {
		bodies = append(bodies, fmt.Sprintf(`{"service":"a","entity":"good-%d","payload":1}`, i))
		if i%3 == 0 {
			bodies = append(bodies, `{"service":"b","entity":"poison","payload":1}`)
		}
	}
	for i, a := range queued(t, h, tokenAll, bodies) {
		if strings.Contains(bodies[i], "poison") {
			if !strings.HasPrefix(a, "500 ") || !strings.Contains(a, `"internal"`) {
				t.Errorf("the refused check: %s", a)
			}
		} else if !strings.HasPrefix(a, "200 ") || !strings.Contains(a, `"forward"`) {
			t.Errorf("check %s beside a refused one: %s", bodies[i], a)
		}
	}
	code, _, out := h.do("POST", "/v1/check:batch", tokenAll, `{"checks":[
		{"service":"a","entity":"batch-1","payload":1},
		{"service":"b","entity":"poison","payload":1},
		{"service":"a","entity":"batch-1","payload":1},
		{"service":"a","entity":"batch-1","payload":2}]}`)
	if code != 200 {
		t.Fatalf("batch with a refused check: %d %s", code, out)
	}
	var resp struct {
		Results []struct {
			Decision string
			Error    *struct{ Code, Message string }
		}
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp.Results) != 4 {
		t.Fatalf("batch: %v %s", err, out)
	}
	for i, want := range []string{"forward", "internal", "duplicate", "forward"} {
		r := resp.Results[i]
		got := r.Decision
		if r.Error != nil {
			got = r.Error.Code
		}
		if got != want {
			t.Errorf("batch result %d: %q, want %q (%s)", i, got, want, out)
		}
	}
	if got := h.check("a", "good-0", "1"); got != "duplicate" {
		t.Fatalf("good-0 after its shared transaction failed: %s", got)
	}
}
