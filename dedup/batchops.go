package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/dam-dedup/dam/internal/retry"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Step reports the progress of a batched state operation (ResetService,
// ResetEntities, PruneState) after each of its batches.
type Step struct {
	// Done counts the rows walked (prune, reset of a service) or the
	// entities given (reset of entities) processed so far.
	Done int64
	// Total is Done's expected final value: exact for a reset, the
	// service's row count or the planner's estimate of the table's rows for
	// a prune; -1 when unknown. Done may pass an estimate.
	Total int64
	// Deleted counts the identities deleted so far.
	Deleted int64
}

// OpOption tunes a batched state operation.
type OpOption func(*opOptions)

type opOptions struct {
	batch    int
	progress func(Step)
}

// WithBatchSize sets the rows deleted (or walked, for a prune) per
// transaction. Default 5000 for resets and 10000 for prunes: each batch is
// one short statement, so no lock is held for long.
func WithBatchSize(n int) OpOption { return func(o *opOptions) { o.batch = n } }

// WithProgress calls fn after every batch, from the calling goroutine.
func WithProgress(fn func(Step)) OpOption { return func(o *opOptions) { o.progress = fn } }

func newOpOptions(def int, opts []OpOption) opOptions {
	o := opOptions{batch: def, progress: func(Step) {}}
	for _, opt := range opts {
		opt(&o)
	}
	if o.batch <= 0 {
		o.batch = def
	}
	if o.progress == nil {
		o.progress = func(Step) {}
	}
	return o
}

// resetBatch is the default number of identities one reset statement
// deletes.
const resetBatch = 5000

// sqlResetEntities deletes the identities $2 of service $1 from every
// mode's table, waiting for those a Decide holds. The same statement on
// both engines: one server probes each table's primary key in key order,
// the order in which a Decide locks; on Citus each shard does, and a
// deadlock across shards is broken by Citus and the batch runs again.
const sqlResetEntities = `WITH
	a AS (DELETE FROM state WHERE service = $1 AND entity = ANY($2::bytea[]) RETURNING 1),
	b AS (DELETE FROM window_ids WHERE service = $1 AND id = ANY($2::bytea[]) RETURNING 1),
	c AS (DELETE FROM versions WHERE service = $1 AND entity = ANY($2::bytea[]) RETURNING 1)
	SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM b) + (SELECT count(*) FROM c)`

// ResetEntities deletes the state of the given entities (or window-mode
// ids) of service, in every mode's table, in batches of one short statement
// each, and returns how many identities it removed (entities without state
// count for nothing). Their next records are forwarded. A batch waits for
// the identities a Decide holds, then deletes them with the state it
// wrote.
func (s *Store) ResetEntities(ctx context.Context, service string, entities [][]byte, opts ...OpOption) (int64, error) {
	if service == "" {
		return 0, fmt.Errorf("%w: empty service", ErrInvalid)
	}
	o := newOpOptions(resetBatch, opts)
	var deleted int64
	for lo := 0; lo < len(entities); lo += o.batch {
		hi := min(lo+o.batch, len(entities))
		chunk := make([][]byte, hi-lo)
		for i, e := range entities[lo:hi] {
			chunk[i] = nonNil(e)
		}
		for _, group := range s.resetGroups(ctx, chunk) {
			var n int64
			err := s.runChunk(ctx, func(bool) error {
				return s.pool.QueryRow(ctx, sqlResetEntities, service, group).Scan(&n)
			})
			if err != nil {
				return deleted, classify("reset", err)
			}
			deleted += n
		}
		o.progress(Step{Done: int64(hi), Total: int64(len(entities)), Deleted: deleted})
	}
	return deleted, nil
}

// The steps of ResetService walk the service's part of a table's
// (service, identity) index in chunks (keyset pagination from the last
// identity deleted; the predicate selects the index: see byService), each
// chunk one statement: locked, deleted, committed. The verbs are the table,
// its identity column and the comparison.
//
// One server: the chunk's rows are locked (FOR UPDATE, waiting for a
// decider holding one) in key order, the order in which a Decide locks
// them too, then deleted by key (= ANY: a probe of the primary key per
// identity; a join back to the table was planned as a hash join over a
// sequential scan of every service's rows). Not by tid: a row the lock
// waited for is a version newer than the statement's snapshot, which a
// delete by its tid does not see, while a delete by key finds the version
// it sees updated and deletes the newest (PostgreSQL's recheck).
const sqlResetChunk = `WITH chunk AS (
		SELECT %[2]s AS k FROM %[1]s WHERE service = $1 AND %[2]s %[3]s $2 AND octet_length(%[2]s) >= 0
		ORDER BY %[2]s LIMIT $3 FOR UPDATE),
	gone AS (
		DELETE FROM %[1]s WHERE service = $1 AND %[2]s = ANY(ARRAY(SELECT k FROM chunk)) RETURNING 1)
	SELECT (SELECT count(*) FROM gone), k FROM chunk ORDER BY k DESC LIMIT 1`

// sqlResetChunkCitus is sqlResetChunk on Citus, which refuses FOR UPDATE
// over several shards: the chunk is read without locks, and the DELETE
// removes the key range it spans, waiting for a row a decider holds. An
// identity created in that range meanwhile goes too (as if decided before
// the reset). Each shard deletes its rows walking its (service, identity)
// index in key order, as a Decide locks them; a deadlock across shards is
// broken by Citus and the chunk runs again (see runChunk).
const sqlResetChunkCitus = `WITH chunk AS (
		SELECT %[2]s AS k FROM %[1]s WHERE service = $1 AND %[2]s %[3]s $2 AND octet_length(%[2]s) >= 0
		ORDER BY %[2]s LIMIT $3),
	last AS (
		SELECT k FROM chunk ORDER BY k DESC LIMIT 1),
	gone AS (
		DELETE FROM %[1]s USING last WHERE service = $1 AND %[2]s %[3]s $2 AND %[2]s <= last.k
			AND octet_length(%[2]s) >= 0 RETURNING 1)
	SELECT (SELECT count(*) FROM gone), k FROM last`

// identityTables are every mode's state tables and their identity columns.
var identityTables = [...]struct{ table, column string }{{"state", "entity"}, {"window_ids", "id"}, {"versions", "entity"}}

// ResetService deletes the state of every identity of service, in every
// mode's table, in batches of one short statement each (never one long
// transaction holding every row's lock), and returns how many identities
// it removed. A batch waits for the identities a Decide holds. An identity
// decided while the reset runs may keep its new state.
func (s *Store) ResetService(ctx context.Context, service string, opts ...OpOption) (int64, error) {
	if service == "" {
		return 0, fmt.Errorf("%w: empty service", ErrInvalid)
	}
	o := newOpOptions(resetBatch, opts)
	total, err := s.Count(ctx, service)
	if err != nil {
		return 0, err
	}
	var deleted int64
	for _, t := range identityTables {
		op, last := ">=", []byte{} // from the smallest key, the empty entity included
		for {
			var n int64
			err := s.runChunk(ctx, func(citus bool) error {
				sql := sqlResetChunk
				if citus {
					sql = sqlResetChunkCitus
				}
				return s.inShardOrder(ctx, s.pool, citus, func(db execer) error {
					return db.QueryRow(ctx, fmt.Sprintf(sql, t.table, t.column, op), service, last, o.batch).Scan(&n, &last)
				})
			})
			if errors.Is(err, pgx.ErrNoRows) { // past the last row
				break
			}
			if err != nil {
				return deleted, classify("reset", err)
			}
			deleted += n
			o.progress(Step{Done: deleted, Total: max(total, deleted), Deleted: deleted})
			op = ">"
		}
	}
	return deleted, nil
}

// pruneTotal is the expected number of rows a prune walks: the service's
// rows, or the planner's estimate for the whole tables (-1 when unknown:
// before the first ANALYZE).
func (s *Store) pruneTotal(ctx context.Context, service string) (int64, error) {
	if service != "" {
		return s.Count(ctx, service)
	}
	dist, err := s.Distributed(ctx)
	if err != nil {
		return 0, err
	}
	sql := sqlPruneTotal
	if dist {
		sql = sqlPruneTotalCitus
	}
	var n *float64
	if err := s.pool.QueryRow(ctx, sql).Scan(&n); err != nil {
		return 0, classify("prune state", err)
	}
	if n == nil || *n < 0 {
		return -1, nil
	}
	return int64(*n), nil
}

// The planner's estimate of the rows of state and versions. On Citus the
// coordinator's tables are empty shells: the estimate is the sum of the
// shards' own (as Citus's citus_stats view reads them), each read on its
// worker; shards never analyzed count for nothing, and the total is NULL
// (unknown) when none was, or when a shard could not be read.
const (
	sqlPruneTotal      = `SELECT sum(reltuples) FROM pg_class WHERE oid IN ('state'::regclass, 'versions'::regclass)`
	sqlPruneTotalCitus = `SELECT CASE WHEN bool_and(success) THEN sum(result::float8) FILTER (WHERE result::float8 >= 0) END
		FROM (SELECT success, CASE WHEN success THEN result END AS result
			FROM unnest(ARRAY['state'::regclass, 'versions'::regclass]) AS t(rel),
				run_command_on_shards(t.rel, $$SELECT reltuples FROM pg_class WHERE oid = '%s'::regclass$$)) r`
)

// PruneState deletes the last-seen and version state of identities (of
// service, or of every service when service is "") not forwarded for
// olderThan, walking each table's (service, entity) index in batches of
// one short statement each (default 10000 rows walked per batch), and
// returns how many it deleted. The next record of a pruned identity is
// forwarded (in version mode, even one older than what was forwarded
// before). An identity a Decide forwards while the prune runs is kept
// (see sqlPruneChunk). Window ids expire by themselves: see PruneWindow.
func (s *Store) PruneState(ctx context.Context, service string, olderThan time.Duration, opts ...OpOption) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: negative age %v", ErrInvalid, olderThan)
	}
	o := newOpOptions(pruneBatch, opts)
	total, err := s.pruneTotal(ctx, service)
	if err != nil {
		return 0, err
	}
	first, next := pruneFirstService, pruneNextService
	if service == "" {
		first, next = pruneFirstAll, pruneNextAll
	}
	var deleted, walked int64
	for _, table := range []string{"state", "versions"} {
		cond := first
		lastService, lastEntity := service, []byte{}
		for {
			var n, chunk int64
			err := s.runChunk(ctx, func(citus bool) error {
				sql := sqlPruneChunk
				if citus {
					sql = sqlPruneChunkCitus
				}
				return s.inShardOrder(ctx, s.pool, citus, func(db execer) error {
					return db.QueryRow(ctx, fmt.Sprintf(sql, table, cond),
						lastService, lastEntity, o.batch, olderThan.Seconds()).Scan(&n, &chunk, &lastService, &lastEntity)
				})
			})
			if errors.Is(err, pgx.ErrNoRows) { // past the last row
				break
			}
			if err != nil {
				return deleted, classify("prune state", err)
			}
			deleted += n
			walked += chunk
			t := total
			if t >= 0 {
				t = max(t, walked)
			}
			o.progress(Step{Done: walked, Total: t, Deleted: deleted})
			cond = next
		}
	}
	return deleted, nil
}

// The batched operations run one statement shape on each engine, like
// Decide (see tables.go). On one server a chunk locks its rows with
// SELECT ... FOR UPDATE [SKIP LOCKED] before deleting them. Citus refuses
// FOR UPDATE over several shards, and one service's identities are spread
// over every shard: there a chunk's DELETE waits for the rows a concurrent
// transaction holds and, under READ COMMITTED, deletes each only if it
// still meets the DELETE's condition once that transaction has ended. Each
// operation documents what its shapes mean for a concurrent Decide. A
// chunk's ORDER BY ... LIMIT n runs on every shard, and the coordinator
// merges their heads: up to n keys from each shard per chunk.

// resetGroups splits a chunk of ResetEntities by shard on Citus, in
// shard order (shards.go): each group's statement is then a router
// statement, which locks one shard's rows at a time, as a routed decide
// does, shard after shard. A multi-shard DELETE, its shards' tasks in
// parallel, waited on a decide's rows on one shard while holding rows that
// decide waited for on another: a distributed deadlock, whose victim, the
// youngest transaction, was the reset again and again. On one server, or
// without a shard map, the chunk is one group.
func (s *Store) resetGroups(ctx context.Context, chunk [][]byte) [][][]byte {
	if s.engine.Load() != engineDistributed || s.unrouted {
		return [][][]byte{chunk}
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return [][][]byte{chunk}
	}
	m := s.shardRouting(ctx, conn.Conn())
	conn.Release()
	if m == nil {
		return [][][]byte{chunk}
	}
	var out [][][]byte
	for _, g := range m.groups(chunk) {
		es := make([][]byte, len(g))
		for k, i := range g {
			es[k] = chunk[i]
		}
		out = append(out, es)
	}
	return out
}

// inShardOrder runs fn, a multi-shard statement of a batched operation
// (reset, prune, the window cleanup), over db. On Citus it runs in a
// transaction of its own whose multi-shard statements run their shards'
// tasks one after the other, in shard order
// (citus.multi_shard_modify_mode = sequential), each shard's rows in key
// order: the order in which a decide routed by shard locks them
// (shards.go), shard after shard. In parallel, the statement's task on one
// shard waited for a decide's rows while its task on another held rows
// that decide waited for: a distributed deadlock, whose victim, the
// youngest transaction, was the operation's chunk again and again. On
// one server (or one running Citus's shapes, SetClaims) fn runs as it is.
func (s *Store) inShardOrder(ctx context.Context, db execer, citus bool, fn func(execer) error) error {
	if !citus || s.engine.Load() != engineDistributed {
		return fn(db)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, sqlShardOrder); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

const sqlShardOrder = `SET LOCAL citus.multi_shard_modify_mode TO 'sequential'`

// citusShapes reports whether s runs the statements written for Citus:
// its tables are distributed (Distributed), or a test asked for them on
// one server (SetClaims).
func (s *Store) citusShapes(ctx context.Context) (bool, error) {
	if s.claims {
		return true, nil
	}
	return s.Distributed(ctx)
}

// maxChunkAttempts bounds the runs of one statement of a batched
// operation that deadlocks roll back. A maintenance chunk is the youngest
// transaction beside the deciders it waits for, so it is the one a
// deadlock cancels: it yields (chunkBackoff) and runs again, more times
// than a Decide, since nothing waits on it.
const maxChunkAttempts = 10

// chunkBackoff is the wait before a chunk runs again after a deadlock:
// jittered, so that it stops meeting the same deciders at the same rows.
var chunkBackoff = retry.Policy{Min: 10 * time.Millisecond, Max: 250 * time.Millisecond}

// runChunk runs fn, one statement of a batched operation, in the shape of
// the store's engine (citus: see citusShapes), and runs it again when it
// changed nothing because of a concurrent transaction: a deadlock (with a
// Decide locking the same rows in another order; on Citus, across shards)
// rolled it back, after a wait (chunkBackoff), or, once, the engine
// refused the one-server shape (feature_not_supported: the tables were
// distributed under a running dam). Its error is fn's, unclassified.
func (s *Store) runChunk(ctx context.Context, fn func(citus bool) error) error {
	relearned := false
	var bo *backoff.ExponentialBackOff
	for attempt := 1; ; attempt++ {
		citus, err := s.citusShapes(ctx)
		if err != nil {
			return err
		}
		err = fn(citus)
		if err == nil || attempt >= maxChunkAttempts || ctx.Err() != nil {
			return err
		}
		switch {
		case !citus && !relearned && s.relearn(ctx, err):
			relearned = true
		case isDeadlock(err):
			if bo == nil {
				bo = chunkBackoff.Backoff()
			}
			t := time.NewTimer(bo.NextBackOff())
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return err
			}
		default:
			return err
		}
	}
}

// isDeadlock reports a statement rolled back by a deadlock (on Citus, a
// distributed deadlock too): it changed nothing.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}
