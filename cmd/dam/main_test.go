package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/internal/pgtest"
)

// envExecDam makes the test binary run as dam itself (for tests that need
// a process of their own, e.g. to send it SIGTERM).
const envExecDam = "DAM_TEST_EXEC_DAM"

// TestMain gives the command tests a real PostgreSQL: the configured or
// local server, else a throwaway cluster; it fails loudly without one.
func TestMain(m *testing.M) {
	if os.Getenv(envExecDam) == "1" {
		os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	pgtest.Main(m)
}

// unsetDSN removes DAM_POSTGRES_DSN for the test (an empty value would
// override the file's postgres.dsn: set-but-empty is a value).
func unsetDSN(t *testing.T) {
	t.Helper()
	t.Setenv(envPostgresDSN, "") // registers the restore
	os.Unsetenv(envPostgresDSN)
}

// writeRunConfig writes a minimal valid configuration using dsn.
func writeRunConfig(t *testing.T, dsn, extra string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dam.yaml")
	body := "kafka:\n  brokers: [127.0.0.1:1]\n  group: g\npostgres:\n  dsn: \"" + dsn + "\"\nhttp:\n  listen: \"\"\n" +
		"routes:\n  - service: s\n    from: in\n    to: out\n" + extra
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestMigrateFromConfig(t *testing.T) {
	unsetDSN(t)
	path := writeRunConfig(t, pgtest.DSN(t), "")
	if code, out, errOut := runDam(t, "migrate", "--config", path); code != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("migrate --config: %d %q %q", code, out, errOut)
	}
}

// dam run refuses a bad configuration before connecting to anything: exit
// status 2 and the key named.
func TestRunConfigErrors(t *testing.T) {
	unsetDSN(t)
	for _, tc := range []struct{ extra, want string }{
		{"    ignore: [updated_at]\n", "routes[0].ignore[0]"},
		{"    mode: sometimes\n", "routes[0].mode"},
		{"    entity: \"header:\"\n", "routes[0].entity"},
		{"    fromm: typo\n", "routes[0].fromm: unknown key"},
	} {
		path := writeRunConfig(t, "postgres://nobody@127.0.0.1:1/x", tc.extra)
		code, _, errOut := runDam(t, "run", "--config", path)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: got %d %q, want exit 2 naming %s", tc.extra, code, errOut, tc.want)
		}
	}
}

// The demo runs the real sidecar and fails unless its per-service counts
// match its reference model: exit 0 means every decision was right.
func TestDemo(t *testing.T) {
	base, err := pgtest.Base()
	if err != nil {
		t.Fatal(err)
	}
	for _, delivery := range []string{"at-least-once", "exactly-once"} {
		code, out, errOut := runDam(t, "demo", "--records", "3000", "--entities", "200", "--dsn", base, "--delivery", delivery)
		if code != 0 || strings.Count(out, "matches") != 4 {
			t.Fatalf("demo --delivery %s: exit %d\n%s\n%s", delivery, code, out, errOut)
		}
	}
}
