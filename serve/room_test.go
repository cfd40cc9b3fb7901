package serve

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	_ = g.Write(&m)
	return m.GetGauge().GetValue()
}

// A room grants room only while every body being read can still finish:
// two bodies that would each hold part of it and wait for the rest are
// not both let in; the second waits, holding nothing, and goes ahead once
// the first is read. A small body that arrives whole fits whenever its
// size is free. A grant that cannot be made safely before the context
// ends is an error (answered 503 overloaded), holding nothing.
func TestRoomKeepsEveryBodyAbleToFinish(t *testing.T) {
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	r := newRoom(100, gauge)
	a, b := r.open(80), r.open(80)
	ctx := context.Background()
	if err := r.grow(ctx, a, 40); err != nil {
		t.Fatal(err)
	}
	// b taking 30 would leave 30 free: a needs 40 more, b 50; neither
	// could finish.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := r.grow(short, b, 30)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || b.held != 0 {
		t.Fatalf("an unsafe grant: %v, b holds %d; want a wait ended by the context, holding nothing", err, b.held)
	}
	// A small body that arrives whole fits beside a.
	small := r.open(10)
	if err := r.grow(ctx, small, 10); err != nil {
		t.Fatal(err)
	}
	r.finish(small)
	r.close(small)

	granted := make(chan error, 1)
	go func() { granted <- r.grow(ctx, b, 30) }()
	select {
	case err := <-granted:
		t.Fatalf("b granted beside a, unread: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := r.grow(ctx, a, 40); err != nil { // a's whole body
		t.Fatal(err)
	}
	r.finish(a)
	r.close(a) // hashed: its room given back
	if err := <-granted; err != nil {
		t.Fatalf("b once a was read: %v", err)
	}
	r.shrink(b, 10) // 10 of the 30 did not come
	if got := gaugeValue(gauge); got != 20 || r.used != 20 {
		t.Fatalf("in flight %v (used %d), want 20", got, r.used)
	}
	r.close(b)
	if got := gaugeValue(gauge); got != 0 || len(r.bodies) != 0 {
		t.Fatalf("in flight %v with %d bodies after every body closed", got, len(r.bodies))
	}
}

// Each token's share is serve.max_in_flight_bytes divided among the
// tokens, at least a body of the largest size and the byte past it.
func TestTokenShare(t *testing.T) {
	for _, tc := range []struct {
		inFlight, body, tokens int
		want                   int64
	}{
		{32 << 20, 4 << 20, 1, 32 << 20},
		{32 << 20, 4 << 20, 4, 8 << 20},
		{32 << 20, 4 << 20, 100, 4<<20 + 1},
		{4 << 20, 4 << 20, 1, 4<<20 + 1},
	} {
		if got := tokenShare(tc.inFlight, tc.body, tc.tokens); got != tc.want {
			t.Errorf("tokenShare(%d, %d, %d) = %d, want %d", tc.inFlight, tc.body, tc.tokens, got, tc.want)
		}
	}
}
