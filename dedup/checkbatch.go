package dedup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/canon"
)

// CheckItem is one record to decide with CheckBatch: its identity and the
// digest of its content.
type CheckItem struct {
	Service string
	Entity  []byte
	Digest  canon.Digest
}

// Batcher is the smallest interface CheckBatch needs: pgx.Tx, *pgx.Conn
// and *pgxpool.Pool satisfy it.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// sqlCheck is Check's compare-and-set. The time it writes is the clock
// when the statement runs (not now(), its transaction's start: an item of
// a batch that waited behind another's row lock wrote a time earlier than
// a decide's forward in between, and a refresh_after route then forwarded
// a duplicate too soon), and never earlier than the time stored, as a
// decide's never is. (EXCLUDED.updated_at and GREATEST, not a function:
// Citus allows only immutable functions in DO UPDATE SET.)
const sqlCheck = `INSERT INTO state AS s (service, entity, digest, updated_at) VALUES ($1, $2, $3, clock_timestamp())
		ON CONFLICT (service, entity) DO UPDATE SET digest = EXCLUDED.digest, updated_at = GREATEST(s.updated_at, EXCLUDED.updated_at),
			src_topic = NULL, src_partition = NULL, src_offset = NULL
		WHERE s.digest IS DISTINCT FROM EXCLUDED.digest
		RETURNING 1`

// CheckBatch decides items as if by Check, one after the other in their
// order (an identity repeated in items compares against its previous
// item), in one round trip and one transaction: outside a transaction the
// batch runs in PostgreSQL's implicit transaction of a pipelined batch;
// inside the caller's pgx.Tx the decisions hold only if it commits. It
// appends one Decision per item, in item order, to out[:0].
//
// The statements run sorted by identity (stably, so the order of a
// repeated identity is kept): concurrent batches lock rows in the same
// order and do not deadlock each other. Errors are Check's; no decision is
// returned with an error.
func CheckBatch(ctx context.Context, db Batcher, items []CheckItem, out []Decision) ([]Decision, error) {
	return checkBatch(ctx, db, items, out, nil)
}

// checkBatch is CheckBatch; with shard (the shard of an entity, on Citus:
// see shards.go), the statements run sorted by shard first, then by
// identity: the order in which a routed Decide locks its identities,
// shard after shard, and the maintenance deletes lock theirs
// (inShardOrder). In identity order alone, a check holding an identity of
// a later shard would wait for one of an earlier shard that a Decide
// holds, while the Decide waits for the check's: a distributed deadlock,
// whose victim, the youngest transaction, is the check.
func checkBatch(ctx context.Context, db Batcher, items []CheckItem, out []Decision, shard func([]byte) int) ([]Decision, error) {
	out = out[:0]
	for i, it := range items {
		if err := CheckService(it.Service); err != nil {
			return out, fmt.Errorf("%w: item %d: %w", ErrInvalid, i, err)
		}
		if err := CheckEntity(it.Entity); err != nil {
			return out, fmt.Errorf("%w: item %d: %w", ErrInvalid, i, err)
		}
		if it.Digest.IsZero() {
			return out, fmt.Errorf("%w: item %d: zero digest", ErrInvalid, i)
		}
	}
	if len(items) == 0 {
		return out, nil
	}
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	var shards []int
	if shard != nil {
		shards = make([]int, len(items))
		for i := range items {
			shards[i] = shard(items[i].Entity)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if shards != nil && shards[a] != shards[b] {
			return shards[a] - shards[b]
		}
		if c := strings.Compare(items[a].Service, items[b].Service); c != 0 {
			return c
		}
		return bytes.Compare(items[a].Entity, items[b].Entity)
	})
	decided := make([]Decision, len(items))
	b := &pgx.Batch{}
	for _, i := range order {
		it := &items[i]
		b.Queue(sqlCheck, it.Service, nonNil(it.Entity), it.Digest[:]).QueryRow(func(row pgx.Row) error {
			var one int
			switch err := row.Scan(&one); {
			case err == nil:
				decided[i] = Forward
			case errors.Is(err, pgx.ErrNoRows):
				decided[i] = Duplicate
			default:
				return err
			}
			return nil
		})
	}
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return out, classify("check batch", err)
	}
	return append(out, decided...), nil
}

// CheckBatch is CheckBatch on the store's pool, in a transaction of its
// own. When ctx has a deadline, the transaction's lock_timeout and
// statement_timeout end shortly before it, so that PostgreSQL itself
// aborts a check that would outlive its caller (waiting on a row lock, for
// instance): the error then means that nothing was decided, and an unknown
// outcome is left to a connection lost during the COMMIT. On Citus the
// items are locked in the order of a routed Decide, shard after shard (see
// checkBatch). A deadlock with a concurrent Decide (which locks in another
// order) rolls the batch back; it then runs again.
func (s *Store) CheckBatch(ctx context.Context, items []CheckItem, out []Decision) ([]Decision, error) {
	var err error
	for attempt := 1; ; attempt++ {
		out, err = s.checkBatchTx(ctx, items, out)
		if err == nil || !isRace(err) || attempt == maxDecideAttempts {
			return out, err
		}
	}
}

// serverMargin is the least time by which PostgreSQL gives up a check
// before the caller's deadline: time for its error to come back.
const serverMargin = 100 * time.Millisecond

// abortMargin is how long before a deadline left away PostgreSQL gives up
// a check: a fifth of left (on Citus the coordinator's abort first cancels
// the statements on its workers, round trips that a loaded cluster
// stretches), at least serverMargin, and at most a quarter of left, so
// that a short deadline keeps most of its time.
func abortMargin(left time.Duration) time.Duration {
	return min(max(serverMargin, left/5), left/4)
}

func (s *Store) checkBatchTx(ctx context.Context, items []CheckItem, out []Decision) ([]Decision, error) {
	out = out[:0]
	if len(items) == 0 {
		return out, nil
	}
	// The engine, learned once, tells what an error means (remoteFailure).
	if _, err := s.Distributed(ctx); err != nil {
		return out, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return out, classify("check batch", err)
	}
	defer conn.Release()
	tx := &txBatcher{conn: conn.Conn()}
	tx.pre = append(tx.pre, "BEGIN ISOLATION LEVEL READ COMMITTED")
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline)
		ms := (left - abortMargin(left)).Milliseconds()
		if ms < 1 {
			return out, fmt.Errorf("%w: check batch: %w", ErrUnavailable, context.DeadlineExceeded)
		}
		// SET LOCAL takes no parameters; ms is an integer.
		tx.pre = append(tx.pre, fmt.Sprintf("SET LOCAL lock_timeout = %d", ms), fmt.Sprintf("SET LOCAL statement_timeout = %d", ms))
	}
	var shard func([]byte) int
	if s.engine.Load() == engineDistributed && !s.unrouted {
		if m := s.shardRouting(ctx, conn.Conn()); m != nil {
			shard = m.shard
		}
	}
	out, err = checkBatch(ctx, tx, items, out, shard)
	if err != nil {
		s.rollback(ctx, conn.Conn())
		if s.remoteFailure(err) {
			// On Citus, maybe committed: the outcome is unknown, as after
			// a lost reply (see Store.classify).
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	return out, err
}

// txBatcher wraps a CheckBatch's statements in a transaction of its own:
// pre first, COMMIT last, one round trip.
type txBatcher struct {
	conn *pgx.Conn
	pre  []string
}

func (t *txBatcher) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	all := &pgx.Batch{}
	for _, sql := range t.pre {
		all.Queue(sql)
	}
	all.QueuedQueries = append(all.QueuedQueries, b.QueuedQueries...)
	all.Queue("COMMIT")
	return t.conn.SendBatch(ctx, all)
}
