package serve_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// Last-seen semantics over HTTP, structural equality, and the route's
// options for a configured service (defaults for any other).
func TestCheck(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	for i, step := range []struct{ service, entity, payload, want string }{
		{"a", "B-007", `{"id":"B-007","ripeness":"yellow","ts":1}`, "forward"},
		{"a", "B-007", `{"ts":2, "ripeness":"yellow","id":"B-007"}`, "duplicate"}, // order and the ignored /ts
		{"a", "B-007", `{"id":"B-007","ripeness":"brown","ts":3}`, "forward"},
		{"a", "B-007", `{"id":"B-007","ripeness":"yellow","ts":4}`, "forward"}, // A B A: forward
		{"a", "B-008", `{"id":"B-007","ripeness":"yellow","ts":4}`, "forward"}, // another entity
		{"b", "B-007", `{"id":"B-007","ripeness":"yellow","ts":1}`, "forward"}, // another service
		{"b", "B-007", `{"id":"B-007","ripeness":"yellow","ts":2}`, "forward"}, // no route: /ts counts
		{"b", "B-007", `{"ripeness":"yellow","id":"B-007","ts":2}`, "duplicate"},
		{"b", "", `null`, "forward"}, // the empty entity; a JSON null payload
		{"b", "", `null`, "duplicate"},
	} {
		if got := h.check(step.service, step.entity, step.payload); got != step.want {
			t.Fatalf("step %d %+v: got %s", i, step, got)
		}
	}
}

// The sidecar and the service decide on the same state: a record the
// sidecar forwarded is a duplicate for the service, hashed the same way.
func TestCheckAgreesWithSidecar(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	ctx := context.Background()
	hasher, err := canon.New(canon.WithIgnore("/ts"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := hasher.Sum([]byte(`{"id":"B-007","ripeness":"yellow","ts":1}`))
	if err != nil {
		t.Fatal(err)
	}
	p := dedup.Partition{Group: "g", Topic: "in.a", Partition: 0}
	pr, err := h.store.Acquire(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.store.InitProgress(ctx, p, pr.Epoch, 0); err != nil {
		t.Fatal(err)
	}
	b := &dedup.Batch{Service: "a", Partition: p, Epoch: pr.Epoch, Start: 0, End: 1,
		Records: []dedup.Record{{Offset: 0, Entity: []byte("B-007"), Digest: d}}}
	if out, err := h.store.Decide(ctx, b, nil); err != nil || out[0] != dedup.Forward {
		t.Fatalf("Decide: %v %v", out, err)
	}
	if got := h.check("a", "B-007", `{"ts":99,"ripeness":"yellow","id":"B-007"}`); got != "duplicate" {
		t.Fatalf("the service disagrees with the sidecar: %s", got)
	}
	// And the other way: the service's forward is the sidecar's duplicate.
	if got := h.check("a", "B-007", `{"id":"B-007","ripeness":"green"}`); got != "forward" {
		t.Fatal(got)
	}
	d2, _ := hasher.Sum([]byte(`{"ripeness":"green","id":"B-007","ts":5}`))
	b = &dedup.Batch{Service: "a", Partition: p, Epoch: pr.Epoch, Start: 1, End: 2,
		Records: []dedup.Record{{Offset: 1, Entity: []byte("B-007"), Digest: d2}}}
	if out, err := h.store.Decide(ctx, b, nil); err != nil || out[0] != dedup.Duplicate {
		t.Fatalf("Decide after the service's forward: %v %v", out, err)
	}
}

// format: bytes routes hash the payload's exact bytes; payload_base64
// carries bytes that are not JSON; entity_hex carries keys that are not
// text.
func TestCheckBytesAndHex(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) {
		r := config.DefaultRoute()
		r.Service, r.From, r.To, r.Format = "raw", "in.raw", "out.raw", config.FormatBytes
		c.Routes = append(c.Routes, r)
	})
	post := func(body string) string {
		t.Helper()
		code, _, out := h.do("POST", "/v1/check", tokenAll, body)
		if code != 200 {
			t.Fatalf("%s: %d %s", body, code, out)
		}
		var r struct{ Decision string }
		_ = json.Unmarshal([]byte(out), &r)
		return r.Decision
	}
	steps := []struct{ body, want string }{
		{`{"service":"raw","entity_hex":"ff00","payload":{"a":1,"b":2}}`, "forward"},
		{`{"service":"raw","entity_hex":"ff00","payload":{"b":2,"a":1}}`, "forward"}, // bytes differ
		{`{"service":"raw","entity_hex":"FF00","payload":{"b":2,"a":1}}`, "duplicate"},
		{`{"service":"raw","entity_hex":"ff00","payload_base64":"eyJiIjoyLCJhIjoxfQ=="}`, "duplicate"}, // the same bytes
		{`{"service":"raw","entity_hex":"ff00","payload_base64":"3q2+7w=="}`, "forward"},               // not JSON
	}
	for i, s := range steps {
		if got := post(s.body); got != s.want {
			t.Fatalf("step %d %s: %s, want %s", i, s.body, got, s.want)
		}
	}
	if st, err := h.store.Get(context.Background(), "raw", []byte{0xff, 0}); err != nil || st.Digest.Scheme() != canon.SchemeBytes1 {
		t.Fatalf("state: %+v %v", st, err)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	body := `{"service":"b","entity":"e","payload":1}`
	for _, tc := range []struct {
		name, token, header string
		code                int
	}{
		{"no token", "", "", 401},
		{"unknown token", "not-a-token-of-ours-0123", "", 401},
		{"a prefix of a token", tokenAll[:20], "", 401},
		{"basic auth", "", "Basic " + tokenAll, 401},
		{"token not allowed b", tokenA, "", 403},
		{"token for all", tokenAll, "", 200},
		{"lower-case scheme", "", "bearer " + tokenAll, 200},
	} {
		req, _ := http.NewRequest("POST", h.url+"/v1/check", strings.NewReader(body))
		switch {
		case tc.header != "":
			req.Header.Set("Authorization", tc.header)
		case tc.token != "":
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.code)
		}
		if tc.code == 401 && resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", tc.name)
		}
	}
	// A token scoped to a is allowed a, on every endpoint.
	if code, _, out := h.do("POST", "/v1/check", tokenA, `{"service":"a","entity":"e","payload":1}`); code != 200 {
		t.Fatalf("token a on a: %d %s", code, out)
	}
	for _, ep := range []struct{ method, path, body string }{
		{"POST", "/v1/check:batch", `{"checks":[{"service":"a","entity":"e","payload":1},{"service":"b","entity":"e","payload":1}]}`},
		{"GET", "/v1/state/b/e", ""},
		{"DELETE", "/v1/state/b/e", ""},
	} {
		code, _, out := h.do(ep.method, ep.path, tokenA, ep.body)
		if c, _ := errorCode(t, out); code != 403 || c != "forbidden" {
			t.Errorf("%s %s with token a: %d %s", ep.method, ep.path, code, out)
		}
		if code, _, _ := h.do(ep.method, ep.path, "", ep.body); code != 401 {
			t.Errorf("%s %s without a token: %d", ep.method, ep.path, code)
		}
	}
	// The forbidden batch decided nothing, not even its allowed check.
	if got := h.check("a", "e", "1"); got != "duplicate" {
		t.Fatalf("a/e after the forbidden batch: %s (the batch must change nothing)", got)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) {
		c.Serve.MaxBodyBytes = 300
		c.Serve.MaxBatch = 2
		c.Routes[0].MaxDepth = 3
	})
	for _, tc := range []struct {
		name, path, body string
		status           int
		code, msg        string
	}{
		{"empty body", "/v1/check", ``, 400, "bad_json", "empty body"},
		{"not JSON", "/v1/check", `{"service":`, 400, "bad_json", "invalid request body: the body ends inside the JSON value"},
		{"syntax", "/v1/check", `{"service":"a",]`, 400, "bad_json", "invalid request body: invalid JSON at byte 16: invalid character ']'"},
		{"wrong type", "/v1/check", `{"service":7,"entity":"e","payload":1}`, 400, "bad_json", "invalid request body: service: want a string, got a number (byte 12)"},
		{"not an object", "/v1/check", `[1]`, 400, "bad_json", "invalid request body: want a JSON object, got an array"},
		{"wrong type in a batch", "/v1/check:batch", `{"checks":[{"entity":{}}]}`, 400, "bad_json", "invalid request body: checks.entity: want a string, got an object"},
		{"checks not an array", "/v1/check:batch", `{"checks":{}}`, 400, "bad_json", "invalid request body: checks: want an array, got an object"},
		{"unknown field", "/v1/check", `{"service":"a","entity":"e","paylod":1}`, 400, "bad_json", `invalid request body: unknown field "paylod"`},
		{"trailing data", "/v1/check", `{"service":"a","entity":"e","payload":1} {}`, 400, "bad_json", "after the JSON value"},
		{"missing service", "/v1/check", `{"entity":"e","payload":1}`, 400, "missing_field", "service"},
		{"missing entity", "/v1/check", `{"service":"a","payload":1}`, 400, "missing_field", "entity"},
		{"missing payload", "/v1/check", `{"service":"a","entity":"e"}`, 400, "missing_field", "payload"},
		{"both entities", "/v1/check", `{"service":"a","entity":"e","entity_hex":"00","payload":1}`, 400, "bad_field", "exclude"},
		{"entity of invalid UTF-8", "/v1/check", "{\"service\":\"a\",\"entity\":\"e\xfe\",\"payload\":1}", 400, "bad_field", "entity: holds U+FFFD"},
		{"entity of a lone surrogate", "/v1/check", `{"service":"a","entity":"e\ud800","payload":1}`, 400, "bad_field", "entity: holds U+FFFD"},
		{"service of invalid UTF-8", "/v1/check", "{\"service\":\"a\xff\",\"entity\":\"e\",\"payload\":1}", 400, "bad_field", "service: holds U+FFFD"},
		{"bad hex", "/v1/check", `{"service":"a","entity_hex":"zz","payload":1}`, 400, "bad_field", "not hex"},
		{"bad base64", "/v1/check", `{"service":"a","entity":"e","payload_base64":"%%"}`, 400, "bad_field", "not base64"},
		{"duplicate member", "/v1/check", `{"service":"a","entity":"e","payload":{"x":1,"x":2}}`, 400, "bad_payload", "at byte 7: duplicate member"},
		{"too deep for the route", "/v1/check", `{"service":"a","entity":"e","payload":[[[[1]]]]}`, 400, "bad_payload", "nesting too deep"},
		{"bad base64 JSON", "/v1/check", `{"service":"a","entity":"e","payload_base64":"e30g+w=="}`, 400, "bad_payload", "invalid JSON"},
		{"body too large", "/v1/check", `{"service":"a","entity":"e","payload":"` + strings.Repeat("x", 300) + `"}`, 413, "body_too_large", "serve.max_body_bytes"},
		{"batch too large", "/v1/check:batch", `{"checks":[{},{},{}]}`, 413, "batch_too_large", "serve.max_batch"},
		{"batch without checks", "/v1/check:batch", `{}`, 400, "missing_field", "checks"},
		{"no such endpoint", "/v1/chekc", `{}`, 404, "not_found", "/v1/chekc"},
	} {
		code, _, out := h.do("POST", tc.path, tokenAll, tc.body)
		c, msg := errorCode(t, out)
		if code != tc.status || c != tc.code || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: %d %s %q; want %d %s ...%s...", tc.name, code, c, msg, tc.status, tc.code, tc.msg)
		}
		// Messages speak of the API, not of dam's Go types (such as
		// "Go struct field checkRequest.service").
		for _, inner := range []string{"Go ", "serve.check", "serve.batch", "checkRequest", "batchRequest", "json: "} {
			if strings.Contains(msg, inner) {
				t.Errorf("%s: the message names %q: %s", tc.name, inner, msg)
			}
		}
	}
}

// An identity string holding U+FFFD is refused, 400 naming its field, and
// nothing is decided: the JSON decoder puts U+FFFD in place of each
// invalid UTF-8 byte and of each lone surrogate escape, so the distinct
// entities "\xfe", "\xff" and "\udc00" would otherwise arrive as one
// identity, the second answered duplicate of the first. The same bytes
// sent as entity_hex are an identity of their own.
func TestIdentityHoldingTheReplacementCharacterIsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	for _, e := range []string{"utf8-\xfe", "utf8-\xff", `utf8-\udc00`, "utf8-\ufffd"} {
		code, _, out := h.do("POST", "/v1/check", tokenAll, `{"service":"a","entity":"`+e+`","payload":1}`)
		if c, msg := errorCode(t, out); code != 400 || c != "bad_field" || !strings.HasPrefix(msg, "entity: holds U+FFFD") {
			t.Errorf("entity %q: %d %s; want 400 bad_field naming entity", e, code, strings.TrimSpace(out))
		}
	}
	code, _, out := h.do("POST", "/v1/check:batch", tokenAll, `{"checks":[{"service":"a","entity":"utf8-\udbff","payload":1}]}`)
	if code != 200 || !strings.Contains(out, `checks[0].entity: holds U+FFFD`) {
		t.Errorf("in a batch: %d %s; want its result to name checks[0].entity", code, strings.TrimSpace(out))
	}
	// Nothing was stored for the bytes they would have become.
	code, _, out = h.do("POST", "/v1/check", tokenAll, `{"service":"a","entity_hex":"`+hex.EncodeToString([]byte("utf8-\ufffd"))+`","payload":1}`)
	if code != 200 || !strings.Contains(out, `"forward"`) {
		t.Errorf("the same bytes as entity_hex: %d %s; want forward (nothing decided before)", code, strings.TrimSpace(out))
	}
}

func TestBatch(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.check("a", "x", `{"v":1}`)
	code, _, out := h.do("POST", "/v1/check:batch", tokenAll, `{"checks":[
		{"service":"a","entity":"x","payload":{"v":1,"ts":9}},
		{"service":"a","entity":"y","payload":{"v":1}},
		{"service":"a","entity":"y","payload":{"v":1}},
		{"service":"a","entity":"z","payload":{"v":1,"v":2}},
		{"service":"a","entity":"x","payload":{"v":2}},
		{"service":"a","payload":1}
	]}`)
	if code != 200 {
		t.Fatalf("%d %s", code, out)
	}
	var resp struct {
		Results []struct {
			Decision, Digest string
			Error            *struct{ Code, Message string }
		}
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range resp.Results {
		if r.Error != nil {
			got = append(got, r.Error.Code+":"+r.Error.Message)
		} else {
			got = append(got, r.Decision)
		}
	}
	want := []string{"duplicate", "forward", "duplicate",
		"bad_payload:checks[3].payload: invalid JSON at byte 7: duplicate member: \"v\"",
		"forward", "missing_field:missing field checks[5].entity (or checks[5].entity_hex)"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
	if _, err := h.store.Get(context.Background(), "a", []byte("z")); err == nil {
		t.Fatal("an invalid check stored state")
	}
	if code, _, out := h.do("POST", "/v1/check:batch", tokenAll, `{"checks":[]}`); code != 200 || !strings.Contains(out, `"results":[]`) {
		t.Fatalf("empty batch: %d %s", code, out)
	}
}

func TestState(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.check("a", "B/007 ü", `{"v":1}`)
	code, _, out := h.do("GET", "/v1/state/a/B%2F007%20%C3%BC", tokenA, "")
	var st struct {
		Service, Entity, Digest string
		EntityHex               string `json:"entity_hex"`
		UpdatedAt               string `json:"updated_at"`
		Source                  *struct{}
	}
	if err := json.Unmarshal([]byte(out), &st); code != 200 || err != nil || st.Entity != "B/007 ü" || st.EntityHex != "422f30303720c3bc" || st.Source != nil || st.UpdatedAt == "" {
		t.Fatalf("get: %d %s", code, out)
	}
	if code, _, out := h.do("GET", "/v1/state/a/422f30303720c3bc?encoding=hex", tokenA, ""); code != 200 || !strings.Contains(out, st.Digest) {
		t.Fatalf("get hex: %d %s", code, out)
	}
	if code, _, out := h.do("GET", "/v1/state/a/zz?encoding=hex", tokenA, ""); code != 400 || !strings.Contains(out, "bad_field") {
		t.Fatalf("get bad hex: %d %s", code, out)
	}
	if code, _, out := h.do("DELETE", "/v1/state/a/B%2F007%20%C3%BC", tokenA, ""); code != 200 || !strings.Contains(out, `"reset":true`) {
		t.Fatalf("delete: %d %s", code, out)
	}
	if code, _, out := h.do("DELETE", "/v1/state/a/B%2F007%20%C3%BC", tokenA, ""); code != 200 || !strings.Contains(out, `"reset":false`) {
		t.Fatalf("delete again: %d %s", code, out)
	}
	code, _, out = h.do("GET", "/v1/state/a/B%2F007%20%C3%BC", tokenA, "")
	if c, _ := errorCode(t, out); code != 404 || c != "not_found" {
		t.Fatalf("get after delete: %d %s", code, out)
	}
	if got := h.check("a", "B/007 ü", `{"v":1}`); got != "forward" {
		t.Fatalf("after reset: %s", got)
	}
}

func TestHealthMetrics(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.check("a", "e", "1")
	h.check("a", "e", "1")
	if code, _, out := h.do("GET", "/healthz", "", ""); code != 200 || out != "ok\n" {
		t.Fatalf("healthz: %d %q", code, out)
	}
	if code, _, out := h.do("GET", "/readyz", "", ""); code != 200 || out != "ready\n" {
		t.Fatalf("readyz: %d %q", code, out)
	}
	_, _, out := h.do("GET", "/metrics", "", "")
	for _, want := range []string{
		`dam_serve_requests_total{code="200",endpoint="check"} 2`,
		`dam_serve_decisions_total{decision="duplicate",service="a"} 1`,
		`dam_serve_decisions_total{decision="forward",service="a"} 1`,
		`dam_serve_request_seconds_count{endpoint="check"} 2`,
		`dam_serve_store_errors_total 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(out, tokenAll) {
		t.Fatal("a token in the metrics")
	}
}

// A check or a state request for a service that no route, no token and
// no serve.services entry names is refused with 400 naming the known
// services, and makes no state: a typo ("emial") would otherwise be
// decided with canon's defaults, and every such check forwarded.
func TestUnknownServiceRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	code, _, body := h.do("POST", "/v1/check", tokenAll, `{"service":"emial","entity":"e","payload":{"a":1}}`)
	c, msg := errorCode(t, body)
	if code != 400 || c != "bad_field" || !strings.Contains(msg, `"emial": unknown service`) || !strings.Contains(msg, `"a", "b"`) {
		t.Errorf("check of an unknown service: %d %s", code, body)
	}
	code, _, body = h.do("POST", "/v1/check:batch", tokenAll, `{"checks":[{"service":"a","entity":"e","payload":1},{"service":"emial","entity":"e","payload":1}]}`)
	// (A batch answers each check: the unknown one alone is refused.)
	if code != 200 || !strings.Contains(body, `"decision":"forward"`) || !strings.Contains(body, `checks[1].service \"emial\": unknown service`) {
		t.Errorf("batch with an unknown service: %d %s", code, body)
	}
	if code, _, body = h.do("GET", "/v1/state/emial/e", tokenAll, ""); code != 400 || !strings.Contains(body, "unknown service") {
		t.Errorf("state of an unknown service: %d %s", code, body)
	}
	if n, err := h.store.Count(context.Background(), "emial"); err != nil || n != 0 {
		t.Errorf("state rows of the unknown service: %d, %v", n, err)
	}
}
