package dedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Progress is a partition's position in the store, as returned by Acquire.
type Progress struct {
	// Epoch is the new fencing epoch: pass it in every Batch.
	Epoch int64
	// Next is P, the next offset to decide; valid only when HasNext.
	Next int64
	// HasNext is false when P was never set (a new partition): set it with
	// InitProgress.
	HasNext bool
	// Delivered is the committed offset its owner last knew (Batch.Delivered,
	// SetDelivered); -1 when none was recorded. It may lag Kafka's
	// committed offset, never lead it.
	Delivered int64
	// TopicID is the input topic's id bound with BindTopic; zero when none
	// was bound.
	TopicID [16]byte
}

// scanProgress reads epoch, next_offset, delivered and topic_id.
func scanProgress(row pgx.Row) (Progress, error) {
	var pr Progress
	var next, delivered *int64
	var id pgtype.UUID
	if err := row.Scan(&pr.Epoch, &next, &delivered, &id); err != nil {
		return Progress{}, err
	}
	if next != nil {
		pr.Next, pr.HasNext = *next, true
	}
	pr.Delivered = -1
	if delivered != nil {
		pr.Delivered = *delivered
	}
	if id.Valid {
		pr.TopicID = id.Bytes
	}
	return pr, nil
}

// Acquire takes ownership of p: it bumps p's fencing epoch (creating the
// row at epoch 1 with no progress), so that every decider holding an older
// epoch is fenced, and returns the new epoch and P. Call it when p is
// assigned and after any failure whose outcome is unknown.
func (s *Store) Acquire(ctx context.Context, p Partition) (Progress, error) {
	pr, err := scanProgress(s.pool.QueryRow(ctx, `INSERT INTO progress AS p (grp, topic, part, epoch) VALUES ($1, $2, $3, 1)
		ON CONFLICT (grp, topic, part) DO UPDATE SET epoch = p.epoch + 1
		RETURNING epoch, next_offset, delivered, topic_id`, p.Group, p.Topic, p.Partition))
	if err != nil {
		return Progress{}, s.classify("acquire", err)
	}
	return pr, nil
}

// BindTopic records id as the id of p's input topic, if none is recorded
// yet, and returns the id recorded (id itself, or the one bound before: a
// different one means the topic was recreated under the same name). It
// fails with ErrFenced if epoch is not p's current epoch.
//
// Binding a progress P made without an id asserts that the topic is the
// one P was made on: the caller must know it. (The sidecar binds such a
// P only while Kafka holds the group's committed offset, which a deleted
// topic takes with it; otherwise it halts the partition and leaves the
// call to an operator.)
func (s *Store) BindTopic(ctx context.Context, p Partition, epoch int64, id [16]byte) ([16]byte, error) {
	var bound pgtype.UUID
	err := s.pool.QueryRow(ctx, `UPDATE progress SET topic_id = coalesce(topic_id, $5)
		WHERE grp = $1 AND topic = $2 AND part = $3 AND epoch = $4 RETURNING topic_id`,
		p.Group, p.Topic, p.Partition, epoch, pgtype.UUID{Bytes: id, Valid: true}).Scan(&bound)
	if errors.Is(err, pgx.ErrNoRows) {
		return [16]byte{}, fmt.Errorf("%w: %s/%d group %q: epoch %d is not current", ErrFenced, p.Topic, p.Partition, p.Group, epoch)
	}
	if err != nil {
		return [16]byte{}, s.classify("bind topic", err)
	}
	return bound.Bytes, nil
}

// Delivered is a partition and the committed offset known for it.
type Delivered struct {
	Partition Partition
	Offset    int64
}

// SetDelivered records, in one statement, the committed offsets known for
// several partitions (see Progress.Delivered), each only if it is above
// the one recorded. It fences nothing: an offset Kafka accepted is true
// whoever reports it.
func (s *Store) SetDelivered(ctx context.Context, ds []Delivered) error {
	if len(ds) == 0 {
		return nil
	}
	grps, topics := make([]string, len(ds)), make([]string, len(ds))
	parts, offsets := make([]int32, len(ds)), make([]int64, len(ds))
	for i, d := range ds {
		grps[i], topics[i], parts[i], offsets[i] = d.Partition.Group, d.Partition.Topic, d.Partition.Partition, d.Offset
	}
	_, err := s.pool.Exec(ctx, `UPDATE progress AS p SET delivered = GREATEST(p.delivered, u.o)
		FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[]) AS u(g, t, pt, o)
		WHERE p.grp = u.g AND p.topic = u.t AND p.part = u.pt`, grps, topics, parts, offsets)
	return s.classify("set delivered", err)
}

// InitProgress sets P of a partition whose P was never set (Acquire
// returned HasNext false), e.g. from Kafka's committed offset or the start
// policy. It fails with ErrFenced if the epoch moved or P is already set to
// another value.
func (s *Store) InitProgress(ctx context.Context, p Partition, epoch, next int64) error {
	ct, err := s.pool.Exec(ctx, `UPDATE progress SET next_offset = $5
		WHERE grp = $1 AND topic = $2 AND part = $3 AND epoch = $4
		AND (next_offset IS NULL OR next_offset = $5)`, p.Group, p.Topic, p.Partition, epoch, next)
	if err != nil {
		return s.classify("init progress", err)
	}
	if ct.RowsAffected() != 1 {
		return fmt.Errorf("%w: %s/%d group %q: epoch %d is not current or progress is already set",
			ErrFenced, p.Topic, p.Partition, p.Group, epoch)
	}
	return nil
}

// Logged returns the logged decisions of p with offsets in [from, to), in
// offset order, and whether logged batches cover [from, to) without a gap
// (an empty range is covered). Offsets of a covered range without an entry
// were duplicates.
func (s *Store) Logged(ctx context.Context, p Partition, from, to int64) (entries []LoggedDecision, covered bool, err error) {
	rows, err := s.pool.Query(ctx, `SELECT first_offset, end_offset, offsets, decisions, entities, causes FROM decision_log
		WHERE grp = $1 AND topic = $2 AND part = $3 AND end_offset > $4 AND first_offset < $5
		ORDER BY first_offset`, p.Group, p.Topic, p.Partition, from, to)
	if err != nil {
		return nil, false, s.classify("logged", err)
	}
	reached := from // covered up to here
	var first, end int64
	var offsets []int64
	var decisions []int16
	var ents [][]byte
	var causes []*string
	_, err = pgx.ForEachRow(rows, []any{&first, &end, &offsets, &decisions, &ents, &causes}, func() error {
		if first <= reached && end > reached {
			reached = end
		}
		if len(offsets) != len(decisions) || len(offsets) != len(ents) || (causes != nil && len(causes) != len(offsets)) {
			return errors.New("decision_log row with arrays of different lengths")
		}
		for i, o := range offsets {
			if o >= from && o < to {
				e := LoggedDecision{Offset: o, Decision: Decision(decisions[i]), Entity: ents[i]}
				if causes != nil && causes[i] != nil {
					e.Cause = *causes[i]
				}
				entries = append(entries, e)
			}
		}
		return nil
	})
	if err != nil {
		return nil, false, s.classify("logged", err)
	}
	return entries, reached >= to, nil
}

// LogStart returns the first offset of p's decision log (the lowest logged
// batch start), or ok false when p has no log rows. Recovery uses it when
// Kafka has no committed offset for p (it expired): the log still holds
// every decision not yet known delivered, from there.
func (s *Store) LogStart(ctx context.Context, p Partition) (first int64, ok bool, err error) {
	var f *int64
	err = s.pool.QueryRow(ctx, `SELECT min(first_offset) FROM decision_log WHERE grp = $1 AND topic = $2 AND part = $3`,
		p.Group, p.Topic, p.Partition).Scan(&f)
	if err != nil {
		return 0, false, s.classify("log start", err)
	}
	if f == nil {
		return 0, false, nil
	}
	return *f, true, nil
}

// PruneLog deletes p's logged batches that end at or below below (Kafka's
// committed offset C: those decisions are delivered) and returns how many.
func (s *Store) PruneLog(ctx context.Context, p Partition, below int64) (int64, error) {
	ct, err := s.pool.Exec(ctx, `DELETE FROM decision_log
		WHERE grp = $1 AND topic = $2 AND part = $3 AND end_offset <= $4`, p.Group, p.Topic, p.Partition, below)
	if err != nil {
		return 0, s.classify("prune log", err)
	}
	return ct.RowsAffected(), nil
}
