package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dam-dedup/dam/canon"
)

// State is the stored state of one identity.
type State struct {
	Service string
	// Entity is the identity: the entity, or in window mode the message id.
	Entity []byte
	// Mode is the rule whose table holds the state.
	Mode Mode
	// Digest is the digest of the content last forwarded.
	Digest canon.Digest
	// UpdatedAt is when the identity was last forwarded (last-seen: its
	// content changed, or it was refreshed; window: the id was forwarded;
	// version: its version rose).
	UpdatedAt time.Time
	// Version is the highest version forwarded, in version mode.
	Version int64
	// ExpiresAt is when a window-mode id expires; it may be past (expired,
	// not yet deleted by the cleanup): the id then reads as absent.
	ExpiresAt time.Time
	// Topic, Partition and Offset locate the record last forwarded; empty,
	// -1 and -1 when it was set by Check.
	Topic     string
	Partition int32
	Offset    int64
}

// ServiceStats summarises one service's state in one mode's table.
type ServiceStats struct {
	Service string
	Mode    Mode
	Rows    int64
	// Oldest and Newest are the earliest and latest UpdatedAt.
	Oldest, Newest time.Time
	// Expired counts window-mode ids past their expiry, waiting for the
	// cleanup.
	Expired int64
}

// Get returns the state of (service, entity), or ErrNotFound. It looks in
// every mode's table; if more than one holds the identity (the service
// changed mode), the most recently forwarded state is returned.
func (s *Store) Get(ctx context.Context, service string, entity []byte) (State, error) {
	return s.get(ctx, service, entity, -1)
}

// GetMode returns the state of (service, entity) in mode m's table alone,
// or ErrNotFound: the state a route of mode m decides against, which Get
// does not return when another mode's table holds a more recent state of
// the identity (a service that changed mode, and back).
func (s *Store) GetMode(ctx context.Context, service string, entity []byte, m Mode) (State, error) {
	if m > Version {
		return State{}, fmt.Errorf("%w: unknown mode %d", ErrInvalid, m)
	}
	return s.get(ctx, service, entity, int(m))
}

// get is Get restricted to mode's table (-1: every table).
func (s *Store) get(ctx context.Context, service string, entity []byte, mode int) (State, error) {
	st := State{Service: service, Entity: entity}
	var digest []byte
	var expires *time.Time
	err := s.pool.QueryRow(ctx, `SELECT mode, digest, updated_at, version, expires_at,
		coalesce(src_topic, ''), coalesce(src_partition, -1), coalesce(src_offset, -1) FROM (
			SELECT 0 AS mode, digest, updated_at, 0::bigint AS version, NULL::timestamptz AS expires_at,
				src_topic, src_partition, src_offset
			FROM state WHERE service = $1 AND entity = $2 AND digest IS NOT NULL
			UNION ALL SELECT 1, digest, forwarded_at, 0, expires_at, src_topic, src_partition, src_offset
			FROM window_ids WHERE service = $1 AND id = $2
			UNION ALL SELECT 2, digest, updated_at, version, NULL, src_topic, src_partition, src_offset
			FROM versions WHERE service = $1 AND entity = $2) x
		WHERE $3 < 0 OR mode = $3
		ORDER BY updated_at DESC LIMIT 1`, service, nonNil(entity), mode).
		Scan(&st.Mode, &digest, &st.UpdatedAt, &st.Version, &expires, &st.Topic, &st.Partition, &st.Offset)
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
	if expires != nil {
		st.ExpiresAt = *expires
	}
	return st, nil
}

// Reset deletes the state of the given entities (or window-mode ids) of
// service, or of the whole service when none is given, in every mode's
// table, and returns how many identities it removed. Their next records
// are forwarded: use it to re-deliver on purpose. It runs in batches (see
// ResetEntities and ResetService).
func (s *Store) Reset(ctx context.Context, service string, entities ...[]byte) (int64, error) {
	if len(entities) == 0 {
		return s.ResetService(ctx, service)
	}
	return s.ResetEntities(ctx, service, entities)
}

// What walks one service's identities (Count, ResetService, PruneState)
// reads them through a second index of each table, (service, entity) or
// (service, id), whose predicate is always true: migration 007 keys the
// tables identity first, which is what a decide's read wants, and the
// predicate, which these statements repeat and a decide's read does not,
// keeps the planner from ever reading a batch's identities through the
// service's part of that index instead of by key. (PostgreSQL uses a
// partial index only for a query whose conditions imply its predicate.)
const (
	byService   = `octet_length(entity) >= 0`
	byServiceID = `octet_length(id) >= 0`
)

// pruneBatch bounds each step of PruneState, so pruning never holds many
// locks or one long transaction.
const pruneBatch = 10000

// The steps of PruneState walk a table's (service, entity) index in
// chunks (keyset pagination: one pass over the rows, whatever their age)
// and delete the chunk's rows older than the cutoff. There is no index on
// updated_at: it would cost every decided record an index insertion (no
// HOT update). The table (state or versions) is the first verb, the
// condition the second.
//
// One server: the chunk's old rows are locked and deleted by their tids
// (TID scans: a join back to the table by key was planned as a hash join
// over a sequential scan of every service's rows for each chunk). Rows
// locked by a Decide in progress are skipped (SKIP LOCKED): they are being
// written now, so they are not old; a row rewritten since the chunk read
// it is a new version at another tid, which the lock's recheck of the tid
// skips too.
const (
	sqlPruneChunk = `WITH chunk AS (
			SELECT service, entity, ctid AS t FROM %[1]s WHERE %[2]s AND ` + byService + `
			ORDER BY service, entity LIMIT $3),
		doomed AS (
			SELECT ctid AS t FROM %[1]s WHERE ctid = ANY(ARRAY(SELECT t FROM chunk))
			AND updated_at < now() - make_interval(secs => $4) FOR UPDATE SKIP LOCKED),
		gone AS (
			DELETE FROM %[1]s WHERE ctid = ANY(ARRAY(SELECT t FROM doomed)) RETURNING 1)
		SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM chunk), service, entity
		FROM chunk ORDER BY service DESC, entity DESC LIMIT 1`
	pruneFirstService = `service = $1 AND entity >= $2`
	pruneNextService  = `service = $1 AND entity > $2`
	pruneFirstAll     = `(service, entity) >= ($1, $2)` // from ('', ''): every row
	pruneNextAll      = `(service, entity) > ($1, $2)`
)

// sqlPruneChunkCitus is sqlPruneChunk on Citus, which refuses FOR UPDATE
// over several shards: the chunk is read without locks, and the DELETE
// removes the old rows of the key range it spans. A row a Decide holds is
// waited for, and its age checked again once the Decide has committed: one
// it forwarded (updated_at rewritten) is kept, one it only read (a
// duplicate) is still old and goes, as if pruned just after the Decide.
// (Citus evaluates now() on the coordinator: one cutoff for every shard.)
// Each shard deletes walking its (service, entity) index in key order, as
// a Decide locks; a deadlock across shards is broken by Citus and the
// chunk runs again (see runChunk).
const sqlPruneChunkCitus = `WITH chunk AS (
		SELECT service, entity FROM %[1]s WHERE %[2]s AND ` + byService + ` ORDER BY service, entity LIMIT $3),
	last AS (
		SELECT service AS last_service, entity AS last_entity FROM chunk ORDER BY service DESC, entity DESC LIMIT 1),
	gone AS (
		DELETE FROM %[1]s USING last WHERE %[2]s AND (service, entity) <= (last_service, last_entity) AND ` + byService + `
			AND updated_at < now() - make_interval(secs => $4) RETURNING 1)
	SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM chunk), last_service, last_entity FROM last`

// DefaultCleanupBatch is the number of expired window ids PruneWindow and
// CleanupWindow delete per statement when given 0.
const DefaultCleanupBatch = 1000

// sqlExpire deletes up to $2 expired ids of service $1, oldest first along
// the expiry index, in one short autocommit statement. One server: rows a
// Decide holds are skipped (SKIP LOCKED): it is deciding them now.
const sqlExpire = `WITH doomed AS (
		SELECT id FROM window_ids WHERE service = $1 AND expires_at <= now()
		ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
	DELETE FROM window_ids w USING doomed d WHERE w.service = $1 AND w.id = d.id`

// sqlExpireCitus is sqlExpire on Citus, which refuses FOR UPDATE over
// several shards: the ids are chosen without locks, and the DELETE waits
// for those a Decide holds and checks their expiry again once it has
// committed. A Decide forwards an expired id afresh (it reads as absent),
// moving its expiry on: such an id is kept. Each shard probes its ids in
// key order, as a Decide locks them; a deadlock across shards is broken by
// Citus and the statement runs again (see runChunk). Citus evaluates the
// DELETE's now() on the coordinator, whose clock Decide reads; the
// workers' clocks only choose the candidates.
const sqlExpireCitus = `WITH doomed AS (
		SELECT id FROM window_ids WHERE service = $1 AND expires_at <= now()
		ORDER BY expires_at LIMIT $2)
	DELETE FROM window_ids WHERE service = $1 AND id = ANY(ARRAY(SELECT id FROM doomed)) AND expires_at <= now()`

// sqlWindowServices walks the services with window ids, one index probe
// each (a loose index scan, driven from here: Citus runs no recursive
// query over distributed tables, and takes each probe's min on every shard
// at once). sqlFirstWindowService starts it.
const (
	sqlFirstWindowService = `SELECT min(service) FROM window_ids`
	sqlNextWindowService  = `SELECT min(service) FROM window_ids WHERE service > $1`
)

// PruneWindow deletes the expired window-mode ids of service (of every
// service when service is "") by statements of at most WithBatchSize rows
// each (default DefaultCleanupBatch), each its own short transaction, and
// returns how many it deleted. Expired ids already read as absent:
// deleting them only bounds the table. Safe beside deciders and other
// pruners. WithProgress is not called.
func (s *Store) PruneWindow(ctx context.Context, service string, opts ...OpOption) (int64, error) {
	batch := newOpOptions(DefaultCleanupBatch, opts).batch
	if service != "" {
		return s.expire(ctx, s.pool, service, batch)
	}
	var services []string
	for {
		var svc *string
		var err error
		if len(services) == 0 {
			err = s.pool.QueryRow(ctx, sqlFirstWindowService).Scan(&svc)
		} else {
			err = s.pool.QueryRow(ctx, sqlNextWindowService, services[len(services)-1]).Scan(&svc)
		}
		if err != nil {
			return 0, classify("prune window", err)
		}
		if svc == nil {
			break
		}
		services = append(services, *svc)
	}
	var total int64
	for _, svc := range services {
		n, err := s.expire(ctx, s.pool, svc, batch)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// execer is what expire and the chunks of the batched operations need of
// a pool, a connection or a transaction (see inShardOrder).
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

func (s *Store) expire(ctx context.Context, db execer, service string, batch int) (int64, error) {
	if batch <= 0 {
		batch = DefaultCleanupBatch
	}
	var total int64
	for {
		var ct pgconn.CommandTag
		err := s.runChunk(ctx, func(citus bool) error {
			sql := sqlExpire
			if citus {
				sql = sqlExpireCitus
			}
			return s.inShardOrder(ctx, db, citus, func(db execer) error {
				var err error
				ct, err = db.Exec(ctx, sql, service, batch)
				return err
			})
		})
		if err != nil {
			return total, classify("prune window", err)
		}
		total += ct.RowsAffected()
		if ct.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}

// cleanupLockKey is the advisory lock of a service's window cleanup: one
// key space for dam's cleanups, one key per schema and service.
const cleanupLockKey = `hashtext('dam.window_cleanup'), hashtext(current_schema() || '/' || $1)`

// CleanupWindow is PruneWindow of one service run by one session at a time:
// it holds a PostgreSQL advisory lock on the service while it deletes, and
// returns ran false, having deleted nothing, when another session (another
// instance's cleanup) holds it. Each statement still deletes at most
// WithBatchSize rows in its own transaction: the lock only keeps the instances from
// competing for the same rows. (On Citus the lock is the coordinator's:
// instances connected to other nodes do not see it, and compete safely.)
func (s *Store) CleanupWindow(ctx context.Context, service string, opts ...OpOption) (deleted int64, ran bool, err error) {
	batch := newOpOptions(DefaultCleanupBatch, opts).batch
	if service == "" {
		return 0, false, fmt.Errorf("%w: empty service", ErrInvalid)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, false, classify("cleanup window", err)
	}
	defer conn.Release()
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+cleanupLockKey+`)`, service).Scan(&ran); err != nil || !ran {
		return 0, false, classify("cleanup window", err)
	}
	defer func() {
		// Unlock even when ctx is done; if that fails, closing the session
		// releases the lock (Release drops a closed connection).
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock(`+cleanupLockKey+`)`, service); err != nil {
			_ = conn.Conn().Close(uctx)
		}
	}()
	deleted, err = s.expire(ctx, conn, service, batch)
	return deleted, true, err
}

// sqlCount counts service $1's identities along the (service, identity)
// indexes (see byService).
const sqlCount = `SELECT (SELECT count(*) FROM state WHERE service = $1 AND digest IS NOT NULL AND ` + byService + `)
	+ (SELECT count(*) FROM window_ids WHERE service = $1 AND ` + byServiceID + `)
	+ (SELECT count(*) FROM versions WHERE service = $1 AND ` + byService + `)`

// Count returns the number of identities of service with a stored state,
// in every mode's table (window ids not yet deleted included). It reads
// only that service's part of each table's (service, identity) index
// (on Citus, of every shard's), unlike Stats, which reads whole tables.
func (s *Store) Count(ctx context.Context, service string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, sqlCount, service).Scan(&n)
	return n, classify("count", err)
}

// Stats returns the row count and age range of every service's state, one
// entry per service and mode, ordered by service then mode.
func (s *Store) Stats(ctx context.Context) ([]ServiceStats, error) {
	rows, err := s.pool.Query(ctx, `SELECT service, 0, count(*), min(updated_at), max(updated_at), 0
			FROM state WHERE digest IS NOT NULL GROUP BY service
		UNION ALL SELECT service, 1, count(*), min(forwarded_at), max(forwarded_at), count(*) FILTER (WHERE expires_at <= now())
			FROM window_ids GROUP BY service
		UNION ALL SELECT service, 2, count(*), min(updated_at), max(updated_at), 0
			FROM versions GROUP BY service
		ORDER BY 1, 2`)
	if err != nil {
		return nil, classify("stats", err)
	}
	stats, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ServiceStats, error) {
		var st ServiceStats
		err := row.Scan(&st.Service, &st.Mode, &st.Rows, &st.Oldest, &st.Newest, &st.Expired)
		return st, err
	})
	return stats, classify("stats", err)
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
	if err := CheckService(service); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := CheckEntity(entity); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
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
	if _, err := s.Distributed(ctx); err != nil {
		return 0, err
	}
	dec, err := Check(ctx, s.pool, service, entity, d)
	if s.remoteFailure(err) {
		// On Citus, maybe committed: the outcome is unknown (see
		// Store.classify).
		return dec, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return dec, err
}
