package dedup

import (
	"fmt"
	"time"

	"github.com/dam-dedup/dam/canon"
)

// The decision rules (DESIGN §1), one pure function per mode: given the
// stored state of an identity, a record and the clock, the decision, its
// cause and the identity's new state. No SQL and no I/O: Decide runs them
// inside its transaction (tables.go reads and writes each mode's table
// around them), and dam explain runs the same functions to say why.

// Stored is what a rule reads and writes of one identity's stored state: a
// plain value, compared with Equal. The zero Stored is an identity without
// state.
type Stored struct {
	// Found reports that the identity has a state; the other fields count
	// only then.
	Found bool
	// Digest is the digest of the record last forwarded. Last-seen decides
	// on it; window and version modes keep it without reading it.
	Digest canon.Digest
	// Forwarded is when the identity was last forwarded (a refresh
	// included). Last-seen reads it only with Rule.RefreshAfter.
	Forwarded time.Time
	// Expires is when a window-mode id's window ends: a record of the id is
	// a duplicate while the clock is before it. Window mode only.
	Expires time.Time
	// Version is the highest version forwarded. Version mode only.
	Version int64
}

// Equal reports whether s and t are the same state: both without state,
// or both with the same fields, times compared as instants (time.Time's
// Equal: the same instant read back from PostgreSQL has another location).
func (s Stored) Equal(t Stored) bool {
	if !s.Found || !t.Found {
		return s.Found == t.Found
	}
	return s.Digest == t.Digest && s.Forwarded.Equal(t.Forwarded) && s.Expires.Equal(t.Expires) && s.Version == t.Version
}

// Cause is the branch of a rule that decided a record: what an
// explanation of the decision says, without comparing again.
type Cause uint8

// The causes, by mode.
const (
	// CauseNoState: every mode: the identity has no stored state (new, or
	// reset or pruned since): Forward.
	CauseNoState Cause = iota + 1
	// CauseChanged: last-seen: the digest differs from the stored digest:
	// Forward.
	CauseChanged
	// CauseUnchanged: last-seen: the digest equals the stored digest, and
	// no refresh is due: Duplicate.
	CauseUnchanged
	// CauseRefreshDue: last-seen with Rule.RefreshAfter: the digest equals
	// the stored digest, but the identity was last forwarded more than
	// RefreshAfter before the clock (strictly): Refresh.
	CauseRefreshDue
	// CauseExpired: window: the id's window has ended (the clock is at or
	// after its expiry): it reads as absent, Forward.
	CauseExpired
	// CauseInWindow: window: the id's window is still open: Duplicate,
	// whatever the content; with Rule.Sliding the window restarts at the
	// clock.
	CauseInWindow
	// CauseNewer: version: the version is above the stored version:
	// Forward.
	CauseNewer
	// CauseSameVersion: version: the version equals the stored version:
	// Duplicate, whatever the content.
	CauseSameVersion
	// CauseOlder: version: the version is below the stored version (an
	// out-of-order update): Stale.
	CauseOlder
)

// String returns the cause's name: "no-state", "changed", "unchanged",
// "refresh-due", "expired", "in-window", "newer", "same-version" or
// "older".
func (c Cause) String() string {
	switch c {
	case CauseNoState:
		return "no-state"
	case CauseChanged:
		return "changed"
	case CauseUnchanged:
		return "unchanged"
	case CauseRefreshDue:
		return "refresh-due"
	case CauseExpired:
		return "expired"
	case CauseInWindow:
		return "in-window"
	case CauseNewer:
		return "newer"
	case CauseSameVersion:
		return "same-version"
	case CauseOlder:
		return "older"
	}
	return "unknown"
}

// Outcome is what a rule decides for one record: the decision, its cause,
// and the identity's state once the record is decided.
type Outcome struct {
	Decision Decision
	Cause    Cause
	// State is the identity's new state: the record's when it is
	// forwarded (Forward or Refresh), else the stored state unchanged, but
	// for a sliding window's new expiry.
	State Stored
}

// Decide decides one valid record, of digest d and version v (read in
// version mode only), against prev, its identity's stored state, at now,
// under r's mode and settings. It is the rule, and all of it: Store.Decide
// calls it for every record of a batch in offset order (a repeated
// identity is decided against the state its previous record left), and
// dam explain calls it to say why. r must be valid (Store.Decide rejects
// an invalid rule before deciding).
func (r Rule) Decide(prev Stored, d canon.Digest, v int64, now time.Time) Outcome {
	switch r.Mode {
	case Window:
		return r.decideWindow(prev, d, now)
	case Version:
		return decideVersion(prev, d, v, now)
	}
	return r.decideLastSeen(prev, d, now)
}

// decideLastSeen: forward iff the digest differs from the stored one or,
// with RefreshAfter, an equal record comes more than RefreshAfter after the
// identity's last forward.
func (r Rule) decideLastSeen(prev Stored, d canon.Digest, now time.Time) Outcome {
	next := Stored{Found: true, Digest: d, Forwarded: now}
	switch {
	case !prev.Found:
		return Outcome{Forward, CauseNoState, next}
	case prev.Digest != d:
		return Outcome{Forward, CauseChanged, next}
	case r.RefreshAfter > 0 && now.Sub(prev.Forwarded) > r.RefreshAfter:
		return Outcome{Refresh, CauseRefreshDue, next}
	}
	return Outcome{Duplicate, CauseUnchanged, prev}
}

// decideWindow: forward iff the id has no open window: absent, or now at
// or after its expiry. A forward opens a window of r.Window; with Sliding,
// a repeat restarts it.
func (r Rule) decideWindow(prev Stored, d canon.Digest, now time.Time) Outcome {
	switch {
	case !prev.Found:
		return Outcome{Forward, CauseNoState, Stored{Found: true, Digest: d, Forwarded: now, Expires: now.Add(r.Window)}}
	case !now.Before(prev.Expires):
		return Outcome{Forward, CauseExpired, Stored{Found: true, Digest: d, Forwarded: now, Expires: now.Add(r.Window)}}
	}
	if r.Sliding {
		prev.Expires = now.Add(r.Window)
	}
	return Outcome{Duplicate, CauseInWindow, prev}
}

// decideVersion: forward iff the version is above the stored one; equal is
// a duplicate, below is stale.
func decideVersion(prev Stored, d canon.Digest, v int64, now time.Time) Outcome {
	switch {
	case !prev.Found:
		return Outcome{Forward, CauseNoState, Stored{Found: true, Digest: d, Forwarded: now, Version: v}}
	case v > prev.Version:
		return Outcome{Forward, CauseNewer, Stored{Found: true, Digest: d, Forwarded: now, Version: v}}
	case v == prev.Version:
		return Outcome{Duplicate, CauseSameVersion, prev}
	}
	return Outcome{Stale, CauseOlder, prev}
}

// Stored returns what the rules read of st: its digest, when it was last
// forwarded, its expiry and its version. st comes from Get or GetMode, so
// it is found.
func (st State) Stored() Stored {
	return Stored{Found: true, Digest: st.Digest, Forwarded: st.UpdatedAt, Expires: st.ExpiresAt, Version: st.Version}
}

// validate rejects a rule that is the caller's bug.
func (r Rule) validate() error {
	switch {
	case r.Mode > Version:
		return fmt.Errorf("%w: unknown mode %d", ErrInvalid, r.Mode)
	case r.Mode == Window && r.Window <= 0:
		return fmt.Errorf("%w: window mode needs a positive window, got %v", ErrInvalid, r.Window)
	case r.Mode != Window && (r.Window != 0 || r.Sliding):
		return fmt.Errorf("%w: a window is only for window mode, not %v", ErrInvalid, r.Mode)
	case r.RefreshAfter < 0:
		return fmt.Errorf("%w: negative refresh_after %v", ErrInvalid, r.RefreshAfter)
	case r.Mode != LastSeen && r.RefreshAfter != 0:
		return fmt.Errorf("%w: refresh_after is only for last-seen mode, not %v", ErrInvalid, r.Mode)
	}
	return nil
}
