package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestServeDefaults(t *testing.T) {
	c, err := Load(writeFile(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Serve{Listen: ":8080", MaxBodyBytes: 4 << 20, MaxInFlightBytes: 32 << 20, MaxConnections: 1024,
		MaxBatch: 500, RequestTimeout: 5 * time.Second, ShutdownGrace: 10 * time.Second}
	if !reflect.DeepEqual(c.Serve, want) {
		t.Fatalf("serve defaults %+v, want %+v", c.Serve, want)
	}
}

func TestServeExample(t *testing.T) {
	c, err := Load("testdata/dam.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []ServeToken{{TokenFile: "/etc/dam/tokens/adapter-2", Services: []string{"customer-2"}}}
	if !reflect.DeepEqual(c.Serve.Tokens, want) {
		t.Fatalf("tokens %+v", c.Serve.Tokens)
	}
}

func TestServeValidateErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(s *Serve)
		key    string
		msg    string
	}{
		{"bad listen", func(s *Serve) { s.Listen = "8080" }, "serve.listen", "invalid address"},
		{"short token", func(s *Serve) { s.Token = "short" }, "serve.token", "too short"},
		{"neither", func(s *Serve) { s.Tokens = []ServeToken{{Services: []string{"a"}}} }, "serve.tokens[0]", "set token or token_file"},
		{"both", func(s *Serve) {
			s.Tokens = []ServeToken{{Token: longToken, TokenFile: "/x", Services: []string{"a"}}}
		}, "serve.tokens[0].token_file", "give one of them"},
		{"short entry token", func(s *Serve) { s.Tokens = []ServeToken{{Token: "abc", Services: []string{"a"}}} }, "serve.tokens[0].token", "too short"},
		{"sixteen a", func(s *Serve) { s.Token = strings.Repeat("a", 16) }, "serve.token", "too easy to guess"},
		{"a pattern", func(s *Serve) { s.Token = strings.Repeat("ab", 16) }, "serve.token", "head -c 32 /dev/urandom | base64"},
		{"entry: sixteen hex", func(s *Serve) { s.Tokens = []ServeToken{{Token: "0123456789abcdef", Services: []string{"a"}}} }, "serve.tokens[0].token", "too easy to guess"},
		{"no services", func(s *Serve) { s.Tokens = []ServeToken{{Token: longToken}} }, "serve.tokens[0].services", "required"},
		{"empty service", func(s *Serve) { s.Tokens = []ServeToken{{Token: longToken, Services: []string{"a", ""}}} }, "serve.tokens[0].services[1]", "empty"},
		{"body", func(s *Serve) { s.MaxBodyBytes = 0 }, "serve.max_body_bytes", "positive"},
		{"batch", func(s *Serve) { s.MaxBatch = -1 }, "serve.max_batch", "positive"},
		{"checks in flight", func(s *Serve) { s.MaxChecksInFlight = -1 }, "serve.max_checks_in_flight", "0 (256 per postgres.max_conns connection) or positive"},
		{"in flight below a body", func(s *Serve) { s.MaxInFlightBytes = s.MaxBodyBytes - 1 }, "serve.max_in_flight_bytes", "at least serve.max_body_bytes"},
		{"connections", func(s *Serve) { s.MaxConnections = 0 }, "serve.max_connections", "positive"},
		{"per address negative", func(s *Serve) { s.MaxConnectionsPerAddress = -1 }, "serve.max_connections_per_address", "from 0"},
		{"per address past the bound", func(s *Serve) { s.MaxConnectionsPerAddress = s.MaxConnections + 1 }, "serve.max_connections_per_address", "serve.max_connections (1024)"},
		{"cert without key", func(s *Serve) { s.TLS.CertFile = "/tls/tls.crt" }, "serve.tls.key_file", "required with serve.tls.cert_file"},
		{"key without cert", func(s *Serve) { s.TLS.KeyFile = "/tls/tls.key" }, "serve.tls.cert_file", "required with serve.tls.key_file"},
		{"timeout", func(s *Serve) { s.RequestTimeout = 0 }, "serve.request_timeout", "positive"},
		{"grace", func(s *Serve) { s.ShutdownGrace = 0 }, "serve.shutdown_grace", "positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(&c.Serve)
			err := c.Validate()
			wantProblem(t, err, tc.key, tc.msg)
			if strings.Contains(err.Error(), longToken) || strings.Contains(err.Error(), "abc") || strings.Contains(err.Error(), "aaaa") {
				t.Fatalf("token quoted in %v", err)
			}
		})
	}
}

// dam serve needs no Kafka and no routes, but a token.
func TestLoadServe(t *testing.T) {
	path := writeFile(t, `postgres: {dsn: "postgres://dam@localhost/dam"}`+"\nserve: {services: [a]}\n")
	if _, err := Load(path, nil); err == nil {
		t.Fatal("Load without kafka and routes succeeded")
	}
	_, err := LoadServe(path, nil)
	wantProblem(t, err, "serve.tokens", "DAM_SERVE_TOKEN")
	_, err = LoadServe(path, []string{"DAM_SERVE_TOKEN=" + longToken, "DAM_SERVE_LISTEN="})
	wantProblem(t, err, "serve.listen", "required")
	if _, err := Load(writeFile(t, minimal), []string{"DAM_SERVE_LISTEN="}); err != nil {
		t.Fatalf("dam run does not need serve.listen: %v", err)
	}
	c, err := LoadServe(path, []string{"DAM_SERVE_TOKEN=" + longToken})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := c.Serve.ResolveTokens()
	if err != nil || len(toks) != 1 || toks[0].Token != longToken || toks[0].Services[0] != AnyService {
		t.Fatalf("tokens %+v, %v", toks, err)
	}
	// Other problems are still reported, and the routes that are given are
	// still checked.
	path = writeFile(t, `postgres: {dsn: x}
serve: {max_batch: 0, token: `+longToken+`}
routes: [{service: a, from: in, to: out, ignore: [nope]}]
`)
	_, err = LoadServe(path, nil)
	errs := problems(t, err)
	if len(errs) != 2 || !strings.Contains(err.Error(), "routes[0].ignore[0]") || !strings.Contains(err.Error(), "serve.max_batch") {
		t.Fatalf("got %v", err)
	}
}

func TestServeTokensNotFromEnvironment(t *testing.T) {
	_, err := Load(writeFile(t, minimal), []string{"DAM_SERVE_TOKENS=x"})
	wantProblem(t, err, "DAM_SERVE_TOKENS", "DAM_SERVE_TOKEN gives one token")
	c, err := Load(writeFile(t, minimal), []string{"DAM_SERVE_LISTEN=:9", "DAM_SERVE_MAX_BATCH=7"})
	if err != nil || c.Serve.Listen != ":9" || c.Serve.MaxBatch != 7 {
		t.Fatalf("%+v %v", c.Serve, err)
	}
}

func TestServeSecretNotQuoted(t *testing.T) {
	_, err := Load(writeFile(t, minimal+"serve: {tokens: [{token: 12345678901234567890, services: [a]}]}\n"), nil)
	wantProblem(t, err, "serve.tokens[0].token", "want a string, got integer")
	if strings.Contains(err.Error(), "12345678901234567890") {
		t.Fatalf("secret in error: %v", err)
	}
}

func TestResolveTokenFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(good, []byte(longToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	guessable := filepath.Join(dir, "guessable")
	if err := os.WriteFile(guessable, []byte(strings.Repeat("a", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := Serve{Tokens: []ServeToken{{TokenFile: good, Services: []string{"a", "b"}}, {Token: longToken + "2", Services: []string{"c"}}}}
	toks, err := s.ResolveTokens()
	if err != nil {
		t.Fatal(err)
	}
	want := []ResolvedToken{{Token: longToken, Services: []string{"a", "b"}, Key: "serve.tokens[0].token_file"}, {Token: longToken + "2", Services: []string{"c"}, Key: "serve.tokens[1].token"}}
	if !reflect.DeepEqual(toks, want) {
		t.Fatalf("got %+v", toks)
	}
	for path, msg := range map[string]string{filepath.Join(dir, "missing"): "no such file", short: "too short", guessable: "too easy to guess"} {
		s := Serve{Tokens: []ServeToken{{Token: longToken, Services: []string{"a"}}, {TokenFile: path, Services: []string{"a"}}}}
		_, err := s.ResolveTokens()
		if err == nil || !strings.HasPrefix(err.Error(), "serve.tokens[1].token_file: ") || !strings.Contains(err.Error(), msg) || strings.Contains(err.Error(), "abc") || strings.Contains(err.Error(), "aaaa") {
			t.Errorf("%s: %v", path, err)
		}
	}
}

func TestRedactedServeTokens(t *testing.T) {
	c := valid()
	c.Serve.Token = longToken
	c.Serve.Tokens = []ServeToken{{Token: longToken + "x", Services: []string{"a"}}, {TokenFile: "/run/t", Services: []string{"b"}}}
	r := c.Redacted()
	if r.Serve.Token != Mask || r.Serve.Tokens[0].Token != Mask || r.Serve.Tokens[1].TokenFile != "/run/t" || r.Serve.Tokens[1].Token != "" {
		t.Fatalf("not redacted: %+v", r.Serve)
	}
	if c.Serve.Tokens[0].Token != longToken+"x" {
		t.Fatal("Redacted changed its receiver")
	}
	out, err := r.YAML()
	if err != nil || strings.Contains(string(out), longToken) {
		t.Fatalf("secret printed (%v):\n%s", err, out)
	}
}

// dam serve needs at least one service named: by a route, a token, or
// serve.services; a "*" token names none.
func TestServeNeedsAService(t *testing.T) {
	path := writeFile(t, `postgres: {dsn: "postgres://dam@localhost/dam"}`+"\n")
	_, err := LoadServe(path, []string{"DAM_SERVE_TOKEN=" + longToken})
	wantProblem(t, err, "serve.services", "required")
	path = writeFile(t, `postgres: {dsn: "postgres://dam@localhost/dam"}`+"\nserve: {services: [\"*\"]}\n")
	_, err = LoadServe(path, []string{"DAM_SERVE_TOKEN=" + longToken})
	wantProblem(t, err, "serve.services[0]", "want a service name")
}
