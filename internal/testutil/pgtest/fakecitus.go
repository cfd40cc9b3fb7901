package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/migrations"
)

// FakeCitusDSN returns the DSN of a migrated database of the test's own
// whose catalog says that dam's tables are distributed over Citus: it
// holds a pg_catalog.pg_dist_partition listing them, which is all that
// dedup.Store reads to learn its engine. A store opened on it runs as it
// does on Citus on one plain PostgreSQL server: the statements written for
// Citus (which one server runs too), and a relayed worker failure
// (internal_error) taken for an outage, for a test of what depends on the
// engine without a Citus cluster. The database is dropped when the test
// ends. On Citus (Citus) the test is skipped: the real cluster's tests
// run there.
//
// Creating a table in pg_catalog takes a superuser (allow_system_table_mods):
// the test fails if the server's user is not one.
func FakeCitusDSN(t testing.TB) string {
	t.Helper()
	if Citus() {
		t.Skip("fakes Citus's catalog on plain PostgreSQL; make test-citus runs the tests on a real cluster")
	}
	base, err := Base()
	if err != nil {
		t.Fatal(err)
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	name := "dam_test_fakecitus_" + hex.EncodeToString(rnd[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := exec(ctx, base, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := exec(ctx, base, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Logf("pgtest: %v", err)
		}
	})
	dsn := withDatabase(base, name)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := migrations.Up(ctx, conn); err != nil {
		t.Fatalf("pgtest: migrate %s: %v", name, err)
	}
	for _, sql := range []string{
		`SET allow_system_table_mods = on`,
		`CREATE TABLE pg_catalog.pg_dist_partition (logicalrelid regclass NOT NULL)`,
		`RESET allow_system_table_mods`,
		`INSERT INTO pg_catalog.pg_dist_partition VALUES ('state'), ('versions'), ('window_ids'), ('progress'), ('decision_log')`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("pgtest: faking Citus's catalog in %s (the server's user must be a superuser): %s: %v", name, sql, err)
		}
	}
	return dsn
}

// withDatabase returns dsn (URL or keyword/value form) with its database
// set to name.
func withDatabase(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + name
			return u.String()
		}
	}
	return dsn + " dbname=" + name
}
