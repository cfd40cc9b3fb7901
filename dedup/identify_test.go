package dedup_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// TestIdentify: the distinct entities of a batch's valid records come out
// once each, in key order (bytea's order: every statement locks and
// writes in it, and the server's sort of the read's array is a pass over
// presorted keys), every record's slot names its own entity, and the
// index finds each entity and nothing else, whatever the order the batch
// holds them in: already sorted, reversed, shuffled, with repeats,
// invalid records, and the empty entity (nil or not). The pools are made
// to catch a sort by 8-byte windows after the shared prefix: keys that
// share long prefixes, differ only past the window, are prefixes of each
// other, end in zero bytes (a shorter key's window ties with its own
// zero-padded extension), or hold bytes at and above 0x80.
func TestIdentify(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	fixed := [][]byte{nil, {}, {0}, {0, 0}, {1}, {0xff}, []byte("a"), []byte("ab"), []byte("b"), []byte("entity-000001"), []byte("entity-000010")}
	alphabet := []byte{0, 1, 'a', 'b', 0x7f, 0x80, 0xff}
	randomPool := func() [][]byte {
		prefix := make([]byte, rng.IntN(20))
		for i := range prefix {
			prefix[i] = alphabet[rng.IntN(len(alphabet))]
		}
		pool := make([][]byte, 2+rng.IntN(12)+rng.IntN(2)*rng.IntN(500))
		for i := range pool {
			e := append([]byte(nil), prefix[:rng.IntN(len(prefix)+1)]...)
			if rng.IntN(4) > 0 {
				e = append(e, prefix[len(e):]...) // most share the whole prefix
			}
			for range rng.IntN(20) {
				e = append(e, alphabet[rng.IntN(len(alphabet))])
			}
			pool[i] = e
		}
		return pool
	}
	for n := range 3000 {
		pool := fixed
		if n%2 == 1 {
			pool = randomPool()
		}
		size := rng.IntN(40)
		if n%10 == 0 || n%10 == 5 { // large enough for the radix sort
			size = 256 + rng.IntN(2000)
		}
		recs := make([]dedup.Record, size)
		for k := range recs {
			recs[k] = dedup.Record{Offset: int64(k), Entity: pool[rng.IntN(len(pool))], Invalid: rng.IntN(8) == 0}
		}
		switch n % 3 {
		case 1: // in key order already
			slices.SortFunc(recs, func(a, b dedup.Record) int { return bytes.Compare(a.Entity, b.Entity) })
		case 2: // in reverse key order
			slices.SortFunc(recs, func(a, b dedup.Record) int { return bytes.Compare(b.Entity, a.Entity) })
		}
		entities, find, slots := dedup.Identify(recs)
		want := map[string]bool{}
		for _, r := range recs {
			if !r.Invalid {
				want[string(r.Entity)] = true
			}
		}
		if len(entities) != len(want) {
			t.Fatalf("batch %d: %d entities, want %d distinct", n, len(entities), len(want))
		}
		for i, e := range entities {
			if e == nil {
				t.Fatalf("batch %d: entity %d is nil (the empty entity is sent as empty bytes)", n, i)
			}
			if i > 0 && bytes.Compare(entities[i-1], e) >= 0 {
				t.Fatalf("batch %d: entities %q then %q: not in strictly increasing key order", n, entities[i-1], e)
			}
			if j, ok := find(e); !ok || j != i {
				t.Fatalf("batch %d: find(%q) = %d, %v; want %d", n, e, j, ok, i)
			}
		}
		for _, e := range append(pool, fixed...) {
			if j, ok := find(e); ok != want[string(e)] || ok && !bytes.Equal(entities[j], e) {
				t.Fatalf("batch %d: find(%q) = %d, %v; the batch has it: %v", n, e, j, ok, want[string(e)])
			}
		}
		for k, r := range recs {
			switch {
			case r.Invalid && slots[k] != -1:
				t.Fatalf("batch %d: invalid record %d has slot %d, want -1", n, k, slots[k])
			case !r.Invalid && !bytes.Equal(entities[slots[k]], r.Entity):
				t.Fatalf("batch %d: record %d of entity %q has the slot of %q", n, k, r.Entity, entities[slots[k]])
			}
		}
	}
}

// BenchmarkIdentify: a batch of 4,000 records (the end-to-end benchmark's
// typical decide) over 100,000 entities keyed as its records are.
func BenchmarkIdentify(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	recs := make([]dedup.Record, 4000)
	for k := range recs {
		recs[k] = dedup.Record{Offset: int64(k), Entity: fmt.Appendf(nil, "entity-%06d", rng.IntN(100000))}
	}
	b.ReportAllocs()
	for b.Loop() {
		entities, find, _ := dedup.Identify(recs)
		for _, e := range entities {
			if _, ok := find(e); !ok {
				b.Fatal("not found")
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
}

// timeFinds returns how long finding every entity of recs takes (best of
// three), with Identify's index.
func timeFinds(recs []dedup.Record) time.Duration {
	entities, find, _ := dedup.Identify(recs)
	best := time.Duration(1 << 62)
	for range 3 {
		start := time.Now()
		for _, e := range entities {
			if _, ok := find(e); !ok {
				panic("not found")
			}
		}
		best = min(best, time.Since(start))
	}
	return best
}

// TestIdentifyFindAmongEqualWindows: a batch of 10,000 records keyed
// "customer:<hex id>" (a topic of mixed keys) with ONE record keyed
// "invoice:1". The shared prefix collapses to nothing and every customer
// key's window is "customer": find searches that run of equal windows by
// bytes, and its look-ups cost about what they cost without the invoice
// key (a walk of the run would make a batch O(n^2), hundreds of times
// slower).
func TestIdentifyFindAmongEqualWindows(t *testing.T) {
	const n = 10000
	benign := make([]dedup.Record, n)
	for k := range benign {
		benign[k] = dedup.Record{Offset: int64(k), Entity: fmt.Appendf(nil, "customer:%032x", uint64(k)*0x9e3779b97f4a7c15)}
	}
	mixed := slices.Clone(benign)
	mixed[n/2].Entity = []byte("invoice:1")
	tb, tm := timeFinds(benign), timeFinds(mixed)
	t.Logf("find of %d entities: customer keys only %v; with one invoice key %v (%.0fx)", n, tb, tm, float64(tm)/float64(tb))
	if tm > 20*tb && tm > 50*time.Millisecond {
		t.Fatalf("one record's key made the read's look-ups %.0fx slower (%v vs %v): find scans runs of equal windows linearly", float64(tm)/float64(tb), tm, tb)
	}
}

// adversarialBatch returns n records of distinct MaxEntityBytes-long
// entities that all share one window: "a" + 8 zero bytes + filler +
// counter, and one record "a" (so the shared prefix is "a").
func adversarialBatch(n int, offset int64) []dedup.Record {
	recs := make([]dedup.Record, n)
	recs[0] = dedup.Record{Offset: offset, Entity: []byte("a"), Digest: digest("x")}
	for k := 1; k < n; k++ {
		e := make([]byte, dedup.MaxEntityBytes)
		e[0] = 'a'
		for i := 9; i < len(e)-8; i++ {
			e[i] = 'f'
		}
		copy(e[len(e)-8:], fmt.Appendf(nil, "%08d", k))
		recs[k] = dedup.Record{Offset: offset + int64(k), Entity: e, Digest: digest("x")}
	}
	return recs
}

// benignBatch: the same sizes, entities whose windows differ.
func benignBatch(n int, offset int64) []dedup.Record {
	recs := adversarialBatch(n, offset)
	for k := 1; k < n; k++ {
		e := recs[k].Entity
		copy(e[1:9], fmt.Appendf(nil, "%08d", k))
	}
	return recs
}

// TestDecideKeysSharingOneWindow: end to end. A producer keys 10,000
// records (max_batch's default) as adversarialBatch does; the second
// decide of them reads 10,000 rows, each looked up among keys that share
// one window. It costs about what keys whose windows differ cost, and
// succeeds: a decide slow enough to outlast statement_timeout, holding the
// partition's progress row, would fail the same way at every retry.
func TestDecideKeysSharingOneWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	ctx := context.Background()
	// A statement timeout well above the default: on Citus a decide of
	// 10,000 rows takes about 2.7 s alone and passed the default 5 s while
	// other packages' tests loaded the machine. This test measures the
	// client's identify, not the server's speed.
	s, err := dedup.Open(ctx, pgtest.DSN(t), dedup.Config{StatementTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	const n = 10000
	run := func(name string, mk func(int, int64) []dedup.Record) time.Duration {
		p, epoch := partition(t, s, name)
		b := &dedup.Batch{Service: name, Partition: p, Epoch: epoch, Start: 0, End: n, Records: mk(n, 0)}
		if _, err := s.Decide(ctx, b, nil); err != nil {
			t.Fatal(err)
		}
		b2 := &dedup.Batch{Service: name, Partition: p, Epoch: epoch, Start: n, End: 2 * n, Records: mk(n, n)}
		start := time.Now()
		out, err := s.Decide(ctx, b2, nil)
		d := time.Since(start)
		if err != nil {
			// The read's rows are consumed as they arrive: a slow look-up
			// keeps the statement running past statement_timeout, and the
			// batch fails the same way every time it is retried.
			t.Fatalf("%s: second decide failed after %v: %v", name, d, err)
		}
		for k, dec := range out {
			if dec != dedup.Duplicate {
				t.Fatalf("%s: record %d: %v, want duplicate", name, k, dec)
			}
		}
		return d
	}
	tb := run("benign", benignBatch)
	ta := run("adversarial", adversarialBatch)
	t.Logf("second decide of %d rows: benign %v, adversarial %v (%.1fx)", n, tb, ta, float64(ta)/float64(tb))
	if ta > 10*tb && ta > 500*time.Millisecond {
		t.Fatalf("keys sharing one window made a decide %.1fx slower (%v vs %v)", float64(ta)/float64(tb), ta, tb)
	}
}

// refIdentify is identify done with a map and a sort: the reference
// TestIdentifyAgreesWithMap compares identify with.
func refIdentify(recs []dedup.Record) ([][]byte, []int32) {
	index := map[string]int{}
	var entities [][]byte
	for _, r := range recs {
		if !r.Invalid {
			if _, ok := index[string(r.Entity)]; !ok {
				index[string(r.Entity)] = 0
				entities = append(entities, r.Entity)
			}
		}
	}
	slices.SortFunc(entities, bytes.Compare)
	for i, e := range entities {
		index[string(e)] = i
	}
	slots := make([]int32, len(recs))
	for k, r := range recs {
		slots[k] = -1
		if !r.Invalid {
			slots[k] = int32(index[string(r.Entity)])
		}
	}
	return entities, slots
}

// TestIdentifyAgreesWithMap: identify agrees with refIdentify
// on adversarial pools: max-length keys differing in one byte anywhere,
// keys that are prefixes of one another padded with 0x00 or 0xff, keys
// sharing their window but not their length, all invalid, a single
// record, and batch sizes around the radix sort's threshold.
func TestIdentifyAgreesWithMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	base := make([]byte, dedup.MaxEntityBytes)
	for i := range base {
		base[i] = byte(rng.IntN(256))
	}
	pools := map[string]func() [][]byte{
		"maxlen-one-byte": func() [][]byte {
			var p [][]byte
			for range 40 {
				e := slices.Clone(base)
				e[rng.IntN(len(e))] ^= byte(1 + rng.IntN(255))
				p = append(p, e)
			}
			return append(p, base)
		},
		"prefix-chains": func() [][]byte {
			var p [][]byte
			for _, pad := range []byte{0, 0xff, 1, 0xfe} {
				for l := 0; l < 20; l++ {
					p = append(p, append([]byte("k"), bytes.Repeat([]byte{pad}, l)...))
				}
			}
			return append(p, nil, []byte{}, []byte("k"))
		},
		"shared-window": func() [][]byte {
			var p [][]byte
			for l := 9; l < 40; l++ {
				for v := range 3 {
					e := append([]byte("p\x00\x00\x00\x00\x00\x00\x00\x00"), bytes.Repeat([]byte{byte(v * 0x7f)}, l-9)...)
					p = append(p, e)
				}
			}
			return append(p, []byte("p"), []byte("p\x00"))
		},
		"high-bytes": func() [][]byte {
			var p [][]byte
			for range 60 {
				e := make([]byte, 1+rng.IntN(12))
				for i := range e {
					e[i] = []byte{0, 0x7f, 0x80, 0xff}[rng.IntN(4)]
				}
				p = append(p, e)
			}
			return p
		},
	}
	for name, mk := range pools {
		for _, size := range []int{0, 1, 2, 254, 255, 256, 257, 511, 512, 3000} {
			for trial := range 5 {
				pool := mk()
				recs := make([]dedup.Record, size)
				allInvalid := trial == 4
				for k := range recs {
					recs[k] = dedup.Record{Offset: int64(k), Entity: pool[rng.IntN(len(pool))], Invalid: allInvalid || rng.IntN(10) == 0}
				}
				got, find, slots := dedup.Identify(recs)
				want, wslots := refIdentify(recs)
				if len(got) != len(want) {
					t.Fatalf("%s size %d: %d entities, want %d", name, size, len(got), len(want))
				}
				for i := range got {
					if !bytes.Equal(got[i], want[i]) || got[i] == nil {
						t.Fatalf("%s size %d: entity %d = %x, want %x", name, size, i, got[i], want[i])
					}
				}
				if !slices.Equal(slots, wslots) {
					t.Fatalf("%s size %d: slots differ", name, size)
				}
				for _, e := range pool {
					j, ok := find(e)
					w, wok := slices.BinarySearchFunc(want, e, bytes.Compare)
					if ok != wok || ok && j != w {
						t.Fatalf("%s size %d: find(%x) = %d,%v want %d,%v", name, size, e, j, ok, w, wok)
					}
				}
			}
		}
	}
}

// TestDecideEntitiesRoundTrip: in every mode, both shapes (one
// server, Citus's claim), with and without a lost race's locking read:
// tricky entities decided once are forwarded, decided again are found by
// the read (DriverBytes, find) and are duplicates; the log's entities are
// the records'.
func TestDecideEntitiesRoundTrip(t *testing.T) {
	ctx := context.Background()
	long := bytes.Repeat([]byte{0xff}, dedup.MaxEntityBytes)
	long2 := slices.Clone(long)
	long2[dedup.MaxEntityBytes-1] = 0xfe
	long3 := slices.Clone(long[:dedup.MaxEntityBytes-1])
	pool := [][]byte{nil, {0}, {0, 0}, {0xff}, {0xff, 0}, long, long2, long3,
		[]byte("entity-00000000"), []byte("entity-00000000\x00"), []byte("entity-000000001"), []byte("entity-0000000")}
	for i := range 300 {
		pool = append(pool, fmt.Appendf(nil, "entity-%08d-%d", i, i%3))
	}
	for _, m := range []struct {
		name string
		rule dedup.Rule
	}{
		{"last-seen", dedup.Rule{}},
		{"refresh", dedup.Rule{RefreshAfter: time.Hour}},
		{"window", dedup.Rule{Mode: dedup.Window, Window: time.Hour}},
		{"sliding", dedup.Rule{Mode: dedup.Window, Window: time.Hour, Sliding: true}},
		{"version", dedup.Rule{Mode: dedup.Version}},
	} {
		for _, claims := range []bool{false, true} {
			for _, mode := range []string{"", "exec", "simple_protocol"} {
				t.Run(fmt.Sprintf("%s/claims=%v/%s", m.name, claims, mode), func(t *testing.T) {
					dsn := pgtest.DSN(t)
					if mode != "" {
						dsn += "&default_query_exec_mode=" + mode
					}
					s, err := dedup.Open(ctx, dsn, dedup.Config{})
					if err != nil {
						t.Fatal(err)
					}
					defer s.Close()
					if claims {
						dedup.SetClaims(s)
					}
					p, epoch := partition(t, s, "rt")
					rng := rand.New(rand.NewPCG(1, 1))
					next := int64(0)
					for round := range 3 {
						shuffled := slices.Clone(pool)
						rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
						recs := make([]dedup.Record, len(shuffled))
						for k, e := range shuffled {
							recs[k] = dedup.Record{Offset: next + int64(k), Entity: e, Digest: digest("same"), Version: 1}
						}
						b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Rule: m.rule, Start: next, End: next + int64(len(recs)), Records: recs}
						out, err := s.Decide(ctx, b, nil)
						if err != nil {
							t.Fatal(err)
						}
						for k, d := range out {
							want := dedup.Duplicate
							if round == 0 {
								want = dedup.Forward
							}
							if m.rule.Mode == dedup.Version && round > 0 {
								want = dedup.Stale
							}
							if d != want && !(want == dedup.Stale && d == dedup.Duplicate) {
								t.Fatalf("round %d record %d (%x): %v, want %v", round, k, recs[k].Entity, d, want)
							}
						}
						if round == 0 {
							logged, covered, err := s.Logged(ctx, p, next, b.End)
							if err != nil || !covered {
								t.Fatalf("logged: %v %v", covered, err)
							}
							if len(logged) != len(recs) {
								t.Fatalf("logged %d, want %d", len(logged), len(recs))
							}
							for k, l := range logged {
								if l.Offset != recs[k].Offset || !bytes.Equal(l.Entity, recs[k].Entity) {
									t.Fatalf("log entry %d: offset %d entity %x; record offset %d entity %x", k, l.Offset, l.Entity, recs[k].Offset, recs[k].Entity)
								}
							}
						}
						next = b.End
					}
				})
			}
		}
	}
}

// TestConcurrentDecidersRadixBatches: deciders of several partitions decide
// batches of 300-600 records (the radix path) over overlapping entities
// that share windows and long prefixes, each batch shuffled; with
// SetDecideAttempts low, a lock-order inversion shows as a deadlock that
// reaches the caller or a Decide that gives up.
func TestConcurrentDecidersRadixBatches(t *testing.T) {
	ctx := context.Background()
	for _, m := range []struct {
		name string
		rule dedup.Rule
	}{
		{"last-seen", dedup.Rule{}},
		{"version", dedup.Rule{Mode: dedup.Version}},
	} {
		t.Run(m.name, func(t *testing.T) {
			s, err := dedup.Open(ctx, pgtest.DSN(t), dedup.Config{MaxConns: 8})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var pool [][]byte
			pool = append(pool, []byte("t"), []byte("t\x00"), nil)
			for i := range 200 {
				pool = append(pool, fmt.Appendf(nil, "t\x00\x00\x00\x00\x00\x00\x00\x00%d", i))
				pool = append(pool, fmt.Appendf(nil, "tenant-7:user-%04d", i))
			}
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for w := range 4 {
				p, epoch := partition(t, s, fmt.Sprint("radix-", w))
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 99))
					next := int64(0)
					var version int64
					for range 6 {
						n := 300 + rng.IntN(300)
						b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Rule: m.rule, Start: next, End: next + int64(n)}
						for k := range n {
							version++
							b.Records = append(b.Records, dedup.Record{Offset: next + int64(k), Entity: pool[rng.IntN(len(pool))], Digest: digest(fmt.Sprint(rng.IntN(3))), Version: version})
						}
						var err error
						for try := 0; try < 20; try++ {
							if _, err = s.Decide(ctx, b, nil); err == nil || !lockTimeout(err) {
								break
							}
						}
						if err != nil {
							errs <- fmt.Errorf("decider %d: %w", w, err)
							return
						}
						next = b.End
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}
