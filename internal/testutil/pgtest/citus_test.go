package pgtest

import (
	"context"
	"os"
	osexec "os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/internal/pglocal"
	"github.com/dam-dedup/dam/internal/testutil/pgcitus"
)

// envNoCitusChild makes TestMain replace startCitus with one that fails as
// pgcitus.Start does without Citus (TestNoCitusFails's subprocess).
const envNoCitusChild = "DAM_PGTEST_NO_CITUS_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(envNoCitusChild) == "1" {
		startCitus = func(context.Context, func(string, ...any), int, ...pglocal.Option) (*pgcitus.Cluster, error) {
			return nil, pgcitus.ErrNoCitus
		}
	}
	Main(m)
}

// TestNoCitusFails: with DAM_TEST_CITUS=1 and no Citus cluster to be had,
// a test that asks for a database fails, saying how to install Citus; it
// is not skipped, nor run on plain PostgreSQL. So is a test that needs the
// cluster itself.
func TestNoCitusFails(t *testing.T) {
	if os.Getenv(envNoCitusChild) == "1" {
		t.Skip("the subprocess of TestNoCitusFails")
	}
	t.Parallel()
	for _, test := range []string{"TestDSNSelectsFreshMigratedSchema", "TestCitusWorkerRestart"} {
		cmd := osexec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), EnvCitus+"=1", EnvCitusDSN+"=", envNoCitusChild+"=1")
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("%s passed without a Citus cluster:\n%s", test, out)
		}
		for _, want := range []string{"--- FAIL: " + test, "make test-citus", EnvCitus} {
			if !strings.Contains(string(out), want) {
				t.Errorf("%s without a Citus cluster: output lacks %q:\n%s", test, want, out)
			}
		}
		if strings.Contains(string(out), "--- SKIP") {
			t.Errorf("%s without a Citus cluster was skipped:\n%s", test, out)
		}
	}
}

// TestCitusSchema: on Citus, a test's schema holds distributed tables, and
// dropping the schema removes them and their shards from every node.
func TestCitusSchema(t *testing.T) {
	if !Citus() {
		t.Skipf("not on Citus: %s=1 (make test-citus) runs this test", EnvCitus)
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, drop, err := NewSchema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dropped := false
	defer func() {
		if !dropped {
			drop()
		}
	}()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var schema string
	if err := conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	var distributed []string
	rows, err := conn.Query(ctx, `SELECT c.relname::text FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
		WHERE c.relnamespace = current_schema()::regnamespace ORDER BY 1`)
	if err == nil {
		distributed, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the migrations distributed %d tables: %v", len(distributed), distributed)

	if _, err := conn.Exec(ctx, `CREATE TABLE citus_probe (k bigint PRIMARY KEY, v text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT create_distributed_table('citus_probe', 'k')`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO citus_probe SELECT g, 'v' FROM generate_series(1, 100) g`); err != nil {
		t.Fatal(err)
	}
	var shards, nodes int
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT nodeport) FROM citus_shards
		WHERE table_name = 'citus_probe'::regclass`).Scan(&shards, &nodes); err != nil {
		t.Fatal(err)
	}
	if shards == 0 || nodes < 2 {
		t.Errorf("citus_probe: %d shards on %d nodes, want shards on 2 or more", shards, nodes)
	}
	conn.Close(ctx)

	drop()
	dropped = true
	base, err := Base()
	if err != nil {
		t.Fatal(err)
	}
	bconn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer bconn.Close(context.Background())
	var left int
	if err := bconn.QueryRow(ctx, `SELECT count(*) FROM pg_dist_shard s JOIN pg_class c ON c.oid = s.logicalrelid
		WHERE c.relnamespace::regnamespace::text = $1`, schema).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("after DROP SCHEMA %s: %d shards left in pg_dist_shard", schema, left)
	}
	// The workers have no trace of the schema (nor of its shards).
	var onWorkers int
	if err := bconn.QueryRow(ctx, `SELECT count(*) FROM run_command_on_workers(
		format('SELECT count(*) FROM pg_namespace WHERE nspname = %L', $1::text)) WHERE NOT success OR result <> '0'`,
		schema).Scan(&onWorkers); err != nil {
		t.Fatal(err)
	}
	if onWorkers != 0 {
		t.Errorf("after DROP SCHEMA %s: %d workers still have it (or did not answer)", schema, onWorkers)
	}
}

// TestCitusWorkerRestart: a test may crash a worker of the package's
// cluster; the coordinator finds it again once it is back. Not parallel:
// every test of the package shares the cluster.
func TestCitusWorkerRestart(t *testing.T) {
	cc := NeedCitusCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE kept (k int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT create_distributed_table('kept', 'k')`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO kept SELECT generate_series(1, 100)`); err != nil {
		t.Fatal(err)
	}
	if err := cc.Worker(len(cc.Workers())-1).Restart(ctx, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM kept`).Scan(&n); err != nil || n != 100 {
		t.Fatalf("after a worker's restart: %d rows, %v; want 100", n, err)
	}
}
