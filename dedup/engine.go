package dedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// The engine under the store: one PostgreSQL server, or Citus (distributed
// PostgreSQL) with dam's tables distributed by migration 005. Decide has a
// statement shape for each (see tables.go); every other operation runs the
// same statements on both.

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
// refused with feature_not_supported learns it again, so tables
// distributed under a running dam are noticed.
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

// forgetEngine makes the next Distributed ask again, after err, if err is
// the refusal of a statement shape the engine does not run.
func (s *Store) forgetEngine(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeNotSupported {
		s.engine.Store(engineUnknown)
		return true
	}
	return false
}

// classify is the package's classify, knowing the engine. On Citus a
// worker lost in the middle of a statement reaches the client through the
// coordinator as internal_error (XX000, the connection's own message) or
// io_error (58030, a shard's COPY failed), not as a connection error:
// both are transient there, and the outcome of a commit they interrupt is
// learned as after any lost reply (SettledProgress). On one server an
// internal error stays permanent: it needs a person.
func (s *Store) classify(op string, err error) error {
	var pgErr *pgconn.PgError
	if err != nil && s.engine.Load() == engineDistributed && errors.As(err, &pgErr) &&
		(pgErr.Code == "XX000" || pgErr.Code == "58030") {
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
	}
	return classify(op, err)
}
