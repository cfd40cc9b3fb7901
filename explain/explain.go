package explain

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// Route is a route as the sidecar runs it: its configuration, its rule,
// and how it reads a record's identity, version and digest.
// pipeline.Route satisfies it.
type Route interface {
	// Config returns the route's validated configuration.
	Config() config.Route
	// Rule returns the decision rule the route's batches carry.
	Rule() dedup.Rule
	// Identify returns a record's identity (its entity, or in window mode
	// its message id), its version (version mode) and its digest, or why
	// the record is bad input.
	Identify(rec *kgo.Record) (identity []byte, version int64, digest canon.Digest, err error)
	// Entity returns a record's identity alone, from its key or a header
	// even when its value is bad input.
	Entity(rec *kgo.Record) ([]byte, error)
}

// Explainer answers why records of one consumer group were, or would be,
// forwarded or dropped. It changes nothing. It is safe for concurrent use.
type Explainer struct {
	store    *dedup.Store
	kafka    *kgo.Client
	group    string
	lookback int64
	clock    func(context.Context) (time.Time, error)
	maxBatch int
}

// Option configures an Explainer.
type Option func(*Explainer)

// DefaultLookback is how many input records before an offset Offset reads
// by default.
const DefaultLookback = 10000

// WithLookback sets how many input records before an offset Offset reads
// to find the content a record repeated or changed (default
// DefaultLookback).
func WithLookback(n int64) Option { return func(e *Explainer) { e.lookback = max(n, 0) } }

// WithMaxDecompressedBatch bounds what a compressed batch of the input may
// inflate to when a record is read (the sidecar's
// pipeline.max_decompressed_batch_bytes; its default by default): a batch
// past it is an error naming it.
func WithMaxDecompressedBatch(n int) Option { return func(e *Explainer) { e.maxBatch = n } }

// WithClock replaces the clock that windows and refreshes are measured on,
// by default the database's (the sidecar's clock): to explain as of a
// given time.
func WithClock(now func(context.Context) (time.Time, error)) Option {
	return func(e *Explainer) { e.clock = now }
}

// New returns an Explainer over the store, and over Kafka through kafka:
// its options (brokers, TLS, SASL) also make the clients that read a
// partition's records, read_committed as the sidecar reads them. group is
// the consumer group whose progress, decision log and committed offsets
// Offset reads. The caller keeps kafka and closes it.
func New(store *dedup.Store, kafka *kgo.Client, group string, opts ...Option) *Explainer {
	e := &Explainer{store: store, kafka: kafka, group: group, lookback: DefaultLookback,
		maxBatch: config.Default().Pipeline.MaxDecompressedBatchBytes}
	e.clock = e.dbClock
	for _, o := range opts {
		o(e)
	}
	return e
}

// dbClock returns the database's clock, on which the sidecar measures
// windows and refreshes (not the local one, which may be skewed).
func (e *Explainer) dbClock(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := e.store.Pool().QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("postgres: reading the clock: %w", err)
	}
	return now, nil
}

// ShowEntity shows an identity as text when it is printable text (UTF-8
// whose every rune is printable: no control or format character a terminal
// could act on, no tab), else as "hex:" and its hex form.
func ShowEntity(e []byte) string {
	if utf8.Valid(e) && !bytes.ContainsFunc(e, func(r rune) bool { return !strconv.IsPrint(r) }) {
		return string(e)
	}
	return "hex:" + hex.EncodeToString(e)
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

// hasherOf returns a route's hashing (r nil: canon's defaults). Routes
// come from a validated configuration, so their options are valid.
func hasherOf(r Route) routeHasher {
	if r == nil {
		h, _ := canon.New()
		return routeHasher{Hasher: h, maxSize: canon.DefaultMaxSize}
	}
	rc := r.Config()
	f, _ := canon.ParseFormat(rc.Format)
	h, err := canon.New(canon.WithFormat(f), canon.WithIgnore(rc.Ignore...), canon.WithMaxDepth(rc.MaxDepth), canon.WithMaxSize(rc.MaxSize))
	if err != nil {
		panic(fmt.Sprintf("route %s validated but its hasher fails: %v", rc.Service, err))
	}
	return routeHasher{Hasher: h, route: &rc, maxSize: rc.MaxSize}
}

// Stored is a stored state, in any mode's table, as explanations show it.
type Stored struct {
	Mode      string    `json:"mode"`
	Digest    string    `json:"digest"`
	UpdatedAt time.Time `json:"updated_at"` // when the identity was last forwarded
	Source    *Source   `json:"source"`     // null: set by a check (dam serve, dedup.Check)
	// Version is the highest version forwarded (version mode).
	Version *int64 `json:"version,omitempty"`
	// ExpiresAt is when the id expires (window mode): it reads as absent
	// from then on.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// Source is the input record that set a stored state.
type Source struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// String returns topic/partition@offset.
func (s Source) String() string { return fmt.Sprintf("%s/%d@%d", s.Topic, s.Partition, s.Offset) }

// StoredOf returns st as explanations show it, nil for nil.
func StoredOf(st *dedup.State) *Stored {
	if st == nil {
		return nil
	}
	out := &Stored{Mode: st.Mode.String(), Digest: st.Digest.String(), UpdatedAt: st.UpdatedAt.UTC()}
	if st.Topic != "" {
		out.Source = &Source{Topic: st.Topic, Partition: st.Partition, Offset: st.Offset}
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

// String describes the stored state in a line, or its absence for nil.
func (s *Stored) String() string {
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

// PayloadExplanation answers whether a record would be forwarded now, and
// why (Explainer.Payload).
type PayloadExplanation struct {
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
	Stored     *Stored `json:"stored"`
	OtherMode  *Stored `json:"other_mode,omitempty"`
	ModeChange string  `json:"mode_change,omitempty"`
	// Digest, Version, Decision and Reason answer for the payload, when one
	// is given: Decision is forward, refresh, duplicate, stale or invalid
	// (bad input).
	Digest   string `json:"digest,omitempty"`
	Version  *int64 `json:"version,omitempty"` // version mode: the payload's version
	Decision string `json:"decision,omitempty"`
	// Cause names the branch of the rule that decided (dedup.Cause: e.g.
	// changed, unchanged, refresh-due, in-window, older).
	Cause  string `json:"cause,omitempty"`
	Reason string `json:"reason"`
	// Refresh (last-seen with refresh_after) and Window (window mode) are
	// the rule's figures behind the decision.
	Refresh    *Refresh    `json:"refresh,omitempty"`
	Window     *Window     `json:"window,omitempty"`
	Difference *Difference `json:"difference,omitempty"`
	// StoredContent says what became of the stored content when it could
	// not be compared: "no longer readable: ...".
	StoredContent string `json:"stored_content,omitempty"`
}

// Query asks whether a record would be forwarded now (Explainer.Payload).
type Query struct {
	// Route is the service's route; nil when the configuration has none:
	// its records are explained as dam serve's checks decide them
	// (last-seen, canon's default hashing).
	Route Route
	// Service is the route's service (or, without a route, a service that
	// has stored state).
	Service string
	// Entity is the identity: the entity, or in window mode the message id.
	Entity []byte
	// Value is the payload, when HasValue; without one the explanation is
	// the stored state and what the rule makes of it.
	Value    []byte
	HasValue bool
	// Headers are the payload record's headers (a version or an id read
	// from a header). The record's key is Entity and, when the route reads
	// its identity from a header missing here, so is that header.
	Headers []kgo.RecordHeader
}

// Payload explains whether q's record would be forwarded now: the stored
// state in the route's mode, the record's digest under the route's
// options, the decision of the route's rule and its reason, and where the
// content differs from the stored content (read back from Kafka at its
// source offset). It changes nothing.
//
// Errors: ErrUnknownService when q has no route and the service no stored
// state; ErrOtherIdentity when the payload's identity is not q.Entity.
func (ex *Explainer) Payload(ctx context.Context, q Query) (*PayloadExplanation, error) {
	service, entity, payload, hasPayload, headers := q.Service, q.Entity, q.Value, q.HasValue, q.Headers
	h := hasherOf(q.Route)
	route := q.Route
	var rule dedup.Rule // without a route: last-seen, as dam serve's checks
	if route == nil {
		n, err := ex.store.Count(ctx, service)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("%w %q: no route of the configuration has it and no state is stored for it", ErrUnknownService, service)
		}
	} else {
		rule = route.Rule()
	}
	now, err := ex.clock(ctx)
	if err != nil {
		return nil, err
	}
	res := &PayloadExplanation{Service: service, Entity: ShowEntity(entity), EntityHex: hex.EncodeToString(entity),
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
				return nil, fmt.Errorf("%w: the payload's identity (%s) is %q, not %q: explain it with that identity",
					ErrOtherIdentity, identitySource(h.route), ShowEntity(id), ShowEntity(entity))
			}
		} else {
			d, bad = h.Sum(payload)
		}
	}

	own, other, err := ex.states(ctx, service, entity, rule.Mode)
	if err != nil {
		return nil, err
	}
	res.Stored, res.OtherMode = StoredOf(own), StoredOf(other)
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
	res.Decision, res.Cause, res.Reason, res.Refresh, res.Window = v.decision.String(), v.cause.String(), v.reason, v.refresh, v.window
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
func (ex *Explainer) withoutPayload(rule dedup.Rule, own *dedup.State, now time.Time, res *PayloadExplanation) string {
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
func (ex *Explainer) storedContent(ctx context.Context, h routeHasher, st *Stored) ([]byte, string) {
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
	b, err := ex.bounds(ctx, "", st.Source.Topic, st.Source.Partition)
	if err != nil {
		return nil, "stored content no longer readable: " + err.Error()
	}
	rec, err := ex.readOne(ctx, st.Source.Topic, st.Source.Partition, st.Source.Offset, b)
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
