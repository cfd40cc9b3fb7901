package dedup_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
)

var seedFlag = flag.Uint64("rules.seed", 0, "seed of TestRulesAgree's random histories (0: a new one)")

// TestRulesAgree runs random histories through the transaction paths on
// PostgreSQL (Decide, in every mode; CheckBatch, last-seen) and through the
// pure rule (Rule.Decide), and requires the same decision for every record
// and the same stored state (and source offset) for every identity after
// every batch. Histories mix the modes and settings (refresh_after, fixed
// and sliding windows), a handful of identities (the empty key and bytes
// that are not text among them) repeated inside batches, tombstones,
// invalid records, versions that rise, repeat and fall, and clocks that
// step onto refresh and window boundaries to the microsecond. The window
// cleanup is left out: it deletes by the database's clock, which the
// histories' clocks are not.
//
// A failure prints the seed; -rules.seed=N runs the same histories again.
func TestRulesAgree(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d: go test ./dedup -run TestRulesAgree -args -rules.seed=%d", seed, seed)
		}
	})
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		rng := rand.New(rand.NewPCG(seed, seed>>32))
		s := shape(newStore(t))
		const histories = 48
		for h := range histories {
			hs := newHistory(t, s, rng, h)
			hs.run(12 + rng.IntN(12))
			if t.Failed() {
				return
			}
		}
	})
}

// history is one partition's records decided under one rule, and the
// model's view of its service's state.
type history struct {
	t     *testing.T
	s     *dedup.Store
	rng   *rand.Rand
	name  string
	rule  dedup.Rule
	check bool // last-seen without refresh: CheckBatch decides some batches
	p     dedup.Partition
	epoch int64
	next  int64
	now   time.Time
	step  time.Duration // the clock's quantum: half the refresh or the window
	model map[string]dedup.Stored
	src   map[string]int64 // the offset that set each identity's state; -1: a check
	log   []string         // the batches so far, for the failure message
}

// The identities of every history, and the contents of their records.
var (
	historyEntities = []string{"", "a", "b", "\xff\x00k"}
	historyDigests  = []canon.Digest{digest("x"), digest("y"), digest("z"), canon.Tombstone}
)

func newHistory(t *testing.T, s *dedup.Store, rng *rand.Rand, n int) *history {
	rules := []dedup.Rule{
		{},
		{RefreshAfter: 2 * time.Second},
		{Mode: dedup.Window, Window: 2 * time.Second},
		{Mode: dedup.Window, Window: 2 * time.Second, Sliding: true},
		{Mode: dedup.Version},
	}
	h := &history{t: t, s: s, rng: rng, name: fmt.Sprintf("h%d", n), rule: rules[n%len(rules)],
		now: t0, step: time.Second, model: map[string]dedup.Stored{}, src: map[string]int64{}}
	h.check = h.rule == dedup.Rule{}
	h.p, h.epoch = partition(t, s, h.name)
	return h
}

// run decides batches, checking every one.
func (h *history) run(batches int) {
	for range batches {
		h.tick()
		if h.check && h.rng.IntN(3) == 0 {
			h.checkBatch()
		} else {
			h.decide()
		}
		h.compareState()
		if h.t.Failed() {
			h.t.Logf("history %s, rule %+v:\n%s", h.name, h.rule, strings.Join(h.log, "\n"))
			return
		}
	}
}

// tick moves the clock by 0, 1µs, a quantum less or more a microsecond,
// or one or two quanta: sums of quanta land exactly on refresh and window
// boundaries, the microseconds on either side of them.
func (h *history) tick() {
	steps := []time.Duration{0, us, h.step - us, h.step, h.step, h.step + us, 2 * h.step}
	h.now = h.now.Add(steps[h.rng.IntN(len(steps))])
}

// records returns 1 to 8 random records.
func (h *history) records() []dedup.Record {
	recs := make([]dedup.Record, 1+h.rng.IntN(8))
	for i := range recs {
		r := &recs[i]
		r.Entity = []byte(historyEntities[h.rng.IntN(len(historyEntities))])
		if h.rng.IntN(10) == 0 {
			r.Invalid = true
			continue
		}
		r.Digest = historyDigests[h.rng.IntN(len(historyDigests))]
		r.Version = int64(h.rng.IntN(6) - 2)
	}
	return recs
}

// want runs the pure rule over recs at now, as the store must: the
// decisions, and the model moved on.
func (h *history) want(rule dedup.Rule, recs []dedup.Record, now time.Time, offsetOf func(i int) int64) []dedup.Decision {
	out := make([]dedup.Decision, len(recs))
	for i, r := range recs {
		if r.Invalid {
			out[i] = dedup.Invalid
			continue
		}
		o := rule.Decide(h.model[string(r.Entity)], r.Digest, r.Version, now)
		out[i] = o.Decision
		h.model[string(r.Entity)] = o.State
		if o.Decision.Forwards() {
			h.src[string(r.Entity)] = offsetOf(i)
		}
	}
	return out
}

// decide decides one batch with Decide at h.now.
func (h *history) decide() {
	recs := h.records()
	b := &dedup.Batch{Service: h.name, Rule: h.rule, Now: h.now, Partition: h.p, Epoch: h.epoch,
		Start: h.next, End: h.next + int64(len(recs)), Records: recs}
	for i := range recs {
		recs[i].Offset = h.next + int64(i)
	}
	h.log = append(h.log, fmt.Sprintf("  decide at %s: %s", h.now.Format(time.RFC3339Nano), showRecords(recs, h.rule)))
	got, err := h.s.Decide(context.Background(), b, nil)
	if err != nil {
		h.t.Fatalf("history %s: decide: %v", h.name, err)
	}
	h.next = b.End
	want := h.want(h.rule, recs, h.now, func(i int) int64 { return recs[i].Offset })
	h.compare(got, want)
}

// checkBatch decides one batch of items with CheckBatch, in a transaction
// of the test's own: the model decides at its start (now()), and takes the
// time each forward stored, checked to lie between then and the end.
func (h *history) checkBatch() {
	ctx := context.Background()
	var recs []dedup.Record
	for _, r := range h.records() {
		if !r.Invalid {
			recs = append(recs, r)
		}
	}
	items := make([]dedup.CheckItem, len(recs))
	for i, r := range recs {
		items[i] = dedup.CheckItem{Service: h.name, Entity: r.Entity, Digest: r.Digest}
	}
	var got []dedup.Decision
	var now time.Time
	err := pgx.BeginFunc(ctx, h.s.Pool(), func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return err
		}
		var err error
		got, err = dedup.CheckBatch(ctx, tx, items, nil)
		return err
	})
	if err != nil {
		h.t.Fatalf("history %s: check batch: %v", h.name, err)
	}
	h.log = append(h.log, fmt.Sprintf("  check at %s: %s", now.Format(time.RFC3339Nano), showRecords(recs, dedup.Rule{})))
	// Checks decide as last-seen without refresh, and keep no source.
	prev := map[string]time.Time{}
	for _, r := range recs {
		if _, ok := prev[string(r.Entity)]; !ok {
			prev[string(r.Entity)] = h.model[string(r.Entity)].Forwarded
		}
	}
	want := h.want(dedup.Rule{}, recs, now, func(int) int64 { return -1 })
	h.compare(got, want)
	// A check stores the clock when its statement runs, never earlier than
	// the time stored: between the transaction's start and now, or the
	// time stored before if later. The model takes what was stored, if so.
	var end time.Time
	if err := h.s.Pool().QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&end); err != nil {
		h.t.Fatal(err)
	}
	for i, r := range recs {
		e := string(r.Entity)
		if !want[i].Forwards() {
			continue
		}
		var at time.Time
		if err := h.s.Pool().QueryRow(ctx, `SELECT updated_at FROM state WHERE service = $1 AND entity = $2`, h.name, r.Entity).Scan(&at); err != nil {
			h.t.Fatal(err)
		}
		lo, hi := now, end
		if p := prev[e]; p.After(lo) {
			lo = p
		}
		if p := prev[e]; p.After(hi) {
			hi = p
		}
		if at.Before(lo) || at.After(hi) {
			h.t.Errorf("history %s, identity %q: a check stored the time %s, outside [%s, %s]", h.name, e,
				at.Format(time.RFC3339Nano), lo.Format(time.RFC3339Nano), hi.Format(time.RFC3339Nano))
		}
		st := h.model[e]
		st.Forwarded = at
		h.model[e] = st
	}
}

func (h *history) compare(got, want []dedup.Decision) {
	h.t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		h.t.Errorf("history %s: the store decided %v, the rule %v", h.name, got, want)
	}
}

// historyTables reads a service's stored state in each mode's table, as
// the rule sees it, and the source offset.
var historyTables = map[dedup.Mode]string{
	dedup.LastSeen: `SELECT entity, digest, updated_at, NULL::timestamptz, 0::bigint, coalesce(src_offset, -1) FROM state WHERE service = $1 AND digest IS NOT NULL`,
	dedup.Window:   `SELECT id, digest, forwarded_at, expires_at, 0::bigint, coalesce(src_offset, -1) FROM window_ids WHERE service = $1`,
	dedup.Version:  `SELECT entity, digest, updated_at, NULL::timestamptz, version, coalesce(src_offset, -1) FROM versions WHERE service = $1`,
}

// compareState requires the stored state of the history's service to be
// the model's, identity by identity.
func (h *history) compareState() {
	h.t.Helper()
	rows, err := h.s.Pool().Query(context.Background(), historyTables[h.rule.Mode], h.name)
	if err != nil {
		h.t.Fatal(err)
	}
	stored := map[string]dedup.Stored{}
	srcs := map[string]int64{}
	var e, d []byte
	var st dedup.Stored
	var expires *time.Time
	var src int64
	_, err = pgx.ForEachRow(rows, []any{&e, &d, &st.Forwarded, &expires, &st.Version, &src}, func() error {
		st.Found, st.Expires = true, time.Time{}
		if expires != nil {
			st.Expires = *expires
		}
		copy(st.Digest[:], d)
		stored[string(e)], srcs[string(e)] = st, src
		return nil
	})
	if err != nil {
		h.t.Fatal(err)
	}
	for _, e := range historyEntities {
		got, want := stored[e], h.model[e]
		if !got.Equal(want) || (want.Found && srcs[e] != h.src[e]) {
			h.t.Errorf("history %s, identity %q: stored %s from offset %d, the rule's %s from offset %d",
				h.name, e, showStored(got), srcs[e], showStored(want), h.src[e])
		}
	}
	if len(stored) > len(historyEntities) {
		h.t.Errorf("history %s: %d identities stored", h.name, len(stored))
	}
}

func showRecords(recs []dedup.Record, rule dedup.Rule) string {
	var parts []string
	for _, r := range recs {
		switch {
		case r.Invalid:
			parts = append(parts, fmt.Sprintf("%q:invalid", r.Entity))
		case rule.Mode == dedup.Version:
			parts = append(parts, fmt.Sprintf("%q:%x/v%d", r.Entity, r.Digest[1:3], r.Version))
		default:
			parts = append(parts, fmt.Sprintf("%q:%x", r.Entity, r.Digest[1:3]))
		}
	}
	return strings.Join(parts, " ")
}

func showStored(st dedup.Stored) string {
	if !st.Found {
		return "none"
	}
	return fmt.Sprintf("{%x forwarded %s expires %s version %d}", st.Digest[:3],
		st.Forwarded.UTC().Format(time.RFC3339Nano), st.Expires.UTC().Format(time.RFC3339Nano), st.Version)
}
