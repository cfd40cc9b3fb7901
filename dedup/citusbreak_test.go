package dedup_test

// Adversarial tests of dam on Citus (branch citusbreak). Each test states
// the finding it proves; they run on plain PostgreSQL too, where they pass,
// and fail on Citus (DAM_TEST_CITUS=1) on today's code.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pgtest"
	"github.com/dam-dedup/dam/migrations"
)

// Finding: on Citus the window cleanup never deletes anything, so
// window_ids grows without bound (a resource exhausted).
//
// docs/citus.md says the window cleanup runs on Citus "every shard, in short
// chunks". The sidecar runs dedup.Store.CleanupWindow every
// cleanup_interval for each window-mode route (pipeline/modes.go); its
// statement (sqlExpire) picks the expired ids with SELECT ... FOR UPDATE SKIP
// LOCKED filtered by service only, which is a multi-shard FOR UPDATE: Citus
// refuses it ("could not run distributed query with FOR UPDATE/SHARE
// commands", 0A000). cleanupLoop logs a warning and tries again at the next
// interval, forever: no expired id is ever deleted, and every forwarded
// message id stays in window_ids for good. The same refusal breaks
// `dam state prune` (sqlPruneChunk: FOR UPDATE OF s SKIP LOCKED) and
// `dam state reset SERVICE` (sqlResetChunk: FOR UPDATE): the existing
// TestPruneWindowAndCleanup, TestPruneStateChunks, TestResetServiceInBatches
// and TestStateOpsEveryMode fail on Citus for the same reason, and
// TestResetServiceHoldsNoLongLocks hangs there (it waits for a first batch
// that never comes).
func TestCitusWindowCleanupDeletesExpiredIds(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	st := newStream(t, s, "cleanup", dedup.Rule{Mode: dedup.Window, Window: time.Hour})
	var recs []vrec
	for i := range 40 {
		recs = append(recs, vrec{fmt.Sprint("id-", i), "x", 0})
	}
	// Forwarded two hours ago with a window of one hour: all expired.
	st.decide(time.Now().Add(-2*time.Hour), recs...)

	// What the sidecar's cleanup loop does every cleanup_interval.
	for round := 1; round <= 3; round++ {
		n, ran, err := s.CleanupWindow(ctx, "svc", 0)
		if err != nil || !ran {
			var left int64
			_ = s.Pool().QueryRow(ctx, `SELECT count(*) FROM window_ids WHERE service = 'svc'`).Scan(&left)
			t.Fatalf("window cleanup round %d: deleted %d, ran %v, %v; %d expired ids left in window_ids "+
				"(the sidecar retries at every interval, and the table only grows)", round, n, ran, err, left)
		}
		if round == 1 && n != 40 {
			t.Fatalf("window cleanup deleted %d expired ids, want 40", n)
		}
	}
	var left int64
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM window_ids WHERE service = 'svc'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d expired ids left after the cleanup", left)
	}
}

// execMigration runs one file of migrations.FS() (005_citus.up.sql or
// .down.sql) on dsn's schema, as `dam migrate` would: on plain PostgreSQL
// it does nothing.
func execMigration(t *testing.T, dsn, file string) {
	t.Helper()
	sql, err := fs.ReadFile(migrations.FS(), file)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), string(sql)); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// waitForLockWait waits until some session waits for a lock: on Citus on a
// worker (citus_lock_waits), on one server in pg_locks.
func waitForLockWait(ctx context.Context, t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) {
	t.Helper()
	q := `SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted)`
	if pgtest.Citus() {
		q = `SELECT EXISTS (SELECT FROM citus_lock_waits)`
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var w bool
		if err := pool.QueryRow(ctx, q).Scan(&w); err != nil {
			t.Fatal(err)
		}
		if w {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no session ever waited for the lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Finding: tables distributed under a running dam (the case engine.go's
// forgetEngine is written for) leave the store deciding in the one-server
// shape for as long as each batch's identities sit in one shard (a
// caught-up partition decides a record or two at a time), and there a lost
// race for a new identity halts the partition instead of being decided
// again.
//
// Store.Distributed learns the engine once. Citus refuses a multi-shard
// SELECT ... FOR UPDATE (0A000), which makes forgetEngine learn it again,
// but it routes a single-shard one, so a batch of one identity keeps the
// one-server shape: SELECT ... FOR UPDATE, then a plain INSERT ... SELECT
// FROM unnest for a new identity. When another decider (another
// partition; the entity is not the partition key) creates that identity
// meanwhile, one server answers 23505 on table state, which isRace runs
// again. Citus runs that INSERT as a COPY into the shard, and
// ReportCopyError relays the worker's unique violation as internal_error
// (XX000, "duplicate key value violates unique constraint
// \"state_pkey_102008\"", no table name). isRace does not know it, and
// Store.classify makes XX000 transient only when the cached engine is
// distributed, which it is not: Decide returns a permanent error, and
// decideResolving halts the partition (retry.Permanent) on a plain race
// that one server decides through.
func TestCitusTablesDistributedUnderARunningDamRaceNewIdentity(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	// dam runs on the tables while they are local (migration 005 not yet
	// run on this database, or run before citus was there).
	execMigration(t, dsn, "005_citus.down.sql")
	s, err := dedup.Open(ctx, dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, epoch := partition(t, s, "race")
	decideAll(t, s, "svc", p, epoch, []rec{{"a", "A"}}, 1) // offset 0: dam is running

	// The operator runs `dam migrate`: migration 005 distributes the tables
	// under the running dam.
	execMigration(t, dsn, "005_citus.up.sql")

	// Another decider (another partition of the same service) is creating
	// identity "x": its transaction has inserted the row, not yet
	// committed.
	other, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	x1 := digest("X1")
	if _, err := tx.Exec(ctx, `INSERT INTO state (service, entity, digest, updated_at) VALUES ('svc', 'x', $1, now())`,
		x1[:]); err != nil {
		t.Fatal(err)
	}

	// This partition's next batch: one record of the new identity x.
	type result struct {
		out []dedup.Decision
		err error
	}
	done := make(chan result, 1)
	go func() {
		b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 1, End: 2,
			Records: []dedup.Record{{Offset: 1, Entity: []byte("x"), Digest: digest("X2")}}}
		out, err := s.Decide(ctx, b, nil)
		done <- result{out, err}
	}()
	waitForLockWait(ctx, t, s.Pool())
	if err := tx.Commit(ctx); err != nil { // the other decider wins the race
		t.Fatal(err)
	}
	r := <-done
	switch {
	case r.err == nil:
		// One server: the race is decided again against x's new state.
		if len(r.out) != 1 || r.out[0] != dedup.Forward {
			t.Fatalf("Decide after the lost race: %v, want [forward] (X2 differs from X1)", r.out)
		}
	case errors.Is(r.err, dedup.ErrUnavailable):
		t.Logf("Decide after the lost race: %v (retried by the caller: acceptable)", r.err)
	default:
		t.Fatalf("Decide after a lost race for a new identity: %v; neither decided again nor ErrUnavailable: "+
			"a permanent error, on which the sidecar halts the partition (decideResolving: retry.Permanent)", r.err)
	}
}
