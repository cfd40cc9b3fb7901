package dedup_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
)

const (
	benchEntities   = 100_000
	benchRecords    = 30_000 // per iteration (percas: a third, to keep it short; the metric is a rate)
	benchPartitions = 3      // deciding in parallel, as a 3-partition topic
	benchDupRate    = 0.30
)

// benchStream generates records whose content repeats the entity's previous
// content benchDupRate of the time, keyed to partitions by entity like a
// keyed Kafka topic, and knows the decision each record must get.
type benchStream struct {
	rng  *rand.Rand
	last []uint64 // per entity: last content
	seq  uint64
}

type benchRec struct {
	entity  []byte
	digest  canon.Digest
	version int64
	want    dedup.Decision
}

func newBenchStream() *benchStream {
	st := &benchStream{rng: rand.New(rand.NewPCG(1, 2)), last: make([]uint64, benchEntities)}
	for i := range st.last {
		st.seq++
		st.last[i] = st.seq
	}
	return st
}

func benchDigest(content uint64) canon.Digest {
	var d canon.Digest
	d[0] = byte(canon.SchemeJSON1)
	for i := 0; i < 8; i++ {
		d[1+i] = byte(content >> (8 * i))
	}
	return d
}

func benchEntity(i int) []byte { return []byte(fmt.Sprintf("entity-%06d", i)) }

// next returns n records split by partition. A record that changes its
// entity's content gets a new version (the sequence number) and, in window
// mode, a new message id; a repeat has the same digest, version and id.
func (st *benchStream) next(n int, rule dedup.Rule) [benchPartitions][]benchRec {
	var parts [benchPartitions][]benchRec
	for range n {
		e := st.rng.IntN(benchEntities)
		r := benchRec{want: dedup.Duplicate}
		if st.rng.Float64() >= benchDupRate {
			st.seq++
			st.last[e] = st.seq
			r.want = dedup.Forward
		}
		r.entity = st.identity(rule, e)
		r.digest = benchDigest(st.last[e])
		r.version = int64(st.last[e])
		parts[e%benchPartitions] = append(parts[e%benchPartitions], r)
	}
	return parts
}

// identity is entity e's identity: the entity, or in window mode the id of
// its current content.
func (st *benchStream) identity(rule dedup.Rule, e int) []byte {
	if rule.Mode == dedup.Window {
		return []byte(fmt.Sprintf("msg-%010d", st.last[e]))
	}
	return benchEntity(e)
}

// BenchmarkDecide measures decided records per second against the test
// server: percas is the seeds' design (one autocommit Check statement per
// record), batch=N is Decide with N records per transaction. Every variant
// runs benchPartitions deciders in parallel over a warmed state of
// benchEntities identities. Compare records/s, not ns/op.
//
// The other rules run next to last-seen at batch=1000 on the same shape of
// stream (benchEntities identities, benchDupRate repeats): refresh is
// last-seen with refresh_after (long, so nothing is refreshed: the cost of
// reading when each identity was forwarded), version has versions rising
// per entity (repeats are duplicates), window has message ids (repeats are
// ids seen before, inside the window).
func BenchmarkDecide(b *testing.B) {
	b.Run("percas", func(b *testing.B) { benchDecide(b, 0, dedup.Rule{}) })
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) { benchDecide(b, n, dedup.Rule{}) })
	}
	for _, m := range []struct {
		name string
		rule dedup.Rule
	}{
		{"refresh", dedup.Rule{RefreshAfter: 24 * time.Hour}},
		{"window", dedup.Rule{Mode: dedup.Window, Window: 24 * time.Hour}},
		{"version", dedup.Rule{Mode: dedup.Version}},
	} {
		b.Run(m.name+"/batch=1000", func(b *testing.B) { benchDecide(b, 1000, m.rule) })
	}
}

// benchTables are the tables each mode writes, vacuumed after warming.
var benchTables = map[dedup.Mode]string{dedup.LastSeen: "state", dedup.Window: "window_ids", dedup.Version: "versions"}

func benchDecide(b *testing.B, batch int, rule dedup.Rule) {
	ctx := context.Background()
	s := newStore(b)
	st := newBenchStream()
	var parts [benchPartitions]dedup.Partition
	var epochs, next [benchPartitions]int64
	for i := range parts {
		parts[i], epochs[i] = partition(b, s, fmt.Sprint("bench-", i))
	}
	// Warm the state: every entity has its first content stored.
	warm := &dedup.Batch{Service: "bench", Partition: parts[0], Epoch: epochs[0], Rule: rule}
	for lo := 0; lo < benchEntities; lo += 10000 {
		warm.Start, warm.End, warm.Records = next[0], next[0]+10000, warm.Records[:0]
		for i := lo; i < lo+10000; i++ {
			warm.Records = append(warm.Records, dedup.Record{Offset: next[0] + int64(i-lo), Entity: st.identity(rule, i),
				Digest: benchDigest(st.last[i]), Version: int64(st.last[i])})
		}
		if _, err := s.Decide(ctx, warm, nil); err != nil {
			b.Fatal(err)
		}
		next[0] = warm.End
	}
	_, _ = s.Pool().Exec(ctx, "VACUUM ANALYZE "+benchTables[rule.Mode])
	perIter := benchRecords
	if batch == 0 {
		perIter /= 3
	}
	cpu := startBackendCPU(ctx, b, s)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		recs := st.next(perIter, rule)
		b.StartTimer()
		var wg sync.WaitGroup
		errs := make([]error, benchPartitions)
		for pi := range benchPartitions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if batch == 0 {
					errs[pi] = benchPerCAS(ctx, s, recs[pi])
				} else {
					errs[pi] = benchBatches(ctx, s, rule, parts[pi], epochs[pi], &next[pi], recs[pi], batch)
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N*perIter)/b.Elapsed().Seconds(), "records/s")
	cpu.report(ctx, b, s, b.N*perIter)
}

// backendCPU measures what the store's PostgreSQL backends spend (CPU read
// from /proc: the test server runs on this machine) and the WAL the server
// writes, per decided record: the server's side of a decide, which
// records/s alone hides on a machine where the server and the benchmark
// share the cores.
type backendCPU struct {
	start  map[int32]time.Duration
	lsn    string
	client time.Duration // this process's CPU (the Store's side)
}

func startBackendCPU(ctx context.Context, b *testing.B, s *dedup.Store) *backendCPU {
	c := &backendCPU{start: backendTimes(ctx, b, s), client: selfCPU(b)}
	if err := s.Pool().QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&c.lsn); err != nil {
		b.Fatal(err)
	}
	return c
}

// report adds pg-µs/record and WAL-B/record. A backend the pool opened
// during the run counts whole; one it closed is missed (it has none to
// close: the pool keeps its connections).
func (c *backendCPU) report(ctx context.Context, b *testing.B, s *dedup.Store, records int) {
	var total time.Duration
	for pid, t := range backendTimes(ctx, b, s) {
		total += t - c.start[pid]
	}
	var wal int64
	if err := s.Pool().QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, c.lsn).Scan(&wal); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(records), "pg-µs/record")
	b.ReportMetric(float64((selfCPU(b)-c.client).Microseconds())/float64(records), "client-µs/record")
	b.ReportMetric(float64(wal)/float64(records), "WAL-B/record")
}

// selfCPU returns this process's user and system CPU time so far.
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendTimes returns the CPU time so far of each backend of the store's
// pool, by process id.
func backendTimes(ctx context.Context, b *testing.B, s *dedup.Store) map[int32]time.Duration {
	conns := s.Pool().AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	times := map[int32]time.Duration{}
	for _, c := range conns {
		pid := c.Conn().PgConn().PID()
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			b.Fatalf("backend CPU (the server must run on this machine): %v", err)
		}
		// utime and stime, in USER_HZ (100 on Linux), after the command name.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		times[int32(pid)] = time.Duration(u+st) * time.Second / 100
	}
	return times
}

func benchPerCAS(ctx context.Context, s *dedup.Store, recs []benchRec) error {
	for _, r := range recs {
		d, err := s.Check(ctx, "bench", r.entity, r.digest)
		if err != nil {
			return err
		}
		if d != r.want {
			return fmt.Errorf("entity %s: %v, want %v", r.entity, d, r.want)
		}
	}
	return nil
}

func benchBatches(ctx context.Context, s *dedup.Store, rule dedup.Rule, p dedup.Partition, epoch int64, next *int64, recs []benchRec, n int) error {
	b := &dedup.Batch{Service: "bench", Partition: p, Epoch: epoch, Rule: rule}
	var out []dedup.Decision
	for lo := 0; lo < len(recs); lo += n {
		hi := min(lo+n, len(recs))
		b.Start, b.End, b.Records = *next, *next+int64(hi-lo), b.Records[:0]
		for i, r := range recs[lo:hi] {
			b.Records = append(b.Records, dedup.Record{Offset: b.Start + int64(i), Entity: r.entity, Digest: r.digest, Version: r.version})
		}
		var err error
		if out, err = s.Decide(ctx, b, out); err != nil {
			return err
		}
		for i, d := range out {
			if d != recs[lo+i].want {
				return fmt.Errorf("entity %s: %v, want %v", recs[lo+i].entity, d, recs[lo+i].want)
			}
		}
		*next = b.End
	}
	return nil
}
