package migrations_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"

	"github.com/dam-dedup/dam/migrations"
)

// migratorTo returns a tern migrator over the embedded migrations, to take
// a schema to a given version.
func migratorTo(t *testing.T, conn *pgx.Conn) *migrate.Migrator {
	t.Helper()
	ctx := context.Background()
	m, err := migrate.NewMigrator(ctx, conn, migrations.VersionTable)
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.(up|down)\.sql$`)
	entries, err := fs.ReadDir(migrations.FS(), ".")
	if err != nil {
		t.Fatal(err)
	}
	type mig struct{ name, up, down string }
	byNum := map[int]*mig{}
	for _, e := range entries {
		p := name.FindStringSubmatch(e.Name())
		if p == nil {
			continue
		}
		n, _ := strconv.Atoi(p[1])
		b, err := fs.ReadFile(migrations.FS(), e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if byNum[n] == nil {
			byNum[n] = &mig{name: p[1] + "_" + p[2]}
		}
		if p[3] == "up" {
			byNum[n].up = string(b)
		} else {
			byNum[n].down = string(b)
		}
	}
	nums := make([]int, 0, len(byNum))
	for n := range byNum {
		nums = append(nums, n)
	}
	sort.Ints(nums)
	for _, n := range nums {
		m.AppendMigration(byNum[n].name, byNum[n].up, byNum[n].down)
	}
	return m
}

// keyColumns returns the columns of table's primary key, in order.
func keyColumns(t *testing.T, conn *pgx.Conn, table string) string {
	t.Helper()
	var cols string
	err := conn.QueryRow(context.Background(), `SELECT string_agg(a.attname, ',' ORDER BY k.n)
		FROM pg_index i CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k(att, n)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.att
		WHERE i.indrelid = $1::regclass AND i.indisprimary`, table).Scan(&cols)
	if err != nil {
		t.Fatal(err)
	}
	return cols
}

// TestMigration007KeepsRows: a deployment at version 6 holding rows of
// several services (the empty entity, NUL bytes, 1024-byte entities among
// them) migrates to 7, back to 6 and to 7 again; each step keeps every
// row, the keys end as documented, and an upsert by (service, entity)
// still finds its row. Runs on Citus too (DAM_TEST_CITUS=1).
func TestMigration007KeepsRows(t *testing.T) {
	ctx := context.Background()
	dsn := emptySchema(t)
	conn := connect(t, dsn)
	m := migratorTo(t, conn)
	if err := m.MigrateTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	long := make([]byte, 1024)
	if _, err := rand.Read(long); err != nil {
		t.Fatal(err)
	}
	long[0] |= 1 // not the entity that starts with a NUL and goes on as long does
	special := [][]byte{{}, {0}, {0, 0}, append([]byte{0}, long[1:]...), long, []byte("a\x00b")}
	for _, q := range []string{
		`INSERT INTO state (service, entity, digest) SELECT 'svc' || (g % 5), int4send(g), '\x01' FROM generate_series(1, 20000) g`,
		`INSERT INTO versions (service, entity, version, digest, updated_at) SELECT 'svc' || (g % 5), int4send(g), 1, '\x01', now() FROM generate_series(1, 20000) g`,
		`INSERT INTO window_ids (service, id, expires_at, forwarded_at, digest) SELECT 'svc' || (g % 5), int4send(g), now() + interval '1 hour', now(), '\x01' FROM generate_series(1, 20000) g`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range special {
		for _, svc := range []string{"svc0", strings.Repeat("s", 128)} {
			if _, err := conn.Exec(ctx, `INSERT INTO state (service, entity, digest) VALUES ($1, $2, '\x01')`, svc, e); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `INSERT INTO versions (service, entity, version, digest, updated_at) VALUES ($1, $2, 1, '\x01', now())`, svc, e); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `INSERT INTO window_ids (service, id, expires_at, forwarded_at, digest) VALUES ($1, $2, now() + interval '1 hour', now(), '\x01')`, svc, e); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := 20000 + 2*len(special)
	check := func(when string, key map[string]string) {
		t.Helper()
		for table, cols := range key {
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != want {
				t.Fatalf("%s: %s holds %d rows (%v), want %d", when, table, n, err, want)
			}
			if got := keyColumns(t, conn, table); got != cols {
				t.Errorf("%s: %s keyed (%s), want (%s)", when, table, got, cols)
			}
		}
		for _, e := range special {
			var d []byte
			err := conn.QueryRow(ctx, `INSERT INTO state AS s (service, entity, digest) VALUES ('svc0', $1, '\x02')
				ON CONFLICT (service, entity) DO UPDATE SET digest = EXCLUDED.digest RETURNING digest`, e).Scan(&d)
			if err != nil {
				t.Fatalf("%s: upsert of entity %x: %v", when, e[:min(len(e), 8)], err)
			}
		}
	}
	newKeys := map[string]string{"state": "entity,service", "versions": "entity,service", "window_ids": "id,service"}
	oldKeys := map[string]string{"state": "service,entity", "versions": "service,entity", "window_ids": "service,id"}
	for i, step := range []struct {
		to   int32
		keys map[string]string
	}{{7, newKeys}, {6, oldKeys}, {7, newKeys}} {
		if err := m.MigrateTo(ctx, step.to); err != nil {
			t.Fatalf("step %d, to version %d: %v", i+1, step.to, err)
		}
		check(fmt.Sprintf("step %d (version %d)", i+1, step.to), step.keys)
	}
}

// TestMigration007FromVersion4KeepsRows: a deployment at version 4
// holding rows runs dam migrate: 005 distributes the tables (on Citus)
// with their rows, then 007 rebuilds the keys of the distributed tables,
// and every row is still there.
func TestMigration007FromVersion4KeepsRows(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, emptySchema(t))
	m := migratorTo(t, conn)
	if err := m.MigrateTo(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO state (service, entity, digest) SELECT 's' || (g % 3), int4send(g), '\x01' FROM generate_series(1, 5000) g`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM state WHERE service = 's1' AND octet_length(entity) >= 0`).Scan(&n); err != nil || n != 1667 {
		t.Fatalf("state of s1 after Up from 4: %d rows, %v; want 1667", n, err)
	}
	if got := keyColumns(t, conn, "state"); got != "entity,service" {
		t.Fatalf("state keyed (%s)", got)
	}
}
