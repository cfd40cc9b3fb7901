package dedup

import (
	"context"
	"time"
)

// The decision log is kept for a while after delivery (the sidecar's
// decision_log.keep), so that explain answers what was decided for an
// offset from the log itself. Recovery never reads those rows: it reads
// the log from the committed offset (Kafka's, or the one recorded as
// delivered, Progress.Delivered) up, and a kept row ends at or below it.

// sqlPruneKept deletes, among p's oldest logged batches (a bounded walk of
// the primary key from its start), those delivered (ending at or below
// $5) and logged longer ago than $6 seconds. Batches are logged in offset
// order, so the oldest rows are the first to go; a row that is not yet
// prunable stops nothing but its own deletion. Every condition names the
// partition: on Citus a router statement on one shard.
const sqlPruneKept = `DELETE FROM decision_log
	WHERE grp = $1 AND topic = $2 AND part = $3
	AND first_offset IN (SELECT first_offset FROM decision_log
		WHERE grp = $1 AND topic = $2 AND part = $3 ORDER BY first_offset LIMIT $4)
	AND end_offset <= $5
	AND logged_at < now() - make_interval(secs => $6)`

// PruneLogKept deletes up to limit of p's logged batches that end at or
// below delivered (the committed offset: those decisions are delivered)
// and were logged more than keep ago, oldest first, and returns how many
// it deleted (fewer than limit: nothing more is due now). The operator
// skips of the deleted range go with them. Call it in a loop, off the
// decide path: each call is one short statement.
func (s *Store) PruneLogKept(ctx context.Context, p Partition, delivered int64, keep time.Duration, limit int) (int64, error) {
	if limit <= 0 || delivered <= 0 {
		return 0, nil
	}
	ct, err := s.pool.Exec(ctx, sqlPruneKept, p.Group, p.Topic, p.Partition, limit, delivered, keep.Seconds())
	if err != nil {
		return 0, s.classify("prune log", err)
	}
	n := ct.RowsAffected()
	if n > 0 {
		// The skips below the log's new start: nothing explains them now.
		below := delivered
		first, ok, err := s.LogStart(ctx, p)
		if err != nil {
			return n, err
		}
		if ok {
			below = min(below, first)
		}
		if _, err := s.pool.Exec(ctx, `DELETE FROM operator_skips WHERE grp = $1 AND topic = $2 AND part = $3 AND skip_offset < $4`,
			p.Group, p.Topic, p.Partition, below); err != nil {
			return n, s.classify("prune log", err)
		}
	}
	return n, nil
}
