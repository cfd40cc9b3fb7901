package pgtest

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/internal/pglocal"
)

// Admin runs statements on the server (no schema selected), each on its
// own, and fails the test at the first error.
func Admin(t testing.TB, sql ...string) {
	t.Helper()
	base, err := Base()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, s := range sql {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// RouteWorker points the Citus coordinator at worker w through addr (a
// test's proxy), as citus_update_node does for a failover, in clear
// (citus.node_conninfo sslmode=disable: the coordinator speaks TLS to its
// workers by default), so that the test can see and lose what the two
// exchange. Everything is put back when the test ends, the prepared
// transactions a lost reply left recovered.
func RouteWorker(t testing.TB, w *pglocal.Cluster, addr string) {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	base, err := Base()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	var nodeID int
	err = conn.QueryRow(ctx, `SELECT nodeid FROM pg_dist_node WHERE nodeport = $1`, w.Port()).Scan(&nodeID)
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	Admin(t, `ALTER SYSTEM SET citus.node_conninfo = 'sslmode=disable'`, `SELECT pg_reload_conf()`,
		fmt.Sprintf(`SELECT citus_update_node(%d, '127.0.0.1', %s)`, nodeID, port))
	t.Cleanup(func() {
		Admin(t, fmt.Sprintf(`SELECT citus_update_node(%d, '127.0.0.1', %d)`, nodeID, w.Port()),
			`ALTER SYSTEM RESET citus.node_conninfo`, `SELECT pg_reload_conf()`,
			`SELECT recover_prepared_transactions()`, `SELECT start_metadata_sync_to_all_nodes()`)
	})
}
