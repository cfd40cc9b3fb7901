package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The demo shows behaviour, not only counts: one entity's forwarded record
// and the duplicate dropped after it, the route that decided them, and
// dam explain's answer for the drop, which names the forwarded offset. On
// a database of the test's own: the demo's schema has a fixed name.
func TestDemoShowsADrop(t *testing.T) {
	dsn := newDatabase(t)
	code, out, errOut := runDam(t, "demo", "--records", "2000", "--entities", "100", "--dsn", dsn)
	if code != 0 {
		t.Fatalf("demo: exit %d\n%s\n%s", code, out, errOut)
	}
	m := regexp.MustCompile(`One banana as route customer-1 decided it \(projections\.customer-1 -> delivery\.customer-1, ignore /updated_at\):
  forwarded projections\.customer-1/(\d+)@(\d+)  key (B-\d+)  \{.*\}
  dropped   projections\.customer-1/(\d+)@(\d+)  key (B-\d+)  \{.*\}

Why was it dropped\? dam explain --topic projections\.customer-1 --partition (\d+) --offset (\d+):
`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no forwarded and dropped record of one banana in the demo's output:\n%s", out)
	}
	fp, fo, fk, dp, do, dk, ep, eo := m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8]
	if fp != dp || fk != dk || ep != dp || eo != do {
		t.Fatalf("the example's records are not one entity's in one partition, or explain asks of another:\n%s", out)
	}
	for _, want := range []string{"decision  duplicate", "duplicate of the content forwarded from offset " + fo + " at ", "entity    " + fk} {
		if !strings.Contains(out, want) {
			t.Errorf("dam explain's answer has no %q:\n%s", want, out)
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
