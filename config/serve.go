package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"slices"
	"time"
)

// Serve configures `dam serve`, the synchronous check service: an HTTP API
// that decides (service, entity, payload) on the same store and with the
// same semantics as the sidecar. Only `dam serve` reads it.
type Serve struct {
	// Listen is the listen address of the API and of its own /metrics,
	// /healthz and /readyz. Default ":8080".
	Listen string `koanf:"listen"`
	// Token is a bearer token allowed every service. A secret: redacted
	// when printed; set it with DAM_SERVE_TOKEN rather than in the file.
	// Default "" (none).
	Token string `koanf:"token"`
	// Tokens are bearer tokens, each allowed a list of services. Not
	// settable from the environment. Default none. `dam serve` needs at
	// least one token here or in Token.
	Tokens []ServeToken `koanf:"tokens"`
	// Services are services `dam serve` checks without a route, hashed
	// with canon's defaults (no ignore list). A check of a service that no
	// route, no token and no entry here names is refused (400): a typo
	// would otherwise make state no one decides with. Default none.
	Services []string `koanf:"services"`
	// TLS serves the API over HTTPS when set. Default off: plain HTTP,
	// for a mesh or a load balancer that terminates TLS.
	TLS ServeTLS `koanf:"tls"`
	// MaxBodyBytes bounds a request body; a larger one gets 413. Default
	// 4194304 (4 MiB).
	MaxBodyBytes int `koanf:"max_body_bytes"`
	// MaxInFlightBytes bounds the request bodies being read or held at
	// once, shared equally among the tokens (each token's share at least
	// MaxBodyBytes): a request takes room in its token's share as its body
	// arrives, and waits for room up to RequestTimeout, then gets 503 with
	// Retry-After. At least MaxBodyBytes. Default 33554432 (32 MiB).
	MaxInFlightBytes int `koanf:"max_in_flight_bytes"`
	// MaxConnections bounds the connections served at once (each is one
	// request at a time: HTTP/1.1). A connection beyond it takes the slot
	// of one that is not serving a request with a valid token (the one
	// that has not finished its request the longest, else the longest
	// idle), which is closed; when every slot serves such a request, it
	// waits a quarter of a second for one to end, then gets 503 with
	// Retry-After. Default 1024.
	MaxConnections int `koanf:"max_connections"`
	// MaxConnectionsPerAddress bounds the connections served at once from
	// one client address; a connection beyond it gets 503 with
	// Retry-After at once. 0 (the default) bounds them by MaxConnections
	// alone: behind a proxy, a load balancer or a mesh sidecar every
	// client has the proxy's address. At most MaxConnections.
	MaxConnectionsPerAddress int `koanf:"max_connections_per_address"`
	// MaxChecksInFlight bounds the checks queued for PostgreSQL or being
	// decided at once (a single check is one, a batch its checks, a
	// state read or reset one): past it, a request waits for room up to
	// 20 ms (250 ms while several tokens want room and its token holds
	// less than its fair share), then gets 503 overloaded with
	// Retry-After. Whatever the bound, while the oldest store work queued
	// (checks, batches, state reads and resets share one queue) has waited
	// over 250 ms for PostgreSQL, a request gets that 503 at once: past
	// capacity the excess is told so at once, and what is admitted is decided in time.
	// 0 (the default): 256 per postgres.max_conns connection (2048 with
	// its default of 8), what the deciders take in one round.
	MaxChecksInFlight int `koanf:"max_checks_in_flight"`
	// MaxBatch bounds the checks of one /v1/check:batch request. Default
	// 500.
	MaxBatch int `koanf:"max_batch"`
	// RequestTimeout bounds the store work of one request; past it the
	// answer is 503 with Retry-After, never a guess. Default 5s.
	RequestTimeout time.Duration `koanf:"request_timeout"`
	// ShutdownGrace bounds the time to finish the requests in flight on
	// SIGTERM. Default 10s.
	ShutdownGrace time.Duration `koanf:"shutdown_grace"`
}

// ServeTLS is the certificate `dam serve` presents. Both files are read at
// start and read again whenever either changes (cert-manager rotates them
// in place), without a restart.
type ServeTLS struct {
	// CertFile is the PEM certificate chain. Default "" (no TLS).
	CertFile string `koanf:"cert_file"`
	// KeyFile is the PEM private key of CertFile. Default "".
	KeyFile string `koanf:"key_file"`
}

// Enabled reports whether TLS is configured.
func (t ServeTLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// ServeToken is one bearer token of `dam serve` and the services it may
// check, read and reset. Exactly one of Token and TokenFile is set.
type ServeToken struct {
	// Token is the token itself. A secret: redacted when printed; prefer
	// TokenFile.
	Token string `koanf:"token"`
	// TokenFile is a file holding the token (one trailing newline is
	// removed), e.g. a mounted Kubernetes secret. Read when `dam serve`
	// starts.
	TokenFile string `koanf:"token_file"`
	// Services are the services the token is allowed; "*" allows every
	// service. Required.
	Services []string `koanf:"services"`
}

// MinTokenLength is the minimum length of a serve token: a short token is
// guessable.
const MinTokenLength = 16

// MinTokenBits is the least entropy a serve token must show, estimated as
// its length times the Shannon entropy of its characters' frequencies: a
// long token of few distinct characters ("aaaaaaaaaaaaaaaa",
// "abababab...") is as guessable as a short one. 24 random bytes in
// base64 show about 130 bits, 16 in hex about 110, a UUID about 120.
const MinTokenBits = 80

// MakeToken is how to make a good token, for error messages.
const MakeToken = "make one with `head -c 32 /dev/urandom | base64`"

// checkToken returns why tok is not a usable token, or nil. The token is
// never quoted.
func checkToken(tok string) error {
	if len(tok) < MinTokenLength {
		return fmt.Errorf("too short: at least %d characters; %s", MinTokenLength, MakeToken)
	}
	if tokenBits(tok) < MinTokenBits {
		return fmt.Errorf("too easy to guess: too few distinct characters for its length; %s", MakeToken)
	}
	return nil
}

// tokenBits estimates the entropy of tok in bits: its length times the
// Shannon entropy of its characters' frequencies.
func tokenBits(tok string) float64 {
	counts := map[rune]int{}
	n := 0
	for _, r := range tok {
		counts[r]++
		n++
	}
	bits := 0.0
	for _, c := range counts {
		p := float64(c) / float64(n)
		bits -= p * math.Log2(p)
	}
	return bits * float64(n)
}

// AnyService in ServeToken.Services allows every service.
const AnyService = "*"

// DefaultServe returns the serve defaults.
func DefaultServe() Serve {
	return Serve{
		Listen:           ":8080",
		MaxBodyBytes:     4 << 20,
		MaxInFlightBytes: 32 << 20,
		MaxConnections:   1024,
		MaxBatch:         500,
		RequestTimeout:   5 * time.Second,
		ShutdownGrace:    10 * time.Second,
	}
}

// validateServe checks the serve section. Token files are not read here
// (see Serve.ResolveTokens); tokens are never quoted in errors.
func (c *Config) validateServe(v *validator) {
	s := &c.Serve
	if s.Listen != "" {
		if _, _, err := net.SplitHostPort(s.Listen); err != nil {
			v.addf("serve.listen", "invalid address %q: want host:port or :port", s.Listen)
		}
	}
	v.tokens("serve", s.Token, s.Tokens)
	for i, svc := range s.Services {
		if svc == "" || svc == AnyService {
			v.addf(fmt.Sprintf("serve.services[%d]", i), "want a service name, got %q", svc)
		}
	}
	if s.MaxBodyBytes <= 0 {
		v.addf("serve.max_body_bytes", "must be positive, got %d", s.MaxBodyBytes)
	}
	if s.MaxInFlightBytes < s.MaxBodyBytes {
		v.addf("serve.max_in_flight_bytes", "must be at least serve.max_body_bytes (%d), got %d: a body of the largest size must fit", s.MaxBodyBytes, s.MaxInFlightBytes)
	}
	if s.MaxConnections <= 0 {
		v.addf("serve.max_connections", "must be positive, got %d", s.MaxConnections)
	}
	if s.MaxConnectionsPerAddress < 0 || s.MaxConnectionsPerAddress > max(0, s.MaxConnections) {
		v.addf("serve.max_connections_per_address", "must be from 0 (no bound of its own) to serve.max_connections (%d), got %d", s.MaxConnections, s.MaxConnectionsPerAddress)
	}
	switch {
	case s.TLS.CertFile != "" && s.TLS.KeyFile == "":
		v.addf("serve.tls.key_file", "required with serve.tls.cert_file")
	case s.TLS.KeyFile != "" && s.TLS.CertFile == "":
		v.addf("serve.tls.cert_file", "required with serve.tls.key_file")
	}
	if s.MaxChecksInFlight < 0 {
		v.addf("serve.max_checks_in_flight", "must be 0 (256 per postgres.max_conns connection) or positive, got %d", s.MaxChecksInFlight)
	}
	if s.MaxBatch <= 0 {
		v.addf("serve.max_batch", "must be positive, got %d", s.MaxBatch)
	}
	v.positive("serve.request_timeout", s.RequestTimeout)
	v.positive("serve.shutdown_grace", s.ShutdownGrace)
}

// tokens checks a section's token (every service) and tokens (each
// allowed a list of services), under prefix (serve, http.tap). Tokens are
// never quoted.
func (v *validator) tokens(prefix, token string, tokens []ServeToken) {
	if token != "" {
		if err := checkToken(token); err != nil {
			v.addf(prefix+".token", "%v", err)
		}
	}
	for i, t := range tokens {
		key := func(name string) string { return fmt.Sprintf("%s.tokens[%d].%s", prefix, i, name) }
		switch {
		case t.Token == "" && t.TokenFile == "":
			v.addf(fmt.Sprintf("%s.tokens[%d]", prefix, i), "set token or token_file")
		case t.Token != "" && t.TokenFile != "":
			v.addf(key("token_file"), "set with token: give one of them")
		case t.Token != "":
			if err := checkToken(t.Token); err != nil {
				v.addf(key("token"), "%v", err)
			}
		}
		v.required(key("services"), len(t.Services) == 0)
		for j, svc := range t.Services {
			if svc == "" {
				v.addf(fmt.Sprintf("%s.tokens[%d].services[%d]", prefix, i, j), "empty service name")
			}
		}
	}
}

// validateForServe adds what only `dam serve` requires: an address and a
// token.
func (c *Config) validateForServe(v *validator) {
	if c.Serve.Listen == "" {
		v.addf("serve.listen", "required: the API needs an address")
	}
	if c.Serve.Token == "" && len(c.Serve.Tokens) == 0 {
		v.addf("serve.tokens", "required: at least one token (or set %sSERVE_TOKEN)", EnvPrefix)
	}
	if len(c.Services()) == 0 {
		v.addf("serve.services", "required: name the services dam serve checks, as routes or in serve.services (a token's %q names none)", AnyService)
	}
}

// LoadServe is Load for `dam serve`: Kafka and routes are optional (a
// route only lends its hashing options to its service), and at least one
// token is required.
func LoadServe(path string, environ []string) (Config, error) {
	return load(path, environ, forServe)
}

// servesWithout reports a problem that does not concern `dam serve`: the
// Kafka connection or the routes are missing.
func servesWithout(e *Error) bool {
	switch e.Key {
	case "kafka.brokers", "kafka.group":
		return errors.Is(e.Err, ErrRequired)
	case "routes":
		return true // only "at least one route is required" is reported on the bare key
	}
	return false
}

// ResolveTokens returns every token of s with the services it allows:
// Token (every service) and each entry of Tokens, reading token files. An
// error names the key of the file that cannot be used.
func (s Serve) ResolveTokens() ([]ResolvedToken, error) {
	return resolveTokens("serve", s.Token, s.Tokens)
}

// resolveTokens is ResolveTokens of a section's token and tokens, whose
// keys start with prefix.
func resolveTokens(prefix, token string, tokens []ServeToken) ([]ResolvedToken, error) {
	var out []ResolvedToken
	if token != "" {
		out = append(out, ResolvedToken{Token: token, Services: []string{AnyService}, Key: prefix + ".token"})
	}
	for i, t := range tokens {
		key := fmt.Sprintf("%s.tokens[%d]", prefix, i)
		tok := t.Token
		if t.TokenFile != "" {
			key += ".token_file"
			b, err := os.ReadFile(t.TokenFile)
			if err != nil {
				var pe *fs.PathError
				if errors.As(err, &pe) {
					err = pe.Err
				}
				return nil, &Error{Key: key, Err: fmt.Errorf("%s: %w", t.TokenFile, err)}
			}
			b = bytes.TrimSuffix(b, []byte("\n"))
			b = bytes.TrimSuffix(b, []byte("\r"))
			if err := checkToken(string(b)); err != nil {
				return nil, &Error{Key: key, Err: fmt.Errorf("%s: token %w", t.TokenFile, err)}
			}
			tok = string(b)
		} else {
			key += ".token"
		}
		out = append(out, ResolvedToken{Token: tok, Services: slices.Clone(t.Services), Key: key})
	}
	return out, nil
}

// ResolvedToken is a token ready to compare: its text, the services it
// allows ("*" for all) and the key it came from (for logs, never the
// token).
type ResolvedToken struct {
	Token    string
	Services []string
	Key      string
}
