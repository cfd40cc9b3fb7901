package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/migrations"
)

// writeCheckConfig writes a configuration of one route (in -> out, dead
// letters to dlq) on brokers and dsn.
func writeCheckConfig(t *testing.T, brokers, dsn string, migrate bool) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dam.yaml")
	body := fmt.Sprintf("kafka:\n  brokers: [%s]\n  group: g\npostgres:\n  dsn: %q\n  migrate: %v\n"+
		"routes:\n  - service: s\n    from: in\n    to: out\n    dead_letter: dlq\n", brokers, dsn, migrate)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// line returns the line of dam check's output about name, and the fix
// line after it ("" if none).
func checkLine(t *testing.T, out, name string) (line, fix string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	re := regexp.MustCompile(`^(ok|warn|FAIL) +` + regexp.QuoteMeta(name) + ` `)
	for i, l := range lines {
		if re.MatchString(l) {
			if i+1 < len(lines) && strings.Contains(lines[i+1], "fix: ") && !re.MatchString(lines[i+1]) {
				fix = lines[i+1][strings.Index(lines[i+1], "fix: ")+len("fix: "):]
			}
			return l, fix
		}
	}
	t.Fatalf("no line about %s in:\n%s", name, out)
	return "", ""
}

// dam check names a missing topic, with the command that creates it, and
// reports the partition count and max.message.bytes of the others against
// the route's max_size; it exits 1 naming the failed check, and 0 once
// the topic exists.
func TestCheckMissingTopic(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 3, "in")
	kc.CreateTopic("dlq", 1, "max.message.bytes", "100000")
	path := writeCheckConfig(t, kc.Addr(), pgtest.DSN(t), false)

	code, out, errOut := runDam(t, "check", "-c", path)
	if code != 1 || !strings.Contains(errOut, "check failed: routes[0].to") {
		t.Fatalf("dam check with out missing: exit %d, stderr %q, want 1 naming routes[0].to\n%s", code, errOut, out)
	}
	if l, _ := checkLine(t, out, "kafka"); !strings.HasPrefix(l, "ok") {
		t.Errorf("kafka: %q", l)
	}
	if l, _ := checkLine(t, out, "routes[0].from"); !strings.HasPrefix(l, "ok") || !strings.Contains(l, "in: 3 partitions, max.message.bytes 1048588") {
		t.Errorf("routes[0].from: %q, want in's partitions and max.message.bytes", l)
	}
	l, fix := checkLine(t, out, "routes[0].to")
	if want := "kafka-topics.sh --bootstrap-server " + kc.Addr() + " --create --topic out --partitions 3"; !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, "out: does not exist") || fix != want {
		t.Errorf("routes[0].to: %q, fix %q; want FAIL, out: does not exist, fix %q", l, fix, want)
	}
	// A dead-letter topic smaller than a record of max_size: a warning.
	l, fix = checkLine(t, out, "routes[0].dead_letter")
	if !strings.HasPrefix(l, "warn") || !strings.Contains(l, "dlq: 1 partition, max.message.bytes 100000") || !strings.Contains(fix, "max.message.bytes=1048576") {
		t.Errorf("routes[0].dead_letter: %q, fix %q", l, fix)
	}
	if l, _ := checkLine(t, out, "postgres"); !strings.HasPrefix(l, "ok") || !strings.Contains(l, fmt.Sprintf("at version %d", migrations.Latest())) {
		t.Errorf("postgres: %q", l)
	}

	kc.CreateTopic("out", 3)
	if code, out, errOut := runDam(t, "check", "--config", path); code != 0 || errOut != "" {
		t.Fatalf("dam check with every topic: exit %d, stderr %q\n%s", code, errOut, out)
	}
}

// dam check names a broker that does not answer, with what to check.
func TestCheckBrokersUnreachable(t *testing.T) {
	t.Parallel()
	path := writeCheckConfig(t, "127.0.0.1:1", pgtest.DSN(t), false)
	code, out, errOut := runDam(t, "check", "-c", path, "--timeout", "5s")
	l, fix := checkLine(t, out, "kafka")
	if code != 1 || !strings.Contains(errOut, "check failed: kafka") || !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, "127.0.0.1:1") || !strings.Contains(fix, "kafka.brokers") {
		t.Fatalf("exit %d, stderr %q, kafka line %q, fix %q\n%s", code, errOut, l, fix, out)
	}
}

// dam check names a schema older than this dam needs and the command that
// migrates it; with postgres.migrate: true (dam run migrates at start)
// that is a warning.
func TestCheckOldSchema(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	dsn := schemaAtVersion(t, 5)
	path := writeCheckConfig(t, kc.Addr(), dsn, false)
	code, out, errOut := runDam(t, "check", "-c", path)
	l, fix := checkLine(t, out, "postgres")
	want := fmt.Sprintf("at version 5, older than this dam needs (%d)", migrations.Latest())
	if code != 1 || !strings.Contains(errOut, "check failed: postgres") || !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, want) || fix != "dam migrate --config "+path {
		t.Fatalf("exit %d, stderr %q, postgres line %q, fix %q; want FAIL %q, fix dam migrate\n%s", code, errOut, l, fix, want, out)
	}

	path = writeCheckConfig(t, kc.Addr(), dsn, true)
	code, out, errOut = runDam(t, "check", "-c", path)
	if l, _ := checkLine(t, out, "postgres"); code != 0 || !strings.HasPrefix(l, "warn") || !strings.Contains(l, "postgres.migrate: true") {
		t.Fatalf("with postgres.migrate: true: exit %d, stderr %q, postgres line %q\n%s", code, errOut, l, out)
	}
}

// schemaAtVersion creates a schema whose version table says version (the
// tables themselves do not matter to the check), dropped after the test,
// and returns a DSN selecting it.
func schemaAtVersion(t *testing.T, version int) string {
	t.Helper()
	base, err := pgtest.Base()
	if err != nil {
		t.Fatal(err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	schema := "dam_test_" + hex.EncodeToString(rnd[:])
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE SCHEMA %s; CREATE TABLE %s.%s (version int4 NOT NULL); INSERT INTO %s.%s VALUES (%d)",
		schema, schema, migrations.VersionTable, schema, migrations.VersionTable, version)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Error(err)
		}
	})
	return pgtest.WithSearchPath(base, schema)
}
