package pipeline

import (
	"context"
	"errors"
	"testing"
	"time"
)

func tapEvents(service string, outcomes ...string) []TapEvent {
	evs := make([]TapEvent, len(outcomes))
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
			tp.publish(tapEvents("s", "forwarded", "duplicate", "duplicate", "invalid"))
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
		tp.publish(tapEvents("s", outcomes...))
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
