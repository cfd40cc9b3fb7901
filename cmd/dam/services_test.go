package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// The state commands refuse a service that no route and no serve token of
// the configuration names, listing the known ones, before they touch the
// store: a typo must not report "reset 0 identities" and exit 0.
func TestStateRefusesUnknownService(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	cfg := writeConfig(t, fmt.Sprintf(`
kafka: {brokers: [localhost:9092], group: g}
postgres: {dsn: %q}
routes:
  - {service: emails, from: in.emails, to: out.emails}
`, dsn))
	for _, args := range [][]string{
		{"state", "reset", "-c", cfg, "emial", "c-1"},
		{"state", "get", "-c", cfg, "emial", "c-1"},
		{"state", "prune", "-c", cfg, "--service", "emial"},
	} {
		code, out, errOut := runDam(t, args...)
		if code != 2 || !strings.Contains(errOut, `unknown service "emial"`) || !strings.Contains(errOut, `"emails"`) {
			t.Errorf("%s: exit %d, %q %q; want 2 naming the unknown service and the known one", strings.Join(args[:2], " "), code, out, errOut)
		}
	}
	if code, out, errOut := runDam(t, "state", "reset", "-c", cfg, "emails", "c-1"); code != 0 || !strings.Contains(out, "reset 0 ") {
		t.Errorf("reset of a known service: exit %d, %q %q", code, out, errOut)
	}
}
