package main

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
	"github.com/dam-dedup/dam/pipeline"
)

// explainer answers dam explain from the configuration, the store and
// Kafka.
type explainer struct {
	cfg      config.Config
	store    *dedup.Store
	kafka    *kafkaReader
	lookback int64
}

// routeHasher is a service's hashing: its route's options or the
// defaults.
type routeHasher struct {
	*canon.Hasher
	route   *config.Route // nil: no route, canon's defaults
	maxSize int
}

func (r routeHasher) describe() string {
	if r.route == nil {
		return "canon's defaults (no route of this service in the configuration)"
	}
	s := fmt.Sprintf("route %s (from %s): format %s", r.route.Service, r.route.From, r.route.Format)
	if len(r.route.Ignore) > 0 {
		s += ", ignore " + strings.Join(r.route.Ignore, " ")
	}
	return s + fmt.Sprintf(", max_depth %d, max_size %d", r.route.MaxDepth, r.route.MaxSize)
}

// hasher returns service's hashing (routes are validated by Load, so the
// options are valid).
func (ex *explainer) hasher(service string) routeHasher {
	for i := range ex.cfg.Routes {
		r := &ex.cfg.Routes[i]
		if r.Service != service {
			continue
		}
		f, _ := canon.ParseFormat(r.Format)
		h, err := canon.New(canon.WithFormat(f), canon.WithIgnore(r.Ignore...), canon.WithMaxDepth(r.MaxDepth), canon.WithMaxSize(r.MaxSize))
		if err != nil {
			panic(fmt.Sprintf("route %s validated but its hasher fails: %v", r.Service, err))
		}
		return routeHasher{Hasher: h, route: r, maxSize: r.MaxSize}
	}
	h, _ := canon.New()
	return routeHasher{Hasher: h, maxSize: canon.DefaultMaxSize}
}

// compile compiles a route as the sidecar runs it (identity, version and
// digest of a record; its rule).
func compile(r *config.Route) (*pipeline.Route, error) {
	c, err := pipeline.CompileRoute(*r)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", r.Service, err)
	}
	return c, nil
}

// storedJSON is a stored state, in any mode's table.
type storedJSON struct {
	Mode      string      `json:"mode"`
	Digest    string      `json:"digest"`
	UpdatedAt time.Time   `json:"updated_at"` // when the identity was last forwarded
	Source    *sourceJSON `json:"source"`     // null: set by a check (dam serve, dedup.Check)
	// Version is the highest version forwarded (version mode).
	Version *int64 `json:"version,omitempty"`
	// ExpiresAt is when the id expires (window mode): it reads as absent
	// from then on.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

type sourceJSON struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

func (s sourceJSON) String() string { return fmt.Sprintf("%s/%d@%d", s.Topic, s.Partition, s.Offset) }

// storedOf returns st as JSON, nil for nil.
func storedOf(st *dedup.State) *storedJSON {
	if st == nil {
		return nil
	}
	out := &storedJSON{Mode: st.Mode.String(), Digest: st.Digest.String(), UpdatedAt: st.UpdatedAt.UTC()}
	if st.Topic != "" {
		out.Source = &sourceJSON{Topic: st.Topic, Partition: st.Partition, Offset: st.Offset}
	}
	switch st.Mode {
	case dedup.Version:
		v := st.Version
		out.Version = &v
	case dedup.Window:
		e := st.ExpiresAt.UTC()
		out.ExpiresAt = &e
	}
	return out
}

func (s *storedJSON) describe() string {
	if s == nil {
		return "none: its next valid record is forwarded (a new identity, or reset, pruned or expired since)"
	}
	from := "by a check (dam serve or dedup.Check)"
	if s.Source != nil {
		from = "from " + s.Source.String()
	}
	d := fmt.Sprintf("%s set %s %s", s.Digest, exact(s.UpdatedAt), from)
	switch {
	case s.Version != nil:
		d = fmt.Sprintf("version %d, %s", *s.Version, d)
	case s.ExpiresAt != nil:
		d += ", expires " + exact(*s.ExpiresAt)
	}
	return d
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// payloadExplanation answers `dam explain SERVICE ENTITY [PAYLOAD]`.
type payloadExplanation struct {
	Service string `json:"service"`
	// Entity is the identity: the entity, or in window mode the message id.
	Entity    string `json:"entity"`
	EntityHex string `json:"entity_hex"`
	Mode      string `json:"mode"` // the route's (last-seen without a route)
	Rule      string `json:"rule"`
	Hashing   string `json:"hashing"`
	// Now is the database's clock, which windows and refreshes are
	// measured on.
	Now time.Time `json:"now"`
	// Stored is the state in the route's mode's table; OtherMode a more
	// recent one in another mode's table, when the service changed mode
	// (ModeChange says so).
	Stored     *storedJSON `json:"stored"`
	OtherMode  *storedJSON `json:"other_mode,omitempty"`
	ModeChange string      `json:"mode_change,omitempty"`
	// Digest, Version, Decision and Reason answer for the payload, when one
	// is given: Decision is forward, refresh, duplicate, stale or invalid
	// (bad input).
	Digest   string `json:"digest,omitempty"`
	Version  *int64 `json:"version,omitempty"` // version mode: the payload's version
	Decision string `json:"decision,omitempty"`
	Reason   string `json:"reason"`
	// Refresh (last-seen with refresh_after) and Window (window mode) are
	// the rule's figures behind the decision.
	Refresh    *refreshJSON `json:"refresh,omitempty"`
	Window     *windowJSON  `json:"window,omitempty"`
	Difference *difference  `json:"difference,omitempty"`
	// StoredContent says what became of the stored content when it could
	// not be compared: "no longer readable: ...".
	StoredContent string `json:"stored_content,omitempty"`
}

func (ex *explainer) payload(ctx context.Context, service string, entity, payload []byte, hasPayload bool, headers []kgo.RecordHeader) (*payloadExplanation, error) {
	h := ex.hasher(service)
	var route *pipeline.Route
	var rule dedup.Rule // without a route: last-seen, as dam serve's checks
	if h.route == nil {
		n, err := ex.store.Count(ctx, service)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, usagef("unknown service %q: no route of the configuration has it and no state is stored for it", service)
		}
	} else {
		var err error
		if route, err = compile(h.route); err != nil {
			return nil, err
		}
		rule = route.Rule()
	}
	now, err := dbClock(ctx, ex.store)
	if err != nil {
		return nil, err
	}
	res := &payloadExplanation{Service: service, Entity: showEntity(entity), EntityHex: hex.EncodeToString(entity),
		Mode: rule.Mode.String(), Rule: describeRule(h.route, rule), Hashing: h.describe(), Now: now.UTC()}

	// The payload's digest, and version, as the sidecar reads them.
	var d canon.Digest
	var version int64
	var bad error
	if hasPayload {
		if route != nil {
			var id []byte
			id, version, d, bad = route.Identify(payloadRecord(h.route, entity, payload, headers))
			if bad == nil && !bytes.Equal(id, entity) {
				return nil, usagef("the payload's identity (%s) is %q, not ENTITY %q: explain it with that identity",
					identitySource(h.route), showEntity(id), showEntity(entity))
			}
		} else {
			d, bad = h.Sum(payload)
		}
	}

	own, other, err := ex.states(ctx, service, entity, rule.Mode)
	if err != nil {
		return nil, err
	}
	res.Stored, res.OtherMode = storedOf(own), storedOf(other)
	res.ModeChange = modeChange(rule.Mode, own, other, h.route != nil)
	storedValue, unreadable := ex.storedContent(ctx, h, res.Stored)

	if !hasPayload {
		res.Reason = "no payload given: " + ex.withoutPayload(rule, own, now, res)
		if storedValue != nil {
			res.Reason += "; the stored content is readable at its source offset"
		} else if own != nil && unreadable != "" {
			res.StoredContent = unreadable
		}
		return res, nil
	}
	if bad != nil {
		res.Decision = dedup.Invalid.String()
		res.Reason = "the payload is bad input: " + hashError(bad)
		if rule.Mode == dedup.Version && h.route.VersionSource().Kind == config.EntityHeader && !hasHeader(headers, h.route.VersionSource().Header) {
			res.Reason += fmt.Sprintf(" (the version is read from a header: give it with --header %s=N)", h.route.VersionSource().Header)
		}
		if h.route != nil {
			res.Reason += "; " + badInputDest(h.route, true)
		}
		return res, nil
	}
	res.Digest = d.String()
	if rule.Mode == dedup.Version {
		res.Version = &version
	}
	v := judge(rule, own, d, version, now)
	res.Decision, res.Reason, res.Refresh, res.Window = v.decision.String(), v.reason, v.refresh, v.window
	if h.route != nil && h.route.Shadow && !v.decision.Forwards() {
		res.Reason += "; the route is in shadow mode: forwarded anyway, marked dam-duplicate: true"
	}
	if own == nil || own.Digest == d {
		return res, nil
	}
	// The content differs from the stored content (whether or not the rule
	// looks at it): show where.
	if unreadable != "" {
		res.StoredContent = unreadable
		return res, nil
	}
	diff, ok, err := firstDifference(h.Hasher, storedValue, payload)
	switch {
	case err != nil:
		res.StoredContent = "not comparable: " + err.Error()
	case ok:
		res.Difference = &diff
	default:
		res.StoredContent = "the record at the source offset equals the payload under the current options: the route's options changed since it was stored"
	}
	return res, nil
}

// withoutPayload says what the rule makes of the stored state alone, and
// fills res's rule figures.
func (ex *explainer) withoutPayload(rule dedup.Rule, own *dedup.State, now time.Time, res *payloadExplanation) string {
	switch {
	case rule.Mode == dedup.Window:
		// The content does not count: a record with this id is decided now
		// as any other would be.
		v := judge(rule, own, canon.Digest{}, 0, now)
		res.Window = v.window
		return fmt.Sprintf("a record with this id would be %s now: %s", wouldBe(v.decision), v.reason)
	case own == nil:
		return "no stored state for this identity: its next valid record is forwarded"
	case rule.Mode == dedup.Version:
		return fmt.Sprintf("a record of this entity is forwarded iff its version is above %d (equal: a duplicate, lower: stale)", own.Version)
	case rule.RefreshAfter > 0:
		res.Refresh = refreshOf(rule, own.UpdatedAt, now)
		if res.Refresh.Refreshed {
			return fmt.Sprintf("a record equal to the stored content would be refreshed (forwarded) now: last forwarded at %s, longer ago than refresh_after %s",
				exact(own.UpdatedAt), rule.RefreshAfter)
		}
		return fmt.Sprintf("the stored state only; a record equal to the stored content is refreshed once decided after %s (refresh_after %s)",
			exact(res.Refresh.DueAfter), rule.RefreshAfter)
	}
	return "the stored state only"
}

// payloadRecord is the record the sidecar would read for a payload of
// identity entity: entity as its key and, when the route reads its
// identity from a header the caller did not give, in that header.
func payloadRecord(r *config.Route, entity, payload []byte, headers []kgo.RecordHeader) *kgo.Record {
	rec := &kgo.Record{Key: entity, Value: payload, Headers: headers}
	src := r.EntitySource()
	if r.Mode == config.ModeWindow {
		src = r.IDSource()
	}
	if src.Kind == config.EntityHeader && !hasHeader(headers, src.Header) {
		rec.Headers = append(rec.Headers[:len(rec.Headers):len(rec.Headers)], kgo.RecordHeader{Key: src.Header, Value: entity})
	}
	return rec
}

// identitySource names where a route reads identities.
func identitySource(r *config.Route) string {
	if r.Mode == config.ModeWindow {
		return "id_from " + r.IDFrom
	}
	return "entity " + r.Entity
}

func hasHeader(hs []kgo.RecordHeader, name string) bool {
	for _, h := range hs {
		if h.Key == name {
			return true
		}
	}
	return false
}

// kafkaTimeout bounds reading the stored content back from Kafka.
const kafkaTimeout = 10 * time.Second

// storedContent reads the value that set the stored digest back from
// Kafka; without it, it says why ("no longer readable: ...").
func (ex *explainer) storedContent(ctx context.Context, h routeHasher, st *storedJSON) ([]byte, string) {
	if st == nil {
		return nil, ""
	}
	if st.Source == nil {
		return nil, "stored content no longer readable: it was set by a check (dam serve or dedup.Check), which keeps only its digest"
	}
	// Kafka is only needed for the difference: do not spend the whole
	// --timeout on it when the brokers do not answer.
	ctx, cancel := context.WithTimeout(ctx, kafkaTimeout)
	defer cancel()
	b, err := ex.kafka.bounds(ctx, "", st.Source.Topic, st.Source.Partition)
	if err != nil {
		return nil, "stored content no longer readable: " + err.Error()
	}
	rec, err := ex.kafka.readOne(ctx, st.Source.Topic, st.Source.Partition, st.Source.Offset, b)
	if err != nil {
		return nil, "stored content no longer readable: " + err.Error()
	}
	if d, err := h.Sum(rec.Value); err != nil || d.String() != st.Digest {
		return nil, fmt.Sprintf("stored content no longer readable: the record at %s does not hash to the stored digest under the current options (the route's options changed, or the input was rewritten)", st.Source)
	}
	if rec.Value == nil {
		return nil, "" // a tombstone: nil is its content
	}
	return rec.Value, ""
}

func hashError(err error) string {
	var ce *canon.Error
	if errors.As(err, &ce) {
		return fmt.Sprintf("invalid JSON at byte %d: %s", ce.Offset, ce.Reason())
	}
	return err.Error()
}
