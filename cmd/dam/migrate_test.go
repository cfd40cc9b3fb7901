package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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

// TestMigrateDSNFromFile: $DAM_POSTGRES_DSN_FILE names a file holding the
// DSN, as the chart mounts its Secret; with $DAM_POSTGRES_DSN too it is a
// usage error naming both.
func TestMigrateDSNFromFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(path, []byte(pgtest.DSN(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unsetDSN(t)
	t.Setenv(envPostgresDSNFile, path)
	if code, out, errOut := runDam(t, "migrate"); code != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("migrate: %d %q %q", code, out, errOut)
	}
	t.Setenv(envPostgresDSN, "postgres://elsewhere/dam")
	if code, _, errOut := runDam(t, "migrate"); code != 2 || !strings.Contains(errOut, "DAM_POSTGRES_DSN and DAM_POSTGRES_DSN_FILE are both set") {
		t.Fatalf("both set: %d %q, want a usage error naming both", code, errOut)
	}
	unsetDSN(t)
	t.Setenv(envPostgresDSNFile, filepath.Join(t.TempDir(), "missing"))
	if code, _, errOut := runDam(t, "migrate"); code != 2 || !strings.Contains(errOut, "DAM_POSTGRES_DSN_FILE: open ") {
		t.Fatalf("missing file: %d %q, want a usage error naming the variable", code, errOut)
	}
}

func TestMigrateWithoutDSN(t *testing.T) {
	t.Setenv(envPostgresDSN, "")
	t.Setenv(envPostgresDSNFile, "")
	if code, _, errOut := runDam(t, "migrate"); code != 2 || !strings.Contains(errOut, "--dsn") {
		t.Fatalf("got %d %q, want usage error", code, errOut)
	}
}
