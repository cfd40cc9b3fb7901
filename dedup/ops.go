package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/canon"
)

// State is the stored state of one identity.
type State struct {
	Service string
	Entity  []byte
	// Digest is the digest of the content last forwarded.
	Digest canon.Digest
	// UpdatedAt is when Digest last changed.
	UpdatedAt time.Time
	// Topic, Partition and Offset locate the record that set Digest; empty,
	// -1 and -1 when it was set by Check.
	Topic     string
	Partition int32
	Offset    int64
}

// ServiceStats summarises one service's state.
type ServiceStats struct {
	Service string
	Rows    int64
	// Oldest and Newest are the earliest and latest UpdatedAt.
	Oldest, Newest time.Time
}

// Get returns the state of (service, entity), or ErrNotFound.
func (s *Store) Get(ctx context.Context, service string, entity []byte) (State, error) {
	st := State{Service: service, Entity: entity}
	var digest []byte
	err := s.pool.QueryRow(ctx, `SELECT digest, updated_at, coalesce(src_topic, ''),
		coalesce(src_partition, -1), coalesce(src_offset, -1)
		FROM state WHERE service = $1 AND entity = $2 AND digest IS NOT NULL`, service, nonNil(entity)).
		Scan(&digest, &st.UpdatedAt, &st.Topic, &st.Partition, &st.Offset)
	if errors.Is(err, pgx.ErrNoRows) {
		return State{}, fmt.Errorf("%w: service %q entity %x", ErrNotFound, service, entity)
	}
	if err != nil {
		return State{}, classify("get", err)
	}
	if len(digest) != canon.Size {
		return State{}, fmt.Errorf("dedup: get: stored digest is %d bytes, want %d", len(digest), canon.Size)
	}
	copy(st.Digest[:], digest)
	return st, nil
}

// Reset deletes the state of the given entities of service, or of the whole
// service when none is given, and returns how many identities it removed.
// Their next records are forwarded: use it to re-deliver on purpose. It
// runs in batches (see ResetEntities and ResetService).
func (s *Store) Reset(ctx context.Context, service string, entities ...[]byte) (int64, error) {
	if len(entities) == 0 {
		return s.ResetService(ctx, service)
	}
	return s.ResetEntities(ctx, service, entities)
}

// pruneBatch bounds each step of PruneState, so pruning never holds many
// locks or one long transaction.
const pruneBatch = 10000

// The steps of PruneState walk the primary key in chunks (keyset
// pagination: one pass over the rows, whatever their age) and delete the
// chunk's rows older than the cutoff. There is no index on updated_at: it
// would cost every decided record an index insertion (no HOT update).
// Rows locked by a Decide in progress are skipped: they are being written
// now, so they are not old.
const (
	sqlPruneChunk = `WITH chunk AS (
			SELECT service, entity FROM state WHERE %s ORDER BY service, entity LIMIT $3),
		doomed AS (
			SELECT s.service, s.entity FROM state s JOIN chunk c ON s.service = c.service AND s.entity = c.entity
			WHERE s.updated_at < now() - make_interval(secs => $4) FOR UPDATE OF s SKIP LOCKED),
		gone AS (
			DELETE FROM state s USING doomed d WHERE s.service = d.service AND s.entity = d.entity RETURNING 1)
		SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM chunk), service, entity
		FROM chunk ORDER BY service DESC, entity DESC LIMIT 1`
	pruneFirstService = `service = $1 AND entity >= $2`
	pruneNextService  = `service = $1 AND entity > $2`
	pruneFirstAll     = `(service, entity) >= ($1, $2)` // from ('', ''): every row
	pruneNextAll      = `(service, entity) > ($1, $2)`
)

// Count returns the number of identities of service with a stored state.
// It reads only that service's part of the primary key, unlike Stats, which
// reads the whole table.
func (s *Store) Count(ctx context.Context, service string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM state WHERE service = $1 AND digest IS NOT NULL`, service).Scan(&n)
	return n, classify("count", err)
}

// Stats returns the row count and age range of every service's state.
func (s *Store) Stats(ctx context.Context) ([]ServiceStats, error) {
	rows, err := s.pool.Query(ctx, `SELECT service, count(*), min(updated_at), max(updated_at)
		FROM state WHERE digest IS NOT NULL GROUP BY service ORDER BY service`)
	if err != nil {
		return nil, classify("stats", err)
	}
	stats, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ServiceStats, error) {
		var st ServiceStats
		err := row.Scan(&st.Service, &st.Rows, &st.Oldest, &st.Newest)
		return st, err
	})
	return stats, classify("stats", err)
}

func (s *Store) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	ct, err := s.pool.Exec(ctx, sql, args...)
	return ct.RowsAffected(), err
}

// Querier is the smallest interface Check needs: *pgx.Conn, pgx.Tx and
// *pgxpool.Pool satisfy it, so Check joins a caller's own transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Check decides one record in a single atomic statement, the per-record
// compare-and-set: it stores d for (service, entity) and returns Forward if
// d differs from the stored digest (or none is stored), else Duplicate and
// changes nothing. Inside the caller's transaction the decision holds only
// if that transaction commits. It keeps no progress or log: for libraries
// and tools; the sidecar uses Decide.
func Check(ctx context.Context, db Querier, service string, entity []byte, d canon.Digest) (Decision, error) {
	if service == "" {
		return 0, fmt.Errorf("%w: empty service", ErrInvalid)
	}
	if d.IsZero() {
		return 0, fmt.Errorf("%w: zero digest", ErrInvalid)
	}
	var one int
	err := db.QueryRow(ctx, sqlCheck, service, nonNil(entity), d[:]).Scan(&one)
	switch {
	case err == nil:
		return Forward, nil
	case errors.Is(err, pgx.ErrNoRows):
		return Duplicate, nil
	}
	return 0, classify("check", err)
}

// Check is Check on the store's pool, in its own autocommit transaction.
func (s *Store) Check(ctx context.Context, service string, entity []byte, d canon.Digest) (Decision, error) {
	return Check(ctx, s.pool, service, entity, d)
}
