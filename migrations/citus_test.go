package migrations_test

import (
	"context"
	"io/fs"
	"maps"
	"slices"
	"testing"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/migrations"
)

// distribution returns each of dam's distributed tables in the schema with
// its distribution column and its colocation group.
func distribution(t *testing.T, dsn string) map[string][2]string {
	t.Helper()
	conn := connect(t, dsn)
	got := map[string][2]string{}
	rows, err := conn.Query(context.Background(), `SELECT c.relname, column_to_column_name(p.logicalrelid, p.partkey), p.colocationid::text
		FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
		WHERE c.relnamespace = current_schema()::regnamespace`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, col, group string
		if err := rows.Scan(&name, &col, &group); err != nil {
			t.Fatal(err)
		}
		got[name] = [2]string{col, group}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// On a database with the citus extension, the migrations distribute
// dam's tables: the identity tables by identity, co-located; progress and
// the decision log by partition, co-located. Down takes them back to local
// tables, and Up distributes them again (each step idempotent). On plain
// PostgreSQL migration 005 does nothing: TestUpDownUp covers it.
func TestCitusDistributes(t *testing.T) {
	if !pgtest.Citus() {
		t.Skipf("not on Citus: %s=1 (make test-citus) runs this test", pgtest.EnvCitus)
	}
	t.Parallel()
	dsn := pgtest.DSN(t)
	check := func(when string) {
		t.Helper()
		got := distribution(t, dsn)
		want := map[string]string{"state": "entity", "versions": "entity", "window_ids": "id", "progress": "part", "decision_log": "part", "operator_skips": "part"}
		if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
			t.Fatalf("%s: distributed tables %v, want %v", when, got, want)
		}
		for table, col := range want {
			if got[table][0] != col {
				t.Errorf("%s: %s distributed by %s, want %s", when, table, got[table][0], col)
			}
		}
		if g := got["state"][1]; got["versions"][1] != g || got["window_ids"][1] != g {
			t.Errorf("%s: the identity tables are not co-located: %v", when, got)
		}
		if got["progress"][1] != got["decision_log"][1] || got["progress"][1] != got["operator_skips"][1] {
			t.Errorf("%s: progress, decision_log and operator_skips are not co-located: %v", when, got)
		}
	}
	check("after Up")
	conn := connect(t, dsn)
	ctx := context.Background()
	if err := migrations.Down(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got := distribution(t, dsn); len(got) != 0 {
		t.Fatalf("after Down: %v still distributed", got)
	}
	if err := migrations.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, conn); err != nil { // nothing to do
		t.Fatal(err)
	}
	check("after Down and Up")

	// A deployment at version 4 with state moves to Citus by dam migrate:
	// its rows are copied into the shards. Back to version 4: every later
	// migration's down, newest first.
	downs, err := fs.Glob(migrations.FS(), "*.down.sql")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(downs)
	slices.Reverse(downs)
	for _, name := range downs {
		if name < "005" {
			break
		}
		down, err := fs.ReadFile(migrations.FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, string(down)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, err := conn.Exec(ctx, `UPDATE `+migrations.VersionTable+` SET version = 4`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO state (service, entity, digest) SELECT 's', int4send(g), '\x01' FROM generate_series(1, 500) g`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	check("after Up from version 4 with rows")
	var n, workers int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM state`).Scan(&n); err != nil || n != 500 {
		t.Fatalf("state after distributing: %d rows, %v; want 500", n, err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(DISTINCT s.nodeport) FROM citus_shards s
		JOIN run_command_on_shards('state', 'SELECT count(*) FROM %s') r ON r.shardid = s.shardid
		WHERE s.table_name = 'state'::regclass AND r.result::bigint > 0`).Scan(&workers); err != nil || workers < 2 {
		t.Fatalf("the rows sit on %d workers (%v), want 2 or more", workers, err)
	}
}
