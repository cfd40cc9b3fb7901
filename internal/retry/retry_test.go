package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

var fast = Policy{Min: time.Millisecond, Max: 2 * time.Millisecond}

func TestDoRetriesUntilSuccess(t *testing.T) {
	n, notified := 0, 0
	got, err := Do(context.Background(), fast, func(error, time.Duration) { notified++ }, func() (int, error) {
		n++
		if n < 4 {
			return 0, errors.New("not yet")
		}
		return 42, nil
	})
	if err != nil || got != 42 || n != 4 || notified != 3 {
		t.Fatalf("Do = %d, %v after %d attempts and %d notifications; want 42, nil, 4, 3", got, err, n, notified)
	}
}

func TestPermanentStopsAtOnce(t *testing.T) {
	bad := errors.New("bad")
	n := 0
	err := Run(context.Background(), fast, nil, func() error { n++; return Permanent(bad) })
	if !errors.Is(err, bad) || n != 1 {
		t.Fatalf("Run = %v after %d attempts, want %v after 1", err, n, bad)
	}
}

func TestContextEndsTheLoop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := Run(ctx, fast, nil, func() error { return errors.New("down") })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %v, want the context's deadline", err)
	}
}

// No limit on elapsed time: backoff's default gives up after 15 minutes,
// which would turn a long outage into a skipped step.
func TestNoElapsedTimeLimit(t *testing.T) {
	start := time.Now()
	n := 0
	err := Run(context.Background(), Policy{Min: 20 * time.Millisecond, Max: 20 * time.Millisecond}, nil, func() error {
		n++
		if time.Since(start) < 150*time.Millisecond {
			return errors.New("down")
		}
		return nil
	})
	if err != nil || n < 3 {
		t.Fatalf("Run = %v after %d attempts", err, n)
	}
}
