package dedup_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// TestDecidePlans: no statement of a Decide scans a whole table, in each
// mode, from an empty table on: the lock reads by key (the batch's keys in
// the index condition), the rewrites by tid, for a batch of thousands of
// identities too: not a sequential scan of the whole state table for the
// lock, nor one in a hash join for the rewrite by tid; and the sliding
// window's extension does not read every id of the service through the
// expiry index.
func TestDecidePlans(t *testing.T) {
	for _, m := range []struct {
		name string
		rule dedup.Rule
	}{
		{"last-seen", dedup.Rule{}},
		{"window", dedup.Rule{Mode: dedup.Window, Window: time.Hour, Sliding: true}},
		{"version", dedup.Rule{Mode: dedup.Version}},
	} {
		t.Run(m.name, func(t *testing.T) { testDecidePlans(t, m.rule) })
	}
}

// keysInIndex matches a plan whose index condition holds the batch's keys.
var keysInIndex = regexp.MustCompile(`"Index Cond": "[^"]*= ANY`)

func testDecidePlans(t *testing.T, rule dedup.Rule) {
	ctx := context.Background()
	s, err := dedup.Open(ctx, pgtest.DSN(t), dedup.Config{MaxConns: 1}) // one session: its statements
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if distributed(t, s) {
		t.Skip("the one-server statements' plans; on Citus the decide claims, and tests/citusplan checks its plans")
	}
	p, epoch := partition(t, s, "in")
	st := newBenchStream()
	next := int64(0)
	for range 8 { // past the five custom plans PostgreSQL tries, to the generic one
		recs := st.next(6000, rule)
		b := &dedup.Batch{Service: "bench", Partition: p, Epoch: epoch, Rule: rule, Start: next, End: next + int64(len(recs[0]))}
		for i, r := range recs[0] {
			b.Records = append(b.Records, dedup.Record{Offset: next + int64(i), Entity: r.entity, Digest: r.digest, Version: r.version})
		}
		if _, err := s.Decide(ctx, b, nil); err != nil {
			t.Fatal(err)
		}
		next = b.End
	}
	conn, err := s.Pool().Acquire(ctx) // the session that decided
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	type stmt struct {
		name, q string
		params  int
	}
	rows, err := conn.Query(ctx, `SELECT name, statement, cardinality(parameter_types) FROM pg_prepared_statements
		WHERE statement ~ '(state|window_ids|versions|decision_log|progress)' AND statement !~ '^INSERT INTO progress'
			AND statement !~ 'SET next_offset = \$5' AND statement !~ 'pg_prepared_statements'`)
	if err != nil {
		t.Fatal(err)
	}
	stmts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (st stmt, err error) {
		return st, r.Scan(&st.name, &st.q, &st.params)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(stmts) < 5 { // lock progress, lock state, update, insert, log, advance
		t.Fatalf("found %d of a Decide's statements in pg_prepared_statements", len(stmts))
	}
	for _, st := range stmts {
		// The plan the decide runs: its settings, in a transaction.
		args := ""
		if st.params > 0 {
			args = "(" + strings.TrimSuffix(strings.Repeat("NULL, ", st.params), ", ") + ")"
		}
		var plan string
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, dedup.SQLPlans); err != nil {
				return err
			}
			return tx.QueryRow(ctx, fmt.Sprintf("EXPLAIN (FORMAT JSON) EXECUTE %s%s", pgx.Identifier{st.name}.Sanitize(), args)).Scan(&plan)
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, node := range []string{"Seq Scan", "Hash Join", "Merge Join", "Materialize"} {
			if strings.Contains(plan, `"Node Type": "`+node+`"`) {
				t.Errorf("%s\nhas a %s (reading more than its rows): %s", st.q, node, nodeTypes(plan))
			}
		}
		if strings.Contains(st.q, "ctid = u.t") && !strings.Contains(plan, `"Node Type": "Tid Scan"`) {
			t.Errorf("%s\nrewrites without a TID scan: %s", st.q, nodeTypes(plan))
		}
		if strings.Contains(st.q, "= ANY($2::bytea[])") && !keysInIndex.MatchString(plan) {
			t.Errorf("%s\nfilters the batch's keys instead of looking them up: %s", st.q, nodeTypes(plan))
		}
		if strings.Contains(plan, "_by_service") {
			t.Errorf("%s\nreads through a (service, identity) index, not by key: %s", st.q, plan)
		}
	}
}

// TestServiceWalkPlans: what walks one service's rows (Count, and the
// chunks of ResetService and PruneState, in both shapes) reads that
// service's part of the (service, identity) indexes, never every
// service's rows: the tables are keyed identity first (migration 007),
// and a walk along the primary key or a sequential scan read 400,000 rows
// for a service of 2,000. Planned for chunks of the default sizes on
// analyzed tables where the service walked holds 1% of the rows.
func TestServiceWalkPlans(t *testing.T) {
	ctx := context.Background()
	s, err := dedup.Open(ctx, pgtest.DSN(t), dedup.Config{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if distributed(t, s) {
		t.Skip("the one-server plans; tests/citusplan checks the statements' plans on Citus")
	}
	for _, q := range []string{
		`INSERT INTO state (service, entity, digest) SELECT CASE WHEN i % 100 = 0 THEN 'small' ELSE 'big' END,
			int4send(i), '\x01' FROM generate_series(1, 200000) i`,
		`INSERT INTO versions (service, entity, version, digest, updated_at) SELECT CASE WHEN i % 100 = 0 THEN 'small' ELSE 'big' END,
			int4send(i), 1, '\x01', now() FROM generate_series(1, 200000) i`,
		`INSERT INTO window_ids (service, id, expires_at, forwarded_at, digest) SELECT CASE WHEN i % 100 = 0 THEN 'small' ELSE 'big' END,
			int4send(i), now() + interval '1 hour', now(), '\x01' FROM generate_series(1, 200000) i`,
		`ANALYZE state, versions, window_ids`,
	} {
		if _, err := s.Pool().Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range dedup.ServiceWalks("small") {
		var plan string
		if err := s.Pool().QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+w.SQL, w.Args...).Scan(&plan); err != nil {
			t.Fatalf("%s: %v", w.Name, err)
		}
		if !strings.Contains(plan, "_by_service") {
			t.Errorf("%s does not walk the service's part of its (service, identity) index: %s", w.Name, nodeTypes(plan))
		}
		for _, node := range []string{"Seq Scan", "Hash Join", "Merge Join"} {
			if strings.Contains(plan, `"Node Type": "`+node+`"`) {
				t.Errorf("%s has a %s (reading more than the service's rows): %s", w.Name, node, nodeTypes(plan))
			}
		}
	}
}

// TestDecidePlansForBigBatches: planned for a batch of 3,000 identities on
// an analyzed table of 30,000 rows (as a prepared statement's first
// executions are, with their arguments), the lock looks the keys up and
// the rewrites go by tid, with the decide's planner settings (without
// them, PostgreSQL plans a sequential scan of the whole table for both).
func TestDecidePlansForBigBatches(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if distributed(t, s) {
		t.Skip("the one-server statements' plans; on Citus the decide claims, and tests/citusplan checks its plans")
	}
	pool := s.Pool()
	for _, table := range []string{"state", "window_ids"} {
		key, extra := "entity", "digest"
		if table == "window_ids" {
			key, extra = "id", "expires_at, forwarded_at, digest"
		}
		vals := "'\\x00'::bytea"
		if table == "window_ids" {
			vals = "now(), now(), '\\x00'::bytea"
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (service, %s, %s)
			SELECT 'bench', convert_to('entity-' || lpad(i::text, 6, '0'), 'UTF8'), %s FROM generate_series(1, 30000) i`, table, key, extra, vals)); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "ANALYZE "+table); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		table, sql string
		byTID      bool
	}{
		{"state", dedup.SQLReadState, false},
		{"state", dedup.SQLLockState, false},
		{"state", dedup.SQLUpdateState, true},
		{"window_ids", dedup.SQLReadWindow, false},
		{"window_ids", dedup.SQLLockWindow, false},
		{"window_ids", dedup.SQLUpdateWindow, true},
		{"window_ids", dedup.SQLExtendWindow, true},
	} {
		key := "entity"
		if c.table == "window_ids" {
			key = "id"
		}
		// The batch's arguments, as literals: planned as a custom plan is.
		var keys, tids, xmins, zeros string
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT array_agg(%s)::text, array_agg(ctid)::text, array_agg(xmin)::text, array_agg(0)::text
			FROM (SELECT %s, ctid, xmin FROM %s ORDER BY md5(%s::text) LIMIT 3000) x`, key, key, c.table, key)).Scan(&keys, &tids, &xmins, &zeros); err != nil {
			t.Fatal(err)
		}
		args := map[string]string{
			"$1": "'bench'", "$2": "'in'", "$3": "0", "$4": lit(keys, "bytea[]"), "$5": lit(keys, "bytea[]"),
			"$6": lit(zeros, "bigint[]"), "$7": "now()", "$8": lit(tids, "tid[]"), "$9": lit(xmins, "xid[]"),
		}
		switch c.sql {
		case dedup.SQLExtendWindow:
			args["$2"], args["$3"], args["$4"] = lit(tids, "tid[]"), "now()", lit(xmins, "xid[]")
		case dedup.SQLUpdateWindow:
			args["$8"], args["$9"], args["$10"] = "now()", lit(tids, "tid[]"), lit(xmins, "xid[]")
		}
		if strings.HasPrefix(c.sql, "SELECT") { // the reads
			args["$2"] = lit(keys, "bytea[]")
		}
		q := regexp.MustCompile(`\$[0-9]+`).ReplaceAllStringFunc(c.sql, func(p string) string { return args[p] })
		var plan string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, dedup.SQLPlans); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+q).Scan(&plan)
		})
		if err != nil {
			t.Fatalf("%s: %v", c.sql, err)
		}
		// The lock may read the service's rows through the index when the
		// batch holds a tenth of them (PostgreSQL's call, by its costs), but
		// never a whole table; a rewrite goes by tid, nothing else.
		nodes := nodeTypes(plan)
		for _, node := range []string{"Seq Scan", "Hash Join", "Merge Join", "Materialize"} {
			if strings.Contains(nodes, node) {
				t.Errorf("%s\nhas a %s: %s", c.sql, node, nodes)
			}
		}
		if c.byTID && (!strings.Contains(nodes, "Tid Scan") || strings.Contains(nodes, "Index")) {
			t.Errorf("%s\nrewrites other than by tid: %s", c.sql, nodes)
		}
	}
}

// nodeTypes lists a JSON plan's node types.
func nodeTypes(plan string) string {
	var ns []string
	for _, m := range regexp.MustCompile(`"Node Type": "([^"]+)"`).FindAllStringSubmatch(plan, -1) {
		ns = append(ns, m[1])
	}
	return strings.Join(ns, " > ")
}

// lit is a literal of type typ holding text.
func lit(text, typ string) string {
	return "'" + strings.ReplaceAll(text, "'", "''") + "'::" + typ
}
