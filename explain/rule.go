package explain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// What explain knows of the decision rules (dedup/rules.go): how a
// route's rule reads, and what it decides for one record now.

// exact prints a time to the microsecond (whole seconds as RFC 3339):
// windows and refreshes are decided to the microsecond.
func exact(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// describeRule says what decides a service's records: its route's mode and
// settings, or without a route dam serve's checks (last-seen).
func describeRule(r *config.Route, rule dedup.Rule) string {
	if r == nil {
		return "last-seen, as dam serve's checks decide (no route of this service in the configuration)"
	}
	switch rule.Mode {
	case dedup.Window:
		kind := "fixed: from the forward"
		if rule.Sliding {
			kind = "sliding: each repeat restarts it"
		}
		return fmt.Sprintf("window: id from %s, window %s (%s)", r.IDFrom, rule.Window, kind)
	case dedup.Version:
		return fmt.Sprintf("version: entity from %s, version from %s", r.Entity, r.VersionFrom)
	}
	s := "last-seen: entity from " + r.Entity
	if rule.RefreshAfter > 0 {
		s += fmt.Sprintf(", refresh_after %s", rule.RefreshAfter)
	}
	return s
}

// Refresh is what refresh_after makes of a record whose content equals
// the stored content.
type Refresh struct {
	After string `json:"after"` // refresh_after
	// LastForwarded is when the identity was last forwarded (a refresh
	// included), and DueAfter that time plus refresh_after: an equal
	// record decided after it (strictly) is refreshed.
	LastForwarded time.Time `json:"last_forwarded"`
	DueAfter      time.Time `json:"due_after"`
	Refreshed     bool      `json:"refreshed"`
}

// Window is a window-mode id's window.
type Window struct {
	Window  string `json:"window"`
	Sliding bool   `json:"sliding"`
	// ExpiresAt is the stored expiry; Expired that it is not after now (the
	// id then reads as absent, whether or not the cleanup deleted it).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Expired   bool       `json:"expired"`
	// NewExpiry is the id's expiry once the record is decided, when that
	// changes it: forwarded, or a sliding repeat.
	NewExpiry *time.Time `json:"new_expiry,omitempty"`
}

// verdict is what a rule decides for one record now, and why.
type verdict struct {
	decision dedup.Decision
	cause    dedup.Cause
	reason   string
	refresh  *Refresh
	window   *Window
}

// judge decides a valid record (its digest d; its version in version mode)
// against st, the identity's state in the rule's own table (nil: none), at
// now, with the rule the sidecar runs (dedup.Rule.Decide), and words its
// cause; it changes nothing. A zero d (no payload) leaves the content out
// of the reasons.
func judge(rule dedup.Rule, st *dedup.State, d canon.Digest, version int64, now time.Time) verdict {
	var prev dedup.Stored
	if st != nil {
		prev = st.Stored()
	}
	o := rule.Decide(prev, d, version, now)
	v := verdict{decision: o.Decision, cause: o.Cause}
	switch rule.Mode {
	case dedup.Window:
		v.reason, v.window = windowReason(rule, prev, o, d, now)
	case dedup.Version:
		v.reason = versionReason(prev, o, d, version)
	default:
		v.reason, v.refresh = lastSeenReason(rule, prev, o, d, now)
	}
	return v
}

func lastSeenReason(rule dedup.Rule, prev dedup.Stored, o dedup.Outcome, d canon.Digest, now time.Time) (string, *Refresh) {
	switch o.Cause {
	case dedup.CauseNoState:
		return "no stored state for this identity: its next record is forwarded", nil
	case dedup.CauseChanged:
		reason := "its digest differs from the stored digest"
		if prev.Digest.Scheme() != d.Scheme() {
			reason += fmt.Sprintf(" (stored with hash scheme %d, the route now hashes with scheme %d: its format changed)", prev.Digest.Scheme(), d.Scheme())
		}
		return reason, nil
	}
	if rule.RefreshAfter <= 0 {
		return "its digest equals the stored digest: the same content as the record last forwarded", nil
	}
	rj := refreshOf(rule, prev.Forwarded, now)
	age := now.Sub(prev.Forwarded)
	if o.Cause == dedup.CauseRefreshDue {
		return fmt.Sprintf("its content equals the stored content, but the identity was last forwarded %s ago (at %s), longer than refresh_after %s: refreshed (forwarded)",
			age, exact(prev.Forwarded), rule.RefreshAfter), rj
	}
	return fmt.Sprintf("its digest equals the stored digest: the same content as the record last forwarded, %s ago (at %s); not refreshed: refresh_after %s, so an equal record is refreshed only once decided after %s",
		age, exact(prev.Forwarded), rule.RefreshAfter, exact(rj.DueAfter)), rj
}

// refreshOf is what refresh_after makes, at now, of a record equal to the
// content of an identity last forwarded at last: the rule decides whether
// it is refreshed; DueAfter is the boundary Rule.RefreshAfter documents.
func refreshOf(rule dedup.Rule, last, now time.Time) *Refresh {
	same := canon.Tombstone // any content: the record's equals the stored one
	o := rule.Decide(dedup.Stored{Found: true, Digest: same, Forwarded: last}, same, 0, now)
	return &Refresh{After: rule.RefreshAfter.String(), LastForwarded: last.UTC(), DueAfter: last.Add(rule.RefreshAfter).UTC(),
		Refreshed: o.Cause == dedup.CauseRefreshDue}
}

func windowReason(rule dedup.Rule, prev dedup.Stored, o dedup.Outcome, d canon.Digest, now time.Time) (string, *Window) {
	wj := &Window{Window: rule.Window.String(), Sliding: rule.Sliding}
	if prev.Found {
		exp := prev.Expires.UTC()
		wj.ExpiresAt = &exp
	}
	// The rule sets a new expiry when it forwards, and on a sliding repeat.
	if fresh := o.State.Expires.UTC(); !o.State.Expires.Equal(prev.Expires) {
		wj.NewExpiry = &fresh
	}
	switch o.Cause {
	case dedup.CauseNoState:
		return fmt.Sprintf("the id was not seen within the window (no stored state): forwarded, its window lasting until %s", exact(o.State.Expires)), wj
	case dedup.CauseExpired:
		wj.Expired = true
		return fmt.Sprintf("the id's window ended at %s (now is %s; it was forwarded at %s): an expired id reads as absent, deleted or not by the cleanup, so it is forwarded afresh, its window lasting until %s",
			exact(prev.Expires), exact(now), exact(prev.Forwarded), exact(o.State.Expires)), wj
	}
	reason := fmt.Sprintf("the id was forwarded at %s and its window lasts until %s (now is %s): a repeated id inside the window is a duplicate whatever its content",
		exact(prev.Forwarded), exact(prev.Expires), exact(now))
	if !d.IsZero() {
		reason += " (" + contentNote(prev.Digest, d) + ")"
	}
	if wj.NewExpiry != nil {
		reason += fmt.Sprintf("; sliding: this repeat extends the window to %s", exact(*wj.NewExpiry))
	}
	return reason, wj
}

func versionReason(prev dedup.Stored, o dedup.Outcome, d canon.Digest, version int64) string {
	switch o.Cause {
	case dedup.CauseNoState:
		return fmt.Sprintf("no version stored for this entity: its first version (%d) is forwarded, whatever it is", version)
	case dedup.CauseNewer:
		return fmt.Sprintf("its version %d is above the stored version %d", version, prev.Version)
	case dedup.CauseSameVersion:
		reason := fmt.Sprintf("its version %d equals the stored version %d: a repeated version is a duplicate whatever its content", version, prev.Version)
		if !d.IsZero() {
			reason += " (" + contentNote(prev.Digest, d) + ")"
		}
		return reason
	}
	return fmt.Sprintf("its version %d is below the stored version %d: an out-of-order update", version, prev.Version)
}

// windowOpened is when the window that a forward at t opens ends: the
// rule's, asked to forward a new id at t.
func windowOpened(rule dedup.Rule, t time.Time) time.Time {
	return rule.Decide(dedup.Stored{}, canon.Tombstone, 0, t).State.Expires
}

// inWindow reports whether a record decided at t finds an id whose window
// ends at end still open: the rule's comparison.
func inWindow(rule dedup.Rule, end, t time.Time) bool {
	return rule.Decide(dedup.Stored{Found: true, Expires: end}, canon.Tombstone, 0, t).Cause == dedup.CauseInWindow
}

// versionCause is what the version rule makes of version v when version
// stored is stored: newer (forwarded), the same (a duplicate) or older
// (stale).
func versionCause(v, stored int64) dedup.Cause {
	return dedup.Rule{Mode: dedup.Version}.Decide(dedup.Stored{Found: true, Version: stored}, canon.Tombstone, v, time.Time{}).Cause
}

// contentNote compares a record's content with the forwarded record's,
// where the rule does not (window and version modes).
func contentNote(stored, d canon.Digest) string {
	if stored == d {
		return "its content is the same as the forwarded record's"
	}
	return "its content differs from the forwarded record's"
}

// wouldBe phrases a decision after "it would be" or "it was".
func wouldBe(d dedup.Decision) string {
	switch d {
	case dedup.Forward:
		return "forwarded"
	case dedup.Refresh:
		return "refreshed (forwarded)"
	case dedup.Duplicate:
		return "a duplicate"
	case dedup.Stale:
		return "stale"
	}
	return "bad input"
}

// states returns the identity's state in mode's table (own; nil: none) and,
// when another mode's table holds a more recent one (the service changed
// mode), that one too.
func (ex *Explainer) states(ctx context.Context, service string, identity []byte, mode dedup.Mode) (own, other *dedup.State, err error) {
	latest, err := ex.store.Get(ctx, service, identity)
	switch {
	case errors.Is(err, dedup.ErrNotFound):
		return nil, nil, nil
	case err != nil:
		return nil, nil, err
	case latest.Mode == mode:
		return &latest, nil, nil
	}
	st, err := ex.store.GetMode(ctx, service, identity, mode)
	switch {
	case errors.Is(err, dedup.ErrNotFound):
		return nil, &latest, nil
	case err != nil:
		return nil, nil, err
	}
	return &st, &latest, nil
}

// modeChange says that the identity was last forwarded under another mode
// than the route's ("" when not).
func modeChange(mode dedup.Mode, own, other *dedup.State, hasRoute bool) string {
	if other == nil {
		return ""
	}
	route := "the route is in mode " + mode.String()
	if !hasRoute {
		route = "this service has no route, so it is decided as dam serve's checks do (last-seen)"
	}
	s := fmt.Sprintf("the identity was last forwarded under mode %s (at %s%s), but %s: the service changed mode, and each mode keeps its own state",
		other.Mode, stamp(other.UpdatedAt), sourceText(other), route)
	if own == nil {
		return s + fmt.Sprintf("; mode %s holds none for it", mode)
	}
	return s + fmt.Sprintf("; mode %s's state, set %s, decides", mode, stamp(own.UpdatedAt))
}

func sourceText(st *dedup.State) string {
	if st.Topic == "" {
		return ", by a check"
	}
	return fmt.Sprintf(" from %s/%d@%d", st.Topic, st.Partition, st.Offset)
}

// badInputDest names the route's dead-letter topic, or says that bad input
// halts the partition.
func badInputDest(r *config.Route, would bool) string {
	verb, halt := "it went to", "it halted"
	if would {
		verb, halt = "dam would send it to", "it would halt"
	}
	if r.DeadLetter == "" {
		return fmt.Sprintf("the route has no dead_letter topic: %s the partition", halt)
	}
	return fmt.Sprintf("%s the dead-letter topic %s", verb, r.DeadLetter)
}
