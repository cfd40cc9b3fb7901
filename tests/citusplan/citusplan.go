// Package citusplan shows how Citus runs the statements of dam's store: it
// runs the store's operations (a decide of each mode, recovery's reads,
// Check, state get, reset, prune, the window cleanup) on a fresh, migrated
// schema of a Citus coordinator, records every statement they send with
// its arguments (a pgx tracer on the store's pool: the statements are the
// store's own, not copies), then plans each again with
// `EXPLAIN (VERBOSE, COSTS OFF)` and the same arguments, and classifies
// the plan:
//
//   - router: one task, on the one shard the distribution column's value
//     selects ("Task Count: 1"): one worker, one round trip from the
//     coordinator;
//   - multi-shard: a task per shard (Task Count > 1), or an
//     INSERT ... SELECT whose rows the coordinator computes and sends to
//     their shards ("INSERT/SELECT method: pull to coordinator" or
//     "repartition"), or one that runs on every shard as it is (pushdown);
//   - coordinator: no distributed table (the clock, an advisory lock).
//
// The writes are planned, not run: EXPLAIN without ANALYZE executes
// nothing. With Analyze, a write is also run by EXPLAIN ANALYZE inside a
// transaction that is rolled back, which shows the tasks Citus actually
// sent.
package citusplan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/migrations"
)

// Statement is one statement the store sent, with its plan on the cluster.
type Statement struct {
	// Op is the store operation that first sent it ("decide (last-seen)",
	// "check", ...); Name says what the statement does in it.
	Op, Name string
	SQL      string
	args     []any
	// Err is the error the statement got when the store ran it, if any.
	Err error
	// Plan is its EXPLAIN (VERBOSE, COSTS OFF); Analyze its EXPLAIN
	// ANALYZE when asked for (rolled back).
	Plan, Analyze string
	// PlanErr is the error of EXPLAIN, if any.
	PlanErr error
	Class   Class
}

// Class is how Citus runs a statement.
type Class struct {
	// Kind is router, multi-shard, coordinator or "-" (not planned:
	// BEGIN, COMMIT); Print says "refused" for a statement Citus does
	// not run.
	Kind string
	// Tasks is the plan's top Task Count (0 when the plan shows none).
	Tasks int
	// Detail is the INSERT ... SELECT method, the subplans, or the custom
	// scan.
	Detail string
}

// Options tune Capture.
type Options struct {
	// Batch is the number of records of each decide (default 1000: dam's
	// pipeline.batch_size, a batch's identities spread over every shard).
	Batch int
	// Analyze also runs each write (and read) with EXPLAIN ANALYZE in a
	// transaction rolled back.
	Analyze bool
	// Logf receives progress lines; it may be nil.
	Logf func(string, ...any)
	// Remote, when set, receives every command the coordinator sends the
	// workers (citus.log_remote_commands) with the operation that caused
	// it.
	Remote func(op, command string)
}

// Capture runs the store's operations on a fresh schema of the Citus
// coordinator at dsn (dropped at the end), and returns every distinct
// statement they sent, in order, with its plan and class.
func Capture(ctx context.Context, dsn string, o Options) ([]Statement, error) {
	if o.Batch <= 0 {
		o.Batch = 1000
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer admin.Close(context.Background())
	var citus bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return nil, err
	}
	if !citus {
		return nil, fmt.Errorf("citusplan: no citus extension at the server")
	}
	schema := fmt.Sprintf("citusplan_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, err
	}
	defer func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			o.Logf("citusplan: drop schema %s: %v", schema, err)
		}
	}()
	mig, err := pgx.ConnectConfig(ctx, withSearchPath(admin.Config(), schema))
	if err != nil {
		return nil, err
	}
	err = migrations.Up(ctx, mig)
	mig.Close(context.Background())
	if err != nil {
		return nil, fmt.Errorf("citusplan: migrate: %w", err)
	}

	rec := &recorder{}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	pc.ConnConfig.Tracer = rec
	if o.Remote != nil {
		pc.ConnConfig.RuntimeParams["citus.log_remote_commands"] = "on"
		pc.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			if cmd, ok := strings.CutPrefix(n.Message, "issuing "); ok {
				o.Remote(rec.currentOp(), cmd)
			}
		}
	}
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	store := dedup.NewStore(pool)
	if dist, err := store.Distributed(ctx); err != nil || !dist {
		return nil, fmt.Errorf("citusplan: dam's tables are not distributed (distributed %v, %v)", dist, err)
	}
	rec.start()
	if err := scenario(ctx, store, o); err != nil {
		return nil, err
	}
	sts := rec.statements()
	o.Logf("citusplan: %d distinct statements; planning them", len(sts))

	conn, err := pgx.ConnectConfig(ctx, withSearchPath(admin.Config(), schema))
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	dedup.RegisterTypes(conn) // the recorded arguments are the store's
	for i := range sts {
		st := &sts[i]
		st.Name = name(st.SQL)
		if !plannable(st.SQL) {
			st.Class = Class{Kind: "-"}
			continue
		}
		st.Plan, st.PlanErr = explain(ctx, conn, "EXPLAIN (VERBOSE, COSTS OFF) ", st)
		if o.Analyze && st.PlanErr == nil {
			var err error
			st.Analyze, err = explain(ctx, conn, "EXPLAIN (ANALYZE, VERBOSE, COSTS OFF, TIMING OFF, SUMMARY OFF) ", st)
			if err != nil {
				st.Analyze = "not available: " + firstLine(err.Error())
			}
		}
		st.Class = classify(st.Plan)
		if strings.Contains(st.Class.Detail, "pull to coordinator") {
			// The plan cannot say: the coordinator computes the rows,
			// then sends each shard its own (one task per shard).
			if n, total, err := shardsOf(ctx, conn, st); err == nil {
				st.Class.Tasks = n
				st.Class.Detail += fmt.Sprintf(", then a task for each shard of its rows (%d of the table's %d)", n, total)
			}
		}
	}
	return sts, nil
}

var insertInto = regexp.MustCompile(`^\s*INSERT INTO (\w+)`)

// shardsOf returns the number of shards an INSERT ... SELECT FROM unnest
// writes (those of its first array of identities) and the table's shards.
func shardsOf(ctx context.Context, conn *pgx.Conn, st *Statement) (n, total int, err error) {
	m := insertInto.FindStringSubmatch(st.SQL)
	if m == nil {
		return 0, 0, fmt.Errorf("no INSERT INTO")
	}
	for _, a := range st.args {
		ids, ok := a.([][]byte)
		if !ok {
			continue
		}
		err = conn.QueryRow(ctx, `SELECT (SELECT count(DISTINCT get_shard_id_for_distribution_column($1::regclass, e)) FROM unnest($2::bytea[]) e),
			(SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = $1::regclass)`, m[1], ids).Scan(&n, &total)
		return n, total, err
	}
	return 0, 0, fmt.Errorf("no identities")
}

// withSearchPath is a copy of cc whose sessions use schema.
func withSearchPath(cc *pgx.ConnConfig, schema string) *pgx.ConnConfig {
	c := cc.Copy()
	c.RuntimeParams["search_path"] = schema
	return c
}

// explain runs prefix+st.SQL with st's arguments in a transaction rolled
// back, the arguments inlined as literals (as a custom plan sees them).
func explain(ctx context.Context, conn *pgx.Conn, prefix string, st *Statement) (string, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if strings.HasPrefix(st.Op, "decide") {
		// Planned as the decide runs it: with its planner settings, on
		// the coordinator and the workers.
		for _, set := range decideSettings {
			if _, err := tx.Exec(ctx, set); err != nil {
				return "", err
			}
		}
	}
	args := append([]any{pgx.QueryExecModeSimpleProtocol}, st.args...)
	rows, err := tx.Query(ctx, prefix+st.SQL, args...)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", err
	}
	return strings.Join(lines, "\n"), nil
}

// decideSettings are the settings a decide on Citus sets in its
// transaction (dedup's planner settings, sent on to the workers).
var decideSettings = []string{
	`SET LOCAL citus.propagate_set_commands = 'local'`,
	`SET LOCAL enable_seqscan = off`,
}

// plannable: EXPLAIN accepts the statement.
func plannable(sql string) bool {
	s := strings.ToUpper(strings.TrimSpace(sql))
	for _, p := range []string{"SELECT", "INSERT", "UPDATE", "DELETE", "WITH"} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

var (
	taskCount = regexp.MustCompile(`Task Count: (\d+)`)
	method    = regexp.MustCompile(`INSERT/SELECT method: ([a-z ]+)`)
	subplans  = regexp.MustCompile(`Distributed Subplan`)
	scan      = regexp.MustCompile(`Custom Scan \((Citus [^)]+)\)`)
	// A long array literal: the batch's identities, inlined.
	longArray = regexp.MustCompile(`'\{[^']{120,}\}'`)
)

// abbreviate shortens the long array literals of a plan.
func abbreviate(plan string) string {
	return longArray.ReplaceAllStringFunc(plan, func(a string) string {
		return fmt.Sprintf("'{%s,... %d elements}'", strings.SplitN(a[2:], ",", 2)[0], strings.Count(a, ",")+1)
	})
}

// classify reads a plan: see the package documentation.
func classify(plan string) Class {
	if plan == "" {
		return Class{Kind: "?"}
	}
	s := scan.FindStringSubmatch(plan)
	if s == nil {
		return Class{Kind: "coordinator", Detail: "no distributed table"}
	}
	c := Class{Detail: s[1]}
	if m := taskCount.FindStringSubmatch(plan); m != nil {
		c.Tasks, _ = strconv.Atoi(m[1])
	}
	var details []string
	if m := method.FindStringSubmatch(plan); m != nil {
		details = append(details, "INSERT ... SELECT: "+strings.TrimSpace(m[1]))
	} else if s[1] == "Citus INSERT ... SELECT" {
		details = append(details, "INSERT ... SELECT: pushdown")
	}
	if n := len(subplans.FindAllString(plan, -1)); n > 0 {
		details = append(details, fmt.Sprintf("%d subplan(s), each its own distributed statement", n))
	}
	if len(details) > 0 {
		c.Detail = strings.Join(details, "; ")
	}
	switch {
	case c.Tasks == 1 && len(subplans.FindAllString(plan, -1)) == 0 && !strings.Contains(s[1], "INSERT ... SELECT"):
		c.Kind = "router"
	case countedOnCoordinator(plan):
		c.Kind = "router"
		c.Detail = "its one subplan a router task; the count of its rows on the coordinator"
	default:
		c.Kind = "multi-shard"
	}
	return c
}

// countedOnCoordinator reports the plan of a modification counted by a
// CTE (dam's insert of new identities): one distributed subplan of one
// task (the modification, on its shard), then one task on the
// coordinator reading the subplan's result.
func countedOnCoordinator(plan string) bool {
	if len(subplans.FindAllString(plan, -1)) != 1 || !strings.Contains(plan, "read_intermediate_result") {
		return false
	}
	counts := taskCount.FindAllStringSubmatch(plan, -1)
	for _, m := range counts {
		if m[1] != "1" {
			return false
		}
	}
	return len(counts) == 2
}

// names tells what a statement does, by its text; the first match wins.
var names = []struct{ has, name string }{
	{"WHERE false", "claim (lock by writing)"},
	{"new rows inserted", "insert new (VALUES, a shard's group)"},
	{"ON CONFLICT DO NOTHING", "placeholders (VALUES)"},
	{"ANY($4::bytea[]) RETURNING 1)", "rewrite by row version (a shard's group)"},
	{"ANY($5::bytea[]) RETURNING 1)", "extend windows (a shard's group)"},
	{"ORDER BY entity FOR UPDATE", "read and lock (a shard's group)"},
	{"ORDER BY id FOR UPDATE", "read and lock (a shard's group)"},
	{"= ANY($4::bytea[]) AND", "write (a shard's group)"},
	{"FROM progress WHERE grp = $1 AND topic = $2 AND part = $3 FOR UPDATE", "progress lock"},
	{"UPDATE progress SET epoch = epoch WHERE", "progress lock (by writing)"},
	{"SELECT next_offset, delivered FROM progress", "progress lock (skip)"},
	{"UPDATE progress SET epoch = epoch + 1", "fence (skip)"},
	{"UPDATE decision_log SET decisions", "mark skipped"},
	{"INSERT INTO operator_skips", "record skip"},
	{"DELETE FROM operator_skips", "prune skips"},
	{"FROM operator_skips", "skip of an offset"},
	{"FOR SHARE", "settled progress"},
	{"ON CONFLICT (service, entity) DO UPDATE SET digest = EXCLUDED.digest, updated_at = GREATEST(s.updated_at, EXCLUDED.updated_at), src_topic = NULL", "compare-and-set"},
	{"set_config('enable_seqscan'", "planner settings"},
	{"citus.propagate_set_commands", "planner settings (sent to the workers)"},
	{"SET LOCAL enable_seqscan", "planner settings"},
	{"clock_timestamp()", "clock"},
	{"INSERT INTO decision_log", "decision log"},
	{"UPDATE progress SET next_offset = $4", "advance P"},
	{"UPDATE progress SET next_offset = $5", "init P"},
	{"UPDATE progress SET topic_id", "bind topic"},
	{"UPDATE progress AS p SET delivered", "set delivered"},
	{"INSERT INTO progress", "acquire (epoch)"},
	{"FROM progress", "read progress"},
	{"first_offset IN (SELECT first_offset FROM decision_log", "prune kept log"},
	{"DELETE FROM decision_log", "prune log"},
	{"min(first_offset), max(end_offset) FROM decision_log", "log range"},
	{"min(first_offset) FROM decision_log", "log start"},
	{"SELECT first_offset, end_offset, logged_at", "log batch of an offset"},
	{"SELECT first_offset, logged_at, offsets", "last forward of an entity"},
	{"LIMIT 1 FOR UPDATE", "log batch of an offset (skip)"},
	{"FROM decision_log", "read log"},
	{"SET expires_at = $3", "extend windows"},
	{"unnest($4::bytea[]", "write (upsert)"},
	{"UNION ALL SELECT 1, digest, forwarded_at", "state get"},
	{"GROUP BY service", "stats"},
	{"SELECT (SELECT count(*) FROM state WHERE service = $1", "count"},
	{"a AS (DELETE FROM state", "reset entities"},
	{"LIMIT $3 FOR UPDATE),", "reset service (chunk)"},
	{"FOR UPDATE OF s SKIP LOCKED", "prune state (chunk)"},
	{"expires_at <= now()", "expire window ids"},
	{"WITH RECURSIVE", "services with window ids"},
	{"pg_try_advisory_lock", "advisory lock"},
	{"pg_advisory_unlock", "advisory unlock"},
	{"pg_dist_partition", "engine"},
	{"pg_class", "row estimate"},
	{"pg_prepared_xact()", "read (a shard's group, no lock)"},
	{"= ANY($2::bytea[])", "read"},
}

func name(sql string) string {
	s := strings.Join(strings.Fields(sql), " ")
	for _, n := range names {
		if strings.Contains(s, n.has) {
			return n.name
		}
	}
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return s
}

// opKey carries the store operation's name in a context.
type opKey struct{}

func withOp(ctx context.Context, op string) context.Context {
	return context.WithValue(ctx, opKey{}, op)
}

// recorder is a pgx tracer keeping every distinct statement (by text), in
// order, with the operation that first sent it and its last arguments
// (a decide's second batch finds identities the first one created).
type recorder struct {
	mu  sync.Mutex
	on  bool
	idx map[string]int
	sts []Statement
	op  string // of the statement sent last
}

func (r *recorder) currentOp() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.op
}

func (r *recorder) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on, r.idx = true, map[string]int{}
}

func (r *recorder) add(ctx context.Context, sql string, args []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on {
		return
	}
	op, _ := ctx.Value(opKey{}).(string)
	r.op = op
	if i, ok := r.idx[sql]; ok {
		r.sts[i].args = append([]any(nil), args...)
		return
	}
	r.idx[sql] = len(r.sts)
	r.sts = append(r.sts, Statement{Op: op, SQL: sql, args: append([]any(nil), args...)})
}

func (r *recorder) fail(sql string, err error) {
	if err == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if i, ok := r.idx[sql]; ok && r.sts[i].Err == nil {
		r.sts[i].Err = err
	}
}

func (r *recorder) statements() []Statement {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Statement(nil), r.sts...)
}

type sqlKey struct{}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(ctx, d.SQL, d.Args)
	return context.WithValue(ctx, sqlKey{}, d.SQL)
}

func (r *recorder) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if sql, ok := ctx.Value(sqlKey{}).(string); ok {
		r.fail(sql, d.Err)
	}
}

func (r *recorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (r *recorder) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.add(ctx, d.SQL, d.Args)
	r.fail(d.SQL, d.Err)
}

func (r *recorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// lostRace decides a batch of one new identity (last-seen, at start of
// p) while another transaction is creating it: the decide's first run
// waits on that transaction's row, finds it committed, loses the race,
// and runs again as a claim (its placeholders, its locking read and its
// rewrite).
func lostRace(ctx context.Context, s *dedup.Store, p dedup.Partition, epoch, start int64, service string, d canon.Digest) error {
	// Connections of their own: the store's pool may have no room.
	cfg := s.Pool().Config().ConnConfig.Copy()
	cfg.Tracer = nil
	other, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer other.Close(ctx)
	watch, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer watch.Close(ctx)
	tx, err := other.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	entity := []byte("entity-lost-race")
	// Another content: the claim's run forwards the record, and rewrites.
	if _, err := tx.Exec(ctx, `INSERT INTO state (service, entity, digest) VALUES ($1, $2, $3)`, service, entity, []byte("another content")); err != nil {
		return err
	}
	b := &dedup.Batch{Service: service, Partition: p, Epoch: epoch, Start: start, End: start + 1, Delivered: start,
		Records: []dedup.Record{{Offset: start, Entity: entity, Digest: d}}}
	done := make(chan error, 1)
	go func() {
		_, err := s.Decide(withOp(ctx, "decide after a lost race"), b, nil)
		done <- err
	}()
	// Commit once the decide waits on the row (Citus's view of the
	// workers' lock waits), not before: it must not find it committed.
	for waited := 0; ; waited++ {
		var n int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM citus_lock_waits`).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			break
		}
		select {
		case err := <-done:
			return fmt.Errorf("the decide ended before waiting on the other transaction: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		if waited > 1000 {
			return errors.New("the decide did not wait on the other transaction in 10 s")
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	return <-done
}

// scenario runs the store's operations: what the sidecar, the check
// service and the state commands send.
func scenario(ctx context.Context, s *dedup.Store, o Options) error {
	must := func(op string, err error) error {
		if err != nil {
			o.Logf("citusplan: %s: %v", op, err)
			return fmt.Errorf("citusplan: %s: %w", op, err)
		}
		return nil
	}
	digest := func(e, v int) canon.Digest {
		var d canon.Digest
		copy(d[:], fmt.Sprintf("entity-%06d-version-%06d-digest", e, v))
		return d
	}
	rules := []dedup.Rule{{Mode: dedup.LastSeen}, {Mode: dedup.Window, Window: time.Hour, Sliding: true}, {Mode: dedup.Version}}
	var parts []dedup.Partition
	var epochs []int64
	for i, rule := range rules {
		service := "plan-" + rule.Mode.String()
		p := dedup.Partition{Group: "g", Topic: "input", Partition: int32(i)}
		parts = append(parts, p)
		op := "decide (" + rule.Mode.String() + ")"
		pctx := withOp(ctx, "acquire")
		pr, err := s.Acquire(pctx, p)
		if err := must("acquire", err); err != nil {
			return err
		}
		if err := must("init progress", s.InitProgress(pctx, p, pr.Epoch, 0)); err != nil {
			return err
		}
		if _, err := s.BindTopic(pctx, p, pr.Epoch, [16]byte{1}); err != nil {
			return must("bind topic", err)
		}
		epochs = append(epochs, pr.Epoch)
		// Two batches: the first creates Batch identities, the second
		// finds half of them and creates as many; 30% of its records
		// repeat their identity's content.
		next := int64(0)
		for b := range 2 {
			batch := &dedup.Batch{Service: service, Rule: rule, Partition: p, Epoch: pr.Epoch, Start: next, End: next + int64(o.Batch), Delivered: next}
			for k := range o.Batch {
				e := b*o.Batch/2 + k
				v := b
				if k%10 < 3 {
					v = 0
				}
				batch.Records = append(batch.Records, dedup.Record{Offset: next + int64(k), Entity: fmt.Appendf(nil, "entity-%06d", e), Digest: digest(e, v), Version: int64(b + 1)})
			}
			if _, err := s.Decide(withOp(ctx, op), batch, nil); err != nil {
				return must(op, err)
			}
			next = batch.End
		}
	}
	if err := must("decide after a lost race", lostRace(ctx, s, parts[0], epochs[0], int64(2*o.Batch), "plan-"+rules[0].Mode.String(), digest(0, 9))); err != nil {
		return err
	}
	p := parts[0]
	rctx := withOp(ctx, "recovery")
	if err := must("set delivered", s.SetDelivered(rctx, []dedup.Delivered{{Partition: parts[0], Offset: 10}, {Partition: parts[1], Offset: 10}})); err != nil {
		return err
	}
	if _, err := s.ReadProgress(rctx, p); err != nil {
		return must("read progress", err)
	}
	if _, err := s.SettledProgress(rctx, p); err != nil {
		return must("settled progress", err)
	}
	if _, _, err := s.Logged(rctx, p, 0, int64(o.Batch)); err != nil {
		return must("logged", err)
	}
	if _, _, err := s.LogStart(rctx, p); err != nil {
		return must("log start", err)
	}
	ectx := withOp(ctx, "dam explain")
	if _, err := s.DecisionAt(ectx, p, 5); err != nil {
		return must("decision at", err)
	}
	if _, _, err := s.LastForward(ectx, p, []byte("entity-000005"), int64(2*o.Batch)); err != nil {
		return must("last forward", err)
	}
	cctx := withOp(ctx, "check")
	if _, err := s.Check(cctx, "plan-check", []byte("entity-000001"), digest(1, 1)); err != nil {
		return must("check", err)
	}
	items := []dedup.CheckItem{{Service: "plan-check", Entity: []byte("entity-000002"), Digest: digest(2, 1)}, {Service: "plan-check", Entity: []byte("entity-000003"), Digest: digest(3, 1)}}
	if _, err := s.CheckBatch(withOp(ctx, "check (batch)"), items, nil); err != nil {
		return must("check batch", err)
	}
	gctx := withOp(ctx, "state get")
	if _, err := s.Get(gctx, "plan-last-seen", []byte("entity-000001")); err != nil {
		return must("state get", err)
	}
	if _, err := s.Count(withOp(ctx, "state count"), "plan-last-seen"); err != nil {
		return must("count", err)
	}
	if _, err := s.Stats(withOp(ctx, "state stats")); err != nil {
		return must("stats", err)
	}
	// The state commands: each runs, but an error does not stop the
	// others (the table shows it).
	ops := []struct {
		op string
		fn func(context.Context) error
	}{
		{"state reset (entities)", func(ctx context.Context) error {
			_, err := s.ResetEntities(ctx, "plan-last-seen", [][]byte{[]byte("entity-000001"), []byte("entity-000002")})
			return err
		}},
		{"state reset (service)", func(ctx context.Context) error {
			_, err := s.ResetService(ctx, "plan-check", dedup.WithBatchSize(100))
			return err
		}},
		{"state prune", func(ctx context.Context) error {
			_, err := s.PruneState(ctx, "", time.Hour, dedup.WithBatchSize(o.Batch))
			return err
		}},
		{"window cleanup", func(ctx context.Context) error {
			_, err := s.PruneWindow(ctx, "", dedup.WithBatchSize(100))
			return err
		}},
		{"window cleanup (locked)", func(ctx context.Context) error {
			_, _, err := s.CleanupWindow(ctx, "plan-window", dedup.WithBatchSize(100))
			return err
		}},
		{"prune log", func(ctx context.Context) error {
			_, err := s.PruneLog(ctx, p, 10)
			return err
		}},
		{"prune kept log", func(ctx context.Context) error {
			_, err := s.PruneLogKept(ctx, p, 20, 0, 100)
			return err
		}},
		{"operator skip", func(ctx context.Context) error {
			pr, err := s.ReadProgress(ctx, p)
			if err != nil || !pr.HasNext {
				return err
			}
			if _, err := s.Skip(ctx, p, pr.Next, -1, "citusplan", "plan"); err != nil {
				return err
			}
			_, _, err = s.SkipAt(ctx, p, pr.Next)
			return err
		}},
	}
	for _, op := range ops {
		if err := op.fn(withOp(ctx, op.op)); err != nil {
			o.Logf("citusplan: %s: %v", op.op, err)
		}
	}
	return nil
}

// Print writes the statements as a Markdown table: operation, statement,
// class, tasks, detail; verbose adds each plan below it.
func Print(w io.Writer, sts []Statement, verbose bool) {
	fmt.Fprintln(w, "| operation | statement | Citus runs it | tasks | how |")
	fmt.Fprintln(w, "|---|---|---|---:|---|")
	for _, st := range sts {
		if st.Class.Kind == "-" {
			if strings.HasPrefix(st.Op, "decide") && strings.TrimSpace(st.SQL) == "COMMIT" {
				fmt.Fprintf(w, "| %s | commit | 2PC | | PREPARE TRANSACTION on each worker connection the transaction wrote over, then COMMIT PREPARED; one phase when it used one |\n", st.Op)
			}
			continue
		}
		kind, tasks, detail := st.Class.Kind, "", st.Class.Detail
		if st.Class.Tasks > 0 {
			tasks = strconv.Itoa(st.Class.Tasks)
		}
		if st.Err != nil {
			detail += "; FAILED when run: " + firstLine(st.Err.Error())
		}
		if st.PlanErr != nil {
			kind, detail = "?", "EXPLAIN failed: "+firstLine(st.PlanErr.Error())
			if strings.Contains(st.PlanErr.Error(), "0A000") { // feature_not_supported
				kind = "refused"
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", st.Op, st.Name, kind, tasks, detail)
	}
	if !verbose {
		return
	}
	for _, st := range sts {
		if st.Plan == "" {
			continue
		}
		fmt.Fprintf(w, "\n-- %s: %s\n%s\n%s\n", st.Op, st.Name, strings.Join(strings.Fields(st.SQL), " "), abbreviate(st.Plan))
		if st.Analyze != "" {
			fmt.Fprintf(w, "-- EXPLAIN ANALYZE (rolled back):\n%s\n", abbreviate(st.Analyze))
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
