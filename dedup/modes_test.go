package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

const (
	S = dedup.Stale
	R = dedup.Refresh
)

// step is one batch decided at t0 + at.
type step struct {
	at   time.Duration
	recs []vrec
	want []dedup.Decision
}

func runSteps(t *testing.T, rule dedup.Rule, steps []step) {
	t.Helper()
	s := newStore(t)
	st := newStream(t, s, "in", rule)
	for i, sp := range steps {
		if got := st.decide(t0.Add(sp.at), sp.recs...); !slices.Equal(got, sp.want) {
			t.Fatalf("step %d (t0+%v): got %v, want %v", i, sp.at, got, sp.want)
		}
	}
}

func TestWindowSemantics(t *testing.T) {
	t.Parallel()
	fixed := dedup.Rule{Mode: dedup.Window, Window: time.Hour}
	sliding := dedup.Rule{Mode: dedup.Window, Window: time.Hour, Sliding: true}
	cases := []struct {
		name  string
		rule  dedup.Rule
		steps []step
	}{
		{"repeats in one batch, content ignored", fixed, []step{
			{0, []vrec{{"a", "1", 0}, {"a", "2", 0}, {"b", "1", 0}, {"a", "1", 0}, {"b", "9", 0}}, []dedup.Decision{F, D, F, D, D}},
		}},
		{"invalid records change nothing", fixed, []step{
			{0, []vrec{{"a", "", 0}, {"a", "1", 0}, {"a", "", 0}, {"a", "1", 0}}, []dedup.Decision{I, F, I, D}},
		}},
		{"expiry exactly at the boundary", fixed, []step{
			{0, []vrec{{"a", "1", 0}}, []dedup.Decision{F}},
			{time.Hour - us, []vrec{{"a", "1", 0}}, []dedup.Decision{D}},
			{time.Hour, []vrec{{"a", "2", 0}, {"a", "3", 0}}, []dedup.Decision{F, D}},
			{2*time.Hour - us, []vrec{{"a", "1", 0}}, []dedup.Decision{D}},
			{2 * time.Hour, []vrec{{"a", "1", 0}}, []dedup.Decision{F}},
		}},
		{"fixed window: repeats do not extend it", fixed, []step{
			{0, []vrec{{"a", "1", 0}}, []dedup.Decision{F}},
			{30 * time.Minute, []vrec{{"a", "1", 0}}, []dedup.Decision{D}},
			{time.Hour, []vrec{{"a", "1", 0}}, []dedup.Decision{F}},
		}},
		{"sliding window: each repeat extends it", sliding, []step{
			{0, []vrec{{"a", "1", 0}, {"b", "1", 0}}, []dedup.Decision{F, F}},
			{30 * time.Minute, []vrec{{"a", "1", 0}}, []dedup.Decision{D}},
			{time.Hour, []vrec{{"a", "1", 0}, {"b", "1", 0}}, []dedup.Decision{D, F}}, // a: until 1h30m; b: expired
			{2*time.Hour - us, []vrec{{"a", "1", 0}}, []dedup.Decision{D}},            // until 3h - 1µs
			{3*time.Hour - 2*us, []vrec{{"c", "1", 0}}, []dedup.Decision{F}},
			{3*time.Hour - us, []vrec{{"a", "1", 0}}, []dedup.Decision{F}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runSteps(t, tc.rule, tc.steps)
		})
	}
}

func TestVersionSemantics(t *testing.T) {
	t.Parallel()
	rule := dedup.Rule{Mode: dedup.Version}
	cases := []struct {
		name  string
		steps []step
	}{
		{"higher forwards, equal is a duplicate, lower is stale", []step{
			{0, []vrec{{"e", "a", 1}}, []dedup.Decision{F}},
			{0, []vrec{{"e", "b", 1}}, []dedup.Decision{D}}, // content does not matter
			{0, []vrec{{"e", "c", 3}}, []dedup.Decision{F}},
			{0, []vrec{{"e", "d", 2}}, []dedup.Decision{S}},
			{0, []vrec{{"e", "c", 3}}, []dedup.Decision{D}},
			{0, []vrec{{"e", "e", 4}}, []dedup.Decision{F}},
		}},
		{"repeats in one batch", []step{
			{0, []vrec{{"e", "a", 5}, {"e", "a", 5}, {"e", "a", 4}, {"x", "a", 4}, {"e", "a", 6}, {"x", "a", 4}, {"e", "a", 5}},
				[]dedup.Decision{F, D, S, F, F, D, S}},
		}},
		{"the first version of an identity forwards, whatever it is", []step{
			{0, []vrec{{"neg", "a", -7}, {"zero", "a", 0}, {"neg", "a", -8}, {"neg", "a", -6}}, []dedup.Decision{F, F, S, F}},
		}},
		{"invalid records change nothing", []step{
			{0, []vrec{{"e", "", 9}, {"e", "a", 1}, {"e", "", 9}, {"e", "a", 2}}, []dedup.Decision{I, F, I, F}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runSteps(t, rule, tc.steps)
		})
	}
}

func TestRefreshSemantics(t *testing.T) {
	t.Parallel()
	rule := dedup.Rule{RefreshAfter: time.Hour}
	runSteps(t, rule, []step{
		{0, []vrec{{"e", "A", 0}, {"e", "A", 0}}, []dedup.Decision{F, D}},
		{time.Hour, []vrec{{"e", "A", 0}}, []dedup.Decision{D}},                        // exactly refresh_after ago: not longer
		{time.Hour + us, []vrec{{"e", "A", 0}, {"e", "A", 0}}, []dedup.Decision{R, D}}, // refreshed, then just forwarded
		{time.Hour + 30*time.Minute, []vrec{{"e", "B", 0}}, []dedup.Decision{F}},       // a change forwards at any time
		{2*time.Hour + 30*time.Minute, []vrec{{"e", "B", 0}}, []dedup.Decision{D}},
		{2*time.Hour + 30*time.Minute + us, []vrec{{"e", "B", 0}, {"f", "B", 0}}, []dedup.Decision{R, F}},
	})

	// Without refresh_after, the same stream never refreshes.
	runSteps(t, dedup.Rule{}, []step{
		{0, []vrec{{"e", "A", 0}}, []dedup.Decision{F}},
		{1000 * time.Hour, []vrec{{"e", "A", 0}}, []dedup.Decision{D}},
	})
}

// TestModesStateAndLog checks, for every mode, what Decide stores (Get) and
// logs: every forward (refreshes too) is logged as Forward with its
// identity, so that recovery re-delivers it; duplicates and stale records
// are not logged.
func TestModesStateAndLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		rule    dedup.Rule
		recs    []vrec
		at      []time.Duration // per batch of one record
		want    []dedup.Decision
		logged  []int64
		check   string // identity to Get
		version int64
	}{
		{dedup.Rule{RefreshAfter: time.Minute}, []vrec{{"e", "A", 0}, {"e", "A", 0}, {"e", "A", 0}},
			[]time.Duration{0, time.Second, time.Hour}, []dedup.Decision{F, D, R}, []int64{0, 2}, "e", 0},
		{dedup.Rule{Mode: dedup.Window, Window: time.Minute}, []vrec{{"id", "A", 0}, {"id", "B", 0}, {"id", "C", 0}},
			[]time.Duration{0, time.Second, time.Hour}, []dedup.Decision{F, D, F}, []int64{0, 2}, "id", 0},
		{dedup.Rule{Mode: dedup.Version}, []vrec{{"e", "A", 2}, {"e", "B", 1}, {"e", "C", 2}, {"e", "D", 3}},
			[]time.Duration{0, 0, 0, 0}, []dedup.Decision{F, S, D, F}, []int64{0, 3}, "e", 3},
	}
	for _, tc := range cases {
		t.Run(tc.rule.Mode.String(), func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			st := newStream(t, s, "in", tc.rule)
			var got []dedup.Decision
			for i, r := range tc.recs {
				got = append(got, st.decide(t0.Add(tc.at[i]), r)...)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("decisions %v, want %v", got, tc.want)
			}
			entries, covered, err := s.Logged(ctx, st.p, 0, st.next)
			if err != nil || !covered {
				t.Fatalf("Logged: covered %v, %v", covered, err)
			}
			var offs []int64
			for _, e := range entries {
				if e.Decision != F || string(e.Entity) != tc.check {
					t.Errorf("log entry %+v", e)
				}
				offs = append(offs, e.Offset)
			}
			if !slices.Equal(offs, tc.logged) {
				t.Errorf("logged offsets %v, want %v", offs, tc.logged)
			}
			last := tc.logged[len(tc.logged)-1]
			state, err := s.Get(ctx, "svc", []byte(tc.check))
			if err != nil {
				t.Fatal(err)
			}
			if state.Mode != tc.rule.Mode || state.Offset != last || state.Digest != digest(tc.recs[last].content) ||
				!state.UpdatedAt.Equal(t0.Add(tc.at[last])) || state.Version != tc.version || state.Topic != "in" {
				t.Errorf("Get: %+v", state)
			}
			if tc.rule.Mode == dedup.Window && !state.ExpiresAt.Equal(t0.Add(tc.at[last]+tc.rule.Window)) {
				t.Errorf("ExpiresAt %v, want %v", state.ExpiresAt, t0.Add(tc.at[last]+tc.rule.Window))
			}
		})
	}
}

func TestDecideRejectsInvalidRules(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	p, epoch := partition(t, s, "in")
	for _, r := range []dedup.Rule{
		{Mode: dedup.Window},
		{Mode: dedup.Window, Window: -time.Second},
		{Mode: dedup.Version, Window: time.Second},
		{Sliding: true},
		{RefreshAfter: -time.Second},
		{Mode: dedup.Version, RefreshAfter: time.Second},
		{Mode: dedup.Window, Window: time.Second, RefreshAfter: time.Second},
		{Mode: 9},
	} {
		b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Rule: r, Start: 0, End: 1,
			Records: []dedup.Record{{Offset: 0, Entity: []byte("e"), Digest: digest("A")}}}
		if _, err := s.Decide(context.Background(), b, nil); !errors.Is(err, dedup.ErrInvalid) {
			t.Errorf("rule %+v: %v, want ErrInvalid", r, err)
		}
	}
}

// TestConcurrentDecidersWindowAndVersion runs deciders of several
// partitions of one service at once on overlapping identities, on the
// database's clock. Window: every id is forwarded exactly once. Version: no
// version of an identity is forwarded twice, and every identity's highest
// version is forwarded and stored.
func TestConcurrentDecidersWindowAndVersion(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		testConcurrentDeciders(t, shape)
	})
}

func testConcurrentDeciders(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
	const deciders, batches, perBatch, ids = 4, 6, 150, 200
	for _, rule := range []dedup.Rule{{Mode: dedup.Window, Window: time.Hour}, {Mode: dedup.Version}} {
		t.Run(rule.Mode.String(), func(t *testing.T) {
			t.Parallel()
			s := shape(newStore(t))
			var mu sync.Mutex
			forwards := map[string][]int64{} // identity: versions forwarded
			highest := map[string]int64{}
			var wg sync.WaitGroup
			errs := make(chan error, deciders)
			for d := range deciders {
				st := newStream(t, s, fmt.Sprint("in-", d), rule)
				rng := rand.New(rand.NewPCG(uint64(d), 99))
				var recs [][]vrec
				for range batches {
					var b []vrec
					for range perBatch {
						r := vrec{id: fmt.Sprint("id-", rng.IntN(ids)), content: "x", version: rng.Int64N(50)}
						b = append(b, r)
						highest[r.id] = max(highest[r.id], r.version)
					}
					recs = append(recs, b)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, b := range recs {
						bt := &dedup.Batch{Service: st.svc, Partition: st.p, Epoch: st.epoch, Rule: rule,
							Start: st.next, End: st.next + int64(len(b))}
						for i, r := range b {
							bt.Records = append(bt.Records, dedup.Record{Offset: st.next + int64(i), Entity: []byte(r.id),
								Digest: digest(r.content), Version: r.version})
						}
						got, err := s.Decide(context.Background(), bt, nil)
						if err != nil {
							errs <- err
							return
						}
						st.next = bt.End
						mu.Lock()
						for i, dec := range got {
							if dec == F {
								forwards[b[i].id] = append(forwards[b[i].id], b[i].version)
							}
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for id, vs := range forwards {
				switch rule.Mode {
				case dedup.Window:
					if len(vs) != 1 {
						t.Errorf("id %s forwarded %d times", id, len(vs))
					}
				case dedup.Version:
					sorted := slices.Clone(vs)
					slices.Sort(sorted)
					if len(slices.Compact(sorted)) != len(vs) {
						t.Errorf("%s: a version forwarded twice: %v", id, vs)
					}
					st, err := s.Get(context.Background(), "svc", []byte(id))
					if err != nil || st.Version != highest[id] || !slices.Contains(vs, highest[id]) {
						t.Errorf("%s: stored %+v (%v), forwarded %v; highest %d", id, st, err, vs, highest[id])
					}
				}
			}
			if len(forwards) != len(highest) {
				t.Errorf("%d identities forwarded, %d seen", len(forwards), len(highest))
			}
		})
	}
}

// TestDecideNewIdentityRaceModes: as TestDecideNewIdentityRace, for the
// window and version tables: a Decide that finds an identity absent while
// another transaction creates it runs again and decides Duplicate.
func TestDecideNewIdentityRaceModes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		rule   dedup.Rule
		insert string
	}{
		{dedup.Rule{Mode: dedup.Window, Window: time.Hour},
			`INSERT INTO window_ids (service, id, expires_at, forwarded_at, digest) VALUES ('svc', 'new', now() + interval '1 hour', now(), $1)`},
		{dedup.Rule{Mode: dedup.Version},
			`INSERT INTO versions (service, entity, version, digest, updated_at) VALUES ('svc', 'new', 7, $1, now())`},
	}
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		for _, tc := range cases {
			testDecideNewIdentityRaceMode(t, shape(newStore(t)), tc.rule, tc.insert)
		}
	})
}

func testDecideNewIdentityRaceMode(t *testing.T, s *dedup.Store, rule dedup.Rule, insert string) {
	t.Run(rule.Mode.String(), func(t *testing.T) {
		ctx := context.Background()
		st := newStream(t, s, "race-"+rule.Mode.String(), rule)
		other, err := s.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Rollback(ctx)
		d := digest("A")
		if _, err := other.Exec(ctx, insert, d[:]); err != nil {
			t.Fatal(err)
		}
		type result struct {
			got []dedup.Decision
			err error
		}
		done := make(chan result, 1)
		go func() {
			b := &dedup.Batch{Service: "svc", Partition: st.p, Epoch: st.epoch, Rule: rule, Start: 0, End: 1,
				Records: []dedup.Record{{Offset: 0, Entity: []byte("new"), Digest: d, Version: 7}}}
			got, err := s.Decide(ctx, b, nil)
			done <- result{got, err}
		}()
		// Wait until Decide's insert waits on the open transaction.
		deadline := time.Now().Add(10 * time.Second)
		for {
			// (Not inside other: it would see one snapshot of the activity.)
			if waiting(ctx, t, s) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("Decide never waited for the concurrent insert")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := other.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if r := <-done; r.err != nil || !slices.Equal(r.got, []dedup.Decision{D}) {
			t.Fatalf("Decide after losing the race: %v, %v; want [Duplicate]", r.got, r.err)
		}
	})
}

// TestPruneWindowAndCleanup: expired ids (by the database's clock) are
// deleted in batches, live ones kept, every service's with service "";
// CleanupWindow runs only while no other session holds the service's lock.
func TestPruneWindowAndCleanup(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		ctx := context.Background()
		rule := dedup.Rule{Mode: dedup.Window, Window: time.Hour}
		past, now := time.Now().Add(-2*time.Hour), time.Now()
		for _, svc := range []string{"a", "b"} {
			st := newStream(t, s, "in-"+svc, rule)
			st.svc = svc
			var old, fresh []vrec
			for i := range 25 {
				old = append(old, vrec{fmt.Sprint("old-", i), "x", 0})
			}
			for i := range 5 {
				fresh = append(fresh, vrec{fmt.Sprint("new-", i), "x", 0})
			}
			st.decide(past, old...)
			st.decide(now, fresh...)
		}
		stats, err := s.Stats(ctx)
		if err != nil || len(stats) != 2 || stats[0].Mode != dedup.Window || stats[0].Rows != 30 || stats[0].Expired != 25 {
			t.Fatalf("Stats: %+v, %v", stats, err)
		}
		if n, err := s.Count(ctx, "a"); err != nil || n != 30 {
			t.Fatalf("Count: %d, %v", n, err)
		}
		if n, err := s.PruneWindow(ctx, "a", dedup.WithBatchSize(10)); err != nil || n != 25 {
			t.Fatalf("PruneWindow(a) in batches of 10: %d, %v; want 25", n, err)
		}

		// Another instance's cleanup holds b's lock: this one skips.
		conn, err := s.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		lock := `hashtext('dam.window_cleanup'), hashtext(current_schema() || '/' || 'b')`
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(`+lock+`)`); err != nil {
			t.Fatal(err)
		}
		if n, ran, err := s.CleanupWindow(ctx, "b", dedup.WithBatchSize(7)); err != nil || ran || n != 0 {
			t.Fatalf("CleanupWindow while locked elsewhere: %d, %v, %v", n, ran, err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(`+lock+`)`); err != nil {
			t.Fatal(err)
		}
		if n, ran, err := s.CleanupWindow(ctx, "b", dedup.WithBatchSize(7)); err != nil || !ran || n != 25 {
			t.Fatalf("CleanupWindow: %d, %v, %v; want 25", n, ran, err)
		}
		// The lock was released: it can be taken again (by this session too).
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+lock+`)`).Scan(&got); err != nil || !got {
			t.Fatalf("lock after CleanupWindow: %v, %v", got, err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(`+lock+`)`); err != nil {
			t.Fatal(err)
		}
		if n, err := s.PruneWindow(ctx, ""); err != nil || n != 0 {
			t.Fatalf("PruneWindow(all) after cleanup: %d, %v", n, err)
		}
		stats, err = s.Stats(ctx)
		if err != nil || len(stats) != 2 || stats[0].Rows != 5 || stats[1].Rows != 5 || stats[0].Expired != 0 {
			t.Fatalf("Stats after cleanup: %+v, %v", stats, err)
		}

		// An expired id of every service goes with service "".
		for _, svc := range []string{"a", "b"} {
			st := newStream(t, s, "more-"+svc, rule)
			st.svc = svc
			st.decide(past, vrec{"old-again", "x", 0})
		}
		if n, err := s.PruneWindow(ctx, ""); err != nil || n != 2 {
			t.Fatalf("PruneWindow(all): %d, %v; want 2", n, err)
		}
	})
}

// TestStateOpsEveryMode: Get, Reset, Count, Stats and PruneState see every
// mode's table.
func TestStateOpsEveryMode(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		s := shape(newStore(t))
		ctx := context.Background()
		ls := newStream(t, s, "ls", dedup.Rule{})
		ls.svc = "ls"
		ls.decide(time.Time{}, vrec{"e1", "A", 0}, vrec{"e2", "A", 0})
		win := newStream(t, s, "win", dedup.Rule{Mode: dedup.Window, Window: time.Hour})
		win.svc = "win"
		win.decide(time.Time{}, vrec{"id1", "A", 0}, vrec{"id2", "A", 0}, vrec{"id3", "A", 0})
		ver := newStream(t, s, "ver", dedup.Rule{Mode: dedup.Version})
		ver.svc = "ver"
		ver.decide(time.Time{}, vrec{"e1", "A", 4}, vrec{"e2", "A", 9})

		stats, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, st := range stats {
			got = append(got, fmt.Sprintf("%s %v %d", st.Service, st.Mode, st.Rows))
		}
		if want := []string{"ls last-seen 2", "ver version 2", "win window 3"}; !slices.Equal(got, want) {
			t.Fatalf("Stats: %q, want %q", got, want)
		}
		if st, err := s.Get(ctx, "ver", []byte("e2")); err != nil || st.Mode != dedup.Version || st.Version != 9 {
			t.Fatalf("Get version: %+v, %v", st, err)
		}
		if st, err := s.Get(ctx, "win", []byte("id2")); err != nil || st.Mode != dedup.Window || st.ExpiresAt.Sub(st.UpdatedAt) != time.Hour {
			t.Fatalf("Get window: %+v, %v", st, err)
		}
		if n, err := s.Reset(ctx, "win", []byte("id1"), []byte("nope")); err != nil || n != 1 {
			t.Fatalf("Reset one id: %d, %v", n, err)
		}
		if got := win.decide(time.Time{}, vrec{"id1", "A", 0}, vrec{"id2", "A", 0}); !slices.Equal(got, []dedup.Decision{F, D}) {
			t.Fatalf("after reset: %v", got)
		}
		if n, err := s.Reset(ctx, "ver"); err != nil || n != 2 {
			t.Fatalf("Reset service: %d, %v", n, err)
		}
		if got := ver.decide(time.Time{}, vrec{"e2", "A", 1}); !slices.Equal(got, []dedup.Decision{F}) {
			t.Fatalf("after reset: %v", got)
		}
		if _, err := s.Pool().Exec(ctx, `UPDATE versions SET updated_at = now() - interval '2 hours'`); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Pool().Exec(ctx, `UPDATE state SET updated_at = now() - interval '2 hours' WHERE entity = 'e1'`); err != nil {
			t.Fatal(err)
		}
		if n, err := s.PruneState(ctx, "", time.Hour); err != nil || n != 2 {
			t.Fatalf("PruneState over state and versions: %d, %v; want 2", n, err)
		}
		for svc, want := range map[string]int64{"ls": 1, "win": 3, "ver": 0} {
			if n, err := s.Count(ctx, svc); err != nil || n != want {
				t.Errorf("Count(%s): %d, %v; want %d", svc, n, err, want)
			}
		}
	})
}

// TestGetMode: a service that changed mode and back decides against its
// mode's own table, which GetMode reads whatever Get returns.
func TestGetMode(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	newStream(t, s, "ls", dedup.Rule{}).decide(t0, vrec{"e", "A", 0})
	newStream(t, s, "ver", dedup.Rule{Mode: dedup.Version}).decide(t0.Add(time.Hour), vrec{"e", "B", 7})
	if st, err := s.Get(ctx, "svc", []byte("e")); err != nil || st.Mode != dedup.Version || st.Version != 7 {
		t.Fatalf("Get: %+v, %v; want the version state, the most recent", st, err)
	}
	st, err := s.GetMode(ctx, "svc", []byte("e"), dedup.LastSeen)
	if err != nil || st.Mode != dedup.LastSeen || st.Digest != digest("A") || !st.UpdatedAt.Equal(t0) || st.Topic != "ls" {
		t.Fatalf("GetMode(last-seen): %+v, %v", st, err)
	}
	if _, err := s.GetMode(ctx, "svc", []byte("e"), dedup.Window); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("GetMode(window): %v, want ErrNotFound", err)
	}
	if _, err := s.GetMode(ctx, "svc", []byte("e"), dedup.Mode(9)); !errors.Is(err, dedup.ErrInvalid) {
		t.Fatalf("GetMode(9): %v, want ErrInvalid", err)
	}
}
