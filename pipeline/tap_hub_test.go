package pipeline

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

// eventsView is a decided batch of events, as the tap reads one.
type eventsView []TapEvent

func (v eventsView) len() int                 { return len(v) }
func (v eventsView) event(i int, e *TapEvent) { *e = v[i]; e.Cause = "" }
func (v eventsView) cause(i int) string       { return v[i].Cause }

func tapEvents(service string, outcomes ...string) eventsView {
	evs := make(eventsView, len(outcomes))
	for i, o := range outcomes {
		evs[i] = TapEvent{Service: service, Topic: "in", Offset: int64(i), Entity: []byte("e"), Outcome: o}
	}
	return evs
}

// The hub never blocks a publisher: a reader that does not read loses what
// does not fit its buffer, and is told how many of the decisions it
// selects; the readers at once are bounded; without a reader it is
// inactive (the deciders build nothing).
func TestTapHubNeverBlocks(t *testing.T) {
	tp := newTap(2)
	if tp.active() || (*Tap)(nil).active() {
		t.Fatal("a tap without readers is active")
	}
	drops, err := tp.Subscribe(TapFilter{Decision: TapDrop})
	if err != nil {
		t.Fatal(err)
	}
	other, err := tp.Subscribe(TapFilter{Service: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tp.Subscribe(TapFilter{}); !errors.Is(err, ErrTapBusy) {
		t.Fatalf("a third reader of two: %v, want ErrTapBusy", err)
	}
	if !tp.active() {
		t.Fatal("a tap with readers is inactive")
	}
	// Far more than a buffer holds, none read: publish returns at once.
	batches := 2 * tapBufferBatches
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range batches {
			tp.publish(tapEvents("s", "forwarded", "duplicate", "duplicate", "invalid"), tapBuild)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("publish blocked on readers that do not read")
	}
	ctx := context.Background()
	got, lost := 0, int64(0)
	for got+int(lost) < 2*batches {
		evs, l, err := drops.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Decision() != TapDrop {
				t.Fatalf("a drop reader got %+v", e)
			}
		}
		got, lost = got+len(evs), lost+l
	}
	if got != 2*tapBufferBatches || lost != int64(2*batches-got) {
		t.Fatalf("read %d and lost %d of %d drops, want %d read and the rest lost", got, lost, 2*batches, 2*tapBufferBatches)
	}
	// The reader of another service selected nothing, lost nothing.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if evs, l, err := other.Next(cctx); len(evs) != 0 || l != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("other service: %d events, %d lost, %v", len(evs), l, err)
	}
	other.Close()
	tp.Close()
	if _, _, err := drops.Next(ctx); !errors.Is(err, ErrTapClosed) {
		t.Fatalf("after Close: %v, want ErrTapClosed", err)
	}
	if tp.active() {
		t.Fatal("a closed tap is active")
	}
}

// A drop's line names the offset whose content it duplicates, and a
// dead letter's its cause.
func TestTapLineReasons(t *testing.T) {
	e := TapEvent{Service: "s", Topic: "in", Partition: 0, Offset: 7, Entity: []byte("k1"), Outcome: "duplicate"}
	e.Source.Topic, e.Source.Offset = "in", 5
	l := e.Line()
	if l.Decision != TapDrop || l.DuplicateOf == nil || l.DuplicateOf.Offset != 5 || l.Reason != "duplicate of the content forwarded from offset 5" {
		t.Fatalf("drop line %+v", l)
	}
	e = TapEvent{Service: "s", Topic: "in", Offset: 8, Entity: []byte{0xff}, Outcome: "invalid", Cause: "not JSON"}
	if l := e.Line(); l.Decision != TapDeadLetter || l.Reason != "bad input: not JSON" || l.Entity != "hex:ff" {
		t.Fatalf("dead-letter line %+v", l)
	}
}

// A reader receives at most TapMaxRate decisions a second, however fast
// it reads; the rest are counted lost.
func TestTapReaderRateBound(t *testing.T) {
	tp := newTap(1)
	r, err := tp.Subscribe(TapFilter{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	outcomes := make([]string, 2000)
	for i := range outcomes {
		outcomes[i] = "forwarded"
	}
	start := time.Now()
	got, lost := 0, int64(0)
	for range 6 {
		tp.publish(tapEvents("s", outcomes...), tapBuild)
		evs, l, err := r.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got, lost = got+len(evs), lost+l
	}
	limit := TapMaxRate + int(time.Since(start).Seconds()*TapMaxRate) + 1
	if got > limit || got+int(lost) != 6*len(outcomes) {
		t.Fatalf("read %d, lost %d of %d: want at most %d read and the rest lost", got, lost, 6*len(outcomes), limit)
	}
}

// records are n decided records of entity e, as admit reads them.
func tapRecords(n int, entity string) []dedup.Record {
	recs := make([]dedup.Record, n)
	for i := range recs {
		recs[i].Entity = []byte(entity)
	}
	return recs
}

// A batch is built for the tap only when a reader may select its
// decisions and has room for them: a reader over its rate costs the
// decider a count of what it loses, and one of another service or
// entity nothing. Built, a dead letter carries its cause and the events
// own their entity bytes.
func TestTapAdmitsOnlyBatchesAReaderHasRoomFor(t *testing.T) {
	tp := newTap(3)
	if got := tp.admit("s", tapRecords(1, "e")); got != tapNone {
		t.Fatalf("no reader: %v, want tapNone", got)
	}
	all, err := tp.Subscribe(TapFilter{})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	if got := tp.admit("s", tapRecords(TapMaxRate, "e")); got != tapBuild {
		t.Fatalf("a reader with its full rate: %v, want tapBuild", got)
	}
	// The reader takes its whole rate, and is told of the rest as lost.
	big := make([]string, 4000)
	for i := range big {
		big[i] = "forwarded"
	}
	var first []TapEvent
	var v, v0 eventsView
	start := time.Now()
	got, lost := 0, int64(0)
	for i := range 3 {
		v = tapEvents("s", big...)
		v[3].Outcome, v[3].Cause = "invalid", "not JSON"
		tp.publish(v, tapBuild)
		evs, l, err := all.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first, v0 = evs, v
		}
		got, lost = got+len(evs), lost+l
	}
	if limit := TapMaxRate + int(time.Since(start).Seconds()*TapMaxRate) + 1; got < TapMaxRate || got > limit || got+int(lost) != 3*len(big) {
		t.Fatalf("read %d and lost %d of %d, want its rate (%d to %d) read and the rest lost", got, lost, 3*len(big), TapMaxRate, limit)
	}
	evs := first
	if evs[3].Cause != "not JSON" || evs[0].Cause != "" {
		t.Fatalf("causes %q and %q, want a dead letter's alone", evs[3].Cause, evs[0].Cause)
	}
	for i := range v0 {
		v0[i].Entity[0] = 'x' // the batch's bytes are the decider's again
	}
	if string(first[0].Entity) != "e" {
		t.Fatalf("a tapped entity changed with the batch: %q", evs[0].Entity)
	}
	// Over its rate: a batch is counted, not built, until room returns.
	if got := tp.admit("s", tapRecords(2000, "e")); got != tapCount {
		t.Fatalf("a reader over its rate: %v, want tapCount", got)
	}
	tp.publish(tapEvents("s", big[:2000]...), tapCount)
	if _, lost, _ := all.Next(timeout(t, 50*time.Millisecond)); lost != 2000 {
		t.Fatalf("a counted batch: %d lost, want 2000", lost)
	}
	deadline := time.Now().Add(10 * time.Second)
	for tp.admit("s", tapRecords(2000, "e")) != tapBuild {
		if time.Now().After(deadline) {
			t.Fatal("the reader's room never returns")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Readers of another service, or of an entity not in the batch, admit
	// nothing, and lose nothing of it.
	all.Close()
	other, err := tp.Subscribe(TapFilter{Service: "other"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	one, err := tp.Subscribe(TapFilter{Entity: []byte("k9"), HasEntity: true})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	if got := tp.admit("s", tapRecords(10, "e")); got != tapCount {
		t.Fatalf("readers of another service and entity: %v, want tapCount", got)
	}
	tp.publish(tapEvents("s", "forwarded", "duplicate"), tapCount)
	for _, r := range []*TapReader{other, one} {
		if evs, lost, err := r.Next(timeout(t, 50*time.Millisecond)); len(evs) != 0 || lost != 0 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%+v: %d events, %d lost, %v", r.f, len(evs), lost, err)
		}
	}
	if got := tp.admit("s", append(tapRecords(10, "e"), tapRecords(1, "k9")...)); got != tapBuild {
		t.Fatalf("a batch holding the entity a reader selects: %v, want tapBuild", got)
	}
}

// timeout is a context that ends after d, or with the test.
func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// forwards is a decided batch of n forwards of service s.
func forwards(s string, n int) eventsView {
	outcomes := make([]string, n)
	for i := range outcomes {
		outcomes[i] = "forwarded"
	}
	return tapEvents(s, outcomes...)
}

// A reader is told of what it loses as it loses it: a batch the tap only
// counts (no reader had room for it), or one published while the reader
// attached after the tap was asked about it, wakes the reader with the
// count, without waiting for decisions that may never come.
func TestTapReportsLossesAsTheyHappen(t *testing.T) {
	for _, c := range []struct {
		name   string
		before bool // the reader attaches before admit
		force  tapAdmission
	}{
		{"a counted batch", true, tapCount},
		{"attached between admit and publish", false, tapNone},
	} {
		t.Run(c.name, func(t *testing.T) {
			tp := newTap(1)
			var r *TapReader
			subscribe := func() {
				var err error
				if r, err = tp.Subscribe(TapFilter{}); err != nil {
					t.Fatal(err)
				}
			}
			if c.before {
				subscribe()
				defer r.Close()
			}
			how := tp.admit("s", tapRecords(5, "e"))
			if c.before {
				how = c.force // as a reader over its rate has it
			} else {
				subscribe()
				defer r.Close()
			}
			if how != c.force {
				t.Fatalf("admitted %v, want %v", how, c.force)
			}
			tp.publish(forwards("s", 5), how)
			evs, lost, err := r.Next(timeout(t, 5*time.Second))
			if err != nil || len(evs) != 0 || lost != 5 {
				t.Fatalf("%d events, %d lost, %v: want 5 lost, told at once", len(evs), lost, err)
			}
		})
	}
}

// A reader's tokens pay only for the decisions it receives: those its
// buffer has no room for cost it none, so that once it has read them it
// receives its full rate again.
func TestTapTokensPayOnlyForDecisionsReceived(t *testing.T) {
	tp := newTap(1)
	r, err := tp.Subscribe(TapFilter{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.mu.Lock()
	r.refilled = time.Now().Add(time.Hour) // no refill: the tokens are what publish leaves
	r.mu.Unlock()
	tokens := func() int { return int(r.room(time.Now())) }

	// The buffer's events nearly full: of 1000 more, 10 fit.
	fill := tapBufferEvents - 10
	tp.publish(forwards("s", fill), tapBuild)
	tp.publish(forwards("s", 1000), tapBuild)
	if got, want := tokens(), TapMaxRate-fill-10; got != want {
		t.Errorf("tokens %d after %d decisions received, want %d", got, fill+10, want)
	}
	// The buffer's batches full: a batch more is lost, its tokens kept.
	got, lost := 0, int64(0)
	for got+int(lost) < fill+1000 {
		evs, l, err := r.Next(timeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got, lost = got+len(evs), lost+l
	}
	if got != fill+10 {
		t.Fatalf("received %d, want %d", got, fill+10)
	}
	for range tapBufferBatches {
		tp.publish(forwards("s", 1), tapBuild)
	}
	before := tokens()
	tp.publish(forwards("s", 5), tapBuild)
	if after := tokens(); after != before {
		t.Errorf("tokens %d, then %d after a batch the reader's full buffer refused", before, after)
	}
}

// blockingView is a batch being published that waits, at its first
// event, for release: another batch is published meanwhile.
type blockingView struct {
	eventsView
	once             sync.Once
	started, release chan struct{}
}

func (v *blockingView) event(i int, e *TapEvent) {
	v.once.Do(func() { close(v.started); <-v.release })
	v.eventsView.event(i, e)
}

// A reader's tokens go to the decisions it selects: a batch it does not
// select (another service's), while it is being published, holds none of
// them, and the reader receives what it selects of a batch published
// meanwhile, within its rate.
func TestTapTokensGoToTheDecisionsSelected(t *testing.T) {
	tp := newTap(1)
	r, err := tp.Subscribe(TapFilter{Service: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.mu.Lock()
	r.tokens, r.refilled = 4000, time.Now().Add(time.Hour) // 4000 left, no refill
	r.mu.Unlock()
	other := &blockingView{eventsView: forwards("other", tapBufferEvents), started: make(chan struct{}), release: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tp.publish(other, tapBuild)
	}()
	<-other.started
	tp.publish(forwards("mine", 10), tapBuild)
	close(other.release)
	<-done
	evs, lost, err := r.Next(timeout(t, 5*time.Second))
	if err != nil || len(evs) != 10 || lost != 0 {
		t.Fatalf("%d events, %d lost, %v: want the 10 selected, within the reader's rate", len(evs), lost, err)
	}
}
