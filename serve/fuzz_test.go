package serve

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/config"
)

// FuzzParseCheck feeds arbitrary bodies to the check request's reading,
// decoding and parsing: no input panics, every rejection is an API error with a
// status and a code, and an accepted check has a service and a digest.
func FuzzParseCheck(f *testing.F) {
	for _, seed := range []string{
		`{"service":"a","entity":"e","payload":{"x":1}}`,
		`{"service":"a","entity_hex":"ff00","payload_base64":"eyJ4IjoxfQ=="}`,
		`{"service":"b","entity":"","payload":null}`,
		`{"service":"a","entity":"e","payload":{"x":1,"x":2}}`,
		`{"service":"a","entity":"e","payload":[[[[[[1]]]]]]}`,
		`{"service":"a","entity":"e","entity_hex":"00","payload":1}`,
		`{"service":"a"} {}`,
		`{"service":7}`,
		`[]`,
		``,
	} {
		f.Add(seed)
	}
	cfg := config.Default()
	r := config.DefaultRoute()
	r.Service, r.From, r.To, r.Ignore, r.MaxDepth = "a", "in", "out", []string{"/ts", "/items/*/ts"}, 4
	cfg.Routes = []config.Route{r}
	cfg.Serve.Token = "fuzz-token-0123456789"
	cfg.Serve.MaxBodyBytes = 1 << 12
	s, err := New(cfg, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body string) {
		w := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/v1/check", strings.NewReader(body))
		var c checkRequest
		_, cancel, release, e := s.readBody(w, req, &s.tokens[0], &c)
		defer cancel()
		defer release()
		if e != nil {
			if e.status < 400 || e.code == "" || e.msg == "" {
				t.Fatalf("decode error without status or code: %+v", e)
			}
			return
		}
		item, e := s.parse(&c, "")
		if e != nil {
			if e.status != 400 || e.code == "" || e.msg == "" {
				t.Fatalf("parse error without status or code: %+v", e)
			}
			return
		}
		if item.Service == "" || item.Digest.IsZero() {
			t.Fatalf("accepted check without a service or a digest: %+v", item)
		}
	})
}
