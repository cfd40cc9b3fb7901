package dedup

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// ReadProgress returns p's current epoch and P without taking ownership.
// A decider uses it to learn the outcome of a batch whose reply was lost:
// P at the batch's End means it committed, P at its Start means it did
// not, another epoch means another owner. (Acquire would bump the epoch and
// could fence a legitimate new owner from a zombie.) A partition never
// acquired has epoch 0.
func (s *Store) ReadProgress(ctx context.Context, p Partition) (Progress, error) {
	pr, err := scanProgress(s.pool.QueryRow(ctx, `SELECT epoch, next_offset, delivered, topic_id FROM progress WHERE grp = $1 AND topic = $2 AND part = $3`,
		p.Group, p.Topic, p.Partition))
	if errors.Is(err, pgx.ErrNoRows) {
		return Progress{Delivered: -1}, nil
	}
	if err != nil {
		return Progress{}, s.classify("read progress", err)
	}
	return pr, nil
}

// SettledProgress is ReadProgress after every transaction that holds p's
// progress row has ended: it waits for a decide whose commit is still in
// flight instead of reading the value from before it. A decider uses it to
// learn the outcome of its own batch after an error. On Citus a commit is
// two-phase: a worker may hold the batch prepared, neither committed nor
// rolled back, until the coordinator (or, after a crash, its recovery of
// prepared transactions) finishes it; ReadProgress would read the old P
// meanwhile, and the batch would be decided again over a commit. The wait
// is bounded by lock_timeout (on Citus, statement_timeout): an error says
// the outcome is not known yet.
func (s *Store) SettledProgress(ctx context.Context, p Partition) (Progress, error) {
	pr, err := scanProgress(s.pool.QueryRow(ctx, `SELECT epoch, next_offset, delivered, topic_id FROM progress
		WHERE grp = $1 AND topic = $2 AND part = $3 FOR SHARE`, p.Group, p.Topic, p.Partition))
	if errors.Is(err, pgx.ErrNoRows) {
		return Progress{Delivered: -1}, nil
	}
	if err != nil {
		return Progress{}, s.classify("read progress", err)
	}
	return pr, nil
}

// SettledVersion returns the version stored for (service, entity) in
// version mode's table once every transaction writing its row has ended
// (found false when it has none), as SettledProgress does for P. A replay
// reads it to tell which of an owed entity's records to deliver: on Citus
// the batch that forwarded the stored version may still be prepared on the
// entity's worker, and a plain read (GetMode) would return the version
// before it, delivering an older record than the adapter is owed. When
// that batch created the row, no read sees it, nor waits for it: the claim
// of Decide (an insert that meets the row in the unique index) waits for
// it, in a transaction rolled back afterwards, so nothing is written.
func (s *Store) SettledVersion(ctx context.Context, service string, entity []byte) (version int64, found bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlClaimVersion, service, [][]byte{nonNil(entity)}); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT version FROM versions WHERE service = $1 AND entity = $2 AND digest <> ''`,
			service, nonNil(entity)).Scan(&version)
	})
	// BeginFunc commits when the function succeeds: a found row was only
	// locked, and the placeholder of a missing one fails the read (no
	// rows), which rolls it back.
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, s.classify("settled version", err)
	}
	return version, true, nil
}
