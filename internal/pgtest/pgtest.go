// Package pgtest gives tests a real PostgreSQL: one fresh, migrated schema
// per test so that tests run in parallel. It never mocks PostgreSQL.
//
// The server is $DAM_TEST_POSTGRES_DSN (default DefaultDSN). If it does not
// answer within a few seconds, Main starts a throwaway cluster from the
// installed binaries (package pglocal) for the package's tests. If that
// fails too, every test that asks for a database fails, saying how to
// provide one.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dam-dedup/dam/internal/pglocal"
	"github.com/dam-dedup/dam/migrations"
)

// EnvDSN names the environment variable holding the test server's DSN.
const EnvDSN = "DAM_TEST_POSTGRES_DSN"

// DefaultDSN is used when EnvDSN is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var (
	baseDSN  string
	setupErr error

	lazyOnce sync.Once // Base without Main
	lazyDSN  string
	lazyErr  error

	dropMu sync.Mutex
	drops  []func() // schemas made by Schema, dropped after the tests
)

// Main is the body of a package's TestMain: it finds or starts the server,
// runs the tests and stops what it started. It does not return.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		dsn = DefaultDSN
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	err := pglocal.Reachable(ctx, dsn)
	cancel()
	if err == nil {
		baseDSN = dsn
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		c, lerr := pglocal.Start(ctx, log.Printf)
		cancel()
		if lerr != nil {
			setupErr = fmt.Errorf("pgtest: no PostgreSQL for tests: %s=%q is unreachable (%v) and starting a local cluster failed (%v); "+
				"set %s to a reachable server (any database; tests create and drop their own schemas) or install PostgreSQL (initdb, pg_ctl)",
				EnvDSN, dsn, err, lerr, EnvDSN)
		} else {
			defer func() {
				if err := c.Stop(); err != nil {
					log.Print(err)
				}
			}()
			baseDSN = c.DSN()
		}
	}
	code := m.Run()
	dropMu.Lock()
	for _, drop := range drops {
		drop()
	}
	dropMu.Unlock()
	return code
}

// DSN creates a fresh schema with the migrations applied, drops it when the
// test ends, and returns a DSN whose search_path selects it (usable by
// subprocesses too). The test fails if there is no server.
func DSN(t testing.TB) string {
	t.Helper()
	dsn, drop, err := NewSchema(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	return dsn
}

// Pool returns a pool on a fresh schema (see DSN), closed when the test
// ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Schema is DSN for code that cannot take a testing.TB (testable examples):
// the schema is dropped after all the package's tests have run.
func Schema() (string, error) {
	dsn, drop, err := NewSchema(context.Background())
	if err != nil {
		return "", err
	}
	dropMu.Lock()
	drops = append(drops, drop)
	dropMu.Unlock()
	return dsn, nil
}

// Base returns the server's DSN (no schema selected), or the reason there
// is no server.
func Base() (string, error) {
	if setupErr != nil {
		return "", setupErr
	}
	if baseDSN != "" {
		return baseDSN, nil
	}
	// Without Main (a package whose TestMain belongs to someone else) there
	// is nowhere to stop a private cluster, so only the configured server
	// is tried.
	lazyOnce.Do(func() {
		dsn := os.Getenv(EnvDSN)
		if dsn == "" {
			dsn = DefaultDSN
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if err := pglocal.Reachable(ctx, dsn); err != nil {
			lazyErr = fmt.Errorf("pgtest: no PostgreSQL for tests: %s=%q is unreachable (%v); set %s to a reachable server "+
				"or call pgtest.Main from TestMain to start a local cluster from the installed PostgreSQL", EnvDSN, dsn, err, EnvDSN)
			return
		}
		lazyDSN = dsn
	})
	return lazyDSN, lazyErr
}

// NewSchema creates a migrated schema with a random name and returns a DSN
// selecting it and a function that drops it.
func NewSchema(ctx context.Context) (dsn string, drop func(), err error) {
	base, err := Base()
	if err != nil {
		return "", nil, err
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", nil, err
	}
	schema := "dam_test_" + hex.EncodeToString(rnd[:])
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := exec(ctx, base, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, err
	}
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := exec(ctx, base, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			log.Printf("pgtest: %v", err)
		}
	}
	dsn = WithSearchPath(base, schema)
	conn, err := pgx.Connect(ctx, dsn)
	if err == nil {
		err = migrations.Up(ctx, conn)
		conn.Close(ctx)
	}
	if err != nil {
		drop()
		return "", nil, fmt.Errorf("pgtest: migrate %s: %w", schema, err)
	}
	return dsn, drop, nil
}

// WithSearchPath returns dsn (URL or keyword/value form) with search_path
// set to schema.
func WithSearchPath(dsn, schema string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			q := u.Query()
			q.Set("search_path", schema)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	return dsn + " search_path=" + schema
}

func exec(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgtest: %s: %w", sql, err)
	}
	return nil
}
