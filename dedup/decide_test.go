package dedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

func TestDecideSemantics(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		recs []rec
		want []dedup.Decision
	}{
		{"ABABA", []rec{{"e", "A"}, {"e", "B"}, {"e", "A"}, {"e", "B"}, {"e", "A"}}, []dedup.Decision{F, F, F, F, F}},
		{"AAAAB", []rec{{"e", "A"}, {"e", "A"}, {"e", "A"}, {"e", "A"}, {"e", "B"}}, []dedup.Decision{F, D, D, D, F}},
		{"h1h2h1", []rec{{"e", "h1"}, {"e", "h2"}, {"e", "h1"}}, []dedup.Decision{F, F, F}},
		{"h1h1h2", []rec{{"e", "h1"}, {"e", "h1"}, {"e", "h2"}}, []dedup.Decision{F, D, F}},
		{"interleaved", []rec{{"x", "1"}, {"y", "1"}, {"x", "1"}, {"y", "2"}, {"x", "2"}, {"y", "2"}},
			[]dedup.Decision{F, F, D, F, F, D}},
		{"invalid", []rec{{"e", "A"}, {"e", ""}, {"e", "A"}, {"n", ""}, {"n", "A"}}, []dedup.Decision{F, I, D, I, F}},
	}
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		for _, tc := range cases {
			for _, n := range []int{1, 2, len(tc.recs)} {
				t.Run(fmt.Sprintf("%s/batch=%d", tc.name, n), func(t *testing.T) {
					p, epoch := partition(t, s, fmt.Sprintf("%s/%d", tc.name, n))
					got := decideAll(t, s, fmt.Sprintf("svc-%s/%d", tc.name, n), p, epoch, tc.recs, n)
					if !slices.Equal(got, tc.want) {
						t.Fatalf("got %v, want %v", got, tc.want)
					}
				})
			}
		}
	})
}

func TestServicesIsolated(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	p1, e1 := partition(t, s, "a")
	p2, e2 := partition(t, s, "b")
	if got := decideAll(t, s, "one", p1, e1, []rec{{"e", "A"}}, 1); got[0] != F {
		t.Fatal(got)
	}
	if got := decideAll(t, s, "two", p2, e2, []rec{{"e", "A"}}, 1); got[0] != F {
		t.Fatalf("the same identity in another service: %v", got)
	}
}

func TestBinaryEntitiesRoundTrip(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	p, epoch := partition(t, s, "in")
	keys := [][]byte{{0x00}, {0xff, 0xfe}, {0xc3, 0x28}, nil, []byte("a\x00b"), bytes.Repeat([]byte{0x80}, 300)}
	b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 0, End: int64(len(keys))}
	for i, k := range keys {
		b.Records = append(b.Records, dedup.Record{Offset: int64(i), Entity: k, Digest: digest(fmt.Sprint(i))})
	}
	got, err := s.Decide(context.Background(), b, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if got[i] != F {
			t.Errorf("key %x: %v", k, got[i])
		}
		st, err := s.Get(context.Background(), "svc", k)
		if err != nil {
			t.Fatalf("key %x: %v", k, err)
		}
		if !bytes.Equal(st.Entity, k) || st.Digest != digest(fmt.Sprint(i)) || st.Topic != "in" || st.Offset != int64(i) {
			t.Errorf("key %x: got %+v", k, st)
		}
	}
	if _, err := s.Get(context.Background(), "svc", []byte{0x01}); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("absent identity: %v", err)
	}
}

func TestTombstones(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	p, epoch := partition(t, s, "in")
	b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 0, End: 3, Records: []dedup.Record{
		{Offset: 0, Entity: []byte("e"), Digest: canon.Tombstone},
		{Offset: 1, Entity: []byte("e"), Digest: canon.Tombstone},
		{Offset: 2, Entity: []byte("e"), Digest: digest("A")},
	}}
	got, err := s.Decide(context.Background(), b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []dedup.Decision{F, D, F}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestInvalidRecordsChangeNothingAndAreLogged(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	p, epoch := partition(t, s, "in")
	got := decideAll(t, s, "svc", p, epoch, []rec{{"bad", ""}, {"e", "A"}, {"e", "A"}, {"bad", ""}}, 4)
	if want := []dedup.Decision{I, F, D, I}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if _, err := s.Get(ctx, "svc", []byte("bad")); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("an invalid record stored state: %v", err)
	}
	entries, covered, err := s.Logged(ctx, p, 0, 4)
	if err != nil || !covered {
		t.Fatal(covered, err)
	}
	want := []dedup.LoggedDecision{{Offset: 0, Decision: I, Entity: []byte("bad")}, {Offset: 1, Decision: F, Entity: []byte("e")},
		{Offset: 3, Decision: I, Entity: []byte("bad")}}
	if fmt.Sprint(entries) != fmt.Sprint(want) {
		t.Fatalf("logged %v, want %v", entries, want)
	}
}

// The decision log keeps each invalid entry's cause, bounded and as text
// (valid UTF-8 without NUL, whatever the cause quotes), and none for the
// other entries or a batch without one; a record forwarded already and
// refused by the store is logged as a forward and changes no state.
func TestLoggedCauses(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		ctx := context.Background()
		p, epoch := partition(t, s, "in")
		long := strings.Repeat("é", dedup.MaxCauseBytes)
		b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 0, End: 6, Records: []dedup.Record{
			{Offset: 0, Entity: []byte("bad"), Invalid: true, Cause: "the store refuses the record: 22023"},
			{Offset: 1, Entity: []byte("e"), Digest: digest("A")},
			{Offset: 2, Entity: []byte("f"), Invalid: true, Forwarded: true, Cause: "ignored"},
			{Offset: 3, Entity: []byte("bad"), Invalid: true},
			{Offset: 4, Entity: []byte("bad"), Invalid: true, Cause: "q\x00\xff" + long},
			{Offset: 5, Entity: []byte("e"), Digest: digest("A")},
		}}
		got, err := s.Decide(ctx, b, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := []dedup.Decision{I, F, I, I, I, D}; !slices.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
		if _, err := s.Decide(ctx, &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 6, End: 7,
			Records: []dedup.Record{{Offset: 6, Entity: []byte("e"), Digest: digest("B")}}}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "svc", []byte("f")); !errors.Is(err, dedup.ErrNotFound) {
			t.Fatalf("a forwarded record the store refused stored state: %v", err)
		}
		entries, covered, err := s.Logged(ctx, p, 0, 7)
		if err != nil || !covered {
			t.Fatal(covered, err)
		}
		if len(entries) != 6 {
			t.Fatalf("logged %v, want 6 entries", entries)
		}
		cut := entries[4].Cause
		entries[4].Cause = ""
		want := []dedup.LoggedDecision{
			{Offset: 0, Decision: I, Entity: []byte("bad"), Cause: "the store refuses the record: 22023"},
			{Offset: 1, Decision: F, Entity: []byte("e")},
			{Offset: 2, Decision: F, Entity: []byte("f")},
			{Offset: 3, Decision: I, Entity: []byte("bad")},
			{Offset: 4, Decision: I, Entity: []byte("bad")},
			{Offset: 6, Decision: F, Entity: []byte("e")},
		}
		if fmt.Sprintf("%+v", entries) != fmt.Sprintf("%+v", want) {
			t.Fatalf("logged %+v, want %+v", entries, want)
		}
		if len(cut) > dedup.MaxCauseBytes || !utf8.ValidString(cut) || strings.ContainsRune(cut, 0) ||
			!strings.HasPrefix(cut, "q\uFFFD\uFFFDéé") || !strings.HasSuffix(cut, "é…") {
			t.Errorf("a long cause with a NUL and invalid UTF-8 logged as %d bytes: %.40q…%q", len(cut), cut, cut[max(0, len(cut)-8):])
		}
	})
}

func TestLoggedAndPruneLog(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	p, epoch := partition(t, s, "in")
	// Batches [0,3) [3,3) [3,7) with a skipped offset 6, then [7,10) unlogged.
	batches := []*dedup.Batch{
		{Start: 0, End: 3, Records: []dedup.Record{{Offset: 0, Entity: []byte("a"), Digest: digest("1")},
			{Offset: 1, Entity: []byte("a"), Digest: digest("1")}, {Offset: 2, Entity: []byte("b"), Digest: digest("1")}}},
		{Start: 3, End: 3},
		{Start: 3, End: 7, Records: []dedup.Record{{Offset: 3, Entity: []byte("a"), Digest: digest("2")},
			{Offset: 5, Entity: []byte("b"), Digest: digest("1")}}},
		{Start: 7, End: 10, NoLog: true, Records: []dedup.Record{{Offset: 8, Entity: []byte("c"), Digest: digest("1")}}},
	}
	for _, b := range batches {
		b.Service, b.Partition, b.Epoch = "svc", p, epoch
		if _, err := s.Decide(ctx, b, nil); err != nil {
			t.Fatal(err)
		}
	}
	check := func(from, to int64, wantOffsets []int64, wantCovered bool) {
		t.Helper()
		entries, covered, err := s.Logged(ctx, p, from, to)
		if err != nil {
			t.Fatal(err)
		}
		var offs []int64
		for _, e := range entries {
			if e.Decision != F {
				t.Errorf("entry %+v", e)
			}
			offs = append(offs, e.Offset)
		}
		if !slices.Equal(offs, wantOffsets) || covered != wantCovered {
			t.Errorf("Logged(%d, %d) = %v covered %v, want %v covered %v", from, to, offs, covered, wantOffsets, wantCovered)
		}
	}
	check(0, 7, []int64{0, 2, 3}, true)
	check(1, 4, []int64{2, 3}, true)
	check(2, 2, nil, true)
	check(0, 8, []int64{0, 2, 3}, false) // [7,10) was not logged
	n, err := s.PruneLog(ctx, p, 3)      // drops [0,3)
	if err != nil || n != 1 {
		t.Fatalf("PruneLog: %d, %v", n, err)
	}
	check(0, 7, []int64{3}, false)
	check(3, 7, []int64{3}, true)
	if st, err := s.Get(ctx, "svc", []byte("c")); err != nil || st.Offset != 8 {
		t.Fatalf("NoLog batch did not store state: %+v, %v", st, err)
	}
}

func TestAcquireEpochs(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	p := dedup.Partition{Group: "g", Topic: "t", Partition: 7}
	pr, err := s.Acquire(ctx, p)
	if err != nil || pr.Epoch != 1 || pr.HasNext {
		t.Fatalf("first Acquire: %+v, %v", pr, err)
	}
	if err := s.InitProgress(ctx, p, pr.Epoch, 42); err != nil {
		t.Fatal(err)
	}
	pr2, err := s.Acquire(ctx, p)
	if err != nil || pr2.Epoch != 2 || !pr2.HasNext || pr2.Next != 42 {
		t.Fatalf("second Acquire: %+v, %v", pr2, err)
	}
	if err := s.InitProgress(ctx, p, pr.Epoch, 0); !errors.Is(err, dedup.ErrFenced) {
		t.Fatalf("InitProgress with an old epoch: %v", err)
	}
	if err := s.InitProgress(ctx, p, pr2.Epoch, 7); !errors.Is(err, dedup.ErrFenced) {
		t.Fatalf("InitProgress over a set P: %v", err)
	}
}

// snapshot is everything a fenced Decide must leave untouched.
func snapshot(t *testing.T, s *dedup.Store) string {
	t.Helper()
	var out string
	for _, q := range []string{
		`SELECT coalesce(string_agg(format('%s %s %s', service, encode(entity, 'hex'), encode(digest, 'hex')), ',' ORDER BY service, entity), '') FROM state`,
		`SELECT coalesce(string_agg(format('%s %s', first_offset, offsets), ',' ORDER BY first_offset), '') FROM decision_log`,
		`SELECT coalesce(string_agg(format('%s %s %s %s %s', grp, topic, part, next_offset, epoch), ',' ORDER BY grp, topic, part), '') FROM progress`,
	} {
		var v string
		if err := s.Pool().QueryRow(context.Background(), q).Scan(&v); err != nil {
			t.Fatal(err)
		}
		out += v + "\n"
	}
	return out
}

func TestFencing(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	p, old := partition(t, s, "in")
	decideAll(t, s, "svc", p, old, []rec{{"e", "A"}}, 1)
	pr, err := s.Acquire(ctx, p) // a new owner
	if err != nil || pr.Next != 1 {
		t.Fatal(pr, err)
	}
	before := snapshot(t, s)
	batch := func(epoch, start int64) *dedup.Batch {
		return &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: start, End: start + 2, Records: []dedup.Record{
			{Offset: start, Entity: []byte("e"), Digest: digest("B")},
			{Offset: start + 1, Entity: []byte("new"), Digest: digest("B")}}}
	}
	for name, b := range map[string]*dedup.Batch{
		"old epoch":      batch(old, 1),
		"start mismatch": batch(pr.Epoch, 0),
		"start ahead":    batch(pr.Epoch, 5),
		"unknown":        {Service: "svc", Partition: dedup.Partition{Group: "g", Topic: "none"}, Epoch: 1, Start: 0, End: 0},
	} {
		got, err := s.Decide(ctx, b, nil)
		if !errors.Is(err, dedup.ErrFenced) || len(got) != 0 {
			t.Errorf("%s: got %v, %v; want ErrFenced", name, got, err)
		}
	}
	if after := snapshot(t, s); after != before {
		t.Fatalf("a fenced Decide changed the store:\nbefore %s\nafter  %s", before, after)
	}
	if got, err := s.Decide(ctx, batch(pr.Epoch, 1), nil); err != nil || !slices.Equal(got, []dedup.Decision{F, F}) {
		t.Fatalf("the new owner: %v, %v", got, err)
	}
}

func TestDecideRejectsInvalidBatches(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	p, epoch := partition(t, s, "in")
	r := func(o int64) dedup.Record { return dedup.Record{Offset: o, Entity: []byte("e"), Digest: digest("A")} }
	for name, b := range map[string]*dedup.Batch{
		"no service":   {Start: 0, End: 1, Records: []dedup.Record{r(0)}},
		"end < start":  {Service: "s", Start: 2, End: 1},
		"out of order": {Service: "s", Start: 0, End: 3, Records: []dedup.Record{r(1), r(0)}},
		"repeated":     {Service: "s", Start: 0, End: 3, Records: []dedup.Record{r(1), r(1)}},
		"below start":  {Service: "s", Start: 1, End: 3, Records: []dedup.Record{r(0)}},
		"at end":       {Service: "s", Start: 0, End: 3, Records: []dedup.Record{r(3)}},
		"zero digest":  {Service: "s", Start: 0, End: 1, Records: []dedup.Record{{Offset: 0, Entity: []byte("e")}}},
		"forwarded, not invalid": {Service: "s", Start: 0, End: 1, Records: []dedup.Record{{Offset: 0, Entity: []byte("e"),
			Digest: digest("A"), Forwarded: true}}},
	} {
		b.Partition, b.Epoch = p, epoch
		if _, err := s.Decide(context.Background(), b, nil); !errors.Is(err, dedup.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	// An empty batch is valid: it only advances progress.
	if _, err := s.Decide(context.Background(), &dedup.Batch{Service: "s", Partition: p, Epoch: epoch, Start: 0, End: 10}, nil); err != nil {
		t.Fatal(err)
	}
	if pr, err := s.Acquire(context.Background(), p); err != nil || pr.Next != 10 {
		t.Fatal(pr, err)
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	var got []dedup.Decision
	for _, c := range []string{"A", "A", "B", "A", "A"} {
		d, err := s.Check(ctx, "svc", []byte{0xff, 0}, digest(c))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, d)
	}
	if want := []dedup.Decision{F, D, F, F, D}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// Check and Decide share the state.
	p, epoch := partition(t, s, "in")
	if got := decideAll(t, s, "svc", p, epoch, []rec{{"\xff\x00", "A"}, {"\xff\x00", "C"}}, 2); !slices.Equal(got, []dedup.Decision{D, F}) {
		t.Fatal(got)
	}
	if _, err := s.Check(ctx, "svc", []byte("e"), canon.Digest{}); !errors.Is(err, dedup.ErrInvalid) {
		t.Fatal(err)
	}
}

func TestResetPruneStats(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		ctx := context.Background()
		for _, svc := range []string{"a", "b"} {
			for _, e := range []string{"1", "2", "3"} {
				if _, err := s.Check(ctx, svc, []byte(e), digest("x")); err != nil {
					t.Fatal(err)
				}
			}
		}
		stats, err := s.Stats(ctx)
		if err != nil || len(stats) != 2 || stats[0].Service != "a" || stats[0].Rows != 3 || stats[0].Oldest.IsZero() {
			t.Fatalf("Stats: %+v, %v", stats, err)
		}
		if n, err := s.Count(ctx, "b"); err != nil || n != 3 {
			t.Fatalf("Count(b): %d, %v", n, err)
		}
		if n, err := s.Count(ctx, "none"); err != nil || n != 0 {
			t.Fatalf("Count(none): %d, %v", n, err)
		}
		if n, err := s.Reset(ctx, "a", []byte("1"), []byte("9")); err != nil || n != 1 {
			t.Fatalf("Reset one: %d, %v", n, err)
		}
		if d, _ := s.Check(ctx, "a", []byte("1"), digest("x")); d != F {
			t.Fatal("a reset identity's next record must be forwarded")
		}
		if n, err := s.Reset(ctx, "a"); err != nil || n != 3 {
			t.Fatalf("Reset service: %d, %v", n, err)
		}
		if n, err := s.PruneState(ctx, "", 1e9*3600); err != nil || n != 0 {
			t.Fatalf("PruneState of fresh rows: %d, %v", n, err)
		}
		if _, err := s.Pool().Exec(ctx, `UPDATE state SET updated_at = now() - interval '2 hours' WHERE entity <> '3'`); err != nil {
			t.Fatal(err)
		}
		if n, err := s.PruneState(ctx, "b", 3600e9); err != nil || n != 2 {
			t.Fatalf("PruneState: %d, %v", n, err)
		}
		if stats, _ := s.Stats(ctx); len(stats) != 1 || stats[0].Rows != 1 {
			t.Fatalf("after prune: %+v", stats)
		}
	})
}

func TestOpenSessionSettings(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	s, err := dedup.Open(context.Background(), dsn, dedup.Config{StatementTimeout: 3 * time.Second, IdleInTransactionTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var stmt, lock, idle, app, path string
	err = s.Pool().QueryRow(context.Background(), `SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),
		current_setting('idle_in_transaction_session_timeout'), current_setting('application_name'), current_setting('search_path')`).
		Scan(&stmt, &lock, &idle, &app, &path)
	if err != nil {
		t.Fatal(err)
	}
	if stmt != "3s" || lock != "2s" || idle != "0" || app != "dam" || !strings.HasPrefix(path, "dam_test_") {
		t.Fatalf("statement_timeout %s, lock_timeout %s, idle_in_transaction_session_timeout %s, application_name %s, search_path %s",
			stmt, lock, idle, app, path)
	}
}

// TestPruneStateChunks prunes more rows than one step holds, across
// services, with the empty identity among them: the keyset walk must visit
// every row exactly once, keep the fresh ones and count what it deleted.
func TestPruneStateChunks(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		ctx := context.Background()
		// 25,001 rows of service "p" (every other one old, the empty identity
		// old too) and 3 rows of each of "o" and "q" (all old).
		_, err := s.Pool().Exec(ctx, `INSERT INTO state (service, entity, digest, updated_at)
			SELECT 'p', int4send(i), '\x01'::bytea, CASE WHEN i % 2 = 0 THEN now() - interval '2 hours' ELSE now() END
			FROM generate_series(1, 25000) i
			UNION ALL SELECT 'p', ''::bytea, '\x01'::bytea, now() - interval '2 hours'
			UNION ALL SELECT svc, int4send(i), '\x01'::bytea, now() - interval '2 hours'
			FROM unnest(ARRAY['o', 'q']) svc, generate_series(1, 3) i`)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := s.PruneState(ctx, "p", time.Hour); err != nil || n != 12501 {
			t.Fatalf("PruneState(p): %d, %v; want 12501", n, err)
		}
		var left int
		if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM state WHERE service = 'p' AND updated_at < now() - interval '1 hour'`).Scan(&left); err != nil || left != 0 {
			t.Fatalf("old rows of p left: %d, %v", left, err)
		}
		if n, err := s.PruneState(ctx, "", time.Hour); err != nil || n != 6 {
			t.Fatalf("PruneState(all): %d, %v; want 6", n, err)
		}
		stats, err := s.Stats(ctx)
		if err != nil || len(stats) != 1 || stats[0].Service != "p" || stats[0].Rows != 12500 {
			t.Fatalf("after prune: %+v, %v", stats, err)
		}
	})
}

// TestDecideNewIdentityRace: a Decide that finds an identity absent while
// another transaction is creating it must not keep its stale decision. The
// other transaction's insert is held open until Decide waits on it; once it
// commits with the same content, Decide loses the race, runs again, finds
// the row and decides Duplicate (a stale Forward would deliver it twice).
//
// With claims (Citus's shape) the first run is the same (not locking); the
// run after the lost race claims.
func TestDecideNewIdentityRace(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		testDecideNewIdentityRace(t, shape(newStore(t)), false)
	})
}

// A Decide that keeps losing races for new identities ends with an error
// the caller retries (ErrUnavailable), not with the unique violation, a
// permanent error that would halt the sidecar's partition for good. Here
// it may run once only, and loses that run.
func TestDecideLosingRacesIsTransient(t *testing.T) {
	defer dedup.SetDecideAttempts(0)() // one run for a batch of one identity
	testDecideNewIdentityRace(t, newStore(t), true)
}

func testDecideNewIdentityRace(t *testing.T, s *dedup.Store, exhaust bool) {
	ctx := context.Background()
	p, epoch := partition(t, s, "race")

	other, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	d := digest("A")
	if _, err := other.Exec(ctx, `INSERT INTO state (service, entity, digest) VALUES ('svc', 'new', $1)`, d[:]); err != nil {
		t.Fatal(err)
	}
	// On one server, Decide waits for this transaction itself: tests
	// running in parallel wait for locks of their own.
	var xid string
	if err := other.QueryRow(ctx, `SELECT pg_current_xact_id()::xid::text`).Scan(&xid); err != nil {
		t.Fatal(err)
	}

	b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 0, End: 1,
		Records: []dedup.Record{{Offset: 0, Entity: []byte("new"), Digest: d}}}
	// Decide's insert waits on the open transaction.
	done := decideBlocked(ctx, t, s, b, xid, "the concurrent insert")
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if exhaust {
		if !errors.Is(r.err, dedup.ErrUnavailable) || !dedup.Transient(r.err) {
			t.Fatalf("Decide that lost its only run: %v, %v; want an error wrapping ErrUnavailable", r.got, r.err)
		}
		return
	}
	if r.err != nil || !slices.Equal(r.got, []dedup.Decision{D}) {
		t.Fatalf("Decide after losing the race: %v, %v; want [Duplicate]", r.got, r.err)
	}
	next := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 1, End: 3, Records: []dedup.Record{
		{Offset: 1, Entity: []byte("new"), Digest: d}, {Offset: 2, Entity: []byte("new"), Digest: digest("B")}}}
	if got, err := s.Decide(ctx, next, nil); err != nil || !slices.Equal(got, []dedup.Decision{D, F}) {
		t.Fatalf("next batch: %v, %v", got, err)
	}
}

// TestRoutedFirstRunCountsPaddedRows: a routed first run inserts its new
// identities by a multi-row VALUES padded by repeating the last row, and
// counts what it inserted: an identity created meanwhile by another
// transaction, the last (whose row is repeated) or one before it, fails the
// count, and the batch is decided again on the row (Duplicate), never
// forwarded a second time.
func TestRoutedFirstRunCountsPaddedRows(t *testing.T) {
	t.Parallel()
	for _, n := range []int{9, 13} { // padded to 10 and 14 rows
		for _, at := range []int{n - 1, n / 2} {
			t.Run(fmt.Sprintf("%d-new-created-%d", n, at), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				s := newStore(t)
				dedup.SetClaims(s)
				p, epoch := partition(t, s, "pad")
				d := digest("A")
				other, err := s.Pool().Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer other.Rollback(ctx)
				created := fmt.Sprintf("new-%02d", at)
				if _, err := other.Exec(ctx, `INSERT INTO state (service, entity, digest, updated_at) VALUES ('svc', $1::bytea, $2, now())`,
					[]byte(created), d[:]); err != nil {
					t.Fatal(err)
				}
				var xid string
				if err := other.QueryRow(ctx, `SELECT pg_current_xact_id()::xid::text`).Scan(&xid); err != nil {
					t.Fatal(err)
				}
				b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 0, End: int64(n)}
				want := make([]dedup.Decision, n)
				for i := range n {
					b.Records = append(b.Records, dedup.Record{Offset: int64(i), Entity: fmt.Appendf(nil, "new-%02d", i), Digest: d})
					want[i] = F
				}
				want[at] = D
				done := decideBlocked(ctx, t, s, b, xid, "the concurrent insert")
				if err := other.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				r := <-done
				if r.err != nil || !slices.Equal(r.got, want) {
					t.Fatalf("Decide after %s was created meanwhile: %v, %v; want %v", created, r.got, r.err, want)
				}
			})
		}
	}
}
