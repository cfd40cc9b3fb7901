package dedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// The engine under the store: one PostgreSQL server, or Citus (distributed
// PostgreSQL) with dam's tables distributed by migration 005. Decide
// (tables.go) and the batched operations (batchops.go, ops.go: reset,
// prune, the window cleanup) have a statement shape for each, since Citus
// refuses a multi-shard SELECT ... FOR UPDATE; every other operation runs
// the same statements on both.

// Engine values of Store.engine.
const (
	engineUnknown int32 = iota
	engineOneServer
	engineDistributed
)

// sqlDistributed reports whether state is a distributed table. It is sent
// only when Citus's catalog exists: on plain PostgreSQL pg_dist_partition
// is not a relation.
const (
	sqlHasCitus      = `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`
	sqlDistributed   = `SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('state'))`
	codeNotSupported = "0A000" // feature_not_supported: what Citus answers a multi-shard FOR UPDATE
)

// Distributed reports whether dam's tables are distributed over Citus
// workers: then Decide locks by writing (Citus refuses a multi-shard
// SELECT ... FOR UPDATE). The answer is learned once and kept; a Decide
// or a batched operation refused as Citus refuses the one-server
// statements learns it again (relearn), so tables distributed under a
// running dam are noticed.
func (s *Store) Distributed(ctx context.Context) (bool, error) {
	if e := s.engine.Load(); e != engineUnknown {
		return e == engineDistributed, nil
	}
	var citus, dist bool
	if err := s.pool.QueryRow(ctx, sqlHasCitus).Scan(&citus); err != nil {
		return false, classify("engine", err)
	}
	if citus {
		if err := s.pool.QueryRow(ctx, sqlDistributed).Scan(&dist); err != nil {
			return false, classify("engine", err)
		}
	}
	e := engineOneServer
	if dist {
		e = engineDistributed
	}
	s.engine.Store(e)
	return dist, nil
}

// relearn learns the engine again after err, an error of the one-server
// statements, if err may be Citus refusing them: feature_not_supported (a
// multi-shard FOR UPDATE) or internal_error (a batch of one shard runs,
// but a concurrent decider's unique violation comes back as XX000, with no
// table name). It reports whether the tables are distributed now: the
// batch is then decided again as a claim. On one server an internal error
// stays what it was.
func (s *Store) relearn(ctx context.Context, err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || (pgErr.Code != codeNotSupported && pgErr.Code != "XX000") {
		return false
	}
	s.engine.Store(engineUnknown)
	dist, derr := s.Distributed(ctx)
	return derr == nil && dist
}

// classify is the package's classify, knowing the engine. On Citus a
// worker lost in the middle of a statement, or a worker's reply to COMMIT
// lost, reaches the client through the coordinator as internal_error
// (XX000: the connection's own message, or "could not commit transaction
// for shard") or io_error (58030, a shard's COPY failed), not as a
// connection error: both are transient there, and the outcome of a commit
// they interrupt is unknown, learned as after any lost reply. On one
// server an internal error stays permanent: it needs a person.
func (s *Store) classify(op string, err error) error {
	if s.remoteFailure(err) {
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
	}
	return classify(op, err)
}

// remoteFailure reports an error that classify makes ErrUnavailable on
// Citus only (see classify), and not already so.
func (s *Store) remoteFailure(err error) bool {
	var pgErr *pgconn.PgError
	return err != nil && s.engine.Load() == engineDistributed && !errors.Is(err, ErrUnavailable) &&
		errors.As(err, &pgErr) && (pgErr.Code == "XX000" || pgErr.Code == "58030")
}
