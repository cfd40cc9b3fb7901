package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrSkip: an operator skip was refused: the offset is not where the
// partition stands (not decided yet past P, delivered already, a
// duplicate), or was skipped already. The message says which.
var ErrSkip = errors.New("dedup: skip refused")

// OperatorSkip is an operator's step past one input record (Skip), as the
// store records it.
type OperatorSkip struct {
	Offset int64
	// By is who skipped it, Reason why, At when (the database's clock).
	By, Reason string
	At         time.Time
	// Was is what the record had been decided before the skip: Forward or
	// Invalid for a record decided and not delivered (its decision log
	// entry now says Skipped), zero for a record that was not decided
	// (the partition halted before it: the skip decided it).
	Was Decision
	// Entity is the logged entity, when Was is Forward or Invalid.
	Entity []byte
}

// Skip records that an operator steps past the record at offset of p, so
// that it is never delivered (by and reason are kept as text of at most
// MaxCauseBytes each), and fences p's owner (its epoch is bumped)
// so that the owner plans p again from the store: a running sidecar
// notices the skip of a halted partition and recovers it; a stopped one
// does at its next start. committed is the group's committed offset C in
// Kafka (-1: none).
//
// Only a record not delivered can be skipped: the offset must not be
// below C (without C, below the offset dam last recorded as delivered),
// and must be either P (not decided: the partition halted before deciding
// it; the skip logs [offset, offset+1) as Skipped and moves P past it) or
// below P with a logged forward or dead letter (the partition halted
// delivering it; the skip turns its entry into Skipped, and the replay of
// [C, P) passes over it). It is meant for a halted partition: on one that
// runs, a record already handed to the producer is delivered anyway. A skipped forward's entity keeps the
// state that forward set: reset it (Reset) for its next record to be
// forwarded whatever it holds.
//
// Errors: ErrSkip (refused: the message says why), ErrUnavailable.
func (s *Store) Skip(ctx context.Context, p Partition, offset, committed int64, by, reason string) (OperatorSkip, error) {
	sk := OperatorSkip{Offset: offset, By: logCause(by), Reason: logCause(reason)}
	refuse := func(format string, args ...any) (OperatorSkip, error) {
		return OperatorSkip{}, fmt.Errorf("%w: %s/%d offset %d: %s", ErrSkip, p.Topic, p.Partition, offset, fmt.Sprintf(format, args...))
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var next, delivered *int64
		err := tx.QueryRow(ctx, `SELECT next_offset, delivered FROM progress
			WHERE grp = $1 AND topic = $2 AND part = $3 FOR UPDATE`, p.Group, p.Topic, p.Partition).Scan(&next, &delivered)
		if errors.Is(err, pgx.ErrNoRows) || err == nil && next == nil {
			_, err = refuse("dam has no progress for this partition in group %q: nothing was decided there", p.Group)
			return err
		}
		if err != nil {
			return err
		}
		var prior OperatorSkip
		found, err := scanSkip(tx.QueryRow(ctx, sqlSkipAt, p.Group, p.Topic, p.Partition, offset), &prior)
		if err != nil {
			return err
		}
		if found {
			_, err = refuse("skipped already, by %s at %s (%s)", prior.By, prior.At.UTC().Format(time.RFC3339), prior.Reason)
			return err
		}
		switch {
		case committed >= 0 && offset < committed:
			_, err = refuse("below the group's committed offset %d: delivered already, nothing to skip", committed)
			return err
		case committed < 0 && delivered != nil && offset < *delivered:
			_, err = refuse("below offset %d, which dam recorded as delivered: nothing to skip", *delivered)
			return err
		case offset > *next:
			_, err = refuse("not decided yet, and the partition's progress is %d: only the record a halted partition stands at can be skipped", *next)
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&sk.At); err != nil {
			return err
		}
		if offset == *next {
			// Not decided: decide it as skipped, logged like a batch of its
			// own, and move P past it.
			if _, err := tx.Exec(ctx, sqlLog, p.Group, p.Topic, p.Partition, offset, offset+1,
				[]int64{offset}, []int16{int16(Skipped)}, [][]byte{{}}, sk.At, nil); err != nil {
				return err
			}
		} else {
			var first int64
			var offsets []int64
			var decisions []int16
			var entities [][]byte
			err := tx.QueryRow(ctx, `SELECT first_offset, offsets, decisions, entities FROM decision_log
				WHERE grp = $1 AND topic = $2 AND part = $3 AND first_offset <= $4 AND end_offset > $4
				ORDER BY logged_at DESC, first_offset DESC LIMIT 1 FOR UPDATE`, p.Group, p.Topic, p.Partition, offset).
				Scan(&first, &offsets, &decisions, &entities)
			if errors.Is(err, pgx.ErrNoRows) {
				_, err = refuse("decided (the progress is %d), but no logged batch covers it: there is nothing dam would deliver to skip", *next)
				return err
			}
			if err != nil {
				return err
			}
			if len(offsets) != len(decisions) || len(offsets) != len(entities) {
				return fmt.Errorf("decision_log row at %d has arrays of different lengths", first)
			}
			i := -1
			for k, o := range offsets {
				if o == offset {
					i = k
				}
			}
			if i < 0 {
				_, err = refuse("decided a duplicate (the logged batch from %d has no entry for it): it is not delivered, nothing to skip", first)
				return err
			}
			sk.Was, sk.Entity = Decision(decisions[i]), entities[i]
			decisions[i] = int16(Skipped)
			if _, err := tx.Exec(ctx, `UPDATE decision_log SET decisions = $5
				WHERE grp = $1 AND topic = $2 AND part = $3 AND first_offset = $4`,
				p.Group, p.Topic, p.Partition, first, decisions); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO operator_skips (grp, topic, part, skip_offset, skipped_by, reason, skipped_at, was, entity)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, p.Group, p.Topic, p.Partition, offset,
			sk.By, sk.Reason, sk.At, int16(sk.Was), sk.Entity); err != nil {
			return err
		}
		// Fence the owner: its next store call fails, and it plans the
		// partition again from what is recorded now.
		_, err = tx.Exec(ctx, `UPDATE progress SET epoch = epoch + 1, next_offset = GREATEST(next_offset, $4)
			WHERE grp = $1 AND topic = $2 AND part = $3`, p.Group, p.Topic, p.Partition, offset+1)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrSkip) {
			return OperatorSkip{}, err
		}
		return OperatorSkip{}, s.classify("skip", err)
	}
	return sk, nil
}

const sqlSkipAt = `SELECT skip_offset, skipped_by, reason, skipped_at, was, entity FROM operator_skips
	WHERE grp = $1 AND topic = $2 AND part = $3 AND skip_offset = $4`

func scanSkip(row pgx.Row, sk *OperatorSkip) (bool, error) {
	var was int16
	err := row.Scan(&sk.Offset, &sk.By, &sk.Reason, &sk.At, &was, &sk.Entity)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	sk.Was = Decision(was)
	return true, nil
}

// SkipAt returns the operator skip of p's record at offset, if one is
// recorded (they are kept as long as the decision log: decision_log.keep).
func (s *Store) SkipAt(ctx context.Context, p Partition, offset int64) (OperatorSkip, bool, error) {
	var sk OperatorSkip
	found, err := scanSkip(s.pool.QueryRow(ctx, sqlSkipAt, p.Group, p.Topic, p.Partition, offset), &sk)
	if err != nil {
		return OperatorSkip{}, false, s.classify("skip at", err)
	}
	return sk, found, nil
}
