package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/migrations"
)

func TestMigrateTwiceAndDown(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t) // already migrated: take it down first
	code, out, errOut := runDam(t, "migrate", "--dsn", dsn, "--down", "--yes")
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

// A migration that cannot apply is not an outage: dam run exits at once
// with the error, instead of retrying it forever.
func TestRunExitsOnBrokenMigration(t *testing.T) {
	unsetDSN(t)
	dsn := pgtest.DSN(t)
	if code, out, errOut := runDam(t, "migrate", "--dsn", dsn, "--down", "--yes"); code != 0 {
		t.Fatalf("migrate --down: %d %q %q", code, out, errOut)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	// A table of dam's name but not dam's: the first migration fails on it.
	_, err = conn.Exec(ctx, `CREATE TABLE state (x int)`)
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	path := writeRunConfig(t, dsn, "")
	done := make(chan struct{})
	var code int
	var errOut string
	go func() {
		defer close(done)
		code, _, errOut = runDam(t, "run", "--config", path)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("dam run still running 20s after a migration failed: it retries a broken migration")
	}
	if code != 1 || !strings.Contains(errOut, "migrating the schema") || !strings.Contains(errOut, "state") {
		t.Fatalf("dam run: exit %d, %q; want exit 1 naming the migration error", code, errOut)
	}
}

// schemaVersion reads dsn's schema version without changing anything.
func schemaVersion(t *testing.T, dsn string) int32 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int32
	if err := conn.QueryRow(ctx, `SELECT version FROM dam_schema_version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// migrate --down drops every table and all the state: it needs --yes, and
// it is refused while a dam session is connected to the schema (a running
// sidecar would halt on relation "progress" does not exist). Sessions on
// other schemas do not count.
func TestMigrateDownGuards(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	latest := schemaVersion(t, dsn)
	code, _, errOut := runDam(t, "migrate", "--dsn", dsn, "--down")
	if code != 2 || !strings.Contains(errOut, "--yes") {
		t.Fatalf("migrate --down without --yes: exit %d, %q; want exit 2 asking for --yes", code, errOut)
	}
	if v := schemaVersion(t, dsn); v != latest {
		t.Fatalf("schema version %d after a refused --down, want %d", v, latest)
	}

	ctx := context.Background()
	store, err := dedup.Open(ctx, dsn, dedup.Config{ApplicationName: "dam-serve"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := dedup.Open(ctx, pgtest.DSN(t), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runDam(t, "migrate", "--dsn", dsn, "--down", "--yes")
	if code != 1 || !strings.Contains(errOut, "1 dam session") || !strings.Contains(errOut, "dam-serve") {
		t.Fatalf("migrate --down with dam serve connected: exit %d, %q; want exit 1 naming the session", code, errOut)
	}
	t.Log(errOut)
	if v := schemaVersion(t, dsn); v != latest {
		t.Fatalf("schema version %d after a refused --down, want %d", v, latest)
	}
	store.Close()
	code, out, errOut := runDam(t, "migrate", "--dsn", dsn, "--down", "--yes")
	if code != 0 || !strings.Contains(out, "-> 0") {
		t.Fatalf("migrate --down --yes with no dam session (one on another schema): exit %d, %q %q", code, out, errOut)
	}
}

func TestMigrateFromConfig(t *testing.T) {
	unsetDSN(t)
	path := writeRunConfig(t, pgtest.DSN(t), "")
	if code, out, errOut := runDam(t, "migrate", "--config", path); code != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("migrate --config: %d %q %q", code, out, errOut)
	}
}
