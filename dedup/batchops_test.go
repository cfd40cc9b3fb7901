package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

// fillState inserts n identities of service, the empty entity among them,
// with updated_at two hours ago for every other one.
func fillState(t *testing.T, s *dedup.Store, service string, n int) {
	t.Helper()
	_, err := s.Pool().Exec(context.Background(), `INSERT INTO state (service, entity, digest, updated_at)
		SELECT $1, CASE WHEN i = 0 THEN ''::bytea ELSE int4send(i) END, '\x01'::bytea,
			CASE WHEN i % 2 = 0 THEN now() - interval '2 hours' ELSE now() END
		FROM generate_series(0, $2 - 1) i`, service, n)
	if err != nil {
		t.Fatal(err)
	}
}

// Resetting a whole service walks it in batches, each reported, and
// leaves other services alone.
func TestResetServiceInBatches(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	fillState(t, s, "big", 2501)
	fillState(t, s, "other", 10)
	var steps []dedup.Step
	n, err := s.ResetService(ctx, "big", dedup.WithBatchSize(1000), dedup.WithProgress(func(st dedup.Step) { steps = append(steps, st) }))
	if err != nil || n != 2501 {
		t.Fatalf("ResetService: %d, %v", n, err)
	}
	want := []dedup.Step{{1000, 2501, 1000}, {2000, 2501, 2000}, {2501, 2501, 2501}}
	if fmt.Sprint(steps) != fmt.Sprint(want) {
		t.Fatalf("steps %v, want %v", steps, want)
	}
	if c, _ := s.Count(ctx, "big"); c != 0 {
		t.Fatalf("%d rows of big left", c)
	}
	if c, _ := s.Count(ctx, "other"); c != 10 {
		t.Fatalf("other: %d rows, want 10", c)
	}
	if n, err := s.ResetService(ctx, "big"); err != nil || n != 0 {
		t.Fatalf("ResetService of an empty service: %d, %v", n, err)
	}
	if _, err := s.ResetService(ctx, ""); !errors.Is(err, dedup.ErrInvalid) {
		t.Fatalf("empty service: %v", err)
	}
}

func TestResetEntitiesInBatches(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	fillState(t, s, "svc", 100)
	var ents [][]byte
	ents = append(ents, nil) // the empty entity
	for i := 1; i < 50; i++ {
		ents = append(ents, []byte{0, 0, 0, byte(i)})
	}
	ents = append(ents, []byte("absent"))
	var steps []dedup.Step
	n, err := s.ResetEntities(ctx, "svc", ents, dedup.WithBatchSize(20), dedup.WithProgress(func(st dedup.Step) { steps = append(steps, st) }))
	if err != nil || n != 50 {
		t.Fatalf("ResetEntities: %d, %v", n, err)
	}
	want := []dedup.Step{{20, 51, 20}, {40, 51, 40}, {51, 51, 50}}
	if fmt.Sprint(steps) != fmt.Sprint(want) {
		t.Fatalf("steps %v, want %v", steps, want)
	}
	if c, _ := s.Count(ctx, "svc"); c != 50 {
		t.Fatalf("%d rows left, want 50", c)
	}
}

// A reset batch waits for a row a decider holds, and does not hold its
// own locks beyond its batch: a Check on an identity of an earlier batch
// proceeds while the reset is blocked.
func TestResetServiceHoldsNoLongLocks(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	fillState(t, s, "svc", 300)
	// Hold the lock of the last identity (int4send(299)) in a transaction.
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM state WHERE service = 'svc' AND entity = int4send(299) FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	firstBatch := make(chan struct{})
	go func() {
		_, err := s.ResetService(ctx, "svc", dedup.WithBatchSize(100), dedup.WithProgress(func(st dedup.Step) {
			if st.Done == 100 {
				close(firstBatch)
			}
		}))
		done <- err
	}()
	<-firstBatch
	// The first batch is committed: its identities are free and absent.
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if d, err := s.Check(cctx, "svc", []byte{}, digest("new")); err != nil || d != dedup.Forward {
		t.Fatalf("Check during the reset: %v, %v", d, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestPruneStateProgress(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	fillState(t, s, "p", 250)
	var steps []dedup.Step
	n, err := s.PruneState(ctx, "p", time.Hour, dedup.WithBatchSize(100), dedup.WithProgress(func(st dedup.Step) { steps = append(steps, st) }))
	if err != nil || n != 125 {
		t.Fatalf("PruneState: %d, %v", n, err)
	}
	want := []dedup.Step{{100, 250, 50}, {200, 250, 100}, {250, 250, 125}}
	if fmt.Sprint(steps) != fmt.Sprint(want) {
		t.Fatalf("steps %v, want %v", steps, want)
	}
}
