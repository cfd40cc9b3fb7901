package analyze

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/pipeline"
)

// Source is where the records come from: Kafka (KafkaSource) or a file
// (FileSource).
type Source interface {
	// Read calls fn with the records in runs (a run is in offset order
	// within a partition, and the runs of a partition follow each
	// other), until the input ends or fn returns an error. fn returns
	// how many of the run it took: all of it with a nil error; with
	// ErrStop (Read then returns nil) or another error (Read returns it),
	// the first n. topics, when not nil, are the only topics Read needs.
	// The first Read fixes the records read: a later Read passes fn
	// exactly the records the first had taken (those of topics), for the
	// what-if runs. fn may keep the records.
	Read(ctx context.Context, topics []string, fn func(run []*kgo.Record) (int, error)) error
	// Rereadable reports whether Read may be called again.
	Rereadable() bool
	// Where names a record's place for a report: topic/partition@offset,
	// or a file's line.
	Where(r *kgo.Record) string
}

// ErrStop, returned by Read's callback, ends the reading without error.
var ErrStop = errors.New("analyze: stop reading")

// ErrNoRoute: Run was given no route.
var ErrNoRoute = errors.New("analyze: no route to analyze")

// Clocks: what the rules take as the time a record is decided.
const (
	// ClockRecord: each record's timestamp, as if dam had decided each
	// record when it was produced (the default).
	ClockRecord = "record"
	// ClockStart: the analysis's start for every record, as dam catching
	// up a backlog decides it within moments.
	ClockStart = "start"
)

// Options are an analysis's settings; the zero value of a field is its
// default.
type Options struct {
	// MaxIdentities caps the identities held in memory at once, over every
	// route (and every what-if run read together). Reaching it stops the
	// reading; the report says where. Default 10,000,000 (about 1 GB).
	MaxIdentities int64
	// SummaryBytes is the memory the churn's summaries may take, over
	// every route. Default 256 MiB. Negative: no churn.
	SummaryBytes int64
	// MaxRecords stops the reading after this many records (0: none).
	MaxRecords int64
	// WhatIf is how many of each route's most changed paths get a what-if
	// run. Default 5; negative: none.
	WhatIf int
	// TopEntities is how many identities with the most drops are listed
	// per route. Default 10; negative: none.
	TopEntities int
	// TopPaths is how many changed paths are listed per route (at least
	// WhatIf). Default 10.
	TopPaths int
	// Clock is ClockRecord (default) or ClockStart.
	Clock string
	// Now is the analysis's start, the clock of records without a
	// timestamp (default time.Now()).
	Now time.Time
	// Progress, when set, is called about every half second while
	// reading, and at the end of each pass.
	Progress func(Progress)
}

// Progress is where a long analysis is.
type Progress struct {
	// Pass is 1 for the decisions, 2 and up for the what-if runs, of
	// Passes at least (the number of what-if passes is known once the
	// first ends).
	Pass, Passes int
	Records      int64 // read in this pass
	Elapsed      time.Duration
	Done         bool // the pass ended
}

// Defaults of Options.
const (
	DefaultMaxIdentities = 10_000_000
	DefaultSummaryBytes  = 256 << 20
	DefaultWhatIf        = 5
	DefaultTopEntities   = 10
	DefaultTopPaths      = 10
)

func (o *Options) defaults() error {
	switch {
	case o.MaxIdentities == 0:
		o.MaxIdentities = DefaultMaxIdentities
	case o.MaxIdentities < 0:
		return fmt.Errorf("analyze: max identities %d: must be positive", o.MaxIdentities)
	}
	if o.SummaryBytes == 0 {
		o.SummaryBytes = DefaultSummaryBytes
	}
	if o.WhatIf == 0 {
		o.WhatIf = DefaultWhatIf
	}
	if o.TopEntities == 0 {
		o.TopEntities = DefaultTopEntities
	}
	if o.TopPaths == 0 {
		o.TopPaths = DefaultTopPaths
	}
	o.TopPaths = max(o.TopPaths, o.WhatIf)
	switch o.Clock {
	case "":
		o.Clock = ClockRecord
	case ClockRecord, ClockStart:
	default:
		return fmt.Errorf("analyze: clock %q: want %q or %q", o.Clock, ClockRecord, ClockStart)
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	return nil
}

// Run reads src and decides its records with routes (from a validated
// configuration: config.LoadAnalyze or Config.ValidateForAnalyze), each
// record by the route reading its topic, and returns the report. It
// writes nothing anywhere.
func Run(ctx context.Context, src Source, routes []config.Route, o Options) (*Report, error) {
	if len(routes) == 0 {
		return nil, ErrNoRoute
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	a := &analysis{src: src, o: o, seed: maphash.MakeSeed(), rep: &Report{Clock: o.Clock}}
	budget := o.SummaryBytes
	var base []*decider
	for _, rc := range routes {
		rt, err := pipeline.CompileRoute(rc, canon.WithLocalDigest())
		if err != nil {
			return nil, fmt.Errorf("route %s: %w", rc.Service, err)
		}
		d := newDecider(rt, o)
		if o.SummaryBytes > 0 && rc.Format == config.FormatJSON {
			d.churn = newChurn(rt.Hasher(), &budget, a.seed)
		}
		d.bad = map[string]*Reason{}
		base = append(base, d)
	}
	passes := 1
	a.progress(1, passes, 0, false)
	if err := a.pass(ctx, 1, passes, base, true); err != nil {
		return nil, err
	}
	for _, d := range base {
		a.rep.Routes = append(a.rep.Routes, d.report(o))
	}
	for _, d := range base {
		if d.summariesRefused {
			a.note("the churn's summaries filled their budget (%d bytes): some forwards are counted as not compared; raise --summary-bytes", o.SummaryBytes)
			break
		}
	}
	if err := a.whatIf(ctx, base); err != nil {
		return nil, err
	}
	return a.rep, nil
}

// analysis is one Run.
type analysis struct {
	src  Source
	o    Options
	seed maphash.Seed
	rep  *Report
}

func (a *analysis) note(format string, args ...any) {
	a.rep.Notes = append(a.rep.Notes, fmt.Sprintf(format, args...))
}

func (a *analysis) progress(pass, passes int, n int64, done bool) {
	if a.o.Progress != nil {
		a.o.Progress(Progress{Pass: pass, Passes: passes, Records: n, Elapsed: time.Since(a.o.Now), Done: done})
	}
}

// pass reads the input once and decides every record with ds (the
// deciders reading its topic). The first pass fixes the records read:
// it stops at MaxRecords or at the identity limit.
//
// Each run of records is identified in parallel (a record's identity,
// version and digest, the costly part: its canonical form hashed), then
// decided in order by this goroutine, chunk by chunk as they are ready.
func (a *analysis) pass(ctx context.Context, pass, passes int, ds []*decider, first bool) error {
	a.rep.Passes++
	byTopic := map[string][]*decider{}
	var topics []string
	for _, d := range ds {
		from := d.route.Config().From
		if _, ok := byTopic[from]; !ok {
			topics = append(topics, from)
		}
		byTopic[from] = append(byTopic[from], d)
	}
	if first {
		topics = nil // every record is read (and counted) once
	}
	ip := newIdentifier(byTopic)
	defer ip.close()
	var n, ids int64
	last := time.Now()
	err := a.src.Read(ctx, topics, func(run []*kgo.Record) (int, error) {
		var stop error
		if first && a.o.MaxRecords > 0 && n+int64(len(run)) > a.o.MaxRecords {
			run, stop = run[:a.o.MaxRecords-n], ErrStop
			a.rep.Stopped = fmt.Sprintf("stopped after --max-records %d records", a.o.MaxRecords)
		}
		r := ip.identify(run)
		for i, rec := range run {
			idents := r.of(i)
			dsOf, routed := byTopic[rec.Topic]
			if first && routed && ids+int64(len(dsOf)) > a.o.MaxIdentities {
				if full := ids + newIdentities(dsOf, idents); full > a.o.MaxIdentities {
					a.rep.Stopped = fmt.Sprintf("stopped after %d records, before %s: the limit of %d identities in memory is reached (about %d MB); raise --max-identities, or analyze a shorter range (--max-records)",
						n, a.src.Where(rec), a.o.MaxIdentities, a.o.MaxIdentities*slotBytes>>20)
					return i, ErrStop
				}
			}
			n++
			if first {
				a.rep.Records++
				if !routed {
					a.rep.Unrouted++
				}
			}
			now := a.o.Now
			if a.o.Clock == ClockRecord && !rec.Timestamp.IsZero() {
				now = rec.Timestamp
			}
			for j, d := range dsOf {
				ids += d.decide(rec, &idents[j], now, a.src)
			}
		}
		if err := ctx.Err(); err != nil {
			return len(run), err
		}
		if t := time.Now(); t.Sub(last) >= 500*time.Millisecond {
			last = t
			a.progress(pass, passes, n, false)
		}
		return len(run), stop
	})
	if err != nil {
		return err
	}
	a.progress(pass, passes, n, true)
	return nil
}

// newIdentities counts the identities of a record (idents, one per
// decider of ds) that are new to their decider.
func newIdentities(ds []*decider, idents []ident) int64 {
	var n int64
	for j, d := range ds {
		if idents[j].err == nil {
			if _, ok := d.state[idents[j].key]; !ok {
				n++
			}
		}
	}
	return n
}

// whatIf runs each route's most changed paths as ignored too: the
// routes compiled with one more ignore pointer each, over the same
// records, in as few passes as the identity limit allows.
func (a *analysis) whatIf(ctx context.Context, base []*decider) error {
	if a.o.WhatIf < 0 {
		return nil
	}
	type job struct {
		d    *decider
		path *PathChange
	}
	var jobs []job
	for i, d := range base {
		ch := a.rep.Routes[i].Churn
		if ch == nil {
			continue
		}
		k := 0
		for j := range ch.Paths {
			p := &ch.Paths[j]
			if k == a.o.WhatIf {
				break
			}
			if p.Path == wholeValue {
				continue // the whole value cannot be ignored
			}
			k++
			rc := d.route.Config()
			rc.Ignore = append(slices.Clip(rc.Ignore), p.Path)
			rt, err := pipeline.CompileRoute(rc, canon.WithLocalDigest())
			if err != nil {
				p.WhatIf = &WhatIf{Error: err.Error()}
				continue
			}
			jobs = append(jobs, job{newDecider(rt, Options{TopEntities: -1}), p})
			jobs[len(jobs)-1].d.identities = d.identities // its identities: the same records'
		}
	}
	if len(jobs) == 0 {
		return nil
	}
	if !a.src.Rereadable() {
		a.note("no what-if rates: the input cannot be read twice (standard input); give a file or a topic")
		return nil
	}
	// Group the runs so that their identities fit the limit together.
	var groups [][]job
	var sum int64
	for _, j := range jobs {
		if len(groups) == 0 || sum+j.d.identities > a.o.MaxIdentities {
			groups = append(groups, nil)
			sum = 0
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], j)
		sum += j.d.identities
	}
	passes := 1 + len(groups)
	for g, group := range groups {
		ds := make([]*decider, len(group))
		for i, j := range group {
			j.d.identities = 0
			ds[i] = j.d
		}
		if err := a.pass(ctx, 2+g, passes, ds, false); err != nil {
			return err
		}
		for _, j := range group {
			j.path.WhatIf = &WhatIf{Dropped: j.d.dropped(), DropRate: rate(j.d.dropped(), j.d.records)}
			j.d.state = nil // free it before the next group
		}
	}
	return nil
}

// decider decides one route's records: a route's rule over its state in
// memory, its counts, and (for the configured routes) its top entities
// and churn.
type decider struct {
	route *pipeline.Route
	rule  dedup.Rule
	state map[idKey]slot

	records, forwarded, refreshed, duplicates, stale, invalid int64
	identities                                                int64

	bad              map[string]*Reason // dead letters by reason; nil: not kept
	top              *topDrops
	churn            *churn
	summariesRefused bool // the churn's budget refused a summary
}

func newDecider(rt *pipeline.Route, o Options) *decider {
	d := &decider{route: rt, rule: rt.Rule(), state: map[idKey]slot{}}
	if o.TopEntities > 0 {
		d.top = &topDrops{n: o.TopEntities, index: map[idKey]int{}}
	}
	return d
}

func (d *decider) dropped() int64 { return d.duplicates + d.stale }

// decide decides r at now, as the sidecar does: its identity, version
// and digest from the route's Identify (in id), its decision from the
// rule against the identity's state. It returns 1 when r's identity is
// new.
func (d *decider) decide(r *kgo.Record, id *ident, now time.Time, src Source) int64 {
	d.records++
	if id.err != nil {
		d.deadLetter(id.err, r, src)
		return 0
	}
	k, version, digest := id.key, id.version, id.digest
	s, found := d.state[k]
	var prev dedup.Stored
	if found {
		prev = s.stored(d.rule.Mode)
	}
	o := d.rule.Decide(prev, short(digest), version, now)
	var added int64
	if !found {
		d.identities++
		added = 1
	}
	s.set(d.rule.Mode, o.State)
	if o.Decision.Forwards() {
		d.state[k] = s
	}
	switch o.Decision {
	case dedup.Forward, dedup.Refresh:
		d.forwarded++
		if o.Decision == dedup.Refresh {
			d.refreshed++
		}
		if d.churn != nil {
			d.churn.forwarded(k, r.Value, !found)
		}
		return added
	case dedup.Duplicate:
		d.duplicates++
	case dedup.Stale:
		d.stale++
	}
	s.drops++
	d.state[k] = s
	if d.top != nil {
		d.top.add(k, id.identity, int64(s.drops))
	}
	return added
}

// deadLetter counts a bad record under the innermost error it wraps.
func (d *decider) deadLetter(err error, r *kgo.Record, src Source) {
	d.invalid++
	if d.bad == nil {
		return
	}
	reason := innermost(err).Error()
	if rs, ok := d.bad[reason]; ok {
		rs.Count++
		return
	}
	if len(d.bad) == maxReasons {
		reason = otherReasons
		if rs, ok := d.bad[reason]; ok {
			rs.Count++
			return
		}
	}
	d.bad[reason] = &Reason{Reason: cut(reason, maxExample), Count: 1, Example: cut(err.Error(), maxExample), At: src.Where(r)}
}

// maxReasons bounds the distinct reasons kept per route.
const (
	maxReasons   = 50
	otherReasons = "(other reasons)"
)

// innermost is the error err wraps deepest (the first of several): the
// sentinel naming what is wrong, without the record's particulars.
func innermost(err error) error {
	for {
		var next error
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			next = u.Unwrap()
		case interface{ Unwrap() []error }:
			if errs := u.Unwrap(); len(errs) > 0 {
				next = errs[0]
			}
		}
		if next == nil {
			return err
		}
		err = next
	}
}

// undecompressable returns the cause of a record that stands for an
// offset of a batch past the decompression bound (kafka.go), or nil.
func undecompressable(r *kgo.Record) error {
	if r.Context == nil {
		return nil
	}
	err, _ := r.Context.Value(undecompressableKey{}).(error)
	return err
}

type undecompressableKey struct{}

func (d *decider) report(o Options) RouteReport {
	rc := d.route.Config()
	rr := RouteReport{
		Service: rc.Service, Topic: rc.From, Mode: describe(rc),
		Records: d.records, Forwarded: d.forwarded, Refreshed: d.refreshed,
		Dropped: d.dropped(), Duplicates: d.duplicates, Stale: d.stale, DropRate: rate(d.dropped(), d.records),
		DeadLetters: d.invalid, Halts: d.invalid > 0 && rc.DeadLetter == "",
		Identities: d.identities, Shadow: rc.Shadow,
	}
	for _, r := range d.bad {
		rr.BadRecords = append(rr.BadRecords, *r)
	}
	slices.SortFunc(rr.BadRecords, func(a, b Reason) int {
		if a.Count != b.Count {
			return int(b.Count - a.Count)
		}
		return strings.Compare(a.Reason, b.Reason)
	})
	if d.top != nil {
		rr.TopEntities = d.top.sorted()
	}
	if c := d.churn; c != nil {
		ch := &Churn{Compared: c.compared, First: c.first, NotCompared: c.notCompared, Unchanged: c.unchanged, OtherPaths: c.others, Paths: []PathChange{}}
		for i, name := range c.names {
			if c.counts[i] > 0 {
				ch.Paths = append(ch.Paths, PathChange{Path: name, Changed: c.counts[i], Share: rate(c.counts[i], c.compared)})
			}
		}
		slices.SortFunc(ch.Paths, func(a, b PathChange) int {
			if a.Changed != b.Changed {
				if a.Changed > b.Changed {
					return -1
				}
				return 1
			}
			return strings.Compare(a.Path, b.Path)
		})
		if len(ch.Paths) > o.TopPaths {
			ch.Paths = ch.Paths[:o.TopPaths]
		}
		rr.Churn = ch
		d.summariesRefused = c.refused > 0
		d.churn = nil // its summaries are no longer needed
	}
	d.state = nil // nor is the state
	return rr
}

// describe words a route's rule: its mode, identity and settings.
func describe(rc config.Route) string {
	var s string
	switch rc.Mode {
	case config.ModeWindow:
		s = fmt.Sprintf("window %s (id %s", rc.Window, rc.IDFrom)
		if rc.Sliding {
			s += ", sliding"
		}
		s += ")"
	case config.ModeVersion:
		s = fmt.Sprintf("version (entity %s, version %s)", rc.Entity, rc.VersionFrom)
	default:
		s = "last-seen (entity " + rc.Entity
		if rc.RefreshAfter > 0 {
			s += fmt.Sprintf(", refresh_after %s", rc.RefreshAfter)
		}
		s += ")"
	}
	if rc.Format == config.FormatBytes {
		s += ", format bytes"
	}
	if len(rc.Ignore) > 0 {
		s += ", ignore " + strings.Join(rc.Ignore, " ")
	}
	return s
}

// topDrops keeps the n identities with the most drops. The counts are
// exact (the slots count every identity's drops); an identity enters when
// its count passes the smallest kept, so the n kept at the end are the n
// with the most drops (ties aside).
type topDrops struct {
	n     int
	items []topItem
	index map[idKey]int // position in items (a min-heap by drops)
}

type topItem struct {
	key      idKey
	identity []byte
	drops    int64
}

func (t *topDrops) Len() int           { return len(t.items) }
func (t *topDrops) Less(i, j int) bool { return t.items[i].drops < t.items[j].drops }
func (t *topDrops) Swap(i, j int) {
	t.items[i], t.items[j] = t.items[j], t.items[i]
	t.index[t.items[i].key] = i
	t.index[t.items[j].key] = j
}
func (t *topDrops) Push(x any) {
	it := x.(topItem)
	t.index[it.key] = len(t.items)
	t.items = append(t.items, it)
}
func (t *topDrops) Pop() any {
	it := t.items[len(t.items)-1]
	t.items = t.items[:len(t.items)-1]
	delete(t.index, it.key)
	return it
}

// add records that identity (key k) now has drops drops.
func (t *topDrops) add(k idKey, identity []byte, drops int64) {
	if i, ok := t.index[k]; ok {
		t.items[i].drops = drops
		heap.Fix(t, i)
		return
	}
	if len(t.items) < t.n {
		heap.Push(t, topItem{key: k, identity: slices.Clone(identity), drops: drops})
		return
	}
	if drops > t.items[0].drops {
		delete(t.index, t.items[0].key)
		t.items[0] = topItem{key: k, identity: slices.Clone(identity), drops: drops}
		t.index[k] = 0
		heap.Fix(t, 0)
	}
}

func (t *topDrops) sorted() []EntityDrops {
	items := slices.Clone(t.items)
	slices.SortFunc(items, func(a, b topItem) int {
		if a.drops != b.drops {
			if a.drops > b.drops {
				return -1
			}
			return 1
		}
		return strings.Compare(string(a.identity), string(b.identity))
	})
	out := make([]EntityDrops, len(items))
	for i, it := range items {
		out[i] = EntityDrops{Entity: showIdentity(it.identity), Drops: it.drops}
	}
	return out
}
