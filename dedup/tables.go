package dedup

import (
	"bytes"
	"time"

	"github.com/jackc/pgx/v5"
)

// The decision rules. Each mode has its own table and, per Decide
// transaction, a ruleTxn: it queues the statement locking the batch's
// identities that exist (round trip 1), decides each record in offset order
// in memory, and queues the statements writing what changed (round trip 2).
// In every table, identities the lock found are rewritten by an upsert,
// identities it did not find are written by a plain INSERT whose unique
// violation, if a concurrent decider created one of them meanwhile, rolls
// the transaction back to be run again (see Decide). Existing rows are
// locked in key order, the same in every batch, so concurrent batches do
// not deadlock on them.

// ruleTxn is one mode's part of one Decide transaction. Identities are
// indexed as Decide's sorted entities.
type ruleTxn interface {
	// queueLock queues the statement that locks and reads the stored state
	// of entities (those that exist).
	queueLock(rt1 *pgx.Batch, service string, entities [][]byte, idx map[string]int)
	// decide decides r, of identity i, at now, and updates the identity's
	// state in memory.
	decide(i int, r *Record, now time.Time) Decision
	// queueWrites queues the statements writing the changed identities.
	queueWrites(rt2 *pgx.Batch, service string, p Partition, entities [][]byte, now time.Time)
}

func newRuleTxn(r Rule, n int) ruleTxn {
	switch r.Mode {
	case Window:
		return &windowTxn{rule: r, rows: newRows(n), expires: make([]time.Time, n), extended: make([]bool, n)}
	case Version:
		return &versionTxn{rows: newRows(n), version: make([]int64, n), has: make([]bool, n)}
	}
	t := &lastSeenTxn{refresh: r.RefreshAfter, rows: newRows(n), current: make([]*[]byte, n)}
	if t.refresh > 0 {
		t.forwarded = make([]time.Time, n)
	}
	return t
}

// rows is what every rule keeps per identity: whether the lock found a row,
// whether the batch changed it, and the digest and offset of the record
// that did.
type rows struct {
	found, changed []bool
	digests        [][]byte
	offsets        []int64
}

func newRows(n int) rows {
	return rows{found: make([]bool, n), changed: make([]bool, n), digests: make([][]byte, n), offsets: make([]int64, n)}
}

// set records that r changed identity i.
func (rs *rows) set(i int, r *Record) {
	rs.changed[i] = true
	rs.digests[i] = r.Digest[:]
	rs.offsets[i] = r.Offset
}

// split returns the changed identities' indexes, those the lock found
// (rewritten) apart from the new ones (inserted).
func (rs *rows) split() (found, added []int) {
	for i, c := range rs.changed {
		switch {
		case !c:
		case rs.found[i]:
			found = append(found, i)
		default:
			added = append(added, i)
		}
	}
	return found, added
}

// pick returns s's elements at the indexes is.
func pick[T any](s []T, is []int) []T {
	out := make([]T, len(is))
	for k, i := range is {
		out[k] = s[i]
	}
	return out
}

// Last-seen: table state.
const (
	sqlLockState = `SELECT entity, digest FROM state
		WHERE service = $1 AND entity = ANY($2::bytea[]) ORDER BY entity FOR UPDATE`
	// With refresh_after, also when each identity was last forwarded.
	sqlLockStateRefresh = `SELECT entity, digest, updated_at FROM state
		WHERE service = $1 AND entity = ANY($2::bytea[]) ORDER BY entity FOR UPDATE`

	// An upsert keeps the statement correct even for a row that a NULL
	// digest marks absent.
	sqlWriteState = `INSERT INTO state AS s (service, entity, digest, updated_at, src_topic, src_partition, src_offset)
		SELECT $1, e, d, $7, $2, $3, o FROM unnest($4::bytea[], $5::bytea[], $6::bigint[]) AS u(e, d, o)
		ON CONFLICT (service, entity) DO UPDATE SET digest = EXCLUDED.digest, updated_at = EXCLUDED.updated_at,
			src_topic = EXCLUDED.src_topic, src_partition = EXCLUDED.src_partition, src_offset = EXCLUDED.src_offset`

	sqlInsertState = `INSERT INTO state (service, entity, digest, updated_at, src_topic, src_partition, src_offset)
		SELECT $1, e, d, $7, $2, $3, o FROM unnest($4::bytea[], $5::bytea[], $6::bigint[]) AS u(e, d, o) ORDER BY e`
)

// lastSeenTxn decides by content: forward iff the digest differs from the
// stored one or, with refresh, when the identity was last forwarded more
// than refresh ago.
type lastSeenTxn struct {
	refresh time.Duration
	rows
	current   []*[]byte   // stored digest, nil if absent
	forwarded []time.Time // when last forwarded; only with refresh
}

func (t *lastSeenTxn) queueLock(rt1 *pgx.Batch, service string, entities [][]byte, idx map[string]int) {
	sql := sqlLockState
	if t.refresh > 0 {
		sql = sqlLockStateRefresh
	}
	rt1.Queue(sql, service, entities).Query(func(rs pgx.Rows) error {
		var e, d []byte
		var at time.Time
		dest := []any{&e, &d}
		if t.refresh > 0 {
			dest = append(dest, &at)
		}
		_, err := pgx.ForEachRow(rs, dest, func() error {
			if i, ok := idx[string(e)]; ok {
				t.found[i] = true
				if d != nil {
					dd := bytes.Clone(d)
					t.current[i] = &dd
				}
				if t.refresh > 0 {
					t.forwarded[i] = at
				}
			}
			return nil
		})
		return err
	})
}

func (t *lastSeenTxn) decide(i int, r *Record, now time.Time) Decision {
	d := Forward
	if cur := t.current[i]; cur != nil && bytes.Equal(*cur, r.Digest[:]) {
		if t.refresh <= 0 || now.Sub(t.forwarded[i]) <= t.refresh {
			return Duplicate
		}
		d = Refresh
	}
	dd := r.Digest[:]
	t.current[i] = &dd
	t.set(i, r)
	if t.refresh > 0 {
		t.forwarded[i] = now
	}
	return d
}

func (t *lastSeenTxn) queueWrites(rt2 *pgx.Batch, service string, p Partition, entities [][]byte, now time.Time) {
	found, added := t.split()
	for _, w := range []struct {
		sql string
		is  []int
	}{{sqlWriteState, found}, {sqlInsertState, added}} {
		if len(w.is) > 0 {
			rt2.Queue(w.sql, service, p.Topic, p.Partition, pick(entities, w.is), pick(t.digests, w.is), pick(t.offsets, w.is), now)
		}
	}
}

// Window: table window_ids.
const (
	sqlLockWindow = `SELECT id, expires_at FROM window_ids
		WHERE service = $1 AND id = ANY($2::bytea[]) ORDER BY id FOR UPDATE`

	// A found row had expired: the id is forwarded afresh.
	sqlWriteWindow = `INSERT INTO window_ids AS w (service, id, expires_at, forwarded_at, digest, src_topic, src_partition, src_offset)
		SELECT $1, i, $8, $7, d, $2, $3, o FROM unnest($4::bytea[], $5::bytea[], $6::bigint[]) AS u(i, d, o)
		ON CONFLICT (service, id) DO UPDATE SET expires_at = EXCLUDED.expires_at, forwarded_at = EXCLUDED.forwarded_at,
			digest = EXCLUDED.digest, src_topic = EXCLUDED.src_topic, src_partition = EXCLUDED.src_partition,
			src_offset = EXCLUDED.src_offset`

	sqlInsertWindow = `INSERT INTO window_ids (service, id, expires_at, forwarded_at, digest, src_topic, src_partition, src_offset)
		SELECT $1, i, $8, $7, d, $2, $3, o FROM unnest($4::bytea[], $5::bytea[], $6::bigint[]) AS u(i, d, o) ORDER BY i`

	// Sliding: the repeated ids' windows restart now.
	sqlExtendWindow = `UPDATE window_ids SET expires_at = $3 WHERE service = $1 AND id = ANY($2::bytea[])`
)

// windowTxn decides by message id: forward iff the id is absent or its
// window has expired (now >= its expiry).
type windowTxn struct {
	rule Rule
	rows
	expires  []time.Time // zero if absent
	extended []bool      // a sliding duplicate moved the expiry of a row the batch did not forward
}

func (t *windowTxn) queueLock(rt1 *pgx.Batch, service string, entities [][]byte, idx map[string]int) {
	rt1.Queue(sqlLockWindow, service, entities).Query(func(rs pgx.Rows) error {
		var id []byte
		var exp time.Time
		_, err := pgx.ForEachRow(rs, []any{&id, &exp}, func() error {
			if i, ok := idx[string(id)]; ok {
				t.found[i], t.expires[i] = true, exp
			}
			return nil
		})
		return err
	})
}

func (t *windowTxn) decide(i int, r *Record, now time.Time) Decision {
	if !t.expires[i].IsZero() && now.Before(t.expires[i]) {
		if t.rule.Sliding {
			t.expires[i] = now.Add(t.rule.Window)
			t.extended[i] = !t.changed[i]
		}
		return Duplicate
	}
	t.expires[i] = now.Add(t.rule.Window)
	t.extended[i] = false
	t.set(i, r)
	return Forward
}

func (t *windowTxn) queueWrites(rt2 *pgx.Batch, service string, p Partition, entities [][]byte, now time.Time) {
	found, added := t.split()
	// Every identity the batch forwarded or extended expires at the same
	// time: one decision time per batch.
	exp := now.Add(t.rule.Window)
	for _, w := range []struct {
		sql string
		is  []int
	}{{sqlWriteWindow, found}, {sqlInsertWindow, added}} {
		if len(w.is) > 0 {
			rt2.Queue(w.sql, service, p.Topic, p.Partition, pick(entities, w.is), pick(t.digests, w.is), pick(t.offsets, w.is), now, exp)
		}
	}
	var ext [][]byte
	for i, e := range t.extended {
		if e {
			ext = append(ext, entities[i])
		}
	}
	if len(ext) > 0 {
		rt2.Queue(sqlExtendWindow, service, ext, exp)
	}
}

// Version: table versions.
const (
	sqlLockVersion = `SELECT entity, version FROM versions
		WHERE service = $1 AND entity = ANY($2::bytea[]) ORDER BY entity FOR UPDATE`

	sqlWriteVersion = `INSERT INTO versions AS v (service, entity, version, digest, updated_at, src_topic, src_partition, src_offset)
		SELECT $1, e, n, d, $8, $2, $3, o FROM unnest($4::bytea[], $5::bigint[], $6::bytea[], $7::bigint[]) AS u(e, n, d, o)
		ON CONFLICT (service, entity) DO UPDATE SET version = EXCLUDED.version, digest = EXCLUDED.digest,
			updated_at = EXCLUDED.updated_at, src_topic = EXCLUDED.src_topic, src_partition = EXCLUDED.src_partition,
			src_offset = EXCLUDED.src_offset`

	sqlInsertVersion = `INSERT INTO versions (service, entity, version, digest, updated_at, src_topic, src_partition, src_offset)
		SELECT $1, e, n, d, $8, $2, $3, o FROM unnest($4::bytea[], $5::bigint[], $6::bytea[], $7::bigint[]) AS u(e, n, d, o) ORDER BY e`
)

// versionTxn decides by version: forward iff above the stored version;
// equal is a duplicate, below is stale.
type versionTxn struct {
	rows
	version []int64
	has     []bool // a version is stored (or set by the batch)
}

func (t *versionTxn) queueLock(rt1 *pgx.Batch, service string, entities [][]byte, idx map[string]int) {
	rt1.Queue(sqlLockVersion, service, entities).Query(func(rs pgx.Rows) error {
		var e []byte
		var v int64
		_, err := pgx.ForEachRow(rs, []any{&e, &v}, func() error {
			if i, ok := idx[string(e)]; ok {
				t.found[i], t.has[i], t.version[i] = true, true, v
			}
			return nil
		})
		return err
	})
}

func (t *versionTxn) decide(i int, r *Record, _ time.Time) Decision {
	switch {
	case t.has[i] && r.Version == t.version[i]:
		return Duplicate
	case t.has[i] && r.Version < t.version[i]:
		return Stale
	}
	t.has[i], t.version[i] = true, r.Version
	t.set(i, r)
	return Forward
}

func (t *versionTxn) queueWrites(rt2 *pgx.Batch, service string, p Partition, entities [][]byte, now time.Time) {
	found, added := t.split()
	for _, w := range []struct {
		sql string
		is  []int
	}{{sqlWriteVersion, found}, {sqlInsertVersion, added}} {
		if len(w.is) > 0 {
			rt2.Queue(w.sql, service, p.Topic, p.Partition, pick(entities, w.is), pick(t.version, w.is),
				pick(t.digests, w.is), pick(t.offsets, w.is), now)
		}
	}
}
