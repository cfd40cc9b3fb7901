package pipeline

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
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
// decider checks one atomic and builds nothing; with readers, it builds
// the batch's events once (one allocation, shared by every reader) and
// hands them to each reader without blocking. A reader's buffer is
// bounded (tapBufferEvents decisions, tapBufferBatches batches), and so is
// its rate (TapMaxRate): what does not fit is lost for that reader alone,
// counted, and the reader is told how many. The readers at once are
// bounded (http.tap.max_readers).
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
	// random; 0 or 1 keeps them all. (A full buffer loses decisions before
	// sampling, the rate bound after it.)
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
	r := &TapReader{t: t, f: f, ch: make(chan tapBatch, tapBufferBatches), done: make(chan struct{}),
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

// publish hands a decided batch's events to every reader, never waiting:
// a reader whose buffer is full loses the batch's decisions that it
// selects. evs is not changed afterwards (the readers share it).
func (t *Tap) publish(evs []TapEvent) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for r := range t.subs {
		n := 0
		for i := range evs {
			if r.f.selects(&evs[i]) {
				n++
			}
		}
		if n == 0 {
			continue
		}
		if r.queued.Load()+int64(n) > tapBufferEvents {
			r.lost.Add(int64(n))
			continue
		}
		select {
		case r.ch <- tapBatch{evs: evs, n: n}:
			r.queued.Add(int64(n))
		default:
			r.lost.Add(int64(n))
		}
	}
}

// tapBatch is one published batch as a reader's buffer holds it: n of its
// events are selected by the reader.
type tapBatch struct {
	evs []TapEvent
	n   int
}

// TapReader is one attached reader of the tap.
type TapReader struct {
	t      *Tap
	f      TapFilter
	ch     chan tapBatch
	queued atomic.Int64 // selected decisions buffered
	lost   atomic.Int64 // selected decisions lost, not yet reported
	done   chan struct{}
	once   sync.Once
	// tokens is the reader's budget of decisions (TapMaxRate a second),
	// as of refilled: Next's alone.
	tokens   float64
	refilled time.Time
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
// call because the reader did not keep up. It returns ctx's error when
// ctx ends, ErrTapClosed when the tap is closed (the pipeline stopped) or
// the reader is.
func (r *TapReader) Next(ctx context.Context) ([]TapEvent, int64, error) {
	for {
		var b tapBatch
		select {
		case b = <-r.ch:
		case <-ctx.Done():
			return nil, r.lost.Swap(0), ctx.Err()
		case <-r.done:
			select {
			case b = <-r.ch:
			default:
				return nil, r.lost.Swap(0), ErrTapClosed
			}
		}
		r.queued.Add(-int64(b.n))
		now := time.Now()
		r.tokens = min(TapMaxRate, r.tokens+now.Sub(r.refilled).Seconds()*TapMaxRate)
		r.refilled = now
		out := make([]TapEvent, 0, min(b.n, int(r.tokens)))
		var over int64
		for i := range b.evs {
			e := &b.evs[i]
			if !r.f.selects(e) || (r.f.Sample != 0 && rand.Float64() >= r.f.Sample) {
				continue
			}
			if r.tokens < 1 {
				over++
				continue
			}
			r.tokens--
			out = append(out, *e)
		}
		if lost := r.lost.Swap(0) + over; len(out) > 0 || lost > 0 {
			return out, lost, nil
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
// decisions as decideBatch has them). Called only while a reader is
// attached.
func (w *worker) tap(recs []*kgo.Record, b *dedup.Batch, decisions []dedup.Decision, undecided bool, causes []error) {
	sources := !undecided && len(b.Sources) == len(recs)
	evs := make([]TapEvent, len(recs))
	for i, r := range recs {
		br := &b.Records[i]
		e := &evs[i]
		*e = TapEvent{Service: w.rt.service, Mode: w.rt.rule.Mode, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			Source: dedup.Source{Offset: -1}}
		ent := br.Entity
		if len(ent) > tapEntityMax {
			ent, e.EntityCut = ent[:tapEntityMax], true
		}
		e.Entity = bytes.Clone(ent)
		switch {
		case br.Invalid:
			e.Outcome = outcomeInvalid.String()
			if causes != nil && causes[i] != nil {
				e.Cause = boundDetail(causes[i].Error())
			}
		case undecided:
			e.Outcome = outcomeUndecided.String()
		default:
			e.Outcome = outcomeOf(decisions[i]).String()
			e.Shadow = w.rt.shadow && !decisions[i].Forwards()
		}
		if sources && !br.Invalid {
			e.Source = b.Sources[i]
		}
	}
	w.d.tap.publish(evs)
}
