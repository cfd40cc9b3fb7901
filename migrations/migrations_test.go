package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// emptySchema returns a DSN selecting a schema with no tables.
func emptySchema(t *testing.T) string {
	t.Helper()
	dsn := pgtest.DSN(t) // migrated; take it back to nothing
	conn := connect(t, dsn)
	if err := migrations.Down(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), "DROP TABLE "+migrations.VersionTable); err != nil {
		t.Fatal(err)
	}
	return dsn
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func tables(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var n int
	err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables
		WHERE schemaname = current_schema() AND tablename IN ('state', 'progress', 'decision_log')`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func version(t *testing.T, conn *pgx.Conn) (int32, int32) {
	t.Helper()
	cur, latest, err := migrations.Version(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	return cur, latest
}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, emptySchema(t))
	if n := tables(t, conn); n != 0 {
		t.Fatalf("empty schema has %d tables", n)
	}
	for i := 0; i < 2; i++ { // the second Up changes nothing
		if err := migrations.Up(ctx, conn); err != nil {
			t.Fatal(err)
		}
		if cur, latest := version(t, conn); cur != latest || latest < 1 {
			t.Fatalf("after Up #%d: version %d of %d", i+1, cur, latest)
		}
		if n := tables(t, conn); n != 3 {
			t.Fatalf("after Up #%d: %d tables", i+1, n)
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO state (service, entity, digest) VALUES ('s', '\x00', '\x01')`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM state").Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("Up on a current schema touched the data: %d rows, %v", rows, err)
	}
	if err := migrations.Down(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if cur, _ := version(t, conn); cur != 0 {
		t.Fatalf("after Down: version %d", cur)
	}
	if n := tables(t, conn); n != 0 {
		t.Fatalf("after Down: %d tables", n)
	}
	if err := migrations.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if n := tables(t, conn); n != 3 {
		t.Fatalf("after Down, Up: %d tables", n)
	}
}

// TestConcurrentUp: two migrators racing on one empty schema both succeed
// (tern's advisory lock serialises them) and the result is one schema.
func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	dsn := emptySchema(t)
	conns := []*pgx.Conn{connect(t, dsn), connect(t, dsn), connect(t, dsn)}
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = migrations.Up(context.Background(), c)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := tables(t, conns[0]); n != 3 {
		t.Fatalf("%d tables", n)
	}
	if cur, latest := version(t, conns[0]); cur != latest {
		t.Fatalf("version %d of %d", cur, latest)
	}
}

// Check reads the version without creating anything, and tells a schema
// older or newer than the binary's from the right one.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, emptySchema(t))
	if err := migrations.Check(ctx, conn); !errors.Is(err, migrations.ErrOlder) || errors.Is(err, migrations.ErrNewer) {
		t.Fatalf("empty schema: %v, want ErrOlder", err)
	}
	var created bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, migrations.VersionTable).Scan(&created); err != nil || created || tables(t, conn) != 0 {
		t.Fatalf("Check created tables (version table: %v, %v)", created, err)
	}
	if err := migrations.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Check(ctx, conn); err != nil {
		t.Fatalf("migrated schema: %v", err)
	}
	if _, err := conn.Exec(ctx, `UPDATE dam_schema_version SET version = version + 1`); err != nil {
		t.Fatal(err)
	}
	err := migrations.Check(ctx, conn)
	var ve *migrations.VersionError
	if !errors.Is(err, migrations.ErrNewer) || !errors.As(err, &ve) || ve.Applied != migrations.Latest()+1 {
		t.Fatalf("newer schema: %v, want ErrNewer naming version %d", err, migrations.Latest()+1)
	}
}

// Up on a DSN whose search_path names a schema that does not exist yet
// (docs/kubernetes.md's ?search_path=dam on a new database) creates that
// schema and migrates into it.
func TestUpCreatesTheSearchPathSchema(t *testing.T) {
	base := pgtest.DSN(t)
	name := fmt.Sprintf("dam_new_%d", time.Now().UnixNano())
	dsn := pgtest.WithSearchPath(base, name)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base)
		if err == nil {
			conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+name+" CASCADE")
			conn.Close(context.Background())
		}
	})
	conn := connect(t, dsn)
	if err := migrations.Up(context.Background(), conn); err != nil {
		t.Fatalf("up on a search_path whose schema does not exist: %v", err)
	}
	var schema string
	if err := conn.QueryRow(context.Background(), "SELECT current_schema()").Scan(&schema); err != nil || schema != name {
		t.Fatalf("current_schema %q (%v), want %q", schema, err, name)
	}
	if n := tables(t, conn); n != 3 {
		t.Errorf("%d of dam's tables in %s, want 3", n, name)
	}
}
