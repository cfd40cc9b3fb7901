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

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/migrations"
)

// setSchemaVersion records version as dsn's schema version, as a newer
// (or older) dam would have left it.
func setSchemaVersion(t *testing.T, dsn string, version int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE dam_schema_version SET version = $1`, version); err != nil {
		t.Fatal(err)
	}
}

// runDamWithin is runDam for a command that would otherwise run until
// stopped: it fails the test if the command is still running after limit.
func runDamWithin(t *testing.T, limit time.Duration, args ...string) (int, string) {
	t.Helper()
	type result struct {
		code   int
		errOut string
	}
	done := make(chan result, 1)
	go func() {
		code, _, errOut := runDam(t, args...)
		done <- result{code, errOut}
	}()
	select {
	case r := <-done:
		return r.code, r.errOut
	case <-time.After(limit):
		t.Fatalf("dam %s still running after %s: it did not refuse the schema", strings.Join(args, " "), limit)
		return 0, ""
	}
}

// dam run and dam serve refuse a schema of another version than the one
// the binary knows, naming both versions: newer whatever postgres.migrate
// says, older when they may not migrate it: a binary never serves checks
// on a schema of a version it does not know.
func TestSchemaVersionChecked(t *testing.T) {
	unsetDSN(t)
	t.Setenv("DAM_SERVE_TOKEN", "schema-version-token-4f9b2c7e1a")
	latest := len(mustUps(t))
	kc := testkafka.New(t, 1, "in", "out")
	for _, tc := range []struct {
		name    string
		version int
		migrate bool
		want    string
	}{
		{"newer", latest + 6, false, fmt.Sprintf("schema version %d is newer than this dam knows (%d)", latest+6, latest)},
		{"newer, migrate on", latest + 6, true, fmt.Sprintf("schema version %d is newer than this dam knows (%d)", latest+6, latest)},
		{"older", latest - 1, false, fmt.Sprintf("schema version %d is older than this dam needs (%d): run dam migrate", latest-1, latest)},
	} {
		for _, command := range []string{"run", "serve"} {
			t.Run(tc.name+"/"+command, func(t *testing.T) {
				dsn := pgtest.DSN(t)
				setSchemaVersion(t, dsn, tc.version)
				path := filepath.Join(t.TempDir(), "dam.yaml")
				yaml := fmt.Sprintf("kafka: {brokers: [%s], group: g}\npostgres: {dsn: %q, migrate: %v}\nhttp: {listen: \"\"}\nserve: {listen: \"127.0.0.1:0\"}\n"+
					"routes:\n  - {service: s, from: in, to: out}\n", kc.Addr(), dsn, tc.migrate)
				if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
					t.Fatal(err)
				}
				code, errOut := runDamWithin(t, 30*time.Second, command, "--config", path)
				if code != 1 || !strings.Contains(errOut, tc.want) {
					t.Fatalf("dam %s on schema version %d: exit %d, %q; want exit 1 and %q", command, tc.version, code, errOut, tc.want)
				}
			})
		}
	}
}

func mustUps(t *testing.T) []string {
	t.Helper()
	ups, err := fs.Glob(migrations.FS(), "*.up.sql")
	if err != nil || len(ups) == 0 {
		t.Fatal(ups, err)
	}
	return ups
}

// dam state and dam explain refuse a schema of another version than the
// one the binary knows, as dam run and dam serve do, naming both versions:
// they neither read a newer schema's tables as if they knew them nor
// change them, and a refused reset leaves the state as it was.
func TestSchemaVersionCheckedByStateAndExplain(t *testing.T) {
	unsetDSN(t)
	latest := len(mustUps(t))
	payload := filepath.Join(t.TempDir(), "p.json")
	if err := os.WriteFile(payload, []byte(`{"a":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		version int
		want    string
	}{
		{"newer", latest + 6, fmt.Sprintf("schema version %d is newer than this dam knows (%d)", latest+6, latest)},
		{"older", latest - 1, fmt.Sprintf("schema version %d is older than this dam needs (%d): run dam migrate", latest-1, latest)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := pgtest.DSN(t)
			s, err := dedup.Open(context.Background(), dsn, dedup.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			d := canon.Digest{byte(canon.SchemeJSON1), 0xab}
			if _, err := s.Check(context.Background(), "s", []byte("e"), d); err != nil {
				t.Fatal(err)
			}
			setSchemaVersion(t, dsn, tc.version)
			path := writeRunConfig(t, dsn, "")
			for _, args := range [][]string{
				{"state", "get", "--dsn", dsn, "s", "e"},
				{"state", "stats", "--dsn", dsn},
				{"state", "reset", "--dsn", dsn, "s", "e"},
				{"state", "reset", "--dsn", dsn, "--all", "--yes", "s"},
				{"state", "prune", "--dsn", dsn, "--older-than", "1s", "--yes"},
				{"explain", "--config", path, "--timeout", "5s", "s", "e"},
				{"explain", "--config", path, "--timeout", "5s", "s", "e", payload},
			} {
				code, out, errOut := runDam(t, args...)
				if code != 1 || !strings.Contains(errOut, tc.want) {
					t.Errorf("dam %s on schema version %d: exit %d, %q %q; want exit 1 and %q", strings.Join(args[:2], " "), tc.version, code, out, errOut, tc.want)
				}
			}
			if _, err := s.Get(context.Background(), "s", []byte("e")); err != nil {
				t.Errorf("the state after the refused commands: %v", err)
			}
		})
	}
}
