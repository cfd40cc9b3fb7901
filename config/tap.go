package config

import "net"

// Tap configures the sidecar's live view of its decisions: GET /v1/tap on
// http.listen, which streams each decision with its reason (dam tap), and
// the reasons of GET /v1/status (dam top). A decision names its entity
// and, for bad input, a cause derived from the payload: the tap is off
// unless enabled, and every request needs one of its bearer tokens, each
// allowed a list of services (the rules of serve.tokens).
type Tap struct {
	// Enabled serves GET /v1/tap. Default false. Needs http.listen and at
	// least one token.
	Enabled bool `koanf:"enabled"`
	// Token is a bearer token allowed every service. A secret: redacted
	// when printed; set it with DAM_HTTP_TAP_TOKEN rather than in the
	// file. Default "" (none).
	Token string `koanf:"token"`
	// Tokens are bearer tokens, each allowed a list of services ("*":
	// every service), in the form of serve.tokens (token or token_file,
	// services). Not settable from the environment. Default none.
	Tokens []ServeToken `koanf:"tokens"`
	// MaxReaders bounds the taps attached at once; one more gets 503.
	// From 1 to 64. Default 4.
	MaxReaders int `koanf:"max_readers"`
}

// MaxTapReaders is the largest http.tap.max_readers.
const MaxTapReaders = 64

// DefaultTap returns the tap defaults: off.
func DefaultTap() Tap { return Tap{MaxReaders: 4} }

// ResolveTokens returns the tap's tokens with the services each allows,
// reading token files: see Serve.ResolveTokens.
func (t Tap) ResolveTokens() ([]ResolvedToken, error) {
	return resolveTokens("http.tap", t.Token, t.Tokens)
}

// validateTap checks http.tap.
func (c *Config) validateTap(v *validator) {
	t := &c.HTTP.Tap
	v.tokens("http.tap", t.Token, t.Tokens)
	if t.MaxReaders < 1 || t.MaxReaders > MaxTapReaders {
		v.addf("http.tap.max_readers", "must be from 1 to %d, got %d", MaxTapReaders, t.MaxReaders)
	}
	if !t.Enabled {
		return
	}
	if c.HTTP.Listen == "" {
		v.addf("http.tap.enabled", "needs http.listen: the tap is served there")
	} else if _, _, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
		return // reported on http.listen
	}
	if t.Token == "" && len(t.Tokens) == 0 {
		v.addf("http.tap.tokens", "required with http.tap.enabled: at least one token (or set %sHTTP_TAP_TOKEN); %s", EnvPrefix, MakeToken)
	}
}
