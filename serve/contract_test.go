package serve_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/dam-dedup/dam/serve"
)

// The contract test: every request the tests send through a harness, and
// every response the service gives them, is checked against the OpenAPI
// document the service serves (openapi.yaml), so that the document cannot
// drift from the code:
//
//   - the endpoint must be in the document, or be a /v1/ path answered 404
//     not_found as the document says of every other /v1/ path;
//   - a request the document rejects (a missing field, a wrong type, an
//     unknown field, no bearer token) must be answered 4xx, and 401 when
//     it lacks the bearer token: a server that accepts what the document
//     forbids is a drift (the document is stricter than the code);
//   - every response must have a status the operation documents, with the
//     documented headers and a body of the documented schema.
//
// The validator is kin-openapi's openapi3filter, which validates OpenAPI
// 3.1 documents with a JSON Schema 2020-12 validator.

// contractDoc is the document and its router, loaded once.
var contractDoc = sync.OnceValues(func() (*contract, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(serve.OpenAPI())
	if err != nil {
		return nil, fmt.Errorf("loading openapi.yaml: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("openapi.yaml is not a valid OpenAPI document: %w", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, err
	}
	return &contract{doc: doc, router: router}, nil
})

type contract struct {
	doc    *openapi3.T
	router routers.Router
}

// exchange is one request and its response, as the validator sees them.
type exchange struct {
	req    *http.Request // its body already read: reqBody
	body   []byte
	status int
	header http.Header
	resp   []byte
}

// validated wraps h so that every exchange through it is checked against
// the document; a violation fails t.
func validated(t *testing.T, h http.Handler) http.Handler {
	c, err := contractDoc()
	if err != nil {
		t.Fatal(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		if rec.Code == serve.StatusClientGone && r.Context().Err() != nil {
			return // its client went away: no client reads this answer
		}
		if err := c.check(exchange{req: r, body: body, status: rec.Code, header: rec.Header(), resp: rec.Body.Bytes()}); err != nil {
			t.Errorf("contract: %s %s -> %d: %v\nrequest: %.300s\nresponse: %.300s", r.Method, r.URL.RequestURI(), rec.Code, err, body, rec.Body.Bytes())
		}
	})
}

// check validates one exchange against the document.
func (c *contract) check(x exchange) error {
	ctx := context.Background()
	req := x.req.Clone(ctx)
	req.Body = io.NopCloser(bytes.NewReader(x.body))
	// The service reads every body as JSON, whatever its Content-Type
	// (curl -d sends a form type): validate it as the JSON it is read as.
	if len(x.body) > 0 {
		req.Header.Set("Content-Type", "application/json")
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		if !errors.Is(err, routers.ErrPathNotFound) && !errors.Is(err, routers.ErrMethodNotAllowed) {
			return err
		}
		// Not in the document: only a /v1/ path answered 404 not_found.
		if !strings.HasPrefix(req.URL.Path, "/v1/") {
			return fmt.Errorf("%s %s is not in the document", req.Method, req.URL.Path)
		}
		if x.status != http.StatusNotFound {
			return fmt.Errorf("%s %s is not in the document, so it must be 404 not_found, not %d", req.Method, req.URL.Path, x.status)
		}
		return c.errorBody(x.resp, "not_found")
	}
	opts := &openapi3filter.Options{AuthenticationFunc: bearerPresent, IncludeResponseStatus: true}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	if reqErr := openapi3filter.ValidateRequest(ctx, in); reqErr != nil {
		var sec *openapi3filter.SecurityRequirementsError
		switch {
		case errors.As(reqErr, &sec) && x.status != http.StatusUnauthorized:
			return fmt.Errorf("a request without a bearer token must be 401, not %d", x.status)
		case x.status < 400 || x.status >= 500:
			return fmt.Errorf("the document rejects the request, but the service answered %d: %w", x.status, reqErr)
		}
	}
	return openapi3filter.ValidateResponse(ctx, &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 x.status,
		Header:                 x.header,
		Body:                   io.NopCloser(bytes.NewReader(x.resp)),
		Options:                opts,
	})
}

// errorBody checks that b is the document's Error with code.
func (c *contract) errorBody(b []byte, code string) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("error body: %w", err)
	}
	if err := c.doc.Components.Schemas["Error"].Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		return fmt.Errorf("error body: %w", err)
	}
	if got := v.(map[string]any)["code"]; got != code {
		return fmt.Errorf("error code %v, want %s", got, code)
	}
	return nil
}

// bearerPresent is the document's bearer scheme as a validator can check
// it: an Authorization header with the Bearer scheme (any case) and a
// credential. Whether the token is configured is the service's to say (a
// documented 401).
func bearerPresent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	h := in.RequestValidationInput.Request.Header.Get("Authorization")
	scheme, cred, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(cred) == "" {
		return errors.New("no bearer token")
	}
	return nil
}

// The document is served as it is embedded, without a token, and counted
// as endpoint "openapi".
func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	code, hdr, out := h.do("GET", "/v1/openapi.yaml", "", "")
	if code != 200 || hdr.Get("Content-Type") != "application/yaml" || out != string(serve.OpenAPI()) {
		t.Fatalf("GET /v1/openapi.yaml: %d %q, %d bytes", code, hdr.Get("Content-Type"), len(out))
	}
	if _, _, m := h.do("GET", "/metrics", "", ""); !strings.Contains(m, `dam_serve_requests_total{code="200",endpoint="openapi"} 1`) {
		t.Errorf("GET /v1/openapi.yaml is not counted as endpoint openapi")
	}
	c, err := contractDoc()
	if err != nil {
		t.Fatal(err)
	}
	if c.doc.OpenAPI != "3.1.0" {
		t.Fatalf("openapi: %s, want 3.1.0", c.doc.OpenAPI)
	}
}

// The contract check is not a test that cannot fail: each kind of drift
// between the document and the service fails it, and the exchanges the
// document allows pass.
func TestContractCatchesDrift(t *testing.T) {
	c, err := contractDoc()
	if err != nil {
		t.Fatal(err)
	}
	const (
		digest = `"0187510011c1a44aab0e29beabbe66f53b2c63844b503ebf819e4bd2e29babb7ab"`
		check  = `{"service":"a","entity":"e","payload":{"v":1}}`
		auth   = "Bearer " + tokenAll
	)
	jsonHdr := func(kv ...string) http.Header {
		h := http.Header{"Content-Type": {"application/json"}}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	for _, tc := range []struct {
		name, method, path, authz, body string
		status                          int
		header                          http.Header
		resp                            string
		want                            string // "" when the exchange is allowed
	}{
		// Allowed exchanges: the check passes them.
		{"a check", "POST", "/v1/check", auth, check, 200, jsonHdr(), `{"decision":"forward","digest":` + digest + `}`, ""},
		{"a batch with an error", "POST", "/v1/check:batch", auth, `{"checks":[` + check + `,{"service":"a"}]}`, 200, jsonHdr(),
			`{"results":[{"decision":"duplicate","digest":` + digest + `},{"error":{"code":"missing_field","message":"m"}}]}`, ""},
		{"a state", "GET", "/v1/state/a/e", auth, "", 200, jsonHdr(),
			`{"service":"a","entity":"e","entity_hex":"65","digest":` + digest + `,"updated_at":"2026-11-24T10:00:00Z","source":{"topic":"in","partition":0,"offset":7}}`, ""},
		{"no token", "POST", "/v1/check", "", check, 401, jsonHdr("WWW-Authenticate", `Bearer realm="dam"`), `{"code":"unauthorized","message":"m"}`, ""},
		{"an outage", "DELETE", "/v1/state/a/e", auth, "", 503, jsonHdr("Retry-After", "1"), `{"code":"unavailable","message":"m"}`, ""},
		{"another /v1 path", "GET", "/v1/chekc", auth, "", 404, jsonHdr(), `{"code":"not_found","message":"m"}`, ""},

		// Drift: each fails.
		{"a field the document lacks", "POST", "/v1/check", auth, check, 200, jsonHdr(),
			`{"decision":"forward","digest":` + digest + `,"stored":true}`, `property "stored" is unsupported`},
		{"a decision the document lacks", "POST", "/v1/check", auth, check, 200, jsonHdr(), `{"decision":"stale","digest":` + digest + `}`, `"/decision"`},
		{"a digest of another form", "POST", "/v1/check", auth, check, 200, jsonHdr(), `{"decision":"forward","digest":"sha256:abc"}`, `"/digest"`},
		{"an undocumented status", "POST", "/v1/check", auth, check, 429, jsonHdr("Retry-After", "1"), `{"code":"unavailable","message":"m"}`, "status is not supported"},
		{"an undocumented error code", "POST", "/v1/check", auth, check, 400, jsonHdr(), `{"code":"too_many_fields","message":"m"}`, `"/code"`},
		{"an error code of another status", "POST", "/v1/check", auth, check, 400, jsonHdr(), `{"code":"unavailable","message":"m"}`, `"/code"`},
		{"a 401 without WWW-Authenticate", "POST", "/v1/check", "", check, 401, jsonHdr(), `{"code":"unauthorized","message":"m"}`, "WWW-Authenticate"},
		{"a 503 without Retry-After", "POST", "/v1/check", auth, check, 503, jsonHdr(), `{"code":"unavailable","message":"m"}`, "Retry-After"},
		{"a state without updated_at", "GET", "/v1/state/a/e", auth, "", 200, jsonHdr(),
			`{"service":"a","entity":"e","entity_hex":"65","digest":` + digest + `}`, `property "updated_at" is missing`},
		{"a batch result both decided and failed", "POST", "/v1/check:batch", auth, `{"checks":[` + check + `]}`, 200, jsonHdr(),
			`{"results":[{"decision":"forward","digest":` + digest + `,"error":{"code":"bad_payload","message":"m"}}]}`, `property "error" is unsupported`},
		{"a request the document rejects, accepted", "POST", "/v1/check", auth, `{"entity":"e","payload":1}`, 200, jsonHdr(),
			`{"decision":"forward","digest":` + digest + `}`, "the document rejects the request"},
		{"an unknown request field, accepted", "POST", "/v1/check", auth, `{"service":"a","entity":"e","payload":1,"ttl":5}`, 200, jsonHdr(),
			`{"decision":"forward","digest":` + digest + `}`, "the document rejects the request"},
		{"no token, not 401", "POST", "/v1/check", "", check, 400, jsonHdr(), `{"code":"bad_json","message":"m"}`, "must be 401"},
		{"a /v1 path the document lacks, answered", "GET", "/v1/stats", auth, "", 200, jsonHdr(), `{}`, "must be 404"},
		{"a path outside /v1 the document lacks", "GET", "/debug/pprof/", "", "", 200, http.Header{}, ``, "not in the document"},
	} {
		req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
		if tc.authz != "" {
			req.Header.Set("Authorization", tc.authz)
		}
		err := c.check(exchange{req: req, body: []byte(tc.body), status: tc.status, header: tc.header, resp: []byte(tc.resp)})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: an allowed exchange failed: %v", tc.name, err)
		case tc.want != "" && err == nil:
			t.Errorf("%s: the drift passed the contract check", tc.name)
		case tc.want != "" && !strings.Contains(err.Error(), tc.want):
			t.Errorf("%s: %v, want an error about %q", tc.name, err, tc.want)
		}
	}
}
