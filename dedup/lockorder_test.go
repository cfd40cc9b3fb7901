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
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
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

// TestCheckBatchLocksInDecideOrder: on Citus, a check batch locks its
// identities in the order a routed decide does (shard after shard, each
// shard's in key order), so the two never deadlock: a check holding an
// identity of a later shard while it waits for one of an earlier shard
// that a decide holds, the decide then waiting for the check's, is a
// distributed deadlock whose victim, the youngest transaction, is the
// check.
func TestCheckBatchLocksInDecideOrder(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if !distributed(t, s) {
		t.Skip("the shards of Citus (DAM_TEST_CITUS=1)")
	}
	// No retry of a check that a deadlock rolled back: the error shows.
	defer dedup.SetDecideAttempts(1)()

	// Three identities b, c, a in three shards in that (hash) order, a
	// before b in key order, a and b on different workers.
	var cands [][]byte
	for i := range 200 {
		cands = append(cands, fmt.Appendf(nil, "k-%03d", i))
	}
	mins, nodes := shardsOf(ctx, t, s, cands)
	var a, b, c []byte
find:
	for ib := range cands {
		for ia := range ib { // a before b in key order
			if mins[ia] <= mins[ib] || nodes[ia] == nodes[ib] {
				continue
			}
			for ic := range cands {
				if mins[ib] < mins[ic] && mins[ic] < mins[ia] {
					a, b, c = cands[ia], cands[ib], cands[ic]
					break find
				}
			}
		}
	}
	if a == nil {
		t.Fatal("no three identities in three shards in the order wanted")
	}
	p, epoch := partition(t, s, "checkorder")
	st := &stream{t: t, s: s, p: p, epoch: epoch, svc: "svc"}
	st.decide(time.Time{}, vrec{string(a), "1", 0}, vrec{string(b), "1", 0}, vrec{string(c), "1", 0})

	lockWaits := func(n int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var w int
			if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM citus_lock_waits`).Scan(&w); err != nil {
				t.Fatal(err)
			}
			if w >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d lock waits, want %d", w, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// c held: the decide locks b, then waits for c.
	hold, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(ctx) }()
	if _, err := hold.Exec(ctx, `SELECT FROM state WHERE service = 'svc' AND entity = $1 FOR UPDATE`, c); err != nil {
		t.Fatal(err)
	}
	decideErr := make(chan error, 1)
	go func() {
		batch := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 3, End: 6, Records: []dedup.Record{
			{Offset: 3, Entity: a, Digest: digest("2")}, {Offset: 4, Entity: b, Digest: digest("2")}, {Offset: 5, Entity: c, Digest: digest("2")}}}
		_, err := s.Decide(ctx, batch, nil)
		decideErr <- err
	}()
	lockWaits(1)
	// The check of a and b: in key order, it would lock a, then wait for
	// b, which the decide holds.
	checked := make(chan error, 1)
	go func() {
		_, err := s.CheckBatch(ctx, []dedup.CheckItem{{Service: "svc", Entity: b, Digest: digest("3")}, {Service: "svc", Entity: a, Digest: digest("3")}}, nil)
		checked <- err
	}()
	lockWaits(2)
	// c released: the decide goes on to a.
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-decideErr; err != nil {
		t.Errorf("decide: %v", err)
	}
	if err := <-checked; err != nil {
		t.Errorf("check batch beside a decide of the same identities: %v", err)
	}
}

// shardsOf returns, for each entity, the least hash of the shard of
// state holding it (the shards' order: a routed decide's) and the worker
// group holding that shard.
func shardsOf(ctx context.Context, t *testing.T, s *dedup.Store, entities [][]byte) (mins, nodes []int32) {
	t.Helper()
	if err := s.Pool().QueryRow(ctx, `SELECT array_agg(d.shardminvalue::int4 ORDER BY n), array_agg(p.groupid ORDER BY n)
		FROM unnest($1::bytea[]) WITH ORDINALITY AS u(e, n)
		JOIN pg_dist_shard d ON d.shardid = get_shard_id_for_distribution_column('state', u.e)
		JOIN pg_dist_placement p ON p.shardid = d.shardid`, entities).Scan(&mins, &nodes); err != nil {
		t.Fatal(err)
	}
	return mins, nodes
}

// lockedInOrder returns two identities, a before b in key order, that a
// check batch on Citus locks in that order too (a's shard first).
func lockedInOrder(ctx context.Context, t *testing.T, s *dedup.Store) (a, b string) {
	t.Helper()
	var cands [][]byte
	for i := range 50 {
		cands = append(cands, fmt.Appendf(nil, "e-%02d", i))
	}
	mins, _ := shardsOf(ctx, t, s, cands)
	for i := range cands {
		for j := i + 1; j < len(cands); j++ {
			if mins[i] < mins[j] {
				return string(cands[i]), string(cands[j])
			}
		}
	}
	t.Fatal("no two identities in two shards in key order")
	return "", ""
}
