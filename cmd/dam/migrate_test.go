package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/internal/pgtest"
	"github.com/dam-dedup/dam/migrations"
)

func runDam(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestMigrateTwiceAndDown(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t) // already migrated: take it down first
	code, out, errOut := runDam(t, "migrate", "--dsn", dsn, "--down")
	if code != 0 || !strings.Contains(out, "-> 0") {
		t.Fatalf("migrate --down: %d %q %q", code, out, errOut)
	}
	ups, err := fs.Glob(migrations.FS(), "*.up.sql")
	if err != nil || len(ups) == 0 {
		t.Fatal(ups, err)
	}
	code, out, errOut = runDam(t, "migrate", "--dsn", dsn)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("schema version 0 -> %d", len(ups))) {
		t.Fatalf("migrate: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runDam(t, "migrate", "--dsn", dsn)
	if code != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("second migrate: %d %q %q", code, out, errOut)
	}
}

func TestMigrateDSNFromEnvironment(t *testing.T) {
	dsn := pgtest.DSN(t)
	t.Setenv(envPostgresDSN, dsn)
	if code, out, errOut := runDam(t, "migrate"); code != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("migrate: %d %q %q", code, out, errOut)
	}
}

func TestMigrateWithoutDSN(t *testing.T) {
	t.Setenv(envPostgresDSN, "")
	if code, _, errOut := runDam(t, "migrate"); code != 2 || !strings.Contains(errOut, "--dsn") {
		t.Fatalf("got %d %q, want usage error", code, errOut)
	}
}
