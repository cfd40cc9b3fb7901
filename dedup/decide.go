package dedup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The statements of Decide. Round trip 1 locks, round trip 2 writes.
const (
	sqlBegin = `BEGIN ISOLATION LEVEL READ COMMITTED`

	sqlLockProgress = `SELECT epoch, next_offset FROM progress
		WHERE grp = $1 AND topic = $2 AND part = $3 FOR UPDATE`

	// Placeholders make new identities lockable: without a row, two
	// deciders of the same new identity would both see it absent. Sorted
	// insertion keeps the lock order of concurrent batches consistent.
	sqlPlaceholders = `INSERT INTO state (service, entity)
		SELECT $1, e FROM unnest($2::bytea[]) AS u(e) ORDER BY e
		ON CONFLICT (service, entity) DO NOTHING`

	// ORDER BY: locks are taken in entity order, the same in every batch,
	// so concurrent batches do not deadlock.
	sqlLockState = `SELECT entity, digest FROM state
		WHERE service = $1 AND entity = ANY($2::bytea[]) ORDER BY entity FOR UPDATE`

	// An upsert rather than an UPDATE: a row deleted by Reset between the
	// placeholder insert and the lock is written again.
	sqlWriteState = `INSERT INTO state AS s (service, entity, digest, updated_at, src_topic, src_partition, src_offset)
		SELECT $1, e, d, now(), $2, $3, o FROM unnest($4::bytea[], $5::bytea[], $6::bigint[]) AS u(e, d, o)
		ON CONFLICT (service, entity) DO UPDATE SET digest = EXCLUDED.digest, updated_at = EXCLUDED.updated_at,
			src_topic = EXCLUDED.src_topic, src_partition = EXCLUDED.src_partition, src_offset = EXCLUDED.src_offset`

	sqlLog = `INSERT INTO decision_log (grp, topic, part, first_offset, end_offset, offsets, decisions, entities)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (grp, topic, part, first_offset) DO UPDATE SET end_offset = EXCLUDED.end_offset,
			offsets = EXCLUDED.offsets, decisions = EXCLUDED.decisions, entities = EXCLUDED.entities,
			logged_at = now()`
	// ON CONFLICT: a stale row at the same offset can only exist when an
	// operator moved progress back by hand; the new decisions replace it.

	sqlAdvance = `UPDATE progress SET next_offset = $4
		WHERE grp = $1 AND topic = $2 AND part = $3 AND epoch = $5`
)

// Decide decides every record of b in offset order, stores the new state,
// appends the batch to the decision log (unless b.NoLog) and advances the
// partition's progress from b.Start to b.End, all in one transaction (DESIGN
// §2 step 1). It appends one Decision per record, in record order, to
// out[:0] and returns it.
//
// Errors: ErrInvalid for a malformed batch (nothing is sent), ErrFenced when
// the partition's epoch is not b.Epoch or its progress is not b.Start
// (nothing changes), ErrUnavailable when the store is unreachable or the
// commit's outcome is unknown (run recovery). No decision is returned with
// an error.
func (s *Store) Decide(ctx context.Context, b *Batch, out []Decision) ([]Decision, error) {
	out = out[:0]
	if err := validate(b); err != nil {
		return out, err
	}
	p := b.Partition
	// The distinct identities with at least one valid record, sorted: only
	// they are read and locked (an invalid record changes nothing).
	idx := make(map[string]int, len(b.Records))
	entities := make([][]byte, 0, len(b.Records))
	for _, r := range b.Records {
		if r.Invalid {
			continue
		}
		if _, ok := idx[string(r.Entity)]; !ok {
			idx[string(r.Entity)] = 0
			entities = append(entities, nonNil(r.Entity))
		}
	}
	slices.SortFunc(entities, bytes.Compare)
	for i, e := range entities {
		idx[string(e)] = i
	}

	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return out, classify("decide", err)
	}
	// A connection left inside a transaction (after an error) is closed, not
	// reused, by Release.
	defer conn.Release()

	// Round trip 1: begin, lock progress, lock the identities.
	var epoch int64
	var next *int64
	current := make([]*[]byte, len(entities)) // stored digest, nil if absent
	rt1 := &pgx.Batch{}
	rt1.Queue(sqlBegin)
	rt1.Queue(sqlLockProgress, p.Group, p.Topic, p.Partition).QueryRow(func(row pgx.Row) error {
		return row.Scan(&epoch, &next)
	})
	if len(entities) > 0 {
		rt1.Queue(sqlPlaceholders, b.Service, entities)
		rt1.Queue(sqlLockState, b.Service, entities).Query(func(rows pgx.Rows) error {
			var e, d []byte
			_, err := pgx.ForEachRow(rows, []any{&e, &d}, func() error {
				if i, ok := idx[string(e)]; ok && d != nil {
					dd := bytes.Clone(d)
					current[i] = &dd
				}
				return nil
			})
			return err
		})
	}
	err = conn.SendBatch(ctx, rt1).Close()
	if errors.Is(err, pgx.ErrNoRows) {
		s.rollback(ctx, conn.Conn())
		return out, fmt.Errorf("%w: %s/%d group %q: no progress row (Acquire first)", ErrFenced, p.Topic, p.Partition, p.Group)
	}
	if err != nil {
		s.rollback(ctx, conn.Conn())
		return out, classify("decide", err)
	}
	if epoch != b.Epoch || next == nil || *next != b.Start {
		s.rollback(ctx, conn.Conn())
		return out, fmt.Errorf("%w: %s/%d group %q: epoch %d, progress %s; batch has epoch %d, start %d",
			ErrFenced, p.Topic, p.Partition, p.Group, epoch, fmtNext(next), b.Epoch, b.Start)
	}

	// Decide in memory, in offset order: current tracks each identity's
	// digest as the batch goes.
	changed := make([]bool, len(entities))
	srcOffset := make([]int64, len(entities))
	var logOffsets []int64
	var logDecisions []int16
	var logEntities [][]byte
	for _, r := range b.Records {
		d := Invalid
		if !r.Invalid {
			i := idx[string(r.Entity)]
			if cur := current[i]; cur != nil && bytes.Equal(*cur, r.Digest[:]) {
				d = Duplicate
			} else {
				d = Forward
				dd := r.Digest[:]
				current[i] = &dd
				changed[i] = true
				srcOffset[i] = r.Offset
			}
		}
		out = append(out, d)
		if d != Duplicate {
			logOffsets = append(logOffsets, r.Offset)
			logDecisions = append(logDecisions, int16(d))
			logEntities = append(logEntities, r.Entity)
		}
	}

	// Round trip 2: write, log, advance, commit.
	rt2 := &pgx.Batch{}
	var wEnt, wDig [][]byte
	var wOff []int64
	for i, c := range changed {
		if c {
			wEnt = append(wEnt, entities[i])
			wDig = append(wDig, *current[i])
			wOff = append(wOff, srcOffset[i])
		}
	}
	if len(wEnt) > 0 {
		rt2.Queue(sqlWriteState, b.Service, p.Topic, p.Partition, wEnt, wDig, wOff)
	}
	if !b.NoLog && b.End > b.Start { // an empty range has nothing to cover
		if logOffsets == nil { // NOT NULL columns: empty arrays, not NULL
			logOffsets, logDecisions, logEntities = []int64{}, []int16{}, [][]byte{}
		}
		rt2.Queue(sqlLog, p.Group, p.Topic, p.Partition, b.Start, b.End, logOffsets, logDecisions, logEntities)
	}
	var advanced int64
	rt2.Queue(sqlAdvance, p.Group, p.Topic, p.Partition, b.End, b.Epoch).Exec(func(ct pgconn.CommandTag) error {
		advanced = ct.RowsAffected()
		return nil
	})
	rt2.Queue("COMMIT")
	if err := conn.SendBatch(ctx, rt2).Close(); err != nil {
		// Lost before or during COMMIT: the outcome may be either; classify
		// says ErrUnavailable for connection errors, so recovery runs.
		s.rollback(ctx, conn.Conn())
		return out[:0], classify("decide", err)
	}
	if advanced != 1 { // cannot happen: the progress row is locked above
		return out[:0], fmt.Errorf("dedup: decide: progress of %s/%d not advanced", p.Topic, p.Partition)
	}
	return out, nil
}

// nonNil maps a nil key to the empty key: pgx sends nil as NULL, and the
// empty key is a valid identity.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func fmtNext(next *int64) string {
	if next == nil {
		return "unset"
	}
	return fmt.Sprint(*next)
}

// rollback ends a transaction left open by a failed or fenced Decide so the
// connection can be reused; if it cannot, Release discards the connection.
func (s *Store) rollback(ctx context.Context, conn *pgx.Conn) {
	if conn.PgConn().TxStatus() != 'I' && !conn.IsClosed() {
		_, _ = conn.Exec(ctx, "ROLLBACK")
	}
}

// validate rejects a batch that is the caller's bug.
func validate(b *Batch) error {
	switch {
	case b == nil:
		return fmt.Errorf("%w: nil batch", ErrInvalid)
	case b.Service == "":
		return fmt.Errorf("%w: empty service", ErrInvalid)
	case b.End < b.Start:
		return fmt.Errorf("%w: end %d before start %d", ErrInvalid, b.End, b.Start)
	}
	prev := b.Start - 1
	for i, r := range b.Records {
		if r.Offset <= prev || r.Offset >= b.End {
			return fmt.Errorf("%w: record %d: offset %d out of order or outside [%d, %d)", ErrInvalid, i, r.Offset, b.Start, b.End)
		}
		prev = r.Offset
		if !r.Invalid && r.Digest.IsZero() {
			return fmt.Errorf("%w: record %d (offset %d): zero digest", ErrInvalid, i, r.Offset)
		}
	}
	return nil
}
