package pgcitus

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/internal/pglocal"
	"github.com/jackc/pgx/v5"
)

// envCitus is pgtest.EnvCitus (pgtest imports this package, so the test
// cannot import it).
const envCitus = "DAM_TEST_CITUS"

// TestStart starts a coordinator and two workers, distributes a table
// and checks its shards are spread over both workers and survive a worker's
// crash. It runs only with DAM_TEST_CITUS=1 (make test-citus), and then
// fails, not skips, when Citus is not installed.
func TestStart(t *testing.T) {
	if on, _ := strconv.ParseBool(os.Getenv(envCitus)); !on {
		t.Skipf("%s is not set: make test-citus runs this test", envCitus)
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cc, err := Start(ctx, t.Logf, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cc.Stop(); err != nil {
			t.Error(err)
		}
	}()
	conn, err := pgx.Connect(ctx, cc.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE spread (k int PRIMARY KEY, v text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT create_distributed_table('spread', 'k')`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO spread SELECT g, 'v' || g FROM generate_series(1, 1000) g`); err != nil {
		t.Fatal(err)
	}

	var shards int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'spread'::regclass`).Scan(&shards); err != nil {
		t.Fatal(err)
	}
	if shards != ShardCount {
		t.Errorf("spread has %d shards, want citus.shard_count = %d", shards, ShardCount)
	}
	rows, err := conn.Query(ctx, `SELECT nodeport, count(*)::int FROM citus_shards WHERE table_name = 'spread'::regclass GROUP BY nodeport`)
	if err != nil {
		t.Fatal(err)
	}
	perPort, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int, error) {
		var p [2]int
		err := r.Scan(&p[0], &p[1])
		return p, err
	})
	if err != nil {
		t.Fatal(err)
	}
	onPort := map[int]int{}
	for _, p := range perPort {
		onPort[p[0]] = p[1]
	}
	for i, w := range cc.Workers() {
		if onPort[w.Port()] == 0 {
			t.Errorf("worker %d (port %d) holds no shard of spread: shards per port %v", i, w.Port(), onPort)
		}
	}
	if n := onPort[cc.Coordinator().Port()]; n != 0 {
		t.Errorf("the coordinator holds %d shards of spread", n)
	}
	// The rows are on the workers: each shard table, read on its worker
	// directly, holds its part, and the parts add up.
	rows, err = conn.Query(ctx, `SELECT shard_name::text, nodeport FROM citus_shards WHERE table_name = 'spread'::regclass`)
	if err != nil {
		t.Fatal(err)
	}
	type placement struct {
		Name string
		Port int
	}
	places, err := pgx.CollectRows(rows, pgx.RowToStructByPos[placement])
	if err != nil {
		t.Fatal(err)
	}
	sum := 0
	for _, w := range cc.Workers() {
		wc, err := pgx.Connect(ctx, w.DSN())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range places {
			if p.Port != w.Port() {
				continue
			}
			var n int
			if err := wc.QueryRow(ctx, `SELECT count(*) FROM `+p.Name).Scan(&n); err != nil {
				t.Fatalf("shard %s on port %d: %v", p.Name, p.Port, err)
			}
			sum += n
		}
		wc.Close(ctx)
	}
	if sum != 1000 {
		t.Errorf("the workers' shards hold %d rows, want 1000", sum)
	}

	// A worker's crash: a statement on its shards fails while it is down,
	// and after it is back (same port) every row is there.
	w := cc.Worker(0)
	if err := w.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	var total int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM spread`).Scan(&total)
	var pgErr interface{ SQLState() string }
	if err == nil {
		t.Error("a query over every shard succeeded with a worker down")
	} else if errors.As(err, &pgErr) {
		t.Logf("with worker 0 down: SQLSTATE %s: %v", pgErr.SQLState(), err)
	} else {
		t.Logf("with worker 0 down: %v", err)
	}
	if err := w.Revive(ctx); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM spread`).Scan(&total); err != nil || total != 1000 {
		t.Fatalf("after the worker's restart: %d rows, %v; want 1000", total, err)
	}
	if err := w.Restart(ctx, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM spread`).Scan(&total); err != nil || total != 1000 {
		t.Fatalf("after the worker's restart: %d rows, %v; want 1000", total, err)
	}
}

// TestInstalled: Installed agrees with Start's check, and
// under DAM_TEST_CITUS=1 Citus must be installed.
func TestInstalled(t *testing.T) {
	t.Parallel()
	err := Installed()
	if errors.Is(err, pglocal.ErrNoBinaries) {
		t.Skip(err)
	}
	if on, _ := strconv.ParseBool(os.Getenv(envCitus)); on && err != nil {
		t.Fatalf("%s is set: %v", envCitus, err)
	}
	if err != nil && !errors.Is(err, ErrNoCitus) {
		t.Fatalf("Installed: %v, want nil or ErrNoCitus", err)
	}
	t.Logf("Installed: %v", err)
}

// TestNotInstalled: PostgreSQL binaries without Citus beside them give
// ErrNoCitus, whose message names the fix.
func TestNotInstalled(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	err := installed(bin)
	if !errors.Is(err, ErrNoCitus) {
		t.Fatalf("installed(empty dir) = %v, want ErrNoCitus", err)
	}
	for _, want := range []string{"make test-citus", "build.sh", "citus.so"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
