package config

import (
	"strings"
	"testing"
)

// The tap is off by default; on, it needs http.listen and a token, and
// its tokens follow serve.tokens's rules, each problem naming its key and
// never quoting a token.
func TestTapValidate(t *testing.T) {
	c, err := Load(writeFile(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTP.Tap.Enabled || c.HTTP.Tap.MaxReaders != 4 {
		t.Fatalf("tap defaults %+v, want off with 4 readers", c.HTTP.Tap)
	}
	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
		key    string
		msg    string
	}{
		{"no token", func(c *Config) { c.HTTP.Tap.Enabled = true }, "http.tap.tokens", "DAM_HTTP_TAP_TOKEN"},
		{"no listen", func(c *Config) { c.HTTP.Tap = Tap{Enabled: true, Token: longToken, MaxReaders: 1}; c.HTTP.Listen = "" }, "http.tap.enabled", "needs http.listen"},
		{"short token", func(c *Config) { c.HTTP.Tap.Token = "abc" }, "http.tap.token", "too short"},
		{"guessable entry", func(c *Config) {
			c.HTTP.Tap.Tokens = []ServeToken{{Token: strings.Repeat("a", 20), Services: []string{"a"}}}
		}, "http.tap.tokens[0].token", "too easy to guess"},
		{"no services", func(c *Config) { c.HTTP.Tap.Tokens = []ServeToken{{Token: longToken}} }, "http.tap.tokens[0].services", "required"},
		{"readers", func(c *Config) { c.HTTP.Tap.MaxReaders = 0 }, "http.tap.max_readers", "from 1 to 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(&c)
			err := c.Validate()
			wantProblem(t, err, tc.key, tc.msg)
			if strings.Contains(err.Error(), longToken) || strings.Contains(err.Error(), "abc") || strings.Contains(err.Error(), "aaaa") {
				t.Fatalf("token quoted in %v", err)
			}
		})
	}
	c, err = Load(writeFile(t, minimal), []string{"DAM_HTTP_TAP_ENABLED=true", "DAM_HTTP_TAP_TOKEN=" + longToken})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := c.HTTP.Tap.ResolveTokens()
	if err != nil || len(toks) != 1 || toks[0].Token != longToken || toks[0].Key != "http.tap.token" {
		t.Fatalf("tokens %+v, %v", toks, err)
	}
	if y, err := c.Redacted().YAML(); err != nil || strings.Contains(string(y), longToken) {
		t.Fatalf("the tap token is printed: %s %v", y, err)
	}
	_, err = Load(writeFile(t, minimal), []string{"DAM_HTTP_TAP_TOKENS=x"})
	wantProblem(t, err, "DAM_HTTP_TAP_TOKENS", "DAM_HTTP_TAP_TOKEN gives one token")
}
