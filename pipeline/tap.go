package pipeline

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/dedup"
)

// Tap: the live stream of decisions (dam tap, GET /v1/tap). The deciders
// publish each decided batch into a hub; readers subscribe with a filter.
//
// The hot path never waits for a reader: while no reader is attached a
// decider checks one atomic and builds nothing. With readers, a reader's
// rate is bounded (TapMaxRate), and a decided batch is built for the tap
// only when a reader has room for it (admits: tokens for the batch, or
// for tapAdmitTokens of it); otherwise each reader counts what it selects
// of the batch as lost, with no event built and no source read. A batch
// admitted is built for each reader once, what it selects up to its
// tokens, and handed over without blocking. A reader's buffer is bounded
// (tapBufferEvents decisions, tapBufferBatches batches): what does not
// fit is lost for that reader alone, counted, and the reader is told how
// many. The readers at once are bounded (http.tap.max_readers).
//
// Catch-up batches (deciding what Kafka's offset is already past) and a
// recovery's re-deliveries are not new decisions: they are not tapped.

// Tap errors.
var (
	// ErrTapBusy: as many readers as http.tap.max_readers are attached.
	ErrTapBusy = errors.New("pipeline: tap: too many readers attached")
	// ErrTapClosed: the pipeline has stopped.
	ErrTapClosed = errors.New("pipeline: tap: closed")
)

// A reader buffers at most this many decisions (matching its filter) and
// this many batches; beyond, what it has not read is lost for it.
const (
	tapBufferEvents  = 4096
	tapBufferBatches = 256
)

// TapMaxRate bounds the decisions a reader receives per second (with a
// burst of as many): each costs the sidecar a line to encode and send,
// and a reader of every decision of a busy sidecar would take a
// noticeable share of its CPU. Beyond it, decisions are lost for the
// reader and counted as such. Filters and sampling come first: a filtered
// reader sees every decision it selects up to this rate. (Vector's tap
// samples too: 100 events per half second by default.)
const TapMaxRate = 10000

// tapAdmitTokens is the room a reader needs for a batch of more records
// to be built for it. A reader of every decision of a busy sidecar is
// over its rate most of the time: the batches decided meanwhile cost the
// hot path a count, not events and sources, and the reader gets whole
// runs of consecutive decisions about ten times a second.
const tapAdmitTokens = TapMaxRate / 10

// tapLostEvery is the least time between two reports of losses alone
// (no decision with them): a reader over its rate is told of what it
// loses as it loses it, in a line at most this often, not one a batch.
const tapLostEvery = 100 * time.Millisecond

// tapEntityMax bounds the entity bytes a tapped decision keeps (a key is
// producer-controlled): a longer one is cut (TapEvent.EntityCut).
const tapEntityMax = 256

// Tap is the hub of the live decision stream. The zero Tap is not usable:
// the pipeline makes one (Pipeline.Tap).
type Tap struct {
	readers atomic.Int32 // the fast check: no reader, no work
	mu      sync.RWMutex
	subs    map[*TapReader]struct{}
	max     int
	closed  bool
}

func newTap(maxReaders int) *Tap {
	return &Tap{subs: map[*TapReader]struct{}{}, max: maxReaders}
}

// active reports whether a reader is attached: one atomic load.
func (t *Tap) active() bool { return t != nil && t.readers.Load() > 0 }

// TapFilter selects the decisions a reader receives. The zero TapFilter
// selects every decision.
type TapFilter struct {
	// Allowed are the services the reader may see (its token's); nil or
	// one containing "*": every service.
	Allowed []string
	// Service, if not "", selects one service.
	Service string
	// Decision, if not "", selects "forward", "drop" or "dead-letter".
	Decision string
	// Entity, if HasEntity, selects one entity (its bytes).
	Entity    []byte
	HasEntity bool
	// Sample, in (0, 1), keeps that fraction of the selected decisions at
	// random; 0 or 1 keeps them all. What a reader loses is counted among
	// the decisions its sampling keeps.
	Sample float64
}

// The decisions a tap names.
const (
	TapForward    = "forward"
	TapDrop       = "drop"
	TapDeadLetter = "dead-letter"
)

// ParseTapEntity reads an entity as dam shows it: text, or "hex:" and its
// bytes in hex.
func ParseTapEntity(s string) ([]byte, error) {
	if h, ok := strings.CutPrefix(s, "hex:"); ok {
		b, err := hex.DecodeString(h)
		if err != nil {
			return nil, fmt.Errorf("entity %q: invalid hex", s)
		}
		return b, nil
	}
	return []byte(s), nil
}

// everything reports whether f selects every decision, unsampled.
func (f *TapFilter) everything() bool {
	return f.Service == "" && f.Allowed == nil && f.Decision == "" && !f.HasEntity && f.Sample == 0
}

// sampled draws whether a selected decision is kept by f's sampling.
func (f *TapFilter) sampled() bool { return f.Sample == 0 || rand.Float64() < f.Sample }

// servesService reports whether f may select decisions of service.
func (f *TapFilter) servesService(service string) bool {
	return (f.Service == "" || f.Service == service) && (f.Allowed == nil || allowed(f.Allowed, service))
}

func (f *TapFilter) selects(e *TapEvent) bool {
	if f.Service != "" && e.Service != f.Service {
		return false
	}
	if f.Allowed != nil && !allowed(f.Allowed, e.Service) {
		return false
	}
	if f.Decision != "" && e.Decision() != f.Decision {
		return false
	}
	return !f.HasEntity || (!e.EntityCut && bytes.Equal(e.Entity, f.Entity))
}

func allowed(services []string, s string) bool {
	for _, a := range services {
		if a == "*" || a == s {
			return true
		}
	}
	return false
}

// Subscribe attaches a reader with filter f. Close it when done. It fails
// with ErrTapBusy when the readers are at their bound, ErrTapClosed once
// the pipeline has stopped.
func (t *Tap) Subscribe(f TapFilter) (*TapReader, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return nil, ErrTapClosed
	case len(t.subs) >= t.max:
		return nil, ErrTapBusy
	}
	if f.Sample >= 1 || f.Sample < 0 {
		f.Sample = 0
	}
	r := &TapReader{t: t, f: f, ch: make(chan []TapEvent, tapBufferBatches), wake: make(chan struct{}, 1), done: make(chan struct{}),
		tokens: TapMaxRate, refilled: time.Now()}
	t.subs[r] = struct{}{}
	t.readers.Store(int32(len(t.subs)))
	return r, nil
}

// Close ends every reader (their Next returns ErrTapClosed once they have
// read what is buffered) and refuses new ones.
func (t *Tap) Close() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	for r := range t.subs {
		r.end()
		delete(t.subs, r)
	}
	t.readers.Store(0)
}

// Admission: what the tap takes of a decided batch.
type tapAdmission int

const (
	tapNone  tapAdmission = iota // no reader: nothing
	tapCount                     // no reader has room: each counts what it selects as lost
	tapBuild                     // a reader has room: the batch is built, with its sources
)

// admit says, before a batch of service is decided, what the tap takes of
// it: tapBuild when a reader may select its decisions and has room for
// them (tokens for the whole batch, or for tapAdmitTokens of a larger
// one), so that the decide reads each record's source; tapCount when
// readers are attached but none has; tapNone without readers.
func (t *Tap) admit(service string, recs []dedup.Record) tapAdmission {
	if !t.active() {
		return tapNone
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	now := time.Now()
	need := float64(min(len(recs), tapAdmitTokens))
	for r := range t.subs {
		if !r.f.servesService(service) || r.queued.Load() >= tapBufferEvents || r.room(now) < need {
			continue
		}
		if r.f.HasEntity && !slices.ContainsFunc(recs, func(rec dedup.Record) bool { return bytes.Equal(rec.Entity, r.f.Entity) }) {
			continue
		}
		return tapBuild
	}
	return tapCount
}

// tapView is a decided batch as the tap reads it.
type tapView interface {
	// len is the number of decisions.
	len() int
	// event sets e to decision i, its Entity the batch's bytes (cut to
	// tapEntityMax), not a copy, and its Cause unset.
	event(i int, e *TapEvent)
	// cause is decision i's dead-letter cause.
	cause(i int) string
}

// publish hands a decided batch's decisions to every reader, never
// waiting. Admitted (tapBuild), each reader gets what it selects, up to
// its tokens and its buffer's room, as events of its own; the rest of
// what it selects is lost for it. Not admitted, every decision a reader
// selects is lost for it: a reader attached since admit (tapNone) too.
func (t *Tap) publish(v tapView, how tapAdmission) {
	if how == tapNone {
		if !t.active() {
			return
		}
		how = tapCount
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := v.len()
	now := time.Now()
	var e TapEvent
	for r := range t.subs {
		if how == tapCount || r.queued.Load() >= tapBufferEvents {
			r.lose(r.f.count(v))
			continue
		}
		// Built: what the reader selects, up to its tokens and its
		// buffer's room. The tokens are taken for what is built, once
		// built: held meanwhile, they would be lost to a batch the
		// reader selects, published at the same time.
		room := max(0, min(n, tapBufferEvents-int(r.queued.Load()), int(r.room(now))))
		out := make([]TapEvent, 0, room)
		var lost int64
		var ents []byte // the events' entities, one allocation or a few
		for i := range n {
			v.event(i, &e)
			if !r.f.selects(&e) || !r.f.sampled() {
				continue
			}
			if len(out) >= room {
				lost++
				continue
			}
			at := len(ents)
			ents = append(ents, e.Entity...)
			e.Entity = ents[at:len(ents):len(ents)]
			if e.Outcome == outcomeInvalid.String() {
				e.Cause = v.cause(i)
			}
			out = append(out, e)
		}
		if got := int(r.take(now, float64(len(out)))); got < len(out) {
			lost += int64(len(out) - got) // taken meanwhile by another batch
			out = out[:got]
		}
		if len(out) > 0 {
			select {
			case r.ch <- out:
				r.queued.Add(int64(len(out)))
			default:
				lost += int64(len(out))
				r.giveBack(float64(len(out)))
			}
		}
		r.lose(lost)
	}
}

// count is how many of v's decisions f selects (sampling included).
func (f *TapFilter) count(v tapView) int64 {
	n := v.len()
	if f.everything() {
		return int64(n)
	}
	var e TapEvent
	var c int64
	for i := range n {
		v.event(i, &e)
		if f.selects(&e) && f.sampled() {
			c++
		}
	}
	return c
}

// TapReader is one attached reader of the tap.
type TapReader struct {
	t      *Tap
	f      TapFilter
	ch     chan []TapEvent
	queued atomic.Int64  // decisions buffered
	lost   atomic.Int64  // selected decisions lost, not yet reported
	wake   chan struct{} // a loss to report, when no batch may follow
	lostAt time.Time     // Next's last report of losses alone
	done   chan struct{}
	once   sync.Once
	// tokens is the reader's budget of decisions (TapMaxRate a second,
	// as many at most), as of refilled. The publishers share it.
	mu       sync.Mutex
	tokens   float64
	refilled time.Time
}

// refill adds the tokens earned since the last refill; mu is held.
func (r *TapReader) refill(now time.Time) {
	if now.After(r.refilled) {
		r.tokens = min(TapMaxRate, r.tokens+now.Sub(r.refilled).Seconds()*TapMaxRate)
		r.refilled = now
	}
}

// room returns the reader's tokens at now.
func (r *TapReader) room(now time.Time) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refill(now)
	return r.tokens
}

// take takes up to n tokens at now and returns how many it took.
func (r *TapReader) take(now time.Time, n float64) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refill(now)
	n = max(0, min(n, float64(int(r.tokens))))
	r.tokens -= n
	return n
}

// giveBack returns n tokens taken and not used.
func (r *TapReader) giveBack(n float64) {
	if n <= 0 {
		return
	}
	r.mu.Lock()
	r.tokens = min(TapMaxRate, r.tokens+n)
	r.mu.Unlock()
}

// lose counts n selected decisions lost, and wakes Next to report them:
// no batch may come after to carry the count.
func (r *TapReader) lose(n int64) {
	if n <= 0 {
		return
	}
	r.lost.Add(n)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *TapReader) end() { r.once.Do(func() { close(r.done) }) }

// Close detaches the reader.
func (r *TapReader) Close() {
	r.t.mu.Lock()
	if _, ok := r.t.subs[r]; ok {
		delete(r.t.subs, r)
		r.t.readers.Store(int32(len(r.t.subs)))
	}
	r.t.mu.Unlock()
	r.end()
}

// Next waits for decisions and returns those the reader selects (after
// sampling), and how many selected decisions were lost since the last
// call because the reader did not keep up or was over its rate. It
// returns ctx's error when ctx ends, ErrTapClosed when the tap is closed
// (the pipeline stopped) or the reader is.
func (r *TapReader) Next(ctx context.Context) ([]TapEvent, int64, error) {
	for {
		var evs []TapEvent
		select {
		case evs = <-r.ch:
		case <-r.wake:
			select {
			case evs = <-r.ch: // a batch buffered carries the count
			default:
				// A loss alone: told at most every tapLostEvery, with
				// what is lost meanwhile; sooner with a batch.
				wait := time.NewTimer(time.Until(r.lostAt.Add(tapLostEvery)))
				select {
				case evs = <-r.ch:
				case <-wait.C:
				case <-ctx.Done():
				case <-r.done:
				}
				wait.Stop()
			}
		case <-ctx.Done():
			return nil, r.lost.Swap(0), ctx.Err()
		case <-r.done:
			select {
			case evs = <-r.ch:
			default:
				return nil, r.lost.Swap(0), ErrTapClosed
			}
		}
		r.queued.Add(-int64(len(evs)))
		if lost := r.lost.Swap(0); len(evs) > 0 || lost > 0 {
			if len(evs) == 0 {
				r.lostAt = time.Now()
			}
			return evs, lost, nil
		}
	}
}

// TapEvent is one tapped decision.
type TapEvent struct {
	Service   string
	Mode      dedup.Mode
	Topic     string
	Partition int32
	Offset    int64
	// Entity is the identity (the entity, or in window mode the message
	// id), cut to its first 256 bytes (EntityCut).
	Entity    []byte
	EntityCut bool
	// Outcome is the record's dam_records_total outcome: forwarded,
	// refreshed, undecided, duplicate, stale or invalid.
	Outcome string
	// Shadow: a shadow route forwarded the drop, marked.
	Shadow bool
	// Source is the input record that set the identity's state the record
	// was decided against (Offset -1: none, or not known): for a drop the
	// record whose content it duplicates.
	Source dedup.Source
	// Cause is a dead letter's cause.
	Cause string
}

// Decision is "forward", "drop" or "dead-letter".
func (e *TapEvent) Decision() string {
	switch e.Outcome {
	case "duplicate", "stale":
		return TapDrop
	case "invalid":
		return TapDeadLetter
	}
	return TapForward
}

// TapRecord locates an input record in a TapLine.
type TapRecord struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// TapLine is a tapped decision as GET /v1/tap streams it (one JSON object
// a line). A line with Lost alone reports decisions the reader lost.
type TapLine struct {
	Service   string `json:"service,omitempty"`
	Topic     string `json:"topic,omitempty"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// Entity is shown as text, or "hex:" and its bytes in hex when it is
	// not printable UTF-8; "…" ends one cut to its first 256 bytes.
	Entity string `json:"entity"`
	// Decision is "forward", "drop" or "dead-letter"; Outcome the finer
	// dam_records_total outcome.
	Decision string `json:"decision,omitempty"`
	Outcome  string `json:"outcome,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// DuplicateOf is, for a drop, the record whose content (id, version)
	// it repeats; Previous, for a forward, the record whose state it
	// replaces. Absent when not known.
	DuplicateOf *TapRecord `json:"duplicate_of,omitempty"`
	Previous    *TapRecord `json:"previous,omitempty"`
	Shadow      bool       `json:"shadow,omitempty"`
	// Lost, on a line of its own, counts the decisions this reader
	// selected and lost since the last such line: it did not keep up.
	Lost int64 `json:"lost,omitempty"`
}

// Line is e as the tap streams it.
func (e *TapEvent) Line() TapLine {
	l := TapLine{Service: e.Service, Topic: e.Topic, Partition: e.Partition, Offset: e.Offset,
		Entity: showEntity(e.Entity), Decision: e.Decision(), Outcome: e.Outcome, Shadow: e.Shadow}
	if e.EntityCut {
		l.Entity += "…"
	}
	var src *TapRecord
	if e.Source.Offset >= 0 {
		src = &TapRecord{Topic: e.Source.Topic, Partition: e.Source.Partition, Offset: e.Source.Offset}
	}
	at := "an unknown record"
	if src != nil {
		at = "offset " + strconv.FormatInt(src.Offset, 10)
		if src.Topic != e.Topic || src.Partition != e.Partition {
			at = fmt.Sprintf("%s/%d offset %d", src.Topic, src.Partition, src.Offset)
		}
	}
	switch e.Outcome {
	case "duplicate":
		l.DuplicateOf = src
		switch e.Mode {
		case dedup.Window:
			l.Reason = "id already forwarded from " + at + ", within the window"
		case dedup.Version:
			l.Reason = "same version as the one forwarded from " + at
		default:
			l.Reason = "duplicate of the content forwarded from " + at
		}
	case "stale":
		l.DuplicateOf = src
		l.Reason = "version below the one forwarded from " + at
	case "forwarded":
		l.Previous = src
		switch {
		case src == nil:
			l.Reason = "no stored state: the identity's first record (or its state was reset or pruned)"
		case e.Mode == dedup.Window:
			l.Reason = "the id's window, opened by " + at + ", has ended"
		case e.Mode == dedup.Version:
			l.Reason = "version above the one forwarded from " + at
		default:
			l.Reason = "changed since the content forwarded from " + at
		}
	case "refreshed":
		l.Previous = src
		l.Reason = "unchanged since " + at + ", forwarded again: refresh_after has passed"
	case "undecided":
		l.Reason = "forwarded undecided: the store is unavailable (on_store_failure: forward)"
	case "invalid":
		l.Reason = "bad input: " + e.Cause
	}
	if e.Shadow {
		l.Reason += "; shadow route: forwarded, marked"
	}
	return l
}

// showEntity is an entity as dam shows it (explain.ShowEntity's rule).
func showEntity(e []byte) string {
	if utf8.Valid(e) && !bytes.ContainsFunc(e, func(r rune) bool { return !strconv.IsPrint(r) }) {
		return string(e)
	}
	return "hex:" + hex.EncodeToString(e)
}

// Tap returns the hub of the live decision stream, or nil unless
// http.tap.enabled.
func (p *Pipeline) Tap() *Tap { return p.tap }

// tap publishes a decided batch's decisions (recs and b.Records,
// decisions as decideBatch has them), as admitted before its decide.
func (w *worker) tap(how tapAdmission, recs []*kgo.Record, b *dedup.Batch, decisions []dedup.Decision, undecided bool, causes []error) {
	w.d.tap.publish(&workerTapView{w: w, recs: recs, b: b, decisions: decisions, undecided: undecided, causes: causes,
		sources: !undecided && len(b.Sources) == len(recs)}, how)
}

// workerTapView is a worker's decided batch as the tap reads it.
type workerTapView struct {
	w         *worker
	recs      []*kgo.Record
	b         *dedup.Batch
	decisions []dedup.Decision
	undecided bool
	causes    []error
	sources   bool
}

func (v *workerTapView) len() int { return len(v.recs) }

func (v *workerTapView) event(i int, e *TapEvent) {
	r, br := v.recs[i], &v.b.Records[i]
	*e = TapEvent{Service: v.w.rt.service, Mode: v.w.rt.rule.Mode, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Entity: br.Entity, Source: dedup.Source{Offset: -1}}
	if len(e.Entity) > tapEntityMax {
		e.Entity, e.EntityCut = e.Entity[:tapEntityMax], true
	}
	switch {
	case br.Invalid:
		e.Outcome = outcomeInvalid.String()
	case v.undecided:
		e.Outcome = outcomeUndecided.String()
	default:
		e.Outcome = outcomeOf(v.decisions[i]).String()
		e.Shadow = v.w.rt.shadow && !v.decisions[i].Forwards()
	}
	if v.sources && !br.Invalid {
		e.Source = v.b.Sources[i]
	}
}

func (v *workerTapView) cause(i int) string {
	if v.causes == nil || v.causes[i] == nil {
		return ""
	}
	return boundDetail(v.causes[i].Error())
}
