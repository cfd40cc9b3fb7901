package dedup_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pgtest"
)

// TestLockOrderUnderMaintenance: deciders of several partitions, in each
// mode, decide batches of overlapping identities given in shuffled order
// (identify must put them in key order: the rewrites are not sorted where
// they are queued), with the empty entity, NUL bytes and
// 1024-byte entities among them, while ResetService, ResetEntities (in
// reverse key order), PruneState and the window cleanup walk the same
// rows. No Decide may give up (ErrUnavailable after too many lost races
// or deadlocks) and no maintenance operation may fail, but for waits past
// lock_timeout, which are retried (see lockTimeout).
func TestLockOrderUnderMaintenance(t *testing.T) {
	for _, m := range []struct {
		name string
		rule dedup.Rule
	}{
		{"last-seen", dedup.Rule{}},
		{"window", dedup.Rule{Mode: dedup.Window, Window: time.Hour, Sliding: true}},
		{"version", dedup.Rule{Mode: dedup.Version}},
	} {
		t.Run(m.name, func(t *testing.T) { testLockOrderUnderMaintenance(t, m.rule) })
	}
}

func testLockOrderUnderMaintenance(t *testing.T, rule dedup.Rule) {
	ctx := context.Background()
	s, err := dedup.Open(ctx, pgtest.DSN(t), dedup.Config{MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	long := make([]byte, dedup.MaxEntityBytes)
	for i := range long {
		long[i] = byte(i * 7)
	}
	long2 := append([]byte{}, long...)
	long2[dedup.MaxEntityBytes-1]++
	pool := [][]byte{{}, {0}, {0, 0}, {0, 1}, {0xff}, long, long2, []byte("a\x00"), []byte("a")}
	for i := range 60 {
		pool = append(pool, []byte(fmt.Sprintf("e%03d", i)))
	}
	const (
		deciders = 4
		batches  = 10
		service  = "svc"
	)
	var failures atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range deciders {
		p, epoch := partition(t, s, fmt.Sprint("lock-", w))
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			next := int64(0)
			var version int64
			for range batches {
				n := 20 + rng.IntN(60)
				b := &dedup.Batch{Service: service, Partition: p, Epoch: epoch, Rule: rule, Start: next, End: next + int64(n)}
				for k := range n {
					e := pool[rng.IntN(len(pool))]
					version++
					var d canon.Digest
					d[0] = byte(canon.SchemeJSON1)
					sum := sha256.Sum256([]byte(fmt.Sprint(rng.IntN(3))))
					copy(d[1:], sum[:])
					b.Records = append(b.Records, dedup.Record{Offset: next + int64(k), Entity: e, Digest: d, Version: version})
				}
				var err error
				for try := 0; try < 20; try++ { // as the pipeline does: ErrUnavailable is retried
					if _, err = s.Decide(ctx, b, nil); err == nil || !lockTimeout(err) {
						break
					}
				}
				if err != nil {
					failures.Add(1)
					t.Errorf("decider %d: %v", w, err)
					return
				}
				next = b.End
			}
		}()
	}
	var mwg sync.WaitGroup
	maint := func(name string, fn func() error) {
		mwg.Add(1)
		go func() {
			defer mwg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := fn(); err != nil && !lockTimeout(err) {
					failures.Add(1)
					t.Errorf("%s: %v", name, err)
					return
				}
			}
		}()
	}
	rev := make([][]byte, len(pool))
	for i, e := range pool {
		rev[len(pool)-1-i] = e
	}
	maint("reset service", func() error {
		_, err := s.ResetService(ctx, service, dedup.WithBatchSize(7))
		return err
	})
	maint("reset entities", func() error {
		_, err := s.ResetEntities(ctx, service, rev, dedup.WithBatchSize(11))
		return err
	})
	maint("prune", func() error {
		_, err := s.PruneState(ctx, service, 0, dedup.WithBatchSize(5))
		return err
	})
	maint("cleanup", func() error {
		_, _, err := s.CleanupWindow(ctx, service, dedup.WithBatchSize(3))
		return err
	})
	wg.Wait()
	close(stop)
	mwg.Wait()
	t.Logf("waits excused: %d past lock_timeout, %d past statement_timeout", timeouts["55P03"].Swap(0), timeouts["57014"].Swap(0))
	if failures.Load() > 0 {
		t.Fatalf("%d failures", failures.Load())
	}
}
