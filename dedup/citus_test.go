package dedup_test

// Where Citus differs from one server: each test states what it guards on
// Citus (DAM_TEST_CITUS=1); they run on plain PostgreSQL too.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgcitus"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/migrations"
)

// TestCitusWindowCleanupDeletesExpiredIds: on Citus the window cleanup
// deletes the expired ids, so window_ids does not grow without bound.
//
// docs/citus.md says the window cleanup runs on Citus "every shard, in short
// chunks". The sidecar runs dedup.Store.CleanupWindow every
// cleanup_interval for each window-mode route (pipeline/modes.go), and
// logs a failure as a warning and tries again at the next interval: a
// statement Citus refuses (a multi-shard SELECT ... FOR UPDATE, 0A000:
// "could not run distributed query with FOR UPDATE/SHARE commands") would
// leave every forwarded message id in window_ids for good. `dam state
// prune` and `dam state reset SERVICE` walk a service the same way:
// TestPruneWindowAndCleanup, TestPruneStateChunks,
// TestResetServiceInBatches, TestStateOpsEveryMode and
// TestResetServiceHoldsNoLongLocks cover them on Citus.
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
		n, ran, err := s.CleanupWindow(ctx, "svc")
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

// distributedUnderRunningDam opens a store on dam's tables while they are
// local (migration 005 undone, or run before citus was there), decides recs
// on a new partition named name (dam is running), then runs migration 005
// under it, as `dam migrate` would: the store still believes the tables
// local. On plain PostgreSQL both migrations do nothing.
func distributedUnderRunningDam(t *testing.T, name string, recs []rec) (dsn string, s *dedup.Store, p dedup.Partition, epoch int64) {
	t.Helper()
	dsn = pgtest.DSN(t)
	execMigration(t, dsn, "005_citus.down.sql")
	s, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	p, epoch = partition(t, s, name)
	decideAll(t, s, "svc", p, epoch, recs, len(recs)) // offsets [0, len(recs))
	execMigration(t, dsn, "005_citus.up.sql")
	return dsn, s, p, epoch
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

// TestCitusTablesDistributedUnderARunningDamRaceNewIdentity: with the
// tables distributed under a running dam (the case the engine's relearn
// in engine.go is for), a race lost for a new identity is decided again,
// or answered ErrUnavailable, which the caller retries: never a permanent
// error, on which the sidecar halts the partition.
//
// Store.Distributed learns the engine once. Citus refuses a multi-shard
// SELECT ... FOR UPDATE (0A000), which makes the store learn it again,
// but it routes a single-shard one, so a batch of one identity (a
// caught-up partition decides a record or two at a time) can run in the
// one-server shape: SELECT ... FOR UPDATE, then an INSERT for a new
// identity. When another decider (another partition; the entity is not
// the partition key) creates that identity meanwhile, one server answers
// 23505 on table state, a race decided again; Citus runs that INSERT as a
// COPY into the shard and relays the worker's unique violation as
// internal_error (XX000, "duplicate key value violates unique constraint
// \"state_pkey_102008\"", no table name), which must not be taken for a
// permanent error either.
func TestCitusTablesDistributedUnderARunningDamRaceNewIdentity(t *testing.T) {
	ctx := context.Background()
	// dam decides offset 0 on local tables, then the operator runs `dam
	// migrate`: migration 005 distributes the tables under the running dam.
	dsn, s, p, epoch := distributedUnderRunningDam(t, "race", []rec{{"a", "A"}})

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

// proxyWorker routes the coordinator's connections to worker i of cc
// through a tcpproxy (pgtest.RouteWorker), so that a test can lose what a
// worker answers the coordinator.
func proxyWorker(t *testing.T, cc *pgcitus.Cluster, i int) *tcpproxy.Proxy {
	t.Helper()
	px := tcpproxy.New(t, fmt.Sprintf("127.0.0.1:%d", cc.Worker(i).Port()))
	pgtest.RouteWorker(t, cc.Worker(i), px.Addr())
	return px
}

// entitiesOnNode returns n entities of service svc whose state rows sit on
// the node at port (as pg_dist_node has it now).
func entitiesOnNode(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, port, n int) [][]byte {
	t.Helper()
	var out [][]byte
	for i := 0; len(out) < n; i++ {
		if i > 1000 {
			t.Fatal("no entity found on the node")
		}
		e := []byte(fmt.Sprint("e-", i))
		var on int
		if err := pool.QueryRow(context.Background(), `SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column('state', $1::bytea)`, e).Scan(&on); err != nil {
			t.Fatal(err)
		}
		if on == port {
			out = append(out, e)
		}
	}
	return out
}

// TestCitusCheckBatchLostWorkerCommitReply: on Citus, a CheckBatch whose
// commit reached the worker but whose reply was lost returns
// ErrUnavailable (an unknown outcome), not a permanent error (a refusal:
// nothing decided), on which dam serve would decide the checks again and
// answer "duplicate" for content nobody was told to forward.
//
// A CheckBatch whose checks sit on one worker commits in one phase: the
// coordinator sends COMMIT to the worker before committing itself. If that
// COMMIT reaches the worker and its reply is lost (the worker crashes
// right after committing, the network between them fails), Citus warns
// "failed to commit transaction" and fails the client's COMMIT with
// "could not commit transaction for shard N on at least one active node",
// SQLSTATE XX000, although the worker committed. dam serve takes a
// permanent error for a refusal (api.go, combine.go: "the store refused
// the transaction for a reason no retry fixes ... decide the checks one by
// one"): TestCitusServeBatchLostWorkerCommitReplyNotDuplicate in
// serve/citus_test.go checks what it answers.
func TestCitusCheckBatchLostWorkerCommitReply(t *testing.T) {
	cc := pgtest.NeedCitusCluster(t)
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	px := proxyWorker(t, cc, 0)
	s, err := dedup.Open(ctx, dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, pxPort, _ := net.SplitHostPort(px.Addr())
	var port int
	fmt.Sscan(pxPort, &port)
	ents := entitiesOnNode(t, s.Pool(), port, 2)
	items := []dedup.CheckItem{{Service: "svc", Entity: ents[0], Digest: digest("A")}, {Service: "svc", Entity: ents[1], Digest: digest("B")}}

	// The next COMMIT the coordinator sends the worker reaches it; its reply
	// is lost.
	px.LoseNextCommitReply(nil)
	out, err := s.CheckBatch(ctx, items, nil)
	t.Logf("CheckBatch with the worker's COMMIT reply lost: %v, %v", out, err)
	if err == nil {
		t.Skip("the COMMIT reply was not lost (the proxy did not see the coordinator's COMMIT)")
	}
	// What did the lost COMMIT do? The worker committed both checks.
	committed := 0
	for _, it := range items {
		st, gerr := s.Get(ctx, it.Service, it.Entity)
		if gerr == nil && st.Digest == it.Digest {
			committed++
		}
	}
	if committed != len(items) {
		t.Skipf("the worker did not commit (%d of %d checks stored): nothing to prove", committed, len(items))
	}
	if !errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("CheckBatch committed on the worker but returned %v, not ErrUnavailable (outcome unknown): "+
			"a caller, dam serve first, takes it for a refusal and decides the checks again, answering duplicate", err)
	}
}

// TestCitusZombieClaimStallIsBounded: a decide that waits (or a zombie
// paused in the middle of its decide transaction) delays other
// partitions' multi-shard decides on Citus, even on identities it does not
// touch: with citus.enable_deadlock_prevention (on by default) each
// multi-shard write first takes a self-conflicting lock per shard on the
// coordinator, held to the end of its transaction. dam keeps that default:
// turned off, decides deadlock each other across shards (their rows are
// locked by each shard in parallel, in no global order) and Citus cancels
// checks and decides as deadlock victims. The stall is bounded, and never
// wrong: the waiting decide gives up after lock_timeout with
// ErrUnavailable (its caller retries after a backoff), and decides once
// the zombie's transaction ends (at the latest after
// idle_in_transaction_session_timeout). docs/citus.md says so.
func TestCitusZombieClaimStallIsBounded(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	pb, epochB := partition(t, s, "b")

	// A zombie: another partition's decide (another service even), paused
	// after its first round trip (progress locked, identities claimed).
	zombie, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer zombie.Rollback(ctx)
	var zents [][]byte
	for i := range 8 {
		zents = append(zents, []byte(fmt.Sprint("zombie-", i)))
	}
	if _, err := zombie.Exec(ctx, `INSERT INTO state AS s (service, entity, updated_at)
		SELECT 'other', e, 'epoch' FROM unnest($1::bytea[]) AS u(e) ORDER BY e
		ON CONFLICT (service, entity) DO UPDATE SET digest = s.digest WHERE false`, zents); err != nil {
		t.Fatal(err)
	}

	// Partition b decides identities of its own service, none of the
	// zombie's: at once on one server; on Citus at once or, waiting on the
	// zombie's shard locks, ErrUnavailable within the timeouts.
	b := &dedup.Batch{Service: "svc", Partition: pb, Epoch: epochB, Start: 0, End: 8}
	for i := range 8 {
		b.Records = append(b.Records, dedup.Record{Offset: int64(i), Entity: []byte(fmt.Sprint("b-", i)), Digest: digest("x")})
	}
	start := time.Now()
	out, err := s.Decide(ctx, b, nil)
	switch {
	case err == nil && len(out) == 8:
		return
	case err == nil:
		t.Fatalf("decisions %v", out)
	case !distributed(t, s) || !errors.Is(err, dedup.ErrUnavailable):
		t.Fatalf("partition b's decide beside a paused zombie of another partition: %v after %v", err, time.Since(start))
	case time.Since(start) > dedup.DefaultStatementTimeout+time.Second:
		t.Fatalf("partition b's decide waited %v, past the statement timeout", time.Since(start))
	}
	t.Logf("on Citus: %v after %v (the zombie's shard locks); decided once the zombie ends", err, time.Since(start).Round(time.Millisecond))
	if err := zombie.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := s.Decide(ctx, b, nil); err != nil || len(out) != 8 {
		t.Fatalf("after the zombie: %v, %v", out, err)
	}
}

// TestCitusRewriteWritesOnlyItsIdentity: with the tables distributed under
// a running dam (the case the engine's relearn in engine.go is for), a
// forward of one identity writes that identity's row and no other. The
// store may decide in the one-server shape while a batch's identities sit
// in one shard (Citus routes that single-shard SELECT ... FOR UPDATE, whose
// ctid is a tid in that shard); a rewrite by tid alone, with no key
// condition, would run on every shard, where the same tid is some other
// identity's row: their next unchanged record would be forwarded (a
// duplicate) and a record equal to the foreign digest dropped (a loss).
//
// On plain PostgreSQL migration 005 does nothing and the test passes.
func TestCitusRewriteWritesOnlyItsIdentity(t *testing.T) {
	ctx := context.Background()
	const n = 64
	var recs []rec
	for i := range n {
		recs = append(recs, rec{fmt.Sprint("e-", i), "A"})
	}
	// dam decides offsets [0, n), then `dam migrate` distributes the tables
	// under it: every shard's rows are copied in, from the first tid of its
	// first page.
	_, s, p, epoch := distributedUnderRunningDam(t, "tid", recs)

	// The next batch: one existing identity changes.
	b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: n, End: n + 1,
		Records: []dedup.Record{{Offset: n, Entity: []byte("e-0"), Digest: digest("B")}}}
	out, err := s.Decide(ctx, b, nil)
	t.Logf("Decide: %v, %v", out, err)

	for i := 1; i < n; i++ {
		e := fmt.Sprint("e-", i)
		st, err := s.Get(ctx, "svc", []byte(e))
		if err != nil {
			t.Fatalf("%s: %v", e, err)
		}
		if st.Digest != digest("A") || st.Offset != int64(i) {
			t.Errorf("%s: state %v from offset %d, want A's from offset %d: e-0's write reached it", e, st.Digest, st.Offset, i)
		}
	}
}

// lostCommitRig is the rig of the tests of a COMMIT PREPARED lost on a
// worker: the Citus cluster, worker 0 behind a proxy (px, whose
// LoseNextCommitPrepared drops it), a store closed at cleanup, and an
// identity on each worker: x on worker 0, y on worker 1 (a decide of both
// commits in two phases).
func lostCommitRig(t *testing.T) (*pgcitus.Cluster, *tcpproxy.Proxy, *dedup.Store, []byte, []byte) {
	t.Helper()
	cc := pgtest.NeedCitusCluster(t)
	dsn := pgtest.DSN(t) // its schema made before the proxy stands in for worker 0
	px := proxyWorker(t, cc, 0)
	s, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	_, pxPort, _ := net.SplitHostPort(px.Addr())
	var port int
	fmt.Sscan(pxPort, &port)
	x := entitiesOnNode(t, s.Pool(), port, 1)[0]
	y := entitiesOnNode(t, s.Pool(), cc.Worker(1).Port(), 1)[0]
	return cc, px, s, x, y
}

// decideRecords decides recs as one batch of b's partition from b.Start,
// each record at the next offset.
func decideRecords(ctx context.Context, s *dedup.Store, b dedup.Batch, recs ...dedup.Record) ([]dedup.Decision, error) {
	b.End = b.Start + int64(len(recs))
	for i, r := range recs {
		r.Offset = b.Start + int64(i)
		b.Records = append(b.Records, r)
	}
	return s.Decide(ctx, &b, nil)
}

// workerHoldsPrepared connects to cc's worker i (closed at cleanup) and
// skips the test when the worker holds no prepared transaction: its
// COMMIT PREPARED was not lost, and there is nothing to prove.
func workerHoldsPrepared(t *testing.T, cc *pgcitus.Cluster, i int) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	w, err := pgx.Connect(ctx, cc.Worker(i).DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(ctx) })
	n := preparedOn(t, w)
	if n == 0 {
		t.Skipf("worker %d holds no prepared transaction (its COMMIT PREPARED was not lost): nothing to prove", i)
	}
	t.Logf("worker %d holds %d transaction(s) prepared", i, n)
	return w
}

// preparedOn counts the transactions w's server holds prepared.
func preparedOn(t *testing.T, w *pgx.Conn) int {
	t.Helper()
	var n int
	if err := w.QueryRow(context.Background(), `SELECT count(*) FROM pg_prepared_xacts`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCitusFirstRunReadsNoCommitStillPrepared: on Citus, a decide's first
// run does not decide on a row that a committed decide's transaction still
// holds prepared on its worker. A two-phase commit is decided by the
// coordinator's commit; a worker that missed its COMMIT PREPARED (a lost
// connection) holds the transaction prepared until the coordinator's
// recovery commits it, and the committed decide has told its caller it
// forwarded. A plain read on that worker still returns the row as it was
// before: a record equal to that old content, decided on it as a
// Duplicate, would be dropped although the identity's last forwarded
// content differs (a lost record). Deciding it must wait for the prepared
// transaction (and may give up with ErrUnavailable, which the caller
// retries), as a claim's lock does.
func TestCitusFirstRunReadsNoCommitStillPrepared(t *testing.T) {
	ctx := context.Background()
	cc, px, s, x, y := lostCommitRig(t)
	p1, e1 := partition(t, s, "one")
	p2, e2 := partition(t, s, "two")
	decide := func(p dedup.Partition, epoch, start int64, recs ...dedup.Record) ([]dedup.Decision, error) {
		return decideRecords(ctx, s, dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: start}, recs...)
	}
	// x holds A.
	if out, err := decide(p1, e1, 0, dedup.Record{Entity: x, Digest: digest("A")}); err != nil || out[0] != dedup.Forward {
		t.Fatalf("seed: %v, %v", out, err)
	}
	// Partition one forwards B for x (and a new y, on the other worker: the
	// commit is two-phase); worker 0 never receives its COMMIT PREPARED.
	px.LoseNextCommitPrepared()
	out, err := decide(p1, e1, 1, dedup.Record{Entity: x, Digest: digest("B")}, dedup.Record{Entity: y, Digest: digest("Y")})
	if err != nil || out[0] != dedup.Forward {
		t.Fatalf("partition one forwarding B: %v, %v", out, err)
	}
	workerHoldsPrepared(t, cc, 0)
	t.Logf("partition one's decide returned %v", out)

	// Partition two, after: A again for x. x's last forwarded content is B.
	out, err = decide(p2, e2, 0, dedup.Record{Entity: x, Digest: digest("A")})
	switch {
	case errors.Is(err, dedup.ErrUnavailable):
		t.Logf("partition two: %v (waited for the prepared transaction; retried by the caller)", err)
	case err != nil:
		t.Fatal(err)
	case out[0] != dedup.Forward:
		t.Fatalf("partition two decided A for x %v after partition one's committed forward of B: "+
			"decided on the row as before the transaction its worker still holds prepared; A is lost", out[0])
	}
}

// TestCitusSlidingExtensionStillPreparedWaitsThenRecovers: on Citus, a
// sliding window's extension that a worker still holds prepared (its
// COMMIT PREPARED lost, the decide returned committed) is not read as the
// window before it: a repeat after the old expiry but within the extended
// window is never forwarded. Deciding it ends as ErrUnavailable while the
// transaction is prepared (a bounded wait, not a hang), and once the
// coordinator's recovery commits it the same batch, retried, decides the
// repeat a duplicate.
func TestCitusSlidingExtensionStillPreparedWaitsThenRecovers(t *testing.T) {
	ctx := context.Background()
	cc, px, s, x, y := lostCommitRig(t)
	p1, e1 := partition(t, s, "one")
	p2, e2 := partition(t, s, "two")
	rule := dedup.Rule{Mode: dedup.Window, Window: time.Hour, Sliding: true}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	decide := func(p dedup.Partition, epoch, start int64, now time.Time, recs ...dedup.Record) ([]dedup.Decision, error) {
		return decideRecords(ctx, s, dedup.Batch{Service: "svc", Rule: rule, Now: now, Partition: p, Epoch: epoch, Start: start}, recs...)
	}
	if out, err := decide(p1, e1, 0, t0, dedup.Record{Entity: x, Digest: digest("A")}); err != nil || out[0] != dedup.Forward {
		t.Fatalf("seed: %v, %v", out, err)
	}
	// At 50m a repeat of x extends its window to 1h50m (with a new y on
	// the other worker: two-phase); worker 0 never receives its COMMIT
	// PREPARED.
	px.LoseNextCommitPrepared()
	out, err := decide(p1, e1, 1, t0.Add(50*time.Minute), dedup.Record{Entity: x, Digest: digest("A")}, dedup.Record{Entity: y, Digest: digest("Y")})
	if err != nil || out[0] != dedup.Duplicate || out[1] != dedup.Forward {
		t.Fatalf("partition one extending x: %v, %v", out, err)
	}
	w := workerHoldsPrepared(t, cc, 0)
	// At 1h10m x repeats on partition two: within the extended window.
	at := t0.Add(70 * time.Minute)
	out, err = decide(p2, e2, 0, at, dedup.Record{Entity: x, Digest: digest("A")})
	switch {
	case errors.Is(err, dedup.ErrUnavailable):
		t.Logf("partition two while prepared: %v", err)
	case err != nil:
		t.Fatal(err)
	case out[0] != dedup.Duplicate:
		t.Fatalf("partition two decided x %v at 1h10m, within the window partition one extended to 1h50m: "+
			"decided on the window as before the extension its worker still holds prepared", out[0])
	default:
		return
	}
	if _, err := s.Pool().Exec(ctx, `SELECT recover_prepared_transactions()`); err != nil {
		t.Fatal(err)
	}
	if n := preparedOn(t, w); n != 0 {
		t.Fatalf("after recovery worker 0 holds %d prepared transaction(s)", n)
	}
	out, err = decide(p2, e2, 0, at, dedup.Record{Entity: x, Digest: digest("A")})
	if err != nil || out[0] != dedup.Duplicate {
		t.Fatalf("partition two after recovery: %v, %v; want duplicate", out, err)
	}
}

// TestCitusResetStillPreparedIsNotReadAsState: on Citus, a reset whose
// delete a worker still holds prepared (its COMMIT PREPARED lost, the
// reset returned) is not decided on as the state before it: a record equal
// to the identity's content before the reset is never dropped. Deciding it
// ends as ErrUnavailable while the delete is prepared, and forwards once
// the coordinator's recovery commits it.
func TestCitusResetStillPreparedIsNotReadAsState(t *testing.T) {
	ctx := context.Background()
	cc, px, s, x, y := lostCommitRig(t)
	p1, e1 := partition(t, s, "one")

	decide := func(start int64, recs ...dedup.Record) ([]dedup.Decision, error) {
		return decideRecords(ctx, s, dedup.Batch{Service: "svc", Partition: p1, Epoch: e1, Start: start}, recs...)
	}
	if out, err := decide(0, dedup.Record{Entity: x, Digest: digest("A")}, dedup.Record{Entity: y, Digest: digest("Y")}); err != nil || out[0] != dedup.Forward {
		t.Fatalf("seed: %v, %v", out, err)
	}
	px.LoseNextCommitPrepared()
	if n, err := s.ResetService(ctx, "svc"); err != nil || n != 2 {
		t.Fatalf("reset: %d, %v", n, err)
	}
	workerHoldsPrepared(t, cc, 0)
	out, err := decide(2, dedup.Record{Entity: x, Digest: digest("A")})
	switch {
	case errors.Is(err, dedup.ErrUnavailable):
		t.Logf("decide while the reset is prepared: %v", err)
	case err != nil:
		t.Fatal(err)
	case out[0] != dedup.Forward:
		t.Fatalf("decided A for x %v after the reset returned: decided on the row its worker still holds deleted, prepared; A is lost", out[0])
	default:
		return
	}
	if _, err := s.Pool().Exec(ctx, `SELECT recover_prepared_transactions()`); err != nil {
		t.Fatal(err)
	}
	out, err = decide(2, dedup.Record{Entity: x, Digest: digest("A")})
	if err != nil || out[0] != dedup.Forward {
		t.Fatalf("decide after recovery: %v, %v; want forward", out, err)
	}
}

// TestCitusFirstRunReadsNoCommitStillPreparedAfterShardSplit: on Citus, a
// decide's first run routed by a shard map that a split has made stale (a
// group spanning two shards) does not decide on a row that a committed
// decide's transaction still holds prepared on its worker. Such a group's
// read is a multi-shard query, and Citus plans its in-doubt sublink (the
// prepared transactions) as a subplan run on the coordinator, whose
// prepared transactions are not the worker's: the row reads as before the
// transaction, as in TestCitusFirstRunReadsNoCommitStillPrepared.
func TestCitusFirstRunReadsNoCommitStillPreparedAfterShardSplit(t *testing.T) {
	cc := pgtest.NeedCitusCluster(t)
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	writer, err := dedup.Open(ctx, dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	reader, err := dedup.Open(ctx, dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	port := cc.Worker(0).Port()
	y := entitiesOnNode(t, writer.Pool(), cc.Worker(1).Port(), 1)[0] // on worker 1
	p1, e1 := partition(t, writer, "one")
	p2, e2 := partition(t, reader, "two")
	decide := func(s *dedup.Store, p dedup.Partition, epoch, start int64, recs ...dedup.Record) ([]dedup.Decision, error) {
		return decideRecords(ctx, s, dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: start}, recs...)
	}
	// The reader keeps a shard map.
	if _, err := decide(reader, p2, e2, 0, dedup.Record{Entity: y, Digest: digest("Y0")}); err != nil {
		t.Fatal(err)
	}
	if dedup.ShardMapShards(reader) < 2 {
		t.Fatal("the reader keeps no shard map")
	}
	// Split a shard of worker 0 at the middle of its range, both halves
	// on worker 0; x and x2 were in it, one in each half now.
	x0 := entitiesOnNode(t, writer.Pool(), port, 1)[0]
	var shard int64
	var lo, hi int32
	if err := writer.Pool().QueryRow(ctx, `SELECT shardid, shardminvalue::int4, shardmaxvalue::int4 FROM pg_dist_shard
		WHERE shardid = get_shard_id_for_distribution_column('state', $1::bytea)`, x0).Scan(&shard, &lo, &hi); err != nil {
		t.Fatal(err)
	}
	mid := int32((int64(lo) + int64(hi)) / 2)
	var x, x2 []byte
	for i := 0; x == nil || x2 == nil; i++ {
		if i > 100000 {
			t.Fatal("no entities in both halves")
		}
		e := []byte(fmt.Sprint("s-", i))
		var h int32
		if err := writer.Pool().QueryRow(ctx, `SELECT worker_hash($1::bytea)`, e).Scan(&h); err != nil {
			t.Fatal(err)
		}
		switch {
		case h >= lo && h <= mid && x == nil:
			x = e
		case h > mid && h <= hi && x2 == nil:
			x2 = e
		}
	}
	var node int32
	if err := writer.Pool().QueryRow(ctx, `SELECT nodeid FROM pg_dist_node WHERE nodeport = $1`, port).Scan(&node); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Pool().Exec(ctx, `SELECT citus_split_shard_by_split_points($1, ARRAY[$2::text], ARRAY[$3::int, $3::int], 'block_writes')`,
		shard, fmt.Sprint(mid), node); err != nil {
		t.Fatal(err)
	}
	// The coordinator reaches worker 0 through a proxy from now on.
	px := proxyWorker(t, cc, 0)

	// x holds A; partition one forwards B for x (and y on worker 1: two
	// phases); worker 0 never receives its COMMIT PREPARED.
	if out, err := decide(writer, p1, e1, 0, dedup.Record{Entity: x, Digest: digest("A")}); err != nil || out[0] != dedup.Forward {
		t.Fatalf("seed: %v, %v", out, err)
	}
	px.LoseNextCommitPrepared()
	out, err := decide(writer, p1, e1, 1, dedup.Record{Entity: x, Digest: digest("B")}, dedup.Record{Entity: y, Digest: digest("Y")})
	if err != nil || out[0] != dedup.Forward {
		t.Fatalf("partition one forwarding B: %v, %v", out, err)
	}
	workerHoldsPrepared(t, cc, 0)
	defer writer.Pool().Exec(ctx, `SELECT recover_prepared_transactions()`)

	// Partition two, by its stale map (x and x2 one group): A again for x.
	out, err = decide(reader, p2, e2, 1, dedup.Record{Entity: x, Digest: digest("A")}, dedup.Record{Entity: x2, Digest: digest("Z")})
	switch {
	case errors.Is(err, dedup.ErrUnavailable):
		t.Logf("partition two: %v (waited for the prepared transaction; retried by the caller)", err)
	case err != nil:
		t.Fatal(err)
	case out[0] != dedup.Forward:
		t.Fatalf("partition two decided A for x %v after partition one's committed forward of B: "+
			"its group's read spans two shards, and the prepared transactions it checked were the coordinator's; A is lost "+
			"(the reader's shard map, stale, dropped: %v)", out[0], dedup.ShardMapShards(reader) == 0)
	}
}
