package serve_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/config"
)

// The decisions are labelled only with the configured services (routes,
// and services named by tokens): any other service a "*" token sends is
// counted as "other", so that made-up services cannot grow /metrics
// (thousands of them would make it megabytes).
func TestMetricsServiceLabels(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config.Config) {
		c.Serve.Tokens = append(c.Serve.Tokens, config.ServeToken{Token: "scoped-token-for-t-and-u-9f8e7d6c", Services: []string{"t", "u"}})
	})
	h.check("a", "e", "1")
	h.check("t", "e", "1")
	for i := range 300 { // refused: no route, token or serve.services names them
		code, _, body := h.do("POST", "/v1/check", tokenAll, fmt.Sprintf(`{"service":"made-up-%d","entity":"e","payload":1}`, i))
		if c, _ := errorCode(t, body); code != 400 || c != "bad_field" {
			t.Fatalf("check of an unknown service: %d %s", code, body)
		}
	}
	_, _, out := h.do("GET", "/metrics", "", "")
	for _, want := range []string{
		`dam_serve_decisions_total{decision="forward",service="a"} 1`,
		`dam_serve_decisions_total{decision="forward",service="t"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(out, "made-up-") || len(out) > 64<<10 {
		t.Fatalf("made-up services in the metrics (%d bytes):\n%s", len(out), grep(out, "dam_serve_decisions_total"))
	}
	if c := strings.Count(out, "dam_serve_decisions_total{"); c != 2 {
		t.Fatalf("%d decision series:\n%s", c, grep(out, "dam_serve_decisions_total"))
	}
}
