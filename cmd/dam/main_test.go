package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
// match its reference model: exit 0 means every decision was right. On a
// database of the test's own: the demo's schema has a fixed name.
func TestDemo(t *testing.T) {
	dsn := newDatabase(t)
	for _, delivery := range []string{"at-least-once", "exactly-once"} {
		code, out, errOut := runDam(t, "demo", "--records", "3000", "--entities", "200", "--dsn", dsn, "--delivery", delivery)
		if code != 0 || strings.Count(out, "matches") != 4 {
			t.Fatalf("demo --delivery %s: exit %d\n%s\n%s", delivery, code, out, errOut)
		}
	}
}

// dam demo drops and makes again the schema dam_demo at each run, but only
// its own (marked by a comment): a dam_demo it did not make, on whatever
// server DAM_POSTGRES_DSN names, is refused unless --yes. On a database of
// the test's own, so that no other test's dam_demo is in the way.
func TestDemoSchemaNotItsOwn(t *testing.T) {
	dsn := newDatabase(t)
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `CREATE SCHEMA dam_demo; CREATE TABLE dam_demo.precious (x int); INSERT INTO dam_demo.precious VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	precious := func() bool {
		var n int
		err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'dam_demo' AND tablename = 'precious'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	t.Setenv(envPostgresDSN, dsn)
	args := []string{"demo", "--records", "40", "--entities", "10"}
	code, _, errOut := runDam(t, args...)
	if code != 2 || !strings.Contains(errOut, "schema dam_demo exists and was not made by dam demo") || !strings.Contains(errOut, "--yes drops it") || !precious() {
		t.Fatalf("demo on a dam_demo of someone else's: exit %d, %q; the table is still there: %v", code, errOut, precious())
	}
	if code, out, errOut := runDam(t, append(args, "--yes")...); code != 0 || precious() {
		t.Fatalf("demo --yes: exit %d; the table is still there: %v\n%s\n%s", code, precious(), out, errOut)
	}
	// Now dam_demo is the demo's own: the next run drops it without --yes.
	if code, out, errOut := runDam(t, args...); code != 0 {
		t.Fatalf("demo again: exit %d\n%s\n%s", code, out, errOut)
	}
}

// newDatabase creates a database for the test on the test server and
// returns its DSN; it is dropped after the test.
func newDatabase(t *testing.T) string {
	t.Helper()
	base, err := pgtest.Base()
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("dam_test_%d", time.Now().UnixNano())
	conn, err := pgx.Connect(context.Background(), base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	u.Path = "/" + name
	return u.String()
}
