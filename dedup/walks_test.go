package dedup_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// The one-server walks of one service (ResetService, PruneState) on tables
// keyed identity first (migration 007) read that service's rows, not
// every service's: each chunk is chosen through the (service, identity)
// index and deleted by key (= ANY) or by tid. A join of the chunk back to
// the table is planned, at the default chunk sizes (5000, 10000), as a
// hash join over a sequential scan of the whole table, once per chunk.

const (
	walkRows  = 400000
	walkSmall = 40000 // rows of service "small": every tenth
)

// populateWalk fills state and versions with walkRows rows of two
// services, "big" and "small" (walkSmall rows), all two days old, and
// analyzes them.
func populateWalk(t *testing.T, ctx context.Context, dsn string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`INSERT INTO state (service, entity, digest, updated_at) SELECT CASE WHEN i % 10 = 0 THEN 'small' ELSE 'big' END,
			int4send(i), '\x01', now() - interval '2 days' FROM generate_series(1, 400000) i`,
		`INSERT INTO versions (service, entity, version, digest, updated_at) SELECT CASE WHEN i % 10 = 0 THEN 'small' ELSE 'big' END,
			int4send(i), 1, '\x01', now() - interval '2 days' FROM generate_series(1, 400000) i`,
		`VACUUM ANALYZE state`, `VACUUM ANALYZE versions`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
}

// tableReads returns the rows sequential scans of table have read, once
// its deleted-rows counter has reached del (the backends that deleted
// have flushed their statistics).
func tableReads(t *testing.T, ctx context.Context, dsn, table string, del int64) int64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		var seq, gone int64
		err = conn.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0), n_tup_del FROM pg_stat_user_tables WHERE relid = $1::regclass`, table).Scan(&seq, &gone)
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if gone >= del || time.Now().After(deadline) {
			if gone < del {
				t.Logf("%s: only %d deletions counted of %d", table, gone, del)
			}
			return seq
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// chunkPlan returns the plan of the first chunk of walk name of service
// "small" (at the walk's default chunk size), for the failure message.
func chunkPlan(t *testing.T, ctx context.Context, s *dedup.Store, name string) string {
	for _, w := range dedup.ServiceWalks("small") {
		if w.Name != name {
			continue
		}
		rows, err := s.Pool().Query(ctx, "EXPLAIN (COSTS OFF) "+w.SQL, w.Args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	t.Fatalf("no walk %q", name)
	return ""
}

// TestResetServiceReadsOnlyItsService: resetting a service of 40,000
// identities, in a state table of 400,000, reads about its own rows, not
// the whole table once per chunk of 5000.
func TestResetServiceReadsOnlyItsService(t *testing.T) {
	testWalkReads(t, "ResetService", "state", "reset state", func(ctx context.Context, s *dedup.Store) (int64, error) {
		return s.ResetService(ctx, "small")
	})
}

// TestPruneStateReadsOnlyItsService: pruning one service of 40,000
// identities in a versions table of 400,000 reads about its own rows, not
// the whole table once per chunk of 10000.
func TestPruneStateReadsOnlyItsService(t *testing.T) {
	testWalkReads(t, "PruneState", "versions", "prune versions first", func(ctx context.Context, s *dedup.Store) (int64, error) {
		return s.PruneState(ctx, "small", time.Hour)
	})
}

// testWalkReads runs op, a walk of service "small" deleting all its rows
// from state and versions, on populateWalk's tables, and checks what the
// sequential scans of table read meanwhile; the plan of the walk's first
// chunk (ServiceWalks' name walk) goes into the failure message.
func testWalkReads(t *testing.T, op, table, walk string, fn func(context.Context, *dedup.Store) (int64, error)) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	populateWalk(t, ctx, dsn)
	before := tableReads(t, ctx, dsn, table, 0)
	s, err := dedup.Open(ctx, dsn, dedup.Config{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	if distributed(t, s) {
		s.Close()
		t.Skip("the one-server statements")
	}
	plan := chunkPlan(t, ctx, s, walk)
	n, err := fn(ctx, s)
	s.Close() // the backends flush their statistics as they exit
	if err != nil {
		t.Fatal(err)
	}
	if n != 2*walkSmall { // state's and versions'
		t.Fatalf("%s deleted %d identities, want %d", op, n, 2*walkSmall)
	}
	read := tableReads(t, ctx, dsn, table, walkSmall) - before
	if read > 2*walkSmall {
		t.Errorf("%s of a service of %d rows read %d rows of %s by sequential scans (the table holds %d)\nplan of its first chunk:\n%s",
			op, walkSmall, read, table, walkRows, plan)
	}
}
