package dedup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// OffsetDecision is what the decision log says about one input offset
// (DecisionAt): the decision, if a logged batch still covers the offset,
// and how much of the partition the log still covers.
type OffsetDecision struct {
	// Covered reports that a logged batch covers the offset; the fields
	// below it are valid only then.
	Covered bool
	// Decision is Forward, Invalid, or Duplicate (an offset of a logged
	// batch without an entry was a duplicate).
	Decision Decision
	// Entity is the logged identity, for Forward and Invalid.
	Entity []byte
	// First and End delimit the logged batch [First, End).
	First, End int64
	// LoggedAt is when the batch was decided.
	LoggedAt time.Time

	// HasLog reports that the partition has any logged batch; LogFrom and
	// LogTo are then the lowest first offset and the highest end offset
	// logged. The log is pruned below Kafka's committed offset, so an
	// offset below LogFrom is no longer covered.
	HasLog         bool
	LogFrom, LogTo int64
}

// DecisionAt returns what the decision log of p says about offset. When
// the log no longer covers it (pruned once delivered, or never decided),
// Covered is false and the state is the only witness left (see Get).
func (s *Store) DecisionAt(ctx context.Context, p Partition, offset int64) (OffsetDecision, error) {
	var od OffsetDecision
	var from, to *int64
	err := s.pool.QueryRow(ctx, `SELECT min(first_offset), max(end_offset) FROM decision_log
		WHERE grp = $1 AND topic = $2 AND part = $3`, p.Group, p.Topic, p.Partition).Scan(&from, &to)
	if err != nil {
		return od, s.classify("decision at", err)
	}
	if from != nil {
		od.HasLog, od.LogFrom, od.LogTo = true, *from, *to
	}
	var offsets []int64
	var decisions []int16
	var entities [][]byte
	// The latest batch covering the offset: batches overlap only when an
	// operator moved progress back, and then the later decision counts.
	err = s.pool.QueryRow(ctx, `SELECT first_offset, end_offset, logged_at, offsets, decisions, entities FROM decision_log
		WHERE grp = $1 AND topic = $2 AND part = $3 AND first_offset <= $4 AND end_offset > $4
		ORDER BY logged_at DESC, first_offset DESC LIMIT 1`, p.Group, p.Topic, p.Partition, offset).
		Scan(&od.First, &od.End, &od.LoggedAt, &offsets, &decisions, &entities)
	if errors.Is(err, pgx.ErrNoRows) {
		return od, nil
	}
	if err != nil {
		return od, s.classify("decision at", err)
	}
	if len(offsets) != len(decisions) || len(offsets) != len(entities) {
		return od, fmt.Errorf("dedup: decision at: decision_log row at %d has arrays of different lengths", od.First)
	}
	od.Covered, od.Decision = true, Duplicate
	for i, o := range offsets {
		if o == offset {
			od.Decision, od.Entity = Decision(decisions[i]), entities[i]
			break
		}
	}
	return od, nil
}

// LoggedForward is a forward found in the decision log by LastForward.
type LoggedForward struct {
	Offset   int64
	LoggedAt time.Time
}

// LastForward returns the latest logged forward of entity in p at an
// offset below before, and false when the log (which is kept for
// decision_log.keep after delivery) holds none. It reads the log back from
// before, a page of batches at a time, and stops at the first page that
// holds one: a recent forward costs a few rows, whatever the log keeps.
func (s *Store) LastForward(ctx context.Context, p Partition, entity []byte, before int64) (LoggedForward, bool, error) {
	var best LoggedForward
	found := false
	for upper := before; !found; {
		rows, err := s.pool.Query(ctx, `SELECT first_offset, logged_at, offsets, decisions, entities FROM decision_log
			WHERE grp = $1 AND topic = $2 AND part = $3 AND first_offset < $4
			ORDER BY first_offset DESC LIMIT $5`, p.Group, p.Topic, p.Partition, upper, lastForwardPage)
		if err != nil {
			return LoggedForward{}, false, s.classify("last forward", err)
		}
		var first int64
		var at time.Time
		var offsets []int64
		var decisions []int16
		var entities [][]byte
		n := 0
		_, err = pgx.ForEachRow(rows, []any{&first, &at, &offsets, &decisions, &entities}, func() error {
			n++
			upper = first
			if len(offsets) != len(decisions) || len(offsets) != len(entities) {
				return errors.New("decision_log row with arrays of different lengths")
			}
			for i, o := range offsets {
				if o < before && Decision(decisions[i]) == Forward && bytes.Equal(entities[i], entity) && (!found || o > best.Offset) {
					best, found = LoggedForward{Offset: o, LoggedAt: at}, true
				}
			}
			return nil
		})
		if err != nil {
			return LoggedForward{}, false, s.classify("last forward", err)
		}
		if n < lastForwardPage {
			break
		}
	}
	return best, found, nil
}

// lastForwardPage is how many logged batches LastForward reads at a time.
const lastForwardPage = 16
