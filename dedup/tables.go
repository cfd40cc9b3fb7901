package dedup

import (
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dam-dedup/dam/canon"
)

// Each mode's table in a Decide transaction. Per transaction, a tableTxn
// queues the statements reading the batch's identities' state (round trip
// 1); Decide then runs the rule (Rule.Decide, rules.go) on each record in
// offset order, in memory, and the tableTxn queues the statements writing
// what changed (round trip 2).
//
// Two shapes, one per engine (Store.Distributed):
//
//   - One server: a plain SELECT reads the identities that exist, with
//     where each row version is (ctid) and which transaction wrote it
//     (xmin). Only what changes is written: each rewrite goes to its row
//     by tid on condition that its xmin is still the one read (a row
//     updated, deleted or moved since is not that version any more), and
//     the count is checked; a row changed meanwhile rolls the transaction
//     back to be run again (see Decide), and that run locks what it reads
//     (SELECT ... FOR UPDATE, in key order), so a batch that lost once
//     cannot lose again. A duplicate writes nothing: it is decided on the
//     state as the read found it, its linearization point. Identities the
//     read did not find are written by a plain INSERT whose unique
//     violation, if a concurrent decider created one of them meanwhile,
//     rolls the transaction back the same way. New identities cost no
//     placeholder row, duplicates no row lock (a lock is a write: WAL and
//     a dirtied page for a record that changes nothing).
//   - Citus refuses SELECT ... FOR UPDATE over several shards, and a batch's
//     identities are spread over every shard. There, a claim locks by
//     writing: INSERT ... ON CONFLICT DO UPDATE ... WHERE false inserts a
//     placeholder row for each new identity and locks each existing one
//     without changing it, then a plain SELECT reads them all, in the same
//     transaction, after the locks are held. A placeholder reads as no
//     state (state: NULL digest; window_ids and versions: empty digest),
//     and is overwritten before commit, since a new identity's first
//     record is always forwarded. A concurrent decider of a new identity
//     waits on the placeholder instead of losing a race; a deadlock between
//     shards is broken by Citus and run again (see Decide). That is the
//     shape of a decide that cannot be grouped by shard. Grouped
//     (shards.go), a decide's first run is the one-server shape by router
//     statements: per shard group a plain SELECT reads the rows (ctid and
//     xmin included), then, shard after shard, per group the new
//     identities by a multi-row INSERT ... VALUES ... ON CONFLICT DO
//     NOTHING that counts the rows it inserted, and the rewrite by row
//     version routed by the group's keys (routedUpdate). A row changed or
//     an identity created meanwhile fails a count: a lost race, and the
//     run after it claims, by router statements as well: per group the
//     placeholders by INSERT ... ON CONFLICT DO NOTHING, then a SELECT ...
//     FOR UPDATE locks and reads every identity of the group (placeholders
//     included), then an UPDATE writes those that changed. Both runs lock
//     in the same order: group by group, new identities before existing
//     rows, each in key order (but for the sliding windows' extensions,
//     which a first run writes after every group: a deadlock there is
//     broken by the server and the batch runs again). A duplicate so costs
//     a worker one index probe in the first run, not a placeholder's probe
//     and a row lock. A row whose last change is still prepared on its
//     worker makes the first run a lost race (sqlInDoubt).
//
// Both shapes read the same state and run the same rule; their writes set
// the same columns.

// tableTxn is one mode's table in one Decide transaction.
type tableTxn interface {
	// queueRead queues the statements that read ids's entities' stored
	// state (of those that exist) into ids, locking them in the shape
	// ids.claim and ids.lock say.
	queueRead(rt1 *pgx.Batch, service string, ids *identities)
	// queueWrites queues the statements writing ids's changed identities.
	queueWrites(rt2 *pgx.Batch, service string, p Partition, ids *identities, now time.Time)
}

func newTableTxn(r Rule) tableTxn {
	switch r.Mode {
	case Window:
		return windowTxn{window: r.Window}
	case Version:
		return versionTxn{}
	}
	return lastSeenTxn{refresh: r.RefreshAfter > 0}
}

// identities are the distinct identities of a batch, in key order (the
// order in which every statement locks or writes them: see identify),
// with their state as the batch goes.
type identities struct {
	rule Rule
	// claim: the identities are locked by a claim (Citus's shape): every
	// one has a row, so every changed one is written by an upsert.
	claim bool
	// lock: one server, the read locks the rows (a run after a lost race).
	lock bool
	// groups, with claim: the claim is routed (shards.go): the identities'
	// indexes by shard, each group read, locked and rewritten by its own
	// statements. group is each identity's group (groupOf); rows counts
	// the rows the groups' reads locked.
	groups [][]int
	group  []int32
	rows   int
	// inDoubt: a routed first run read a row whose last change is
	// prepared on its worker (sqlInDoubt): the run is a lost race.
	inDoubt  bool
	entities [][]byte
	index    entityIndex // finds an entity in entities
	// state is each identity's state: as the read found it, then as each
	// of its records leaves it.
	state []Stored
	// found: the read found a row (rewritten; the others are inserted).
	found []bool
	// tids and xmins: one server, where the read found each row version
	// (its ctid) and the transaction that wrote it. The rewrite goes
	// straight to it, without the index probe and the uniqueness check of
	// an upsert (a quarter of the server's CPU per decided record), if it
	// is still that version.
	tids  []pgtype.TID
	xmins []uint32
	// changed: a record of the batch forwarded the identity; offsets holds
	// that record's offset.
	changed []bool
	offsets []int64
	// touched: a record changed the state without forwarding it (a sliding
	// window's expiry), and none of the batch forwarded it.
	touched []bool
	// sources, when the batch asks for them (Batch.Sources), is where each
	// identity's state came from: as read, then the batch's record that
	// last forwarded it (topic and partition the batch's). src is the
	// read's scratch.
	sources []Source
	part    Partition
	src     Source
}

func newIdentities(rule Rule, entities [][]byte, index entityIndex) *identities {
	n := len(entities)
	return &identities{rule: rule, entities: entities, index: index, state: make([]Stored, n),
		found: make([]bool, n), changed: make([]bool, n), offsets: make([]int64, n), touched: make([]bool, n)}
}

// read records the state read for entity e, and which row version (a
// claim reads none). It keeps nothing of e.
func (ids *identities) read(e []byte, st Stored, v rowVersion) {
	ids.inDoubt = ids.inDoubt || v.inDoubt
	if i, ok := ids.index.find(e); ok {
		ids.found[i], ids.state[i] = true, st
		if ids.sources != nil && st.Found {
			ids.sources[i] = ids.src
		}
		if !ids.claim {
			if ids.tids == nil {
				ids.tids, ids.xmins = make([]pgtype.TID, len(ids.entities)), make([]uint32, len(ids.entities))
			}
			ids.tids[i], ids.xmins[i] = v.tid, v.xmin
		}
	}
}

// rowVersion is where a row version is and the transaction that wrote it.
type rowVersion struct {
	tid  pgtype.TID
	xmin uint32
	// inDoubt: a routed first run's read found the row's last change
	// prepared on its worker (see sqlInDoubt).
	inDoubt bool
}

// dest adds the row version's columns (ctid, xmin) to a read's, on one
// server and in a routed first run.
func (v *rowVersion) dest(ids *identities, dest []any) []any {
	if ids.claim {
		return dest
	}
	return append(dest, &v.tid, &v.xmin)
}

// doubtDest adds, in a routed first run, whether the row is in doubt: the
// column sqlInDoubt adds at the end of the read's select list (before the
// sources', sourceSQL).
func (v *rowVersion) doubtDest(ids *identities, dest []any) []any {
	if ids.claim || ids.groups == nil {
		return dest
	}
	return append(dest, &v.inDoubt)
}

// sqlInDoubt is the column a routed first run's read adds after xmin:
// whether the transaction that last changed the row (xmax) is prepared on
// the row's worker. Citus commits a decide that wrote several workers in
// two phases, and a worker whose COMMIT PREPARED was lost (a connection
// cut) holds the transaction prepared until the coordinator's recovery
// commits it (citus.recover_2pc_interval), although the decide has
// returned committed: a plain read there sees the row as before it. A
// write would wait for it, but a duplicate writes nothing, and would be
// decided on the old content. Such a row makes the run a lost race; the
// claim after it locks, and so waits for the prepared transaction (or
// ends as unavailable, retried). The array is built once per statement,
// on the worker (Citus sends a FROM-less sublink with the task; a FROM
// pg_prepared_xacts would be read on the coordinator).
const sqlInDoubt = `, xmax = ANY(ARRAY(SELECT (pg_prepared_xact()).transaction)) FROM `

// sqlSourceColumns are the columns a read adds, last, when the batch asks
// for its sources (Batch.Sources).
const sqlSourceColumns = `, coalesce(src_topic, ''), coalesce(src_partition, -1), coalesce(src_offset, -1) FROM `

// sourceSQL returns a read's statement with the source columns added
// when the batch asks for them; every read's select list ends at its first
// " FROM ".
func (ids *identities) sourceSQL(sql string) string {
	if ids.sources == nil {
		return sql
	}
	return strings.Replace(sql, " FROM ", sqlSourceColumns, 1)
}

// sourceDest adds the source columns' destinations to a read's, when the
// batch asks for them.
func (ids *identities) sourceDest(dest []any) []any {
	if ids.sources == nil {
		return dest
	}
	return append(dest, &ids.src.Topic, &ids.src.Partition, &ids.src.Offset)
}

// decide decides r, a valid record whose identity is entities[i], at now
// under the batch's rule, and keeps its identity's new state.
func (ids *identities) decide(i int, r *Record, now time.Time) Decision {
	prev := ids.state[i]
	o := ids.rule.Decide(prev, r.Digest, r.Version, now)
	ids.state[i] = o.State
	switch {
	case o.Decision.Forwards():
		ids.changed[i], ids.offsets[i], ids.touched[i] = true, r.Offset, false
		if ids.sources != nil {
			ids.sources[i] = Source{Topic: ids.part.Topic, Partition: ids.part.Partition, Offset: r.Offset}
		}
	case !ids.changed[i] && !o.State.Equal(prev):
		ids.touched[i] = true
	}
	return o.Decision
}

// queueChanged queues the writes of the changed identities, each
// statement with the arguments args makes for its identities (indexes into
// entities): update for those the one-server read found (with their tids
// and xmins as two more arguments), upsert for every one a claim locked,
// rewrite for those of each shard group of a routed claim, insert for the
// new ones (see writes).
func (ids *identities) queueChanged(rt2 *pgx.Batch, w writes, args func(is []int) []any) {
	if ids.groups != nil && !ids.claim {
		ids.queueChangedRouted(rt2, w, args)
		return
	}
	var found, added []int
	for i, c := range ids.changed {
		switch {
		case !c:
		case ids.found[i] || ids.claim:
			found = append(found, i)
		default:
			added = append(added, i)
		}
	}
	switch {
	case len(found) == 0:
	case ids.groups != nil:
		// A routed claim: every identity has a row, locked by the read.
		for _, g := range ids.byGroup(found) {
			rt2.Queue(w.rewrite, args(g)...)
		}
	case ids.claim:
		rt2.Queue(w.upsert, args(found)...)
	default:
		// In key order (entities are: see identify), as every decider
		// writes: concurrent rewrites of the same rows wait for each other
		// instead of deadlocking.
		tids, xmins := ids.versions(found)
		rt2.Queue(w.update, append(args(found), tids, xmins)...)
	}
	if len(added) > 0 {
		rt2.Queue(w.insert, args(added)...)
	}
}

// queueChangedRouted is queueChanged for a routed decide's first run (no
// claim): per shard group in shard order, the group's new identities
// inserted (w.values), then the rows it found rewritten by row version
// (w.updateRouted), each in key order. A routed claim takes its locks in
// the same order (per group its placeholders, then the read that locks):
// deciders of overlapping identities, one in its first run and one
// claiming, wait for each other instead of deadlocking.
func (ids *identities) queueChangedRouted(rt2 *pgx.Batch, w writes, args func(is []int) []any) {
	var changed []int
	for i, c := range ids.changed {
		if c {
			changed = append(changed, i)
		}
	}
	for _, g := range ids.byGroup(changed) {
		var found, added []int
		for _, i := range g {
			if ids.found[i] {
				found = append(found, i)
			} else {
				added = append(added, i)
			}
		}
		if len(added) > 0 {
			w.values.queue(rt2, args(added))
		}
		if len(found) > 0 {
			tids, xmins := ids.versions(found)
			rt2.Queue(w.updateRouted, append(args(found), tids, xmins, len(found))...)
		}
	}
}

// writes are a mode's statements writing changed identities (see
// queueChanged): update by row version, one server; updateRouted the
// same, routed by a shard group's identities; upsert for a claim; rewrite
// for a routed claim; insert for new identities, and values the same
// routed.
type writes struct {
	update, updateRouted, upsert, rewrite, insert string
	values                                        valuesInsert
}

// versions returns the row versions the read found for the identities
// at is.
func (ids *identities) versions(is []int) (tidArray, xidArray) {
	tids, xmins := make(tidArray, len(is)), make(xidArray, len(is))
	for k, i := range is {
		tids[k], xmins[k] = ids.tids[i], ids.xmins[i]
	}
	return tids, xmins
}

// rowChangedMsg starts the error of a rewrite that found a row changed.
// Each rewrite by row version ends with a check: a row changed since it
// was read (not rewritten) fails the statement, so that the server rolls
// the transaction back (the COMMIT queued after it in the same round trip
// is skipped: a check in the client would come too late); isRace takes the
// error for a lost race. The cast of a non-constant text fails only then.
const rowChangedMsg = "dam: a row changed since it was read"

// columns returns, for the identities at is, the entity, the digest of the
// state and the offset that set it.
func (ids *identities) columns(is []int) (entities, digests byteaArray, offsets int8Array) {
	entities, digests, offsets = make(byteaArray, len(is)), make(byteaArray, len(is)), make(int8Array, len(is))
	for k, i := range is {
		entities[k], digests[k], offsets[k] = ids.entities[i], ids.state[i].Digest[:], ids.offsets[i]
	}
	return entities, digests, offsets
}

// pick returns a if cond, else b.
func pick(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

// storedDigest reads a stored digest. One of another length (not written
// by this version) reads as the zero digest, which equals no record's.
func storedDigest(b []byte) canon.Digest {
	var d canon.Digest
	if len(b) == len(d) {
		copy(d[:], b)
	}
	return d
}

// Last-seen: table state.
const (
	// One server: the read, and the read that locks (after a lost race).
	sqlReadStateRows = `SELECT entity, digest, ctid, xmin FROM state
		WHERE service = $1 AND entity = ANY($2::bytea[])`
	sqlLockState = sqlReadStateRows + ` ORDER BY entity FOR UPDATE`
	// With refresh_after, also when each identity was last forwarded.
	sqlReadStateRowsRefresh = `SELECT entity, digest, ctid, xmin, updated_at FROM state
		WHERE service = $1 AND entity = ANY($2::bytea[])`
	sqlLockStateRefresh = sqlReadStateRowsRefresh + ` ORDER BY entity FOR UPDATE`

	// The row versions read, by tid ($8) if still the version read (xmin,
	// $9) and still the identity's: a tid means a row in one table, and on
	// tables distributed under a running dam (before the store learns the
	// engine) the statement runs on every shard, where the same tid is
	// another identity's row. The row version is the only condition the
	// planner can use, so that the only plan is a TID scan per row
	// (sqlPlans): an indexable condition on the key let PostgreSQL read
	// every row of the service through the index instead, hence the
	// entity compared inside IS TRUE, and the service ($1) only typed.
	// The count is checked (rowChangedMsg).
	sqlUpdateState = `WITH w AS (UPDATE state AS s SET digest = u.d, updated_at = $7, src_topic = $2, src_partition = $3, src_offset = u.o
		FROM unnest($4::bytea[], $5::bytea[], $6::bigint[], $8::tid[], $9::xid[]) AS u(e, d, o, t, x)
		WHERE s.ctid = u.t AND s.xmin = u.x AND (s.entity = u.e) IS TRUE AND $1::text IS NOT NULL RETURNING 1)
		SELECT CASE WHEN count(*) = cardinality($8::tid[]) THEN 0
			ELSE ('` + rowChangedMsg + `: ' || count(*) || ' of ' || cardinality($8::tid[]))::int END FROM w`

	// An upsert keeps the statement correct even for a row that a NULL
	// digest marks absent.
	sqlWriteState = `INSERT INTO state AS s (service, entity, digest, updated_at, src_topic, src_partition, src_offset)
		SELECT $1, e, d, $7, $2, $3, o FROM unnest($4::bytea[], $5::bytea[], $6::bigint[]) AS u(e, d, o)
		ON CONFLICT (service, entity) DO UPDATE SET digest = EXCLUDED.digest, updated_at = EXCLUDED.updated_at,
			src_topic = EXCLUDED.src_topic, src_partition = EXCLUDED.src_partition, src_offset = EXCLUDED.src_offset`

	sqlInsertState = `INSERT INTO state (service, entity, digest, updated_at, src_topic, src_partition, src_offset)
		SELECT $1, e, d, $7, $2, $3, o FROM unnest($4::bytea[], $5::bytea[], $6::bigint[]) AS u(e, d, o) ORDER BY e`

	// Citus: the claim (a placeholder's digest is NULL), then the read.
	sqlClaimState = `INSERT INTO state AS s (service, entity, updated_at)
		SELECT $1, e, 'epoch' FROM unnest($2::bytea[]) AS u(e) ORDER BY e
		ON CONFLICT (service, entity) DO UPDATE SET digest = s.digest WHERE false`
	sqlReadState        = `SELECT entity, digest FROM state WHERE service = $1 AND entity = ANY($2::bytea[])`
	sqlReadStateRefresh = `SELECT entity, digest, updated_at FROM state WHERE service = $1 AND entity = ANY($2::bytea[])`

	// Citus, routed (shards.go): the placeholders (a multi-row VALUES),
	// then per shard group the read that locks, and the rewrite.
	sqlPlaceholdersState      = `INSERT INTO state (service, entity, updated_at) VALUES`
	sqlPlaceholderStateRow    = `, 'epoch'`
	sqlLockStateRouted        = sqlReadState + ` ORDER BY entity FOR UPDATE`
	sqlLockStateRoutedRefresh = sqlReadStateRefresh + ` ORDER BY entity FOR UPDATE`
	sqlRewriteState           = `UPDATE state AS s SET digest = u.d, updated_at = $7, src_topic = $2, src_partition = $3, src_offset = u.o
		FROM unnest($4::bytea[], $5::bytea[], $6::bigint[]) AS u(e, d, o)
		WHERE s.service = $1 AND s.entity = ANY($4::bytea[]) AND s.entity = u.e`
)

var stateWrites = writes{
	update: sqlUpdateState, updateRouted: routedUpdate(sqlUpdateState, "s.entity = ANY($4::bytea[])", "$8", "$10"),
	upsert: sqlWriteState, rewrite: sqlRewriteState, insert: sqlInsertState,
	values: valuesInsert{
		head:   `INSERT INTO state (service, entity, digest, updated_at, src_topic, src_partition, src_offset) VALUES`,
		row:    `($1, ?, ?, $4, $2, $3, ?)`,
		common: []int{0, 1, 2, 6}, arrays: []int{3, 4, 5},
	},
}

// routedUpdate returns a one-server rewrite by row version (sqlUpdateState
// and its kin) with cond, a condition on the distribution column that
// holds for every row it rewrites, so that Citus routes it to the one
// shard of a shard group. The workers still rewrite by tid.
//
// Its check counts against a number (count, one more argument after the
// row versions), not the cardinality of the tid array: Citus writes every
// array argument into the text of the worker's statement, once per use.
func routedUpdate(sql, cond, tids, count string) string {
	const at = `$1::text IS NOT NULL RETURNING 1)`
	card := `cardinality(` + tids + `::tid[])`
	if !strings.Contains(sql, at) || strings.Count(sql, card) != 2 || strings.Contains(sql, count) {
		panic("dedup: routedUpdate: not a rewrite by row version: " + sql)
	}
	sql = strings.Replace(sql, at, `$1::text IS NOT NULL AND `+cond+` RETURNING 1)`, 1)
	return strings.ReplaceAll(sql, card, count+`::int`)
}

// lastSeenTxn is table state. With refresh, the read also takes when each
// identity was last forwarded.
type lastSeenTxn struct{ refresh bool }

func (t lastSeenTxn) queueRead(rt1 *pgx.Batch, service string, ids *identities) {
	var sql string
	var ph placeholders
	switch {
	case ids.groups != nil && ids.claim:
		ph = placeholders{sqlPlaceholdersState, sqlPlaceholderStateRow}
		sql = pick(t.refresh, sqlLockStateRoutedRefresh, sqlLockStateRouted)
	case ids.claim:
		rt1.Queue(sqlClaimState, service, byteaArray(ids.entities))
		sql = pick(t.refresh, sqlReadStateRefresh, sqlReadState)
	case ids.lock:
		sql = pick(t.refresh, sqlLockStateRefresh, sqlLockState)
	default:
		sql = pick(t.refresh, sqlReadStateRowsRefresh, sqlReadStateRows)
	}
	ids.queueReads(rt1, service, sql, ph, func(rs pgx.Rows) error {
		// The row's bytes, not copies: read only until the next row.
		var e, d pgtype.DriverBytes
		var at time.Time
		var v rowVersion
		dest := v.dest(ids, []any{&e, &d})
		if t.refresh {
			dest = append(dest, &at)
		}
		dest = ids.sourceDest(v.doubtDest(ids, dest))
		_, err := pgx.ForEachRow(rs, dest, func() error {
			// A row whose digest is NULL holds no state, but exists.
			ids.read(e, Stored{Found: d != nil, Digest: storedDigest(d), Forwarded: at}, v)
			ids.rows++
			return nil
		})
		return err
	})
}

func (t lastSeenTxn) queueWrites(rt2 *pgx.Batch, service string, p Partition, ids *identities, now time.Time) {
	ids.queueChanged(rt2, stateWrites, func(is []int) []any {
		entities, digests, offsets := ids.columns(is)
		return []any{service, p.Topic, p.Partition, entities, digests, offsets, now}
	})
}

// Window: table window_ids.
const (
	sqlReadWindowRows = `SELECT id, expires_at, ctid, xmin FROM window_ids
		WHERE service = $1 AND id = ANY($2::bytea[])`
	sqlLockWindow = sqlReadWindowRows + ` ORDER BY id FOR UPDATE`

	// The row versions read ($9, $10; see sqlUpdateState).
	sqlUpdateWindow = `WITH w AS (UPDATE window_ids AS w SET expires_at = $8, forwarded_at = $7, digest = u.d,
			src_topic = $2, src_partition = $3, src_offset = u.o
		FROM unnest($4::bytea[], $5::bytea[], $6::bigint[], $9::tid[], $10::xid[]) AS u(i, d, o, t, x)
		WHERE w.ctid = u.t AND w.xmin = u.x AND (w.id = u.i) IS TRUE AND $1::text IS NOT NULL RETURNING 1)
		SELECT CASE WHEN count(*) = cardinality($9::tid[]) THEN 0
			ELSE ('` + rowChangedMsg + `: ' || count(*) || ' of ' || cardinality($9::tid[]))::int END FROM w`

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
	// One server: the row versions read ($2, $4; see sqlUpdateState). By
	// key, the generic plan read every id of the service through the
	// expiry index.
	sqlExtendWindowTIDs = `WITH w AS (UPDATE window_ids AS w SET expires_at = $3 FROM unnest($2::tid[], $4::xid[], $5::bytea[]) AS u(t, x, i)
		WHERE w.ctid = u.t AND w.xmin = u.x AND (w.id = u.i) IS TRUE AND $1::text IS NOT NULL RETURNING 1)
		SELECT CASE WHEN count(*) = cardinality($2::tid[]) THEN 0
			ELSE ('` + rowChangedMsg + `: ' || count(*) || ' of ' || cardinality($2::tid[]))::int END FROM w`

	// Citus: the claim (a placeholder's digest is empty), then the read.
	sqlClaimWindow = `INSERT INTO window_ids AS w (service, id, expires_at, forwarded_at, digest)
		SELECT $1, i, 'epoch', 'epoch', '' FROM unnest($2::bytea[]) AS u(i) ORDER BY i
		ON CONFLICT (service, id) DO UPDATE SET expires_at = w.expires_at WHERE false`
	sqlReadWindow = `SELECT id, expires_at FROM window_ids WHERE service = $1 AND id = ANY($2::bytea[]) AND digest <> ''`

	// Citus, routed (shards.go): the placeholders, then per shard group
	// the read that locks (a placeholder too: its digest is empty), and
	// the rewrite.
	sqlPlaceholdersWindow   = `INSERT INTO window_ids (service, id, expires_at, forwarded_at, digest) VALUES`
	sqlPlaceholderWindowRow = `, 'epoch', 'epoch', ''`
	sqlLockWindowRouted     = `SELECT id, expires_at, digest <> '' FROM window_ids WHERE service = $1 AND id = ANY($2::bytea[]) ORDER BY id FOR UPDATE`
	sqlRewriteWindow        = `UPDATE window_ids AS w SET expires_at = $8, forwarded_at = $7, digest = u.d, src_topic = $2, src_partition = $3, src_offset = u.o
		FROM unnest($4::bytea[], $5::bytea[], $6::bigint[]) AS u(i, d, o)
		WHERE w.service = $1 AND w.id = ANY($4::bytea[]) AND w.id = u.i`
)

var windowWrites = writes{
	update: sqlUpdateWindow, updateRouted: routedUpdate(sqlUpdateWindow, "w.id = ANY($4::bytea[])", "$9", "$11"),
	upsert: sqlWriteWindow, rewrite: sqlRewriteWindow, insert: sqlInsertWindow,
	values: valuesInsert{
		head:   `INSERT INTO window_ids (service, id, expires_at, forwarded_at, digest, src_topic, src_partition, src_offset) VALUES`,
		row:    `($1, ?, $5, $4, ?, $2, $3, ?)`,
		common: []int{0, 1, 2, 6, 7}, arrays: []int{3, 4, 5},
	},
}

// sqlExtendWindowTIDsRouted is sqlExtendWindowTIDs routed by the shard
// group's ids ($5).
var sqlExtendWindowTIDsRouted = routedUpdate(sqlExtendWindowTIDs, "w.id = ANY($5::bytea[])", "$2", "$6")

// windowTxn is table window_ids.
type windowTxn struct{ window time.Duration }

func (t windowTxn) queueRead(rt1 *pgx.Batch, service string, ids *identities) {
	sql := pick(ids.lock, sqlLockWindow, sqlReadWindowRows)
	var ph placeholders
	switch {
	case ids.groups != nil && ids.claim:
		ph = placeholders{sqlPlaceholdersWindow, sqlPlaceholderWindowRow}
		sql = sqlLockWindowRouted
	case ids.claim:
		rt1.Queue(sqlClaimWindow, service, byteaArray(ids.entities))
		sql = sqlReadWindow
	}
	ids.queueReads(rt1, service, sql, ph, func(rs pgx.Rows) error {
		var id pgtype.DriverBytes // the row's bytes, until the next row
		var exp time.Time
		var v rowVersion
		found := true
		dest := []any{&id, &exp}
		if ids.groups != nil && ids.claim {
			dest = append(dest, &found)
		}
		_, err := pgx.ForEachRow(rs, ids.sourceDest(v.doubtDest(ids, v.dest(ids, dest))), func() error {
			ids.rows++
			if found { // not a placeholder
				ids.read(id, Stored{Found: true, Expires: exp}, v)
			}
			return nil
		})
		return err
	})
}

func (t windowTxn) queueWrites(rt2 *pgx.Batch, service string, p Partition, ids *identities, now time.Time) {
	// Every identity the batch forwarded or extended expires at the same
	// time: one decision time per batch.
	exp := now.Add(t.window)
	ids.queueChanged(rt2, windowWrites, func(is []int) []any {
		entities, digests, offsets := ids.columns(is)
		return []any{service, p.Topic, p.Partition, entities, digests, offsets, now, exp}
	})
	var ext byteaArray
	var found []int
	for i, touched := range ids.touched {
		switch {
		case !touched:
		case ids.claim:
			ext = append(ext, ids.entities[i])
		default: // touched: found, and not forwarded
			found = append(found, i)
		}
	}
	switch {
	case len(ext) == 0:
	case ids.groups != nil:
		// ext is in key order, and a subset of entities: by group.
		is := make([]int, 0, len(ext))
		for i, touched := range ids.touched {
			if touched {
				is = append(is, i)
			}
		}
		for _, g := range ids.byGroup(is) {
			rt2.Queue(sqlExtendWindow, service, ids.groupEntities(g), exp)
		}
	default:
		rt2.Queue(sqlExtendWindow, service, ext, exp)
	}
	if len(found) > 0 {
		// found is in key order: see queueChanged. Routed, per shard group.
		if ids.groups == nil {
			tids, xmins := ids.versions(found)
			rt2.Queue(sqlExtendWindowTIDs, service, tids, exp, xmins, ids.groupEntities(found))
		} else {
			for _, g := range ids.byGroup(found) {
				tids, xmins := ids.versions(g)
				rt2.Queue(sqlExtendWindowTIDsRouted, service, tids, exp, xmins, ids.groupEntities(g), len(g))
			}
		}
	}
}

// Version: table versions.
const (
	sqlReadVersionRows = `SELECT entity, version, ctid, xmin FROM versions
		WHERE service = $1 AND entity = ANY($2::bytea[])`
	sqlLockVersion = sqlReadVersionRows + ` ORDER BY entity FOR UPDATE`

	// The row versions read ($9, $10; see sqlUpdateState).
	sqlUpdateVersion = `WITH w AS (UPDATE versions AS v SET version = u.n, digest = u.d, updated_at = $8,
			src_topic = $2, src_partition = $3, src_offset = u.o
		FROM unnest($4::bytea[], $5::bigint[], $6::bytea[], $7::bigint[], $9::tid[], $10::xid[]) AS u(e, n, d, o, t, x)
		WHERE v.ctid = u.t AND v.xmin = u.x AND (v.entity = u.e) IS TRUE AND $1::text IS NOT NULL RETURNING 1)
		SELECT CASE WHEN count(*) = cardinality($9::tid[]) THEN 0
			ELSE ('` + rowChangedMsg + `: ' || count(*) || ' of ' || cardinality($9::tid[]))::int END FROM w`

	sqlWriteVersion = `INSERT INTO versions AS v (service, entity, version, digest, updated_at, src_topic, src_partition, src_offset)
		SELECT $1, e, n, d, $8, $2, $3, o FROM unnest($4::bytea[], $5::bigint[], $6::bytea[], $7::bigint[]) AS u(e, n, d, o)
		ON CONFLICT (service, entity) DO UPDATE SET version = EXCLUDED.version, digest = EXCLUDED.digest,
			updated_at = EXCLUDED.updated_at, src_topic = EXCLUDED.src_topic, src_partition = EXCLUDED.src_partition,
			src_offset = EXCLUDED.src_offset`

	sqlInsertVersion = `INSERT INTO versions (service, entity, version, digest, updated_at, src_topic, src_partition, src_offset)
		SELECT $1, e, n, d, $8, $2, $3, o FROM unnest($4::bytea[], $5::bigint[], $6::bytea[], $7::bigint[]) AS u(e, n, d, o) ORDER BY e`

	// Citus: the claim (a placeholder's digest is empty), then the read.
	sqlClaimVersion = `INSERT INTO versions AS v (service, entity, version, digest, updated_at)
		SELECT $1, e, 0, '', 'epoch' FROM unnest($2::bytea[]) AS u(e) ORDER BY e
		ON CONFLICT (service, entity) DO UPDATE SET version = v.version WHERE false`
	sqlReadVersion = `SELECT entity, version FROM versions WHERE service = $1 AND entity = ANY($2::bytea[]) AND digest <> ''`

	// Citus, routed (shards.go): the placeholders, then per shard group
	// the read that locks (a placeholder too: its digest is empty), and
	// the rewrite.
	sqlPlaceholdersVersion   = `INSERT INTO versions (service, entity, version, digest, updated_at) VALUES`
	sqlPlaceholderVersionRow = `, 0, '', 'epoch'`
	sqlLockVersionRouted     = `SELECT entity, version, digest <> '' FROM versions WHERE service = $1 AND entity = ANY($2::bytea[]) ORDER BY entity FOR UPDATE`
	sqlRewriteVersion        = `UPDATE versions AS v SET version = u.n, digest = u.d, updated_at = $8, src_topic = $2, src_partition = $3, src_offset = u.o
		FROM unnest($4::bytea[], $5::bigint[], $6::bytea[], $7::bigint[]) AS u(e, n, d, o)
		WHERE v.service = $1 AND v.entity = ANY($4::bytea[]) AND v.entity = u.e`
)

var versionWrites = writes{
	update: sqlUpdateVersion, updateRouted: routedUpdate(sqlUpdateVersion, "v.entity = ANY($4::bytea[])", "$9", "$11"),
	upsert: sqlWriteVersion, rewrite: sqlRewriteVersion, insert: sqlInsertVersion,
	values: valuesInsert{
		head:   `INSERT INTO versions (service, entity, version, digest, updated_at, src_topic, src_partition, src_offset) VALUES`,
		row:    `($1, ?, ?, ?, $4, $2, $3, ?)`,
		common: []int{0, 1, 2, 7}, arrays: []int{3, 4, 5, 6},
	},
}

// versionTxn is table versions.
type versionTxn struct{}

func (versionTxn) queueRead(rt1 *pgx.Batch, service string, ids *identities) {
	sql := pick(ids.lock, sqlLockVersion, sqlReadVersionRows)
	var ph placeholders
	switch {
	case ids.groups != nil && ids.claim:
		ph = placeholders{sqlPlaceholdersVersion, sqlPlaceholderVersionRow}
		sql = sqlLockVersionRouted
	case ids.claim:
		rt1.Queue(sqlClaimVersion, service, byteaArray(ids.entities))
		sql = sqlReadVersion
	}
	ids.queueReads(rt1, service, sql, ph, func(rs pgx.Rows) error {
		var e pgtype.DriverBytes // the row's bytes, until the next row
		var n int64
		var v rowVersion
		found := true
		dest := []any{&e, &n}
		if ids.groups != nil && ids.claim {
			dest = append(dest, &found)
		}
		_, err := pgx.ForEachRow(rs, ids.sourceDest(v.doubtDest(ids, v.dest(ids, dest))), func() error {
			ids.rows++
			if found { // not a placeholder
				ids.read(e, Stored{Found: true, Version: n}, v)
			}
			return nil
		})
		return err
	})
}

func (versionTxn) queueWrites(rt2 *pgx.Batch, service string, p Partition, ids *identities, now time.Time) {
	ids.queueChanged(rt2, versionWrites, func(is []int) []any {
		entities, digests, offsets := ids.columns(is)
		versions := make(int8Array, len(is))
		for k, i := range is {
			versions[k] = ids.state[i].Version
		}
		return []any{service, p.Topic, p.Partition, entities, versions, digests, offsets, now}
	})
}
