package dedup_test

import (
	"testing"
	"time"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
)

// Every branch of every rule, on its boundaries: the decision, the cause
// and the new state.
func TestRuleDecide(t *testing.T) {
	a, b := digest("a"), digest("b")
	hour := dedup.Rule{RefreshAfter: time.Hour}
	window := dedup.Rule{Mode: dedup.Window, Window: time.Hour}
	sliding := dedup.Rule{Mode: dedup.Window, Window: time.Hour, Sliding: true}
	version := dedup.Rule{Mode: dedup.Version}
	seen := dedup.Stored{Found: true, Digest: a, Forwarded: t0}
	open := dedup.Stored{Found: true, Digest: a, Forwarded: t0, Expires: t0.Add(time.Hour)}
	v3 := dedup.Stored{Found: true, Digest: a, Forwarded: t0, Version: 3}
	later := t0.Add(time.Minute)
	for _, tc := range []struct {
		name    string
		rule    dedup.Rule
		prev    dedup.Stored
		d       canon.Digest
		version int64
		now     time.Time
		want    dedup.Outcome
	}{
		{"last-seen new", dedup.Rule{}, dedup.Stored{}, a, 0, t0,
			dedup.Outcome{Decision: dedup.Forward, Cause: dedup.CauseNoState, State: seen}},
		{"last-seen changed", dedup.Rule{}, seen, b, 0, later,
			dedup.Outcome{Decision: dedup.Forward, Cause: dedup.CauseChanged, State: dedup.Stored{Found: true, Digest: b, Forwarded: later}}},
		{"last-seen same", dedup.Rule{}, seen, a, 0, t0.Add(1000 * time.Hour),
			dedup.Outcome{Decision: dedup.Duplicate, Cause: dedup.CauseUnchanged, State: seen}},
		{"refresh at the limit", hour, seen, a, 0, t0.Add(time.Hour),
			dedup.Outcome{Decision: dedup.Duplicate, Cause: dedup.CauseUnchanged, State: seen}},
		{"refresh past the limit", hour, seen, a, 0, t0.Add(time.Hour + us),
			dedup.Outcome{Decision: dedup.Refresh, Cause: dedup.CauseRefreshDue, State: dedup.Stored{Found: true, Digest: a, Forwarded: t0.Add(time.Hour + us)}}},
		{"refresh, changed", hour, seen, b, 0, later,
			dedup.Outcome{Decision: dedup.Forward, Cause: dedup.CauseChanged, State: dedup.Stored{Found: true, Digest: b, Forwarded: later}}},
		{"window new", window, dedup.Stored{}, a, 0, t0,
			dedup.Outcome{Decision: dedup.Forward, Cause: dedup.CauseNoState, State: open}},
		{"window open", window, open, b, 0, t0.Add(time.Hour - us),
			dedup.Outcome{Decision: dedup.Duplicate, Cause: dedup.CauseInWindow, State: open}},
		{"window at its expiry", window, open, a, 0, t0.Add(time.Hour),
			dedup.Outcome{Decision: dedup.Forward, Cause: dedup.CauseExpired,
				State: dedup.Stored{Found: true, Digest: a, Forwarded: t0.Add(time.Hour), Expires: t0.Add(2 * time.Hour)}}},
		{"sliding repeat", sliding, open, b, 0, later,
			dedup.Outcome{Decision: dedup.Duplicate, Cause: dedup.CauseInWindow,
				State: dedup.Stored{Found: true, Digest: a, Forwarded: t0, Expires: later.Add(time.Hour)}}},
		{"version new", version, dedup.Stored{}, a, -2, t0,
			dedup.Outcome{Decision: dedup.Forward, Cause: dedup.CauseNoState, State: dedup.Stored{Found: true, Digest: a, Forwarded: t0, Version: -2}}},
		{"version above", version, v3, b, 4, later,
			dedup.Outcome{Decision: dedup.Forward, Cause: dedup.CauseNewer, State: dedup.Stored{Found: true, Digest: b, Forwarded: later, Version: 4}}},
		{"version equal", version, v3, b, 3, later,
			dedup.Outcome{Decision: dedup.Duplicate, Cause: dedup.CauseSameVersion, State: v3}},
		{"version below", version, v3, a, 2, later,
			dedup.Outcome{Decision: dedup.Stale, Cause: dedup.CauseOlder, State: v3}},
	} {
		got := tc.rule.Decide(tc.prev, tc.d, tc.version, tc.now)
		if got.Decision != tc.want.Decision || got.Cause != tc.want.Cause || !got.State.Equal(tc.want.State) {
			t.Errorf("%s: got %v %v %+v, want %v %v %+v", tc.name, got.Decision, got.Cause, got.State,
				tc.want.Decision, tc.want.Cause, tc.want.State)
		}
	}
}

// Equal compares instants, and every state without Found is the same.
func TestStoredEqual(t *testing.T) {
	st := dedup.Stored{Found: true, Digest: digest("a"), Forwarded: t0, Expires: t0.Add(time.Hour), Version: 7}
	local := st
	local.Forwarded, local.Expires = t0.In(time.FixedZone("x", 3600)), st.Expires.Local()
	if !st.Equal(local) {
		t.Errorf("the same instants in other locations differ")
	}
	for _, change := range []func(*dedup.Stored){
		func(s *dedup.Stored) { s.Found = false },
		func(s *dedup.Stored) { s.Digest = digest("b") },
		func(s *dedup.Stored) { s.Forwarded = s.Forwarded.Add(us) },
		func(s *dedup.Stored) { s.Expires = s.Expires.Add(-us) },
		func(s *dedup.Stored) { s.Version++ },
	} {
		other := st
		change(&other)
		if st.Equal(other) || other.Equal(st) {
			t.Errorf("%+v equals %+v", other, st)
		}
	}
	if !(dedup.Stored{}).Equal(dedup.Stored{Digest: digest("a")}) {
		t.Errorf("two states without Found differ")
	}
}
