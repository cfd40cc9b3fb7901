package explain

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// Ref names an input record that a decision refers to, and where
// that knowledge comes from: "state", "decision log" or "kafka" (found by
// reading the input before the offset).
type Ref struct {
	Offset int64 `json:"offset"`
	// At is when it was forwarded (from the state or the decision log), or
	// the record's timestamp (from kafka).
	At   time.Time `json:"at"`
	From string    `json:"from"`
	// AtOrBefore: the run of equal content reaches back past the records
	// read (--lookback); it may have started earlier.
	AtOrBefore bool `json:"at_or_before,omitempty"`
	// Version is its version, in version mode.
	Version *int64 `json:"version,omitempty"`
}

func (r *Ref) offsetText() string {
	if r.AtOrBefore {
		return fmt.Sprintf("%d or earlier", r.Offset)
	}
	return fmt.Sprint(r.Offset)
}

// OffsetExplanation answers what was decided for one input record, and why
// (Explainer.Offset).
type OffsetExplanation struct {
	Topic     string     `json:"topic"`
	Partition int32      `json:"partition"`
	Offset    int64      `json:"offset"`
	Timestamp *time.Time `json:"timestamp,omitempty"` // the record's, when readable
	Service   string     `json:"service"`
	Mode      string     `json:"mode"`
	Rule      string     `json:"rule"`
	// Entity is the identity: the entity, or in window mode the message id.
	Entity    string `json:"entity,omitempty"`
	EntityHex string `json:"entity_hex,omitempty"`
	Digest    string `json:"digest,omitempty"`
	Version   *int64 `json:"version,omitempty"` // version mode: the record's version
	// Decision is forward, refresh, duplicate, stale, dropped (version
	// mode: not forwarded, a duplicate or stale, no longer known which),
	// invalid, skipped (an operator stepped past it: Skip), undecided (not
	// decided yet) or unknown (no longer recorded).
	Decision string `json:"decision"`
	Reason   string `json:"reason"`
	// DecidedAt is when it was decided, when known: the state's time of the
	// forward it set, else its logged batch's time.
	DecidedAt *time.Time `json:"decided_at,omitempty"`
	// DuplicateOf is the forward a duplicate repeated; StaleAgainst the
	// forward of the higher version a stale record lost to; Previous, for a
	// forward, the record before it (its content, or its version).
	DuplicateOf  *Ref        `json:"duplicate_of,omitempty"`
	StaleAgainst *Ref        `json:"stale_against,omitempty"`
	Previous     *Ref        `json:"previous,omitempty"`
	Difference   *Difference `json:"difference,omitempty"`
	// Refresh and Window are the rule's figures behind the decision, where
	// they are known.
	Refresh *Refresh `json:"refresh,omitempty"`
	Window  *Window  `json:"window,omitempty"`
	// Skip is the operator skip of a skipped record: who, when, why.
	Skip *Skip `json:"skip,omitempty"`
	// Evidence lists what the answer rests on, and what no longer covers
	// the offset.
	Evidence []string `json:"evidence"`

	// DifferenceFrom is the offset whose content the difference is from.
	DifferenceFrom int64 `json:"-"`
}

// Skip is an operator's skip of the record (dam state skip).
type Skip struct {
	By     string    `json:"by"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
	// Was is what it had been decided before the skip (forward, invalid),
	// or "undecided": the partition halted before deciding it.
	Was string `json:"was"`
}

// reading is an input record as its route decides it (pipeline.Route's
// Identify): its identity, version and digest, or why it is bad input.
type reading struct {
	rec      *kgo.Record
	identity []byte
	version  int64
	digest   canon.Digest
	err      error
}

func readAs(c Route, r *kgo.Record) reading {
	id, v, d, err := c.Identify(r)
	return reading{rec: r, identity: id, version: v, digest: d, err: err}
}

// of reports whether r is a valid record of identity id.
func (r *reading) of(id []byte) bool { return r.err == nil && bytes.Equal(r.identity, id) }

func (r *reading) ref(from string) *Ref {
	return &Ref{Offset: r.rec.Offset, At: r.rec.Timestamp.UTC(), From: from}
}

// offsetCase is what one offset's explanation is worked out from.
type offsetCase struct {
	ex     *Explainer
	res    *OffsetExplanation
	rc     *config.Route
	route  Route
	rule   dedup.Rule
	h      routeHasher
	p      dedup.Partition
	b      bounds
	od     dedup.OffsetDecision
	lo     int64     // the first offset read before it
	before []reading // the records read in [lo, offset)
	cur    reading   // the record
	own    *dedup.State
	other  *dedup.State
}

// Offset explains what was decided for the input record at offset of
// partition of r's input topic, and why: from the decision log while it
// covers the offset (it is kept for decision_log.keep after delivery),
// otherwise from the state and the input read before the offset, and it
// says which (Evidence). It changes nothing.
//
// Errors: ErrGone when the record can no longer be read and the decision
// log does not cover it.
func (ex *Explainer) Offset(ctx context.Context, r Route, part int32, offset int64) (*OffsetExplanation, error) {
	rc := r.Config()
	topic := rc.From
	var err error
	x := &offsetCase{ex: ex, rc: &rc, route: r, rule: r.Rule(), h: hasherOf(r),
		p: dedup.Partition{Group: ex.group, Topic: topic, Partition: part}}
	res := &OffsetExplanation{Topic: topic, Partition: part, Offset: offset, Service: rc.Service,
		Mode: x.rule.Mode.String(), Rule: describeRule(&rc, x.rule)}
	x.res = res

	if x.b, err = ex.bounds(ctx, x.p.Group, topic, part); err != nil {
		return nil, err
	}
	pr, err := ex.store.ReadProgress(ctx, x.p)
	if err != nil {
		return nil, err
	}
	if x.od, err = ex.store.DecisionAt(ctx, x.p, offset); err != nil {
		return nil, err
	}
	decided := pr.HasNext && offset < pr.Next
	res.Evidence = append(res.Evidence, progressLine(pr, x.b))
	res.Evidence = append(res.Evidence, logLine(x.od, offset, decided, x.rule))

	x.lo = max(x.b.Start, offset-ex.lookback)
	recs, readErr := ex.readRange(ctx, topic, part, x.lo, offset, x.b)
	if readErr != nil && !errors.Is(readErr, errUnreadable) {
		return nil, readErr
	}
	var rec *kgo.Record
	if n := len(recs); n > 0 && recs[n-1].Offset == offset {
		rec, recs = recs[n-1], recs[:n-1]
	} else if readErr == nil {
		readErr = fmt.Errorf("%s/%d@%d: %w: no committed record at this offset (compacted, aborted or a transaction marker)", topic, part, offset, errUnreadable)
	}
	if rec == nil {
		res.Evidence = append(res.Evidence, "kafka: "+readErr.Error())
		if !x.od.Covered {
			return nil, fmt.Errorf("%w: %w, and the decision log does not cover offset %d", ErrGone, readErr, offset)
		}
		if x.od.Decision == dedup.Skipped {
			return res, x.skipped(ctx)
		}
		res.Decision = x.od.Decision.String()
		res.Reason = fmt.Sprintf("the decision log says %s; the record itself is no longer readable", x.od.Decision)
		if x.rule.Mode == dedup.Version && x.od.Decision == dedup.Duplicate {
			res.Decision = decisionDropped
			res.Reason = "the decision log says it was not forwarded, a duplicate or stale (it records only forwards and dead letters); the record, whose version would tell which, is no longer readable"
		}
		if x.od.Entity != nil {
			res.Entity, res.EntityHex = ShowEntity(x.od.Entity), hex.EncodeToString(x.od.Entity)
		}
		return res, nil
	}
	ts := rec.Timestamp.UTC()
	res.Timestamp = &ts

	// The record and the input before it, as the sidecar reads them.
	x.before = make([]reading, len(recs))
	for i, in := range recs {
		x.before[i] = readAs(r, in)
	}
	x.cur = readAs(r, rec)
	if x.cur.err == nil {
		res.Entity, res.EntityHex, res.Digest = ShowEntity(x.cur.identity), hex.EncodeToString(x.cur.identity), x.cur.digest.String()
		if x.rule.Mode == dedup.Version {
			v := x.cur.version
			res.Version = &v
		}
		if x.own, x.other, err = ex.states(ctx, rc.Service, x.cur.identity, x.rule.Mode); err != nil {
			return nil, err
		}
		res.Evidence = append(res.Evidence, x.stateLine())
		if mc := modeChange(x.rule.Mode, x.own, x.other, true); mc != "" {
			res.Evidence = append(res.Evidence, "state: "+mc)
		}
	} else if id, err := r.Entity(rec); err == nil {
		res.Entity, res.EntityHex = ShowEntity(id), hex.EncodeToString(id)
	}

	fromState := x.fromState()
	switch {
	case !decided:
		return res, x.undecided(ctx, pr)
	case x.od.Covered && x.od.Decision == dedup.Skipped:
		return res, x.skipped(ctx)
	case x.od.Covered && x.od.Decision == dedup.Invalid, !x.od.Covered && x.cur.err != nil:
		x.invalid()
	case x.cur.err != nil:
		res.Decision = x.od.Decision.String()
		res.Reason = fmt.Sprintf("the decision log says %s, but under the current options the record is bad input (%s): the route's options changed since",
			x.od.Decision, hashError(x.cur.err))
	case x.od.Covered && x.od.Decision == dedup.Forward, !x.od.Covered && fromState && x.own.Offset == offset:
		x.forward(ctx)
	case x.od.Covered:
		x.notForwarded(ctx, true)
	case fromState && x.own.Offset < offset:
		x.notForwarded(ctx, false)
	default:
		x.unknown(ctx)
	}
	if rc.Shadow && (res.Decision == dedup.Duplicate.String() || res.Decision == dedup.Stale.String() || res.Decision == decisionDropped) {
		res.Reason += "; the route is in shadow mode: it was forwarded anyway, marked dam-duplicate: true"
	}
	return res, nil
}

// decisionDropped: version mode, not forwarded (a duplicate or stale), no
// longer known which.
const decisionDropped = "dropped"

// fromState reports that the identity's state (in the route's mode) was
// set from the record's partition.
func (x *offsetCase) fromState() bool {
	return x.own != nil && x.own.Topic == x.p.Topic && x.own.Partition == x.p.Partition
}

func (x *offsetCase) stateLine() string {
	if x.own != nil {
		return "state: " + StoredOf(x.own).String()
	}
	s := fmt.Sprintf("state: none stored in mode %s for this identity (never forwarded, or reset or pruned since", x.rule.Mode)
	if x.rule.Mode == dedup.Window {
		s += ", or its window ended and the cleanup deleted it"
	}
	return s + ")"
}

// decidedAt is when the record was decided, when known: exactly, from the
// state it set; else its logged batch's time (the start of the decide
// transaction, a moment before its clock was read).
func (x *offsetCase) decidedAt() (time.Time, bool) {
	switch {
	case x.fromState() && x.own.Offset == x.res.Offset:
		return x.own.UpdatedAt, true
	case x.od.Covered:
		return x.od.LoggedAt, true
	}
	return time.Time{}, false
}

// unread says why records before the ones read were not read, between
// around ("" when every record of the partition before the offset was
// read).
func (x *offsetCase) unread(around ...string) string {
	var why string
	switch {
	case x.lo > x.b.Start:
		why = fmt.Sprintf("beyond --lookback (offsets below %d were not read)", x.lo)
	case x.b.Start > 0:
		why = fmt.Sprintf("deleted by retention (the partition starts at %d)", x.b.Start)
	default:
		return ""
	}
	return around[0] + why + strings.Join(around[1:], "")
}

// recordAt returns the input record at off: from the records read, or
// from Kafka.
func (x *offsetCase) recordAt(ctx context.Context, off int64) (*reading, error) {
	for i := range x.before {
		if x.before[i].rec.Offset == off {
			return &x.before[i], nil
		}
	}
	rec, err := x.ex.readOne(ctx, x.p.Topic, x.p.Partition, off, x.b)
	if err != nil {
		return nil, err
	}
	r := readAs(x.route, rec)
	return &r, nil
}

// previous returns the last valid record of the identity read before the
// offset, nil if none.
func (x *offsetCase) previous() *reading {
	for i := len(x.before) - 1; i >= 0; i-- {
		if x.before[i].of(x.cur.identity) {
			return &x.before[i]
		}
	}
	return nil
}

// lastForward returns the identity's last logged forward before the
// offset.
func (x *offsetCase) lastForward(ctx context.Context) (dedup.LoggedForward, bool) {
	f, ok, err := x.ex.store.LastForward(ctx, x.p, x.cur.identity, x.res.Offset)
	return f, ok && err == nil
}

// diff sets the first difference from the content of base to the record's.
func (x *offsetCase) diff(base *reading) {
	if base == nil || base.err != nil || base.digest == x.cur.digest {
		return
	}
	if d, ok, err := firstDifference(x.h.Hasher, base.rec.Value, x.cur.rec.Value); err == nil && ok {
		x.res.Difference, x.res.DifferenceFrom = &d, base.rec.Offset
	}
}

// skipped explains a record an operator skipped (dam state skip), from
// the skip the store recorded with it.
func (x *offsetCase) skipped(ctx context.Context) error {
	res := x.res
	res.Decision = dedup.Skipped.String()
	t := x.od.LoggedAt.UTC()
	res.DecidedAt = &t
	sk, ok, err := x.ex.store.SkipAt(ctx, x.p, res.Offset)
	if err != nil {
		return err
	}
	if !ok {
		res.Reason = fmt.Sprintf("skipped by an operator (dam state skip) at or after %s; who and why are no longer recorded: it was not delivered", exact(t))
		return nil
	}
	at := sk.At.UTC()
	res.DecidedAt = &at
	was := "undecided"
	how := "the partition had halted before deciding it"
	if sk.Was != 0 {
		was = sk.Was.String()
		how = fmt.Sprintf("it had been decided %s and was not delivered (the partition halted delivering it)", sk.Was)
		if res.Entity == "" && sk.Entity != nil {
			res.Entity, res.EntityHex = ShowEntity(sk.Entity), hex.EncodeToString(sk.Entity)
		}
	}
	res.Skip = &Skip{By: sk.By, Reason: sk.Reason, At: at, Was: was}
	res.Reason = fmt.Sprintf("skipped by an operator: %s at %s (%q); %s; it was not delivered, and the partition went on after it",
		sk.By, exact(at), sk.Reason, how)
	return nil
}

func (x *offsetCase) undecided(ctx context.Context, pr dedup.Progress) error {
	res := x.res
	res.Decision = "undecided"
	res.Reason = fmt.Sprintf("not decided yet: offsets below %s are decided", nextText(pr))
	if x.cur.err != nil {
		res.Reason += fmt.Sprintf("; decided now, it would be bad input (%s): %s", hashError(x.cur.err), badInputDest(x.rc, true))
		return nil
	}
	now, err := x.ex.clock(ctx)
	if err != nil {
		return err
	}
	v := judge(x.rule, x.own, x.cur.digest, x.cur.version, now)
	res.Reason += fmt.Sprintf("; decided now (%s), it would be %s: %s", exact(now), wouldBe(v.decision), v.reason)
	res.Refresh, res.Window = v.refresh, v.window
	return nil
}

func (x *offsetCase) invalid() {
	why := "valid under the current options: the route's options changed since"
	if x.cur.err != nil {
		why = hashError(x.cur.err)
	}
	x.res.Decision = dedup.Invalid.String()
	x.res.Reason = fmt.Sprintf("bad input (%s); %s", why, badInputDest(x.rc, false))
}

// forward explains a record that was forwarded.
func (x *offsetCase) forward(ctx context.Context) {
	res := x.res
	res.Decision = dedup.Forward.String()
	at, known := x.decidedAt()
	if known {
		t := at.UTC()
		res.DecidedAt = &t
	}
	noun := "the stored digest"
	switch x.rule.Mode {
	case dedup.Window:
		x.forwardWindow(ctx, at, known)
		noun = "the id's stored state"
	case dedup.Version:
		x.forwardVersion(ctx)
		noun = "the stored version"
	default:
		x.forwardLastSeen(ctx, at, known)
	}
	if x.fromState() && x.own.Offset == res.Offset {
		res.Reason += "; it set " + noun + ", still current"
	}
}

func (x *offsetCase) forwardLastSeen(ctx context.Context, at time.Time, known bool) {
	res := x.res
	prev := x.previous()
	switch {
	case prev == nil:
		res.Reason = fmt.Sprintf("forwarded: no earlier record of this entity in offsets [%d, %d): a new identity%s", x.lo, res.Offset, x.unread(", or its previous record is "))
	case prev.digest != x.cur.digest:
		res.Previous = prev.ref("kafka")
		res.Reason = fmt.Sprintf("forwarded: its content differs from the previous record of this entity (offset %d)", prev.rec.Offset)
		x.diff(prev)
	case x.rule.RefreshAfter > 0:
		res.Previous = prev.ref("kafka")
		x.refreshed(ctx, prev, at, known)
	default:
		res.Previous = prev.ref("kafka")
		res.Reason = fmt.Sprintf("forwarded although the previous record of this entity (offset %d) has the same content: its state was reset or pruned in between (or changed by a check)", prev.rec.Offset)
	}
}

// refreshed explains the forward of a record equal to the previous one on
// a route with refresh_after: a refresh, or a reset in between, told apart
// by the time since the identity's forward before it.
func (x *offsetCase) refreshed(ctx context.Context, prev *reading, at time.Time, known bool) {
	res, r := x.res, x.rule.RefreshAfter
	lf, ok := x.lastForward(ctx)
	if !ok || !known {
		res.Reason = fmt.Sprintf("forwarded although its content equals the previous record of this entity (offset %d): a refresh (refresh_after %s) or a state reset or pruned in between; the decision log records both as forwards, and no longer holds the forward before it",
			prev.rec.Offset, r)
		return
	}
	res.Refresh = refreshOf(x.rule, lf.LoggedAt, at)
	gap := at.Sub(lf.LoggedAt)
	if res.Refresh.Refreshed {
		res.Decision = dedup.Refresh.String()
		res.Reason = fmt.Sprintf("refreshed: its content equals the previous record of this entity (offset %d), but the identity was last forwarded from offset %d at %s, %s before this record was decided (%s): longer than refresh_after %s",
			prev.rec.Offset, lf.Offset, exact(lf.LoggedAt), gap, exact(at), r)
		return
	}
	res.Reason = fmt.Sprintf("forwarded although its content equals the previous record of this entity (offset %d), only %s after the identity's forward from offset %d (at %s; refresh_after %s): its state was reset or pruned in between (or changed by a check)",
		prev.rec.Offset, gap, lf.Offset, exact(lf.LoggedAt), r)
}

func (x *offsetCase) forwardWindow(ctx context.Context, at time.Time, known bool) {
	res, rule := x.res, x.rule
	res.Window = &Window{Window: rule.Window.String(), Sliding: rule.Sliding}
	res.Reason = "forwarded: its id had no open window when it was decided"
	if lf, ok := x.lastForward(ctx); ok {
		res.Previous = &Ref{Offset: lf.Offset, At: lf.LoggedAt.UTC(), From: "decision log"}
		if rule.Sliding {
			res.Reason += fmt.Sprintf(": the id was last forwarded from offset %d at %s, and its sliding window (%s from the forward or its last repeat) had ended",
				lf.Offset, exact(lf.LoggedAt), rule.Window)
			return
		}
		end := windowOpened(rule, lf.LoggedAt).UTC()
		res.Window.ExpiresAt, res.Window.Expired = &end, true
		res.Reason += fmt.Sprintf(": the id was last forwarded from offset %d at %s, and that window ended at %s", lf.Offset, exact(lf.LoggedAt), exact(end))
		if known {
			res.Reason += fmt.Sprintf("; this record was decided at %s", exact(at))
			if inWindow(rule, end, at) {
				res.Window.Expired = false
				res.Reason += ", before that end: the id was reset in between"
			}
		}
		return
	}
	if prev := x.previous(); prev != nil {
		res.Previous = prev.ref("kafka")
		res.Reason += fmt.Sprintf(": the input holds an earlier record of this id (offset %d), whose window had ended by then (or the id was reset); the decision log no longer holds its forward",
			prev.rec.Offset)
		return
	}
	res.Reason += fmt.Sprintf(": no earlier record of this id in offsets [%d, %d): a first sighting%s", x.lo, res.Offset, x.unread(", or its earlier record is "))
}

func (x *offsetCase) forwardVersion(ctx context.Context) {
	res, v := x.res, x.cur.version
	w, ok := x.versionBefore(ctx)
	if !ok {
		res.Reason = fmt.Sprintf("forwarded: no earlier version of this entity is known in the state, the decision log or the input read, [%d, %d): its first version%s",
			x.lo, res.Offset, x.unread(", or the forward before it is "))
		return
	}
	res.Previous = w.ref
	switch {
	case !w.exact:
		res.Reason = fmt.Sprintf("forwarded: its version %d is above %d, the highest earlier version of this entity in the input read (offset %d)", v, w.version, w.ref.Offset)
	case versionCause(v, w.version) == dedup.CauseNewer:
		res.Reason = fmt.Sprintf("forwarded: its version %d is above the version %d stored when it was decided, forwarded from offset %d at %s", v, w.version, w.ref.Offset, stamp(w.ref.At))
	default:
		res.Reason = fmt.Sprintf("forwarded although its version %d is not above the version %d forwarded from offset %d: its state was reset or pruned in between", v, w.version, w.ref.Offset)
	}
	if base, err := x.recordAt(ctx, w.ref.Offset); err == nil {
		x.diff(base)
	}
}

// notForwarded explains a decided record that was not forwarded (logged:
// the decision log covers it; else the state, set from an earlier offset
// of the partition, shows it).
func (x *offsetCase) notForwarded(ctx context.Context, logged bool) {
	switch x.rule.Mode {
	case dedup.Window:
		x.duplicateWindow(ctx)
	case dedup.Version:
		x.notForwardedVersion(ctx, logged)
	default:
		if !logged && x.own.Digest != x.cur.digest {
			x.unknown(ctx)
			return
		}
		x.duplicateLastSeen(ctx)
	}
}

func (x *offsetCase) duplicateLastSeen(ctx context.Context) {
	res := x.res
	res.Decision = dedup.Duplicate.String()
	res.DuplicateOf = x.duplicateOf(ctx)
	if res.DuplicateOf == nil {
		res.Reason = "a duplicate of the content stored when it was decided; the record that forwarded that content is no longer known (beyond the log, the state and --lookback)"
		return
	}
	res.Reason = fmt.Sprintf("duplicate of the content forwarded from offset %s at %s", res.DuplicateOf.offsetText(), stamp(res.DuplicateOf.At))
	if x.od.Covered {
		// The log says so: decided a duplicate, when, in which batch.
		t := x.od.LoggedAt.UTC()
		res.DecidedAt = &t
		if res.DuplicateOf.From == "decision log" {
			res.Reason += x.sameContent(ctx, res.DuplicateOf.Offset)
		}
		res.Reason += fmt.Sprintf("; decided at %s (the decision log holds its batch [%d, %d))", exact(t), x.od.First, x.od.End)
	}
	// With refresh_after: not refreshed, since it was decided too soon
	// after that forward (when both times are known).
	if at, known := x.decidedAt(); x.rule.RefreshAfter > 0 && known && res.DuplicateOf.From != "kafka" {
		if rj := refreshOf(x.rule, res.DuplicateOf.At, at); !rj.Refreshed {
			res.Refresh = rj
			res.Reason += fmt.Sprintf("; not refreshed: decided at %s, %s after that forward, not longer than refresh_after %s",
				exact(at), at.Sub(res.DuplicateOf.At), x.rule.RefreshAfter)
		}
	}
}

// sameContent checks the logged forward at off, the entity's last before
// the duplicate, against the duplicate's content, read back from Kafka:
// the same content makes the source definite; other content means the
// state held by then came from elsewhere.
func (x *offsetCase) sameContent(ctx context.Context, off int64) string {
	r, err := x.recordAt(ctx, off)
	switch {
	case err != nil:
		return fmt.Sprintf(" (the entity's last logged forward before it; its record is no longer readable: %v)", err)
	case r.err != nil || r.digest != x.cur.digest:
		return " (the entity's last logged forward in this partition, but with other content: the content it repeated was stored from elsewhere, another partition, a check, or the state restored)"
	}
	return " (the entity's last logged forward before it, with the same content)"
}

// duplicateOf finds the forward whose content a duplicate repeated: the
// state's source when it still holds that content, else the last logged
// forward of the entity, else the start of the run of equal content in the
// input read before the offset.
func (x *offsetCase) duplicateOf(ctx context.Context) *Ref {
	st, off := x.own, x.res.Offset
	if x.fromState() && st.Offset < off && st.Digest == x.cur.digest {
		return &Ref{Offset: st.Offset, At: st.UpdatedAt.UTC(), From: "state"}
	}
	if f, ok := x.lastForward(ctx); ok {
		return &Ref{Offset: f.Offset, At: f.LoggedAt.UTC(), From: "decision log"}
	}
	return x.runStart()
}

// runStart finds, in the records read before the offset, the first record
// of the run of the identity's records with the record's digest that ends
// there: under last-seen, the forward whose content the run repeats. nil
// when the identity has no such record there.
func (x *offsetCase) runStart() *Ref {
	var run, first *reading
	for i := len(x.before) - 1; i >= 0; i-- {
		r := &x.before[i]
		if !r.of(x.cur.identity) {
			continue // invalid records change nothing
		}
		first = r
		if r.digest != x.cur.digest {
			break
		}
		run = r
	}
	if run == nil {
		return nil
	}
	ref := run.ref("kafka")
	// The run reaches the first record read, and records before it were not
	// read: it may have started earlier.
	ref.AtOrBefore = x.lo > x.b.Start && run == first && run == x.firstOf()
	return ref
}

// firstOf returns the first valid record of the identity read.
func (x *offsetCase) firstOf() *reading {
	for i := range x.before {
		if x.before[i].of(x.cur.identity) {
			return &x.before[i]
		}
	}
	return nil
}

func (x *offsetCase) duplicateWindow(ctx context.Context) {
	res, rule := x.res, x.rule
	res.Decision = dedup.Duplicate.String()
	res.Window = &Window{Window: rule.Window.String(), Sliding: rule.Sliding}
	var fwd *Ref
	var base *reading
	if x.fromState() && x.own.Offset < res.Offset {
		fwd = &Ref{Offset: x.own.Offset, At: x.own.UpdatedAt.UTC(), From: "state"}
	} else if lf, ok := x.lastForward(ctx); ok {
		fwd = &Ref{Offset: lf.Offset, At: lf.LoggedAt.UTC(), From: "decision log"}
	}
	if fwd == nil {
		// Only the input is left: the earliest record of the id read.
		if first := x.firstOf(); first != nil {
			res.DuplicateOf = first.ref("kafka")
			res.DuplicateOf.AtOrBefore = x.lo > x.b.Start
			x.diff(first)
			res.Reason = fmt.Sprintf("a duplicate: its id was seen within the window (%s); its forward is no longer in the state or the decision log, and the earliest record of this id in the input read is offset %s (the forward, unless a window ended in between)",
				rule.Window, res.DuplicateOf.offsetText())
			return
		}
		res.Reason = fmt.Sprintf("a duplicate: its id was seen within the window (%s); the record that forwarded the id is no longer known (beyond the state, the log and --lookback)", rule.Window)
		return
	}
	res.DuplicateOf = fwd
	kind := "sliding, extended by each repeat"
	if !rule.Sliding {
		end := windowOpened(rule, fwd.At)
		res.Window.ExpiresAt = &end
		kind = "fixed, until " + exact(end)
	}
	res.Reason = fmt.Sprintf("duplicate of the id forwarded from offset %d at %s: its window (%s, %s) was still open when this record was decided; a repeated id is a duplicate whatever its content",
		fwd.Offset, exact(fwd.At), rule.Window, kind)
	if fwd.From == "state" {
		base = &reading{digest: x.own.Digest}
	}
	if r, err := x.recordAt(ctx, fwd.Offset); err == nil && r.err == nil {
		base = r
	}
	if base != nil {
		res.Reason += " (" + contentNote(base.digest, x.cur.digest) + ")"
		if base.rec != nil {
			x.diff(base)
		}
	}
}

// versionWitness is the version stored for the identity when the record
// was decided, and the forward that set it, as far as it can be known.
type versionWitness struct {
	version int64
	ref     *Ref
	// exact: from the state or the decision log, or from the input read
	// back to the partition's start; else a lower bound (the highest
	// version in the input read before the offset).
	exact bool
}

func (x *offsetCase) versionBefore(ctx context.Context) (versionWitness, bool) {
	witness := func(v int64, ref *Ref, exact bool) (versionWitness, bool) {
		ref.Version = &v
		return versionWitness{version: v, ref: ref, exact: exact}, true
	}
	if x.fromState() && x.own.Offset < x.res.Offset {
		return witness(x.own.Version, &Ref{Offset: x.own.Offset, At: x.own.UpdatedAt.UTC(), From: "state"}, true)
	}
	if lf, ok := x.lastForward(ctx); ok {
		if r, err := x.recordAt(ctx, lf.Offset); err == nil && r.err == nil {
			return witness(r.version, &Ref{Offset: lf.Offset, At: lf.LoggedAt.UTC(), From: "decision log"}, true)
		}
	}
	// Every valid record raises the stored version to its own, at least: the
	// highest version read before the offset is a lower bound.
	var best *reading
	for i := range x.before {
		if r := &x.before[i]; r.of(x.cur.identity) && (best == nil || r.version > best.version) {
			best = r
		}
	}
	if best == nil {
		return versionWitness{}, false
	}
	return witness(best.version, best.ref("kafka"), x.lo <= x.b.Start)
}

func (x *offsetCase) notForwardedVersion(ctx context.Context, logged bool) {
	res, v := x.res, x.cur.version
	w, ok := x.versionBefore(ctx)
	var c dedup.Cause // what the rule makes of v against the version stored then
	if ok {
		c = versionCause(v, w.version)
	}
	switch {
	case c == dedup.CauseOlder:
		res.Decision, res.StaleAgainst = dedup.Stale.String(), w.ref
		if w.ref.From == "kafka" && !w.exact {
			res.Reason = fmt.Sprintf("stale: its version %d is below version %d of the earlier record at offset %d, so below the version stored when it was decided: an out-of-order update",
				v, w.version, w.ref.Offset)
		} else {
			res.Reason = fmt.Sprintf("stale: its version %d is below the version %d stored when it was decided, forwarded from offset %d at %s: an out-of-order update",
				v, w.version, w.ref.Offset, stamp(w.ref.At))
		}
		return
	case w.exact && c == dedup.CauseSameVersion:
		res.Decision, res.DuplicateOf = dedup.Duplicate.String(), w.ref
		res.Reason = fmt.Sprintf("duplicate: its version %d equals the version stored when it was decided, forwarded from offset %d at %s; a repeated version is a duplicate whatever its content",
			v, w.ref.Offset, stamp(w.ref.At))
		if base, err := x.recordAt(ctx, w.ref.Offset); err == nil && base.err == nil {
			res.Reason += " (" + contentNote(base.digest, x.cur.digest) + ")"
			x.diff(base)
		}
		return
	case !logged:
		x.unknown(ctx)
		return
	}
	res.Decision = decisionDropped
	res.Reason = "not forwarded (the decision log covers the offset, and records only forwards and dead letters): a duplicate or stale, and which is no longer known: "
	switch {
	case !ok:
		res.Reason += fmt.Sprintf("the version stored when it was decided is gone (the state has moved on, the decision log holds no forward of this entity before it, and the input read, [%d, %d), holds no earlier version of it)",
			x.lo, res.Offset)
	case c == dedup.CauseSameVersion:
		res.DuplicateOf = w.ref
		res.Reason += fmt.Sprintf("its version %d equals the highest earlier version in the input read (offset %d), but a higher one may have been stored from before offset %d (--lookback)",
			v, w.ref.Offset, x.lo)
	default:
		res.Reason += fmt.Sprintf("its version %d is above %d (offset %d, from the %s), so the version stored then came from elsewhere (another partition, a check, or a state reset or restored)",
			v, w.version, w.ref.Offset, w.ref.From)
	}
}

// unknown explains a decided record whose decision is no longer recorded,
// with what the input before it suggests.
func (x *offsetCase) unknown(ctx context.Context) {
	res := x.res
	res.Decision = "unknown"
	res.Reason = "the decision is no longer recorded: " + x.unknownWhy()
	prev := x.previous()
	switch x.rule.Mode {
	case dedup.Window:
		if prev == nil {
			res.Reason += fmt.Sprintf("; the input read before it, [%d, %d), holds no earlier record of this id: it was probably forwarded, a first sighting%s", x.lo, res.Offset, x.unread(" (unless its earlier record is ", ")"))
			return
		}
		res.Previous = prev.ref("kafka")
		res.Reason += fmt.Sprintf("; the input before it holds an earlier record of this id (offset %d, timestamp %s): it was a duplicate if that id's window (%s) was still open when this record was decided, else forwarded",
			prev.rec.Offset, stamp(prev.rec.Timestamp), x.rule.Window)
	case dedup.Version:
		w, ok := x.versionBefore(ctx)
		v := x.cur.version
		switch {
		case !ok:
			res.Reason += fmt.Sprintf("; the input read before it, [%d, %d), holds no earlier version of this entity: it was probably forwarded, its first version%s", x.lo, res.Offset, x.unread(" (unless an earlier one is ", ")"))
		case versionCause(v, w.version) == dedup.CauseNewer:
			res.Previous = w.ref
			res.Reason += fmt.Sprintf("; the input before it suggests it was forwarded: its version %d is above every earlier version there (the highest, %d, at offset %d)", v, w.version, w.ref.Offset)
		case versionCause(v, w.version) == dedup.CauseSameVersion:
			res.DuplicateOf = w.ref
			res.Reason += fmt.Sprintf("; the input before it suggests a duplicate of version %d at offset %d (unless a higher version was stored from elsewhere: then stale)", v, w.ref.Offset)
		default:
			res.StaleAgainst = w.ref
			res.Reason += fmt.Sprintf("; the input before it suggests it was stale: its version %d is below version %d at offset %d", v, w.version, w.ref.Offset)
		}
	default:
		// The input before the offset still shows what was stored when it
		// was decided (unless the identity was reset in between).
		if prev == nil {
			return
		}
		if prev.digest == x.cur.digest {
			res.DuplicateOf = x.runStart()
			res.Reason += fmt.Sprintf("; the input before it suggests a duplicate of the content forwarded from offset %s (unless the identity was reset in between)",
				res.DuplicateOf.offsetText())
			return
		}
		res.Previous = prev.ref("kafka")
		x.diff(prev)
		res.Reason += fmt.Sprintf("; the input before it suggests it was forwarded: it differs from the previous record of this entity (offset %d)", prev.rec.Offset)
	}
}

// unknownWhy says why the state no longer shows the decision.
func (x *offsetCase) unknownWhy() string {
	st, off := x.own, x.res.Offset
	noun := "the stored digest"
	switch x.rule.Mode {
	case dedup.Window:
		noun = "the id's stored state"
	case dedup.Version:
		if st != nil {
			noun = fmt.Sprintf("the stored version (%d)", st.Version)
		}
	}
	switch {
	case st == nil && x.other != nil:
		return fmt.Sprintf("the identity has no state in mode %s now; its most recent state is in mode %s: the service changed mode", x.rule.Mode, x.other.Mode)
	case st == nil && x.rule.Mode == dedup.Window:
		return "the id has no stored state now (its window ended and the cleanup deleted it, or it was reset)"
	case st == nil:
		return "the identity has no stored state now (reset or pruned since)"
	case st.Topic == "":
		return fmt.Sprintf("%s was since set by a check (dam serve or dedup.Check) at %s", noun, stamp(st.UpdatedAt))
	case st.Topic != x.p.Topic || st.Partition != x.p.Partition:
		return fmt.Sprintf("%s was since set from another partition (%s/%d@%d)", noun, st.Topic, st.Partition, st.Offset)
	case st.Offset > off:
		return fmt.Sprintf("%s was since set from offset %d at %s", noun, st.Offset, stamp(st.UpdatedAt))
	case x.rule.Mode == dedup.Version:
		return fmt.Sprintf("the stored version %d (from offset %d) is below this record's %d, which would then have been forwarded: the state was reset and restored, or the route's options changed",
			st.Version, st.Offset, x.cur.version)
	}
	return fmt.Sprintf("%s (from offset %d) differs from this record's %s under the current options; the route's options changed since, or the state was restored", noun, st.Offset, x.cur.digest)
}

func nextText(pr dedup.Progress) string {
	if !pr.HasNext {
		return "the partition's progress, which is not set yet"
	}
	return fmt.Sprintf("the partition's progress %d", pr.Next)
}

func progressLine(pr dedup.Progress, b bounds) string {
	c := "none"
	if b.Committed >= 0 {
		c = fmt.Sprint(b.Committed)
	}
	p := "not set"
	if pr.HasNext {
		p = fmt.Sprint(pr.Next)
	}
	return fmt.Sprintf("progress: decided below %s; the group's committed offset is %s; the partition holds [%d, %d)", p, c, b.Start, b.End)
}

func logLine(od dedup.OffsetDecision, offset int64, decided bool, rule dedup.Rule) string {
	switch {
	case !decided && od.HasLog:
		return fmt.Sprintf("decision log: does not cover offset %d yet (it holds [%d, %d))", offset, od.LogFrom, od.LogTo)
	case !decided:
		return fmt.Sprintf("decision log: does not cover offset %d yet (empty for this partition)", offset)
	case od.Covered:
		what := od.Decision.String()
		switch {
		case od.Decision == dedup.Duplicate && rule.Mode == dedup.Version:
			what = "not forwarded, a duplicate or stale (the log holds forwards and dead letters only)"
		case od.Decision == dedup.Duplicate:
			what = "duplicate (not forwarded: the log holds forwards and dead letters only)"
		case od.Decision == dedup.Skipped:
			what = "skipped by an operator (not delivered)"
		case od.Decision == dedup.Forward && rule.RefreshAfter > 0:
			what = "forward (or a refresh: the log records refreshes as forwards)"
		}
		return fmt.Sprintf("decision log: offset %d is in the batch [%d, %d) decided %s: %s", offset, od.First, od.End, exact(od.LoggedAt), what)
	case od.HasLog:
		return fmt.Sprintf("decision log: no longer covers offset %d (it holds [%d, %d); a batch is pruned once delivered and older than decision_log.keep)", offset, od.LogFrom, od.LogTo)
	}
	return fmt.Sprintf("decision log: no longer covers offset %d (empty for this partition: a batch is pruned once delivered and older than decision_log.keep)", offset)
}
