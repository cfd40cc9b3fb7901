package dedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
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
// SELECT ... FOR UPDATE). The answer is learned once and kept: on the
// pool's first connection for a store that Open built (see learnEngine),
// else at the first call. A Decide or a batched operation refused as Citus
// refuses the one-server statements learns it again (relearn), so tables
// distributed under a running dam are noticed.
func (s *Store) Distributed(ctx context.Context) (bool, error) {
	if e := s.engine.Load(); e != engineUnknown {
		return e == engineDistributed, nil
	}
	return s.learn(ctx, s.pool)
}

// rowQuerier is what learn reads the catalog with: the pool, or a
// connection being set up.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// learn reads the engine from the catalog over db and keeps it.
func (s *Store) learn(ctx context.Context, db rowQuerier) (bool, error) {
	var citus, dist bool
	if err := db.QueryRow(ctx, sqlHasCitus).Scan(&citus); err != nil {
		return false, classify("engine", err)
	}
	if citus {
		if err := db.QueryRow(ctx, sqlDistributed).Scan(&dist); err != nil {
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

// learnEngine is run by every connection of a pool that Open built, when
// it connects, before any statement of the store runs on it: while the
// engine is unknown, it learns it there. So the engine is known before
// the first statement of a fresh process, which is recovery's (Acquire,
// InitProgress, BindTopic), not a Decide's: a Citus worker lost during a
// dam's start is then an outage to wait out, not an error that needs a
// person (see classify). A connection that cannot learn it fails, as a
// connection that cannot be set up does.
func (s *Store) learnEngine(ctx context.Context, conn *pgx.Conn) error {
	if s.engine.Load() != engineUnknown {
		return nil
	}
	_, err := s.learn(ctx, conn)
	return err
}

// relearn learns the engine again after err, an error of the one-server
// statements, if err may be Citus refusing them: feature_not_supported (a
// multi-shard FOR UPDATE) or internal_error (a batch of one shard runs,
// but a concurrent decider's unique violation comes back as XX000, with no
// table name). It reports whether the tables are distributed now: the
// batch is then decided again as a claim. On one server an internal error
// stays what it was. Until the catalog answers, the engine learned before
// stays in place.
func (s *Store) relearn(ctx context.Context, err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || (pgErr.Code != codeNotSupported && pgErr.Code != "XX000") {
		return false
	}
	dist, derr := s.learn(ctx, s.pool)
	return derr == nil && dist
}

// Transient is the package's Transient for an error of s's own
// operations, knowing the engine: on Citus a worker's internal or I/O
// error relayed by the coordinator is transient too (see classify). Such
// an error met while s believed its tables local, or before it knew, makes
// it learn the engine again first: the tables may have been distributed
// under it. A caller that gave up on an error judges it again with this
// before leaving it to a person (a partition whose recovery failed).
func (s *Store) Transient(ctx context.Context, err error) bool {
	if Transient(err) {
		return true
	}
	if remoteCode(err) && s.engine.Load() != engineDistributed {
		if _, lerr := s.learn(ctx, s.pool); lerr != nil {
			return false
		}
	}
	return s.remoteFailure(err)
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
	return err != nil && s.engine.Load() == engineDistributed && !errors.Is(err, ErrUnavailable) && remoteCode(err)
}

// remoteCode reports an internal_error or io_error: what a Citus
// coordinator relays of a worker's failure.
func remoteCode(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "XX000" || pgErr.Code == "58030")
}

// WorkerFailure reports an error that the store made ErrUnavailable only
// because it runs on Citus: a worker's internal or I/O error relayed by
// the coordinator (see classify). Mostly a worker lost in the middle of a
// statement, gone at the next try; but Citus relays some errors that a
// record's own content causes on a worker the same way, and those fail at
// every try. A decider bounds its tries of such an error, then tells the
// record's fault from an outage by deciding the records one at a time
// (package pipeline's decideApart).
func WorkerFailure(err error) bool {
	return errors.Is(err, ErrUnavailable) && remoteCode(err)
}
