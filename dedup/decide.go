package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The statements of Decide common to every mode. Round trip 1 locks the
// partition's progress and reads the identities' state, round trip 2
// writes what changed. On one server, a row is written only if it is
// still the version read, and new identities are not locked in advance
// (no placeholder rows: that cost every record of a batch an extra index
// probe, about a quarter of the server's CPU per record); a race with a
// concurrent decider is detected instead, and the batch decided again. The
// statements of each mode's table are in tables.go.
const (
	sqlBegin = `BEGIN ISOLATION LEVEL READ COMMITTED`

	// Every statement of a decide reads by key (the primary key) or by
	// tid, never the whole table: set so in this transaction. For a batch
	// of thousands of identities, a prepared statement's first executions
	// (planned for their parameters) chose a sequential scan, for the lock
	// and, in a hash join, for the rewrite by tid: tens of milliseconds
	// each on 100,000 rows, more on a bigger table. The tid is the only
	// condition of the rewrite that the planner can use (tables.go), so
	// without a sequential scan its only plan is a TID scan per row. (Forcing generic plans as well was
	// measured and rejected: a generic plan made while the table was still
	// empty read every row of the service for each batch.)
	sqlPlans = `SELECT set_config('enable_seqscan', 'off', true)`
	// On Citus, the workers plan the statements a decide sends them, with
	// their own settings: a setting of the coordinator's reaches them only
	// as a SET LOCAL with citus.propagate_set_commands 'local' (a
	// set_config does not). Without it, each shard group's read, a few
	// hundred keys, was a sequential scan of its shard (25,000 rows in the
	// benchmark, every row of the shard in production), and each rewrite
	// a hash join over one.
	sqlPropagateSets = `SET LOCAL citus.propagate_set_commands = 'local'`
	sqlPlansWorkers  = `SET LOCAL enable_seqscan = off`

	sqlLockProgress = `SELECT epoch, next_offset FROM progress
		WHERE grp = $1 AND topic = $2 AND part = $3 FOR UPDATE`
	// A routed decide on Citus (shards.go) locks progress by writing it:
	// Citus commits in two phases a transaction that modifies several
	// workers only if it opens (or assigns a placement's task to) a
	// connection after its first modification; a SELECT ... FOR UPDATE is
	// not one, and a routed decide of router statements alone then
	// committed its workers one after the other, in one phase each. Its
	// first statement modifying a row, every other worker it writes is
	// reached after, and the commit is two-phase.
	sqlLockProgressWrite = `UPDATE progress SET epoch = epoch
		WHERE grp = $1 AND topic = $2 AND part = $3 RETURNING epoch, next_offset`

	// The decision time, read after the identities' state: a cleanup that
	// deleted one of their rows as expired, or a decider that wrote one,
	// either committed before the read, with an earlier time, or changed
	// the row the batch would write, which then runs again. So the time
	// written for one identity never goes back, whichever instance writes
	// it.
	sqlClock = `SELECT clock_timestamp()`

	sqlLog = `INSERT INTO decision_log (grp, topic, part, first_offset, end_offset, offsets, decisions, entities, logged_at, causes)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT (grp, topic, part, first_offset) DO UPDATE SET end_offset = EXCLUDED.end_offset,
			offsets = EXCLUDED.offsets, decisions = EXCLUDED.decisions, entities = EXCLUDED.entities,
			logged_at = EXCLUDED.logged_at, causes = EXCLUDED.causes`
	// ON CONFLICT: a stale row at the same offset can only exist when an
	// operator moved progress back by hand; the new decisions replace it.
	// logged_at is the decision time, a parameter: Citus allows only
	// immutable functions in DO UPDATE SET.

	// GREATEST ignores a NULL: an unknown delivered offset leaves the
	// recorded one.
	sqlAdvance = `UPDATE progress SET next_offset = $4, delivered = GREATEST(delivered, $6)
		WHERE grp = $1 AND topic = $2 AND part = $3 AND epoch = $5`
)

// Decide decides every record of b in offset order under b.Rule, stores
// the new state, appends the batch to the decision log (unless b.NoLog)
// and advances the partition's progress from b.Start to b.End, all in one
// transaction (DESIGN §2 step 1). It appends one Decision per record, in
// record order, to out[:0] and returns it.
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
	// The distinct identities with at least one valid record: only they
	// are read (an invalid record changes nothing). Each valid record's
	// slot is its identity's index, found once here: deciding a record
	// then indexes arrays, not a map.
	entities, index, slots := identify(b.Records)

	// A lost race (a new identity created, or a row read changed, by a
	// concurrent decider) or a deadlock rolls the transaction back:
	// nothing changed, so the batch is simply decided again.
	var err error
	route := true
	for attempt := 1; ; attempt++ {
		var claim, raced bool
		if claim, err = s.Distributed(ctx); err != nil {
			return out, err
		}
		// A run after a lost race locks what it reads: it cannot lose to a
		// changed row again.
		out, raced, err = s.decideOnce(ctx, b, entities, index, slots, claim || s.claims, attempt > 1, route, out)
		if errors.Is(err, errStaleShards) {
			route = false // this batch, once: see shards.go
		}
		if !raced {
			break
		}
		if attempt >= maxDecideAttempts+len(entities) || ctx.Err() != nil {
			// Still losing: contention, not a fault of the batch. Nothing
			// changed; the caller retries after its backoff, as after an
			// outage, instead of halting on a unique violation.
			err = fmt.Errorf("%w: lost the race for a new identity to a concurrent decider %d times in a row: %w", ErrUnavailable, attempt, err)
			break
		}
	}
	return out, err
}

// maxDecideAttempts, plus one per identity of the batch, bounds the runs
// of one Decide that lose a race. Each run after the first locks what it
// reads, and a run that lost a new identity finds it existing and locks it
// the next time, but another new identity of the same batch can be lost
// in the next run: with deciders of several partitions on overlapping
// identities (entity not the partition key), five runs were seen to lose
// in a row, and the error would have halted the partition.
var maxDecideAttempts = 5

// decideOnce is one transaction of Decide. raced reports a rollback caused
// by a concurrent decider (a new identity created or a row read changed
// meanwhile, a deadlock): nothing changed and the batch may be decided
// again at once.
//
// claim selects the statements that lock by writing (Citus; see tables.go),
// lock those that lock what they read (one server); route lets a claim be
// routed by shard (shards.go).
func (s *Store) decideOnce(ctx context.Context, b *Batch, entities [][]byte, index entityIndex, slots []int32, claim, lock, route bool, out []Decision) (_ []Decision, raced bool, _ error) {
	out = out[:0]
	p := b.Partition
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return out, false, s.classify("decide", err)
	}
	// A connection left inside a transaction (after an error) is closed, not
	// reused, by Release.
	defer conn.Release()
	registerArrays(conn.Conn())
	table := newTableTxn(b.Rule)
	ids := newIdentities(b.Rule, entities, index)
	ids.claim, ids.lock = claim, lock
	var routing *shardMap // the map a routed decide's first run checks
	if claim && route && !s.unrouted && len(entities) > 0 {
		m := oneShard // one server running Citus's shapes (SetClaims)
		if s.engine.Load() == engineDistributed {
			m = s.shardRouting(ctx, conn.Conn())
		}
		if m != nil && m != oneShard && !lock {
			routing = m
		}
		if m != nil {
			// Routed. The first run reads without locking and writes by
			// row version, as on one server (tables.go): a duplicate then
			// costs a worker one index probe, not a placeholder's probe
			// and a row lock. A run after a lost race claims (lock).
			ids.groups = m.groups(entities)
			ids.claim = lock
		}
	}
	wantSources := len(b.Sources) == len(b.Records) && len(b.Records) > 0
	if wantSources {
		ids.sources, ids.part = make([]Source, len(entities)), p
		for i := range ids.sources {
			ids.sources[i].Offset = -1
		}
	}

	// Round trip 1: begin, lock progress, read the identities that exist
	// (locked after a lost race, or claimed on Citus), read the clock.
	var epoch int64
	var next *int64
	var now time.Time
	rt1 := &pgx.Batch{}
	if err := s.begin(ctx, conn.Conn(), rt1); err != nil {
		s.rollback(ctx, conn.Conn())
		return out, false, s.classify("decide", err)
	}
	rt1.Queue(pick(ids.groups != nil, sqlLockProgressWrite, sqlLockProgress), p.Group, p.Topic, p.Partition).QueryRow(func(row pgx.Row) error {
		return row.Scan(&epoch, &next)
	})
	if len(entities) > 0 {
		table.queueRead(rt1, b.Service, ids)
	}
	if b.Now.IsZero() {
		rt1.Queue(sqlClock).QueryRow(func(row pgx.Row) error { return row.Scan(&now) })
	}
	shards := -1
	if routing != nil {
		rt1.Queue(sqlShardCount).QueryRow(func(row pgx.Row) error { return row.Scan(&shards) })
	}
	err = conn.SendBatch(ctx, rt1).Close()
	if routing != nil && err == nil && shards != len(routing.mins) {
		// A shard split since the map was read (a claim learns it from
		// Citus refusing its locking read). A group that spans two shards
		// was read by a multi-shard statement, which Citus plans in
		// steps: its check of rows prepared on their worker (sqlInDoubt)
		// ran on the coordinator. Nothing changed: run again, by the
		// map read again.
		s.forgetShards()
		s.rollback(ctx, conn.Conn())
		return out, true, fmt.Errorf("%w: %d shards, %d in the map", errStaleShards, shards, len(routing.mins))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		s.rollback(ctx, conn.Conn())
		return out, false, fmt.Errorf("%w: %s/%d group %q: no progress row (Acquire first)", ErrFenced, p.Topic, p.Partition, p.Group)
	}
	if err != nil {
		s.rollback(ctx, conn.Conn())
		// Refused as Citus refuses the one-server shape: the tables were
		// distributed under a running dam; run it again as a claim.
		if !claim && s.relearn(ctx, err) {
			return out, true, s.classify("decide", err)
		}
		// A routed read that locks refused as spanning shards: the shard
		// map is stale (a shard split since it was read). Run again
		// unrouted; the next decide reads the map again.
		if ids.groups != nil && refused(err) {
			s.forgetShards()
			return out, true, fmt.Errorf("%w: %w", errStaleShards, s.classify("decide", err))
		}
		return out, isRace(err), s.classify("decide", err)
	}
	if ids.inDoubt {
		// A row's last change is prepared on its worker, not committed
		// there yet (tables.go, sqlInDoubt). Nothing changed: run again
		// as a claim, which waits for it.
		s.rollback(ctx, conn.Conn())
		return out, true, errors.New("dedup: decide: a row's last change is prepared on its worker, not committed there yet")
	}
	if ids.groups != nil && ids.claim && ids.rows != len(entities) {
		// A row that existed when the placeholders were inserted was
		// deleted before the read locked it (a reset, an expiry): nothing
		// is locked for that identity. Nothing changed: run again.
		s.rollback(ctx, conn.Conn())
		return out, true, fmt.Errorf("dedup: decide: %d of %d identities' rows deleted meanwhile", len(entities)-ids.rows, len(entities))
	}
	if epoch != b.Epoch || next == nil || *next != b.Start {
		s.rollback(ctx, conn.Conn())
		return out, false, fmt.Errorf("%w: %s/%d group %q: epoch %d, progress %s; batch has epoch %d, start %d",
			ErrFenced, p.Topic, p.Partition, p.Group, epoch, fmtNext(next), b.Epoch, b.Start)
	}
	if !b.Now.IsZero() {
		now = b.Now
	}
	// PostgreSQL keeps microseconds: decide with what is stored.
	now = now.Truncate(time.Microsecond)

	// Decide in memory, in offset order: each identity's state goes from
	// one of its records to the next.
	var logOffsets []int64
	var logDecisions []int16
	var logEntities [][]byte
	var logCauses []*string // nil (NULL) until an entry has a cause
	for k := range b.Records {
		r := &b.Records[k]
		d, e := Invalid, r.Entity
		if !r.Invalid {
			if wantSources {
				b.Sources[k] = ids.sources[slots[k]]
			}
			d, e = ids.decide(int(slots[k]), r, now), entities[slots[k]] // the same bytes, packed
		} else if wantSources {
			b.Sources[k] = Source{Offset: -1}
		}
		out = append(out, d)
		logged := d
		switch {
		case d == Duplicate, d == Stale:
			continue
		case d == Refresh, r.Forwarded: // the log says what to deliver, not why
			logged = Forward
		case d == Invalid && r.Cause != "":
			if logCauses == nil {
				logCauses = make([]*string, len(logOffsets), cap(logOffsets))
			}
			c := logCause(r.Cause)
			logCauses = append(logCauses, &c)
			logOffsets, logDecisions, logEntities = append(logOffsets, r.Offset), append(logDecisions, int16(d)), append(logEntities, e)
			continue
		}
		logOffsets, logDecisions, logEntities = append(logOffsets, r.Offset), append(logDecisions, int16(logged)), append(logEntities, e)
		if logCauses != nil {
			logCauses = append(logCauses, nil)
		}
	}

	// Round trip 2: write, log, advance, commit.
	rt2 := &pgx.Batch{}
	table.queueWrites(rt2, b.Service, p, ids, now)
	if !b.NoLog && b.End > b.Start { // an empty range has nothing to cover
		if logOffsets == nil { // NOT NULL columns: empty arrays, not NULL
			logOffsets, logDecisions, logEntities = []int64{}, []int16{}, [][]byte{}
		}
		var causes any // NULL, the usual case: no entry has a cause
		if logCauses != nil {
			causes = logCauses
		}
		rt2.Queue(sqlLog, p.Group, p.Topic, p.Partition, b.Start, b.End, int8Array(logOffsets), int2Array(logDecisions), byteaArray(logEntities), now, causes)
	}
	var advanced int64
	var delivered *int64
	if b.Delivered > 0 {
		delivered = &b.Delivered
	}
	rt2.Queue(sqlAdvance, p.Group, p.Topic, p.Partition, b.End, b.Epoch, delivered).Exec(func(ct pgconn.CommandTag) error {
		advanced = ct.RowsAffected()
		return nil
	})
	rt2.Queue("COMMIT")
	if err := conn.SendBatch(ctx, rt2).Close(); err != nil {
		// A statement failed: the server skipped the rest, COMMIT included,
		// so the transaction is rolled back; a race may run again at once.
		// Lost before or during COMMIT: the outcome may be either; classify
		// says ErrUnavailable for connection errors, so recovery runs.
		s.rollback(ctx, conn.Conn())
		if !claim {
			// Tables distributed under a running dam: once the engine is
			// known, classify takes Citus's internal_error for what it is
			// there (the outcome of a COMMIT it interrupts is unknown: the
			// caller learns it from P, then decides again as a claim).
			s.relearn(ctx, err)
		}
		return out[:0], isRace(err), s.classify("decide", err)
	}
	if advanced != 1 { // cannot happen: the progress row is locked above
		return out[:0], false, fmt.Errorf("dedup: decide: progress of %s/%d not advanced", p.Topic, p.Partition)
	}
	return out, false, nil
}

// begin queues into rt1 the start of a decide's transaction, with its
// planner settings (sqlPlans). On Citus they go to the workers too, as
// SET LOCAL statements that Citus sends each worker's transaction as the
// text of the query that set them: in the simple protocol, a batch is
// one query of every statement it holds, so there the statements setting
// them run first, each its own query (two round trips more).
func (s *Store) begin(ctx context.Context, conn *pgx.Conn, rt1 *pgx.Batch) error {
	switch {
	case s.engine.Load() != engineDistributed:
		rt1.Queue(sqlBegin)
		rt1.Queue(sqlPlans)
	case conn.Config().DefaultQueryExecMode != pgx.QueryExecModeSimpleProtocol:
		rt1.Queue(sqlBegin)
		rt1.Queue(sqlPropagateSets)
		rt1.Queue(sqlPlansWorkers)
	default:
		for _, q := range []string{sqlBegin, sqlPropagateSets + "; " + sqlPlansWorkers} {
			if _, err := conn.Exec(ctx, q); err != nil {
				return err
			}
		}
	}
	return nil
}

// logCause is c as the decision log keeps it: text (valid UTF-8, no NUL)
// of at most MaxCauseBytes. Causes may quote input, and input is hostile.
func logCause(c string) string {
	c = strings.ReplaceAll(strings.ToValidUTF8(c, "\uFFFD"), "\x00", "\uFFFD")
	if len(c) <= MaxCauseBytes {
		return c
	}
	cut := MaxCauseBytes - len("…")
	for cut > 0 && !utf8.RuneStart(c[cut]) {
		cut--
	}
	return c[:cut] + "…"
}

// isRace reports an error that rolled a Decide back because of a
// concurrent decider: a new identity inserted meanwhile (unique violation
// on a mode's table), a row changed since it was read, or a deadlock. All
// come from the server in reply to a statement, so the transaction did not
// commit.
func isRace(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	// A rewrite found a row changed since the read (tables.go): its check
	// failed the statement with its message in a cast's error.
	if pgErr.Code == "22P02" && strings.Contains(pgErr.Message, rowChangedMsg) {
		return true
	}
	if pgErr.Code == "40P01" {
		return true
	}
	switch pgErr.TableName {
	case "state", "window_ids", "versions":
		return pgErr.Code == "23505"
	}
	return false
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
	case b.End < b.Start:
		return fmt.Errorf("%w: end %d before start %d", ErrInvalid, b.End, b.Start)
	}
	if err := CheckService(b.Service); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := b.Rule.validate(); err != nil {
		return err
	}
	prev := b.Start - 1
	for i, r := range b.Records {
		if r.Offset <= prev || r.Offset >= b.End {
			return fmt.Errorf("%w: record %d: offset %d out of order or outside [%d, %d)", ErrInvalid, i, r.Offset, b.Start, b.End)
		}
		prev = r.Offset
		if r.Invalid {
			continue
		}
		if r.Forwarded {
			return fmt.Errorf("%w: record %d (offset %d): forwarded but not invalid", ErrInvalid, i, r.Offset)
		}
		if r.Digest.IsZero() {
			return fmt.Errorf("%w: record %d (offset %d): zero digest", ErrInvalid, i, r.Offset)
		}
		if err := CheckEntity(r.Entity); err != nil {
			// The caller marks such a record Invalid (bad input).
			return fmt.Errorf("%w: record %d (offset %d): %w", ErrInvalid, i, r.Offset, err)
		}
	}
	return nil
}
