// Package pgtest gives tests a real PostgreSQL: one fresh, migrated schema
// per test so that tests run in parallel. It never mocks PostgreSQL.
//
// The server is $DAM_TEST_POSTGRES_DSN (default DefaultDSN). If it does not
// answer within a few seconds, Main starts a throwaway cluster from the
// installed binaries (package pglocal) for the package's tests. If that
// fails too, every test that asks for a database fails, saying how to
// provide one.
//
// With DAM_TEST_CITUS=1 (EnvCitus; make test-citus) the server is a Citus
// cluster instead: $DAM_TEST_CITUS_DSN (EnvCitusDSN) when it answers, else
// a throwaway coordinator and two workers that Main starts
// (pgcitus.Start); $DAM_TEST_POSTGRES_DSN is not used. The schemas
// and migrations are the same; the migrations distribute the tables when
// the citus extension exists. If there is no Citus cluster, every test
// that asks for a database fails: none is quietly run on plain PostgreSQL.
// Tests ask Citus whether they run on Citus, and a test that must crash a
// worker gets the cluster from NeedCitusCluster.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dam-dedup/dam/internal/pglocal"
	"github.com/dam-dedup/dam/internal/testutil/pgcitus"
	"github.com/dam-dedup/dam/migrations"
)

// EnvDSN names the environment variable holding the test server's DSN.
const EnvDSN = "DAM_TEST_POSTGRES_DSN"

// DefaultDSN is used when EnvDSN is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// EnvCitus names the environment variable that runs the tests on Citus
// when true (1): make test-citus sets it.
const EnvCitus = "DAM_TEST_CITUS"

// EnvCitusDSN names the environment variable holding the DSN of a Citus
// coordinator for the tests under EnvCitus; when it is unset or does not
// answer, Main starts a local Citus cluster.
const EnvCitusDSN = "DAM_TEST_CITUS_DSN"

// CitusWorkers is the number of workers of the Citus cluster Main starts.
const CitusWorkers = 2

var (
	baseDSN  string
	setupErr error
	// onCitus: the server has the citus extension (or EnvCitus is set).
	onCitus bool
	// citus: the Citus cluster Main started, if it did.
	citus *pgcitus.Cluster

	lazyOnce  sync.Once // Base without Main
	lazyDSN   string
	lazyErr   error
	lazyCitus bool

	dropMu sync.Mutex
	drops  []func() // schemas made by Schema, dropped after the tests
)

// Main is the body of a package's TestMain: it finds or starts the server,
// runs the tests and stops what it started. It does not return.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if stop := setup(); stop != nil {
		defer stop()
	}
	code := m.Run()
	dropMu.Lock()
	for _, drop := range drops {
		drop()
	}
	dropMu.Unlock()
	return code
}

// setup sets baseDSN, or setupErr, and returns what stops the cluster it
// started, if any.
func setup() (stop func()) {
	wantCitus, err := citusWanted()
	if err != nil {
		setupErr = err
		return nil
	}
	if wantCitus {
		onCitus = true
		return setupCitus()
	}
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		dsn = DefaultDSN
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	err = pglocal.Reachable(ctx, dsn)
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
			stop = func() {
				if err := c.Stop(); err != nil {
					log.Print(err)
				}
			}
			baseDSN = c.DSN()
		}
	}
	if baseDSN != "" {
		onCitus = hasCitus(baseDSN)
	}
	return stop
}

// setupCitus is setup under EnvCitus: $DAM_TEST_CITUS_DSN if it answers
// (and is a Citus coordinator), else a local Citus cluster.
func setupCitus() (stop func()) {
	if dsn := os.Getenv(EnvCitusDSN); dsn != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err := pglocal.Reachable(ctx, dsn)
		cancel()
		if err == nil {
			if !hasCitus(dsn) {
				setupErr = fmt.Errorf("pgtest: %s=%q has no citus extension in its database; "+
					"point it at a Citus coordinator (CREATE EXTENSION citus) or unset it to start a local Citus cluster", EnvCitusDSN, dsn)
				return nil
			}
			baseDSN = dsn
			return nil
		}
		log.Printf("pgtest: %s=%q is unreachable (%v): starting a local Citus cluster", EnvCitusDSN, dsn, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	c, err := startCitus(ctx, log.Printf, CitusWorkers)
	cancel()
	if err != nil {
		setupErr = fmt.Errorf("pgtest: %s is set but there is no Citus cluster for tests: %w; or set %s to a Citus coordinator",
			EnvCitus, err, EnvCitusDSN)
		return nil
	}
	citus = c
	baseDSN = c.DSN()
	return func() {
		if err := c.Stop(); err != nil {
			log.Print(err)
		}
	}
}

// startCitus is pgcitus.Start; the package's tests replace it to see
// Main without Citus.
var startCitus = pgcitus.Start

// citusWanted reports whether EnvCitus asks for Citus.
func citusWanted() (bool, error) {
	v := os.Getenv(EnvCitus)
	if v == "" {
		return false, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("pgtest: %s=%q: want 1 (run the tests on Citus) or 0", EnvCitus, v)
	}
	return on, nil
}

// hasCitus reports whether the citus extension exists in dsn's database.
func hasCitus(dsn string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false
	}
	defer conn.Close(ctx)
	var ok bool
	err = conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')`).Scan(&ok)
	return err == nil && ok
}

// Citus reports whether the tests run on Citus: EnvCitus is set (even if
// there turned out to be no Citus cluster: the tests asking for a database
// then fail), or the server has the citus extension.
func Citus() bool {
	if on, err := citusWanted(); on || err != nil {
		return on
	}
	if baseDSN == "" && setupErr == nil {
		Base() // without Main: look at the configured server
	}
	return onCitus || lazyCitus
}

// CitusCluster returns the Citus cluster that Main started, or nil: when
// the tests do not run on Citus, when the server is $DAM_TEST_CITUS_DSN's,
// or when none could be started. The cluster is the package's: a test that
// crashes a worker disturbs every test running then, so it should not be
// parallel (see NeedCitusCluster).
func CitusCluster() *pgcitus.Cluster { return citus }

// NeedCitusCluster returns the Citus cluster that Main started, for a test
// that must crash or restart a node. It skips the test when the tests do
// not run on Citus or the cluster is $DAM_TEST_CITUS_DSN's (not this
// process's to restart), and fails it when EnvCitus is set but there is no
// Citus cluster. Such a test should not call t.Parallel: the package's
// other tests share the cluster.
func NeedCitusCluster(t testing.TB) *pgcitus.Cluster {
	t.Helper()
	if !Citus() {
		t.Skipf("not on Citus: %s=1 (make test-citus) runs this test", EnvCitus)
	}
	if _, err := Base(); err != nil {
		t.Fatal(err)
	}
	if citus == nil {
		t.Skipf("the Citus cluster is %s's, not one this test may restart; unset it to run this test on a local cluster", EnvCitusDSN)
	}
	return citus
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
		wantCitus, err := citusWanted()
		if err != nil {
			lazyErr = err
			return
		}
		if wantCitus {
			dsn := os.Getenv(EnvCitusDSN)
			if dsn == "" {
				lazyErr = fmt.Errorf("pgtest: %s is set but %s is not: set it to a Citus coordinator "+
					"or call pgtest.Main from TestMain to start a local Citus cluster", EnvCitus, EnvCitusDSN)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if err := pglocal.Reachable(ctx, dsn); err != nil {
				lazyErr = fmt.Errorf("pgtest: %s is set but %s=%q is unreachable (%v)", EnvCitus, EnvCitusDSN, dsn, err)
				return
			}
			if !hasCitus(dsn) {
				lazyErr = fmt.Errorf("pgtest: %s=%q has no citus extension in its database", EnvCitusDSN, dsn)
				return
			}
			lazyDSN, lazyCitus = dsn, true
			return
		}
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
		lazyDSN, lazyCitus = dsn, hasCitus(dsn)
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
