package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// fillState inserts n identities of service, the empty entity among them,
// with updated_at two hours ago for every other one.
func fillState(t *testing.T, s *dedup.Store, service string, n int) {
	t.Helper()
	_, err := s.Pool().Exec(context.Background(), `INSERT INTO state (service, entity, digest, updated_at)
		SELECT $1, CASE WHEN i = 0 THEN ''::bytea ELSE int4send(i) END, '\x01'::bytea,
			CASE WHEN i % 2 = 0 THEN now() - interval '2 hours' ELSE now() END
		FROM generate_series(0, $2 - 1) i`, service, n)
	if err != nil {
		t.Fatal(err)
	}
}

// Resetting a whole service walks it in batches, each reported, and
// leaves other services alone.
func TestResetServiceInBatches(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		ctx := context.Background()
		fillState(t, s, "big", 2501)
		fillState(t, s, "other", 10)
		var steps []dedup.Step
		n, err := s.ResetService(ctx, "big", dedup.WithBatchSize(1000), dedup.WithProgress(func(st dedup.Step) { steps = append(steps, st) }))
		if err != nil || n != 2501 {
			t.Fatalf("ResetService: %d, %v", n, err)
		}
		want := []dedup.Step{{1000, 2501, 1000}, {2000, 2501, 2000}, {2501, 2501, 2501}}
		if fmt.Sprint(steps) != fmt.Sprint(want) {
			t.Fatalf("steps %v, want %v", steps, want)
		}
		if c, _ := s.Count(ctx, "big"); c != 0 {
			t.Fatalf("%d rows of big left", c)
		}
		if c, _ := s.Count(ctx, "other"); c != 10 {
			t.Fatalf("other: %d rows, want 10", c)
		}
		if n, err := s.ResetService(ctx, "big"); err != nil || n != 0 {
			t.Fatalf("ResetService of an empty service: %d, %v", n, err)
		}
		if _, err := s.ResetService(ctx, ""); !errors.Is(err, dedup.ErrInvalid) {
			t.Fatalf("empty service: %v", err)
		}
	})
}

func TestResetEntitiesInBatches(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	fillState(t, s, "svc", 100)
	var ents [][]byte
	ents = append(ents, nil) // the empty entity
	for i := 1; i < 50; i++ {
		ents = append(ents, []byte{0, 0, 0, byte(i)})
	}
	ents = append(ents, []byte("absent"))
	var steps []dedup.Step
	n, err := s.ResetEntities(ctx, "svc", ents, dedup.WithBatchSize(20), dedup.WithProgress(func(st dedup.Step) { steps = append(steps, st) }))
	if err != nil || n != 50 {
		t.Fatalf("ResetEntities: %d, %v", n, err)
	}
	want := []dedup.Step{{20, 51, 20}, {40, 51, 40}, {51, 51, 50}}
	if fmt.Sprint(steps) != fmt.Sprint(want) {
		t.Fatalf("steps %v, want %v", steps, want)
	}
	if c, _ := s.Count(ctx, "svc"); c != 50 {
		t.Fatalf("%d rows left, want 50", c)
	}
}

// A reset batch waits for a row a decider holds, and does not hold its
// own locks beyond its batch: a Check on an identity of an earlier batch
// proceeds while the reset is blocked.
func TestResetServiceHoldsNoLongLocks(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		ctx := context.Background()
		fillState(t, s, "svc", 300)
		// Hold the lock of the last identity (int4send(299)) in a transaction.
		tx, err := s.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SELECT 1 FROM state WHERE service = 'svc' AND entity = int4send(299) FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		firstBatch := make(chan struct{})
		go func() {
			_, err := s.ResetService(ctx, "svc", dedup.WithBatchSize(100), dedup.WithProgress(func(st dedup.Step) {
				if st.Done == 100 {
					close(firstBatch)
				}
			}))
			done <- err
		}()
		select {
		case <-firstBatch:
		case err := <-done:
			t.Fatalf("ResetService ended before its first batch: %v", err)
		}
		// The first batch is committed: its identities are free and absent.
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if d, err := s.Check(cctx, "svc", []byte{}, digest("new")); err != nil || d != dedup.Forward {
			t.Fatalf("Check during the reset: %v, %v", d, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

func TestPruneStateProgress(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		ctx := context.Background()
		fillState(t, s, "p", 250)
		var steps []dedup.Step
		n, err := s.PruneState(ctx, "p", time.Hour, dedup.WithBatchSize(100), dedup.WithProgress(func(st dedup.Step) { steps = append(steps, st) }))
		if err != nil || n != 125 {
			t.Fatalf("PruneState: %d, %v", n, err)
		}
		want := []dedup.Step{{100, 250, 50}, {200, 250, 100}, {250, 250, 125}}
		if fmt.Sprint(steps) != fmt.Sprint(want) {
			t.Fatalf("steps %v, want %v", steps, want)
		}

		// Every service's: the total is the planner's estimate, unknown
		// before the tables are analyzed (on Citus, the shards' estimates).
		steps = nil
		fillState(t, s, "q", 150)
		if n, err := s.PruneState(ctx, "", time.Hour, dedup.WithProgress(func(st dedup.Step) { steps = append(steps, st) })); err != nil || n != 75 {
			t.Fatalf("PruneState of every service: %d, %v", n, err)
		}
		if len(steps) != 1 || steps[0].Done != 275 || steps[0].Deleted != 75 || steps[0].Total != -1 && steps[0].Total < 275 {
			t.Fatalf("steps %v, want {275 -1 75} (or a known total from an ANALYZE meanwhile)", steps)
		}
		if _, err := s.Pool().Exec(ctx, `ANALYZE state; ANALYZE versions`); err != nil {
			t.Fatal(err)
		}
		steps = nil
		if n, err := s.PruneState(ctx, "", time.Hour, dedup.WithProgress(func(st dedup.Step) { steps = append(steps, st) })); err != nil || n != 0 {
			t.Fatalf("PruneState of every service again: %d, %v", n, err)
		}
		if want := []dedup.Step{{200, 200, 0}}; fmt.Sprint(steps) != fmt.Sprint(want) {
			t.Fatalf("steps after ANALYZE %v, want %v (the estimate of 200 rows)", steps, want)
		}
	})
}

// besideADecide runs op while a transaction holds two rows of table the
// way a Decide does: written (the identity forwarded), and locked only (a
// duplicate), then commits it. On one server op skips both rows without
// waiting; with Citus's statements it waits for them and checks each again
// once the transaction has committed. It returns op's result.
func besideADecide(t *testing.T, s *dedup.Store, write, lock string, op func(context.Context) (int64, error)) int64 {
	t.Helper()
	ctx := context.Background()
	citus, err := dedup.CitusShapes(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, sql := range []string{write, lock} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := op(ctx)
		done <- result{n, err}
	}()
	if !citus {
		select {
		case r := <-done: // SKIP LOCKED: finished while the rows are held
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			return r.n
		case <-time.After(5 * time.Second):
			t.Fatal("the one-server statement waited for a locked row")
		}
	}
	for !waiting(ctx, t, s) {
		select {
		case r := <-done:
			t.Fatalf("finished without waiting for the held rows: %d, %v", r.n, r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.n
}

// TestPruneStateBesideADecide: an old identity that a Decide forwards
// while the prune runs is kept. One that it only reads is skipped on one
// server (SKIP LOCKED), and on Citus deleted once the Decide commits, as
// if pruned just after it: both are pruned states of an identity not
// forwarded for the age given.
func TestPruneStateBesideADecide(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		ctx := context.Background()
		if _, err := s.Pool().Exec(ctx, `INSERT INTO state (service, entity, digest, updated_at) VALUES
			('svc', 'forwarded', '\x01', now() - interval '2 hours'), ('svc', 'duplicate', '\x01', now() - interval '2 hours'),
			('svc', 'old', '\x01', now() - interval '2 hours'), ('svc', 'fresh', '\x01', now())`); err != nil {
			t.Fatal(err)
		}
		citus, _ := dedup.CitusShapes(ctx, s)
		n := besideADecide(t, s,
			`UPDATE state SET digest = '\x02', updated_at = now() WHERE service = 'svc' AND entity = 'forwarded'`,
			`SELECT 1 FROM state WHERE service = 'svc' AND entity = 'duplicate' FOR UPDATE`,
			func(ctx context.Context) (int64, error) { return s.PruneState(ctx, "svc", time.Hour) })
		want, left := int64(1), "duplicate forwarded fresh"
		if citus {
			want, left = 2, "forwarded fresh"
		}
		if got := stateLeft(t, s, "state", "entity"); n != want || got != left {
			t.Fatalf("pruned %d, left %q; want %d, %q", n, got, want, left)
		}
	})
}

// TestPruneWindowBesideADecide: an expired id that a Decide forwards
// afresh while the cleanup runs is kept. One only locked is skipped on one
// server, and on Citus deleted once the lock is released (still expired).
func TestPruneWindowBesideADecide(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		ctx := context.Background()
		if _, err := s.Pool().Exec(ctx, `INSERT INTO window_ids (service, id, expires_at, forwarded_at, digest)
			SELECT 'svc', id, now() + e, now() - interval '2 hours', '\x01'
			FROM (VALUES ('forwarded'::bytea, interval '-1 hour'), ('locked', interval '-1 hour'),
				('expired', interval '-1 hour'), ('live', interval '1 hour')) v(id, e)`); err != nil {
			t.Fatal(err)
		}
		citus, _ := dedup.CitusShapes(ctx, s)
		n := besideADecide(t, s,
			`UPDATE window_ids SET expires_at = now() + interval '1 hour', forwarded_at = now() WHERE service = 'svc' AND id = 'forwarded'`,
			`SELECT 1 FROM window_ids WHERE service = 'svc' AND id = 'locked' FOR UPDATE`,
			func(ctx context.Context) (int64, error) { return s.PruneWindow(ctx, "svc") })
		want, left := int64(1), "forwarded live locked"
		if citus {
			want, left = 2, "forwarded live"
		}
		if got := stateLeft(t, s, "window_ids", "id"); n != want || got != left {
			t.Fatalf("deleted %d, left %q; want %d, %q", n, got, want, left)
		}
	})
}

// stateLeft lists the identities of table, in order.
func stateLeft(t *testing.T, s *dedup.Store, table, column string) string {
	t.Helper()
	var left string
	err := s.Pool().QueryRow(context.Background(),
		fmt.Sprintf(`SELECT coalesce(string_agg(convert_from(%[2]s, 'UTF8'), ' ' ORDER BY %[2]s), '') FROM %[1]s`, table, column)).Scan(&left)
	if err != nil {
		t.Fatal(err)
	}
	return left
}

// TestBatchOpsNoticeDistribution (Citus only): a store that learned its
// tables were local, which are then distributed under it, has its first
// batched operation refused (FOR UPDATE over several shards); it learns
// the engine again and runs Citus's statements.
func TestBatchOpsNoticeDistribution(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	if !distributed(t, s) {
		t.Skip("needs Citus (make test-citus)")
	}
	ctx := context.Background()
	tables := []string{"state", "versions", "window_ids", "progress", "decision_log"}
	for i := len(tables) - 1; i >= 0; i-- {
		if _, err := s.Pool().Exec(ctx, `SELECT undistribute_table($1)`, tables[i]); err != nil {
			t.Fatal(err)
		}
	}
	learner, err := dedup.Open(ctx, s.Pool().Config().ConnString(), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer learner.Close()
	if distributed(t, learner) {
		t.Fatal("the tables still read as distributed")
	}
	for _, sql := range []string{
		`SELECT create_distributed_table('state', 'entity', colocate_with => 'none')`,
		`SELECT create_distributed_table('versions', 'entity', colocate_with => 'state')`,
		`SELECT create_distributed_table('window_ids', 'id', colocate_with => 'state')`,
	} {
		if _, err := s.Pool().Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	fillState(t, learner, "svc", 10)
	if n, err := learner.ResetService(ctx, "svc"); err != nil || n != 10 {
		t.Fatalf("ResetService: %d, %v", n, err)
	}
	if !distributed(t, learner) {
		t.Fatal("the store did not learn that its tables are distributed")
	}
}

// TestResetServiceDeletesWhatItWaitedFor: ResetService's chunk waits for a
// row a decider holds (FOR UPDATE), then deletes what it locked, the
// version the decider committed meanwhile included (a delete by key
// follows the update chain: PostgreSQL's recheck; a delete by tid, looked
// up with the statement's snapshot taken before the wait, would keep it).
// A reset that kept it would, under live traffic, miss exactly the
// identities being decided, and the replay an operator runs after it
// would drop their records as duplicates.
func TestResetServiceDeletesWhatItWaitedFor(t *testing.T) {
	ctx := context.Background()
	s, err := dedup.Open(ctx, pgtest.DSN(t), dedup.Config{MaxConns: 4, LockTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if distributed(t, s) {
		t.Skip("the one-server statement")
	}
	p, epoch := partition(t, s, "in")
	decideAll(t, s, "svc", p, epoch, []rec{{"a", "1"}, {"b", "1"}, {"c", "1"}}, 3)
	// A decider rewriting b, in flight (what a Decide's rewrite does).
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	d := digest("2")
	if _, err := tx.Exec(ctx, `UPDATE state SET digest = $1, updated_at = clock_timestamp() WHERE service = 'svc' AND entity = 'b'`, d[:]); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = s.ResetService(ctx, "svc")
		done <- err
	}()
	for !waiting(ctx, t, s) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	left, err := s.Count(ctx, "svc")
	if err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		st, _ := s.Get(ctx, "svc", []byte("b"))
		t.Fatalf("ResetService returned (%d deleted) and left %d identities of the service; b: digest %x... (the decider's)", n, left, st.Digest[:4])
	}
}
