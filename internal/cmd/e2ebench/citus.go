package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/internal/pglocal"
	"github.com/dam-dedup/dam/internal/testutil/pgcitus"
	"github.com/dam-dedup/dam/tests/citusplan"
)

// The Citus comparison. dam-citus runs the current dam on a Citus cluster
// of its own (a coordinator and -citus-workers workers, pgcitus.Start,
// all on this machine); dam-single runs it on one throwaway server started
// with the same binaries and settings as each Citus node (durable commits,
// fsync off, full_page_writes off), so that the ratio measures the
// distribution, not the settings of the machine's shared server.
//
// Both targets are dedicated to the bench, so their PostgreSQL CPU is
// measured per node from /proc over the backlog phase: every process of
// the node (the postmaster, every backend, and the backends that exited
// meanwhile, through the postmaster's reaped-children time), less the
// background processes (checkpointer, background writer, WAL writer, the
// launchers, Citus's maintenance daemon) and the autovacuum workers. What
// is left is the backends: on the coordinator dam's sessions, on the
// workers the coordinator's connections (each opened and closed one
// included), and the postmaster's forks of them.

const (
	variantSingle = "dam-single"
	variantCitus  = "dam-citus"
)

// pgTarget is the PostgreSQL a variant runs against.
type pgTarget struct {
	dsn string // the server, or the Citus coordinator
	// nodes are the dedicated nodes whose processes are measured; none
	// for the shared server (the variant's backends are found by their
	// application name).
	nodes []pgNode
	// workers is the number of Citus workers (0: one server).
	workers int
	stop    func()
}

// pgNode is one PostgreSQL server of a target.
type pgNode struct {
	role       string // "server", "coordinator", "worker 1", ...
	dsn        string
	postmaster int
}

// dedicatedTarget starts the target of dam-single or dam-citus.
// cachedConns, when positive, is the coordinator's
// citus.max_cached_conns_per_worker (see -citus-cached-conns).
func dedicatedTarget(ctx context.Context, variant string, workers, cachedConns int) (*pgTarget, error) {
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	t := &pgTarget{}
	switch variant {
	case variantSingle:
		c, err := pglocal.Start(sctx, logf, pglocal.Durable())
		if err != nil {
			return nil, err
		}
		t.dsn, t.stop = c.DSN(), func() { logStop(c.Stop()) }
		t.nodes = []pgNode{{role: "server", dsn: c.DSN()}}
	case variantCitus:
		cc, err := pgcitus.Start(sctx, logf, workers)
		if err != nil {
			return nil, err
		}
		t.dsn, t.stop, t.workers = cc.DSN(), func() { logStop(cc.Stop()) }, workers
		t.nodes = []pgNode{{role: "coordinator", dsn: cc.DSN()}}
		for i, w := range cc.Workers() {
			t.nodes = append(t.nodes, pgNode{role: fmt.Sprintf("worker %d", i+1), dsn: w.DSN()})
		}
		if cachedConns > 0 {
			for _, sql := range []string{fmt.Sprintf("ALTER SYSTEM SET citus.max_cached_conns_per_worker = %d", cachedConns), "SELECT pg_reload_conf()"} {
				if err := execOn(sctx, cc.DSN(), sql); err != nil {
					t.stop()
					return nil, err
				}
			}
		}
	default:
		return nil, fmt.Errorf("no dedicated target for %s", variant)
	}
	for i := range t.nodes {
		pid, err := postmasterPID(sctx, t.nodes[i].dsn)
		if err != nil {
			t.stop()
			return nil, fmt.Errorf("%s: %w", t.nodes[i].role, err)
		}
		t.nodes[i].postmaster = pid
	}
	return t, nil
}

func logStop(err error) {
	if err != nil {
		logf("%v", err)
	}
}

// postmasterPID is the parent of a backend of the server at dsn.
func postmasterPID(ctx context.Context, dsn string) (int, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0, err
	}
	st, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	return st.ppid, nil
}

// checkpointAll checkpoints every node of the target (see freshSchema).
func (t *pgTarget) checkpointAll(ctx context.Context) error {
	for _, n := range t.nodes {
		if err := execOn(ctx, n.dsn, "CHECKPOINT"); err != nil {
			return fmt.Errorf("%s: %w", n.role, err)
		}
	}
	return nil
}

func execOn(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// walPositions is each node's current WAL position.
func (t *pgTarget) walPositions(ctx context.Context) []string {
	lsns := make([]string, len(t.nodes))
	for i, n := range t.nodes {
		lsns[i], _ = walLSN(ctx, n.dsn)
	}
	return lsns
}

// walSince sums the WAL every node wrote since from.
func (t *pgTarget) walSince(ctx context.Context, from []string) int64 {
	var total int64
	for i, n := range t.nodes {
		to, err := walLSN(ctx, n.dsn)
		if err != nil || from[i] == "" {
			continue
		}
		d, _ := walDiff(ctx, n.dsn, to, from[i])
		total += d
	}
	return total
}

// procStat is what cpu accounting needs of /proc/PID/stat.
type procStat struct {
	ppid int
	// own is the process's user+system time, reaped its waited-for
	// children's.
	own, reaped time.Duration
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("short /proc/%d/stat", pid)
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	tick := func(v int64) time.Duration { return time.Duration(v) * time.Second / 100 } // USER_HZ
	return procStat{ppid: int(n(1)), own: tick(n(11) + n(12)), reaped: tick(n(13) + n(14))}, nil
}

// procKind classifies a postmaster's child by its process title.
func procKind(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return "backend"
	}
	title := string(b)
	switch {
	case strings.Contains(title, "autovacuum worker"):
		return "autovacuum"
	case strings.Contains(title, "checkpointer"), strings.Contains(title, "background writer"),
		strings.Contains(title, "walwriter"), strings.Contains(title, "launcher"),
		strings.Contains(title, "archiver"), strings.Contains(title, "stats collector"),
		strings.Contains(title, "Citus Maintenance Daemon"):
		return "background"
	}
	return "backend"
}

// nodeSample is the CPU of a postmaster and its children at one instant.
type nodeSample struct {
	// total is the postmaster's own and reaped CPU plus every live
	// child's own and reaped: every process of the node, exited ones
	// included.
	total    time.Duration
	children map[int]childSample
}

type childSample struct {
	kind string
	cpu  time.Duration // own + reaped
}

func sampleNode(postmaster int) nodeSample {
	s := nodeSample{children: map[int]childSample{}}
	pm, err := readStat(postmaster)
	if err != nil {
		return s
	}
	s.total = pm.own + pm.reaped
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.ppid != postmaster {
			continue
		}
		c := childSample{kind: procKind(pid), cpu: st.own + st.reaped}
		s.children[pid] = c
		s.total += c.cpu
	}
	return s
}

// nodeCPU is a node's CPU over a window.
type nodeCPU struct {
	role                     string
	backends, background, av time.Duration
}

// cpuMeter samples every node of a target from start to stop: the
// samples in between follow the autovacuum workers, which come and go.
type cpuMeter struct {
	nodes []pgNode
	first []nodeSample
	mu    sync.Mutex
	// per node and child pid: the first and latest CPU seen, and whether
	// it was alive at the first sample.
	seen []map[int]*seenChild
	done chan struct{}
	wg   sync.WaitGroup
}

type seenChild struct {
	kind        string
	first, last time.Duration
}

func startCPUMeter(nodes []pgNode) *cpuMeter {
	m := &cpuMeter{nodes: nodes, done: make(chan struct{})}
	for range nodes {
		m.seen = append(m.seen, map[int]*seenChild{})
	}
	m.first = m.sample()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-tick.C:
				m.sample()
			}
		}
	}()
	return m
}

// sample samples every node, records its children and returns the samples.
func (m *cpuMeter) sample() []nodeSample {
	out := make([]nodeSample, len(m.nodes))
	for i, n := range m.nodes {
		out[i] = sampleNode(n.postmaster)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, s := range out {
		for pid, c := range s.children {
			if sc, ok := m.seen[i][pid]; ok {
				sc.last = c.cpu
				continue
			}
			first := time.Duration(0) // born after the first sample: all its CPU is in the window
			if m.first == nil {
				first = c.cpu
			}
			m.seen[i][pid] = &seenChild{kind: c.kind, first: first, last: c.cpu}
		}
	}
	return out
}

// stop takes the last sample and returns each node's CPU since the first.
func (m *cpuMeter) stop() []nodeCPU {
	close(m.done)
	m.wg.Wait()
	last := m.sample()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]nodeCPU, len(m.nodes))
	for i, n := range m.nodes {
		c := nodeCPU{role: n.role}
		for _, sc := range m.seen[i] {
			switch sc.kind {
			case "background":
				c.background += sc.last - sc.first
			case "autovacuum":
				c.av += sc.last - sc.first
			}
		}
		c.backends = last[i].total - m.first[i].total - c.background - c.av
		out[i] = c
	}
	return out
}

// citusUnavailable says why dam-citus cannot run, or nil.
func citusUnavailable() error { return pgcitus.Installed() }

// printCitus prints dam-single and dam-citus side by side: their rates
// (medians over their runs), ratio, CPU per record and latency.
func printCitus(w io.Writer, o options, rs []result, citus *pgTarget) {
	type agg struct {
		rates, damUS, pgUS, wal, p50, p99 []float64
		nodes                             map[string][]float64
		records                           int
		bg, av                            []float64
	}
	by := map[string]*agg{}
	var order []string
	for _, r := range rs {
		if r.variant != variantSingle && r.variant != variantCitus && r.variant != "dam" {
			continue
		}
		a := by[r.variant]
		if a == nil {
			a = &agg{nodes: map[string][]float64{}}
			by[r.variant] = a
			order = append(order, r.variant)
		}
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(r.records) }
		a.records = r.records
		a.rates = append(a.rates, r.rate())
		a.damUS = append(a.damUS, float64(r.cpu.Microseconds())/float64(r.records+r.steadyN))
		a.pgUS = append(a.pgUS, per(r.pgCPU))
		a.wal = append(a.wal, float64(r.walBytes)/float64(r.records))
		a.p50 = append(a.p50, r.steady.P50)
		a.p99 = append(a.p99, r.steady.P99)
		var bg, av time.Duration
		for _, n := range r.nodes {
			a.nodes[n.role] = append(a.nodes[n.role], per(n.backends))
			bg += n.background
			av += n.av
		}
		a.bg = append(a.bg, per(bg))
		a.av = append(a.av, per(av))
	}
	single, citusRuns := by[variantSingle], by[variantCitus]
	if single == nil || citusRuns == nil {
		return
	}
	conns := "Citus's default"
	if o.citusCachedConns > 0 {
		conns = strconv.Itoa(o.citusCachedConns)
	}
	fmt.Fprintf(w, "\non Citus: dam-citus = a coordinator and %d workers, %d shards per table, citus.max_cached_conns_per_worker %s, all on this machine's %d CPUs with dam and the broker; dam-single = one server with the same binaries and settings (medians over each variant's runs)\n",
		citus.workers, pgcitus.ShardCount, conns, runtime.NumCPU())
	fmt.Fprintf(w, "%-11s %5s %9s %10s %10s %9s %10s %9s %11s %11s\n", "variant", "runs", "records", "records/s", "vs single", "dam µs/r", "PG µs/r", "WAL B/r", "p50 steady", "p99 steady")
	base := median(single.rates)
	for _, v := range order {
		a := by[v]
		pg, wal := fmt.Sprintf("%.1f", median(a.pgUS)), fmt.Sprintf("%.0f", median(a.wal))
		if v == "dam" { // the shared server: its own backends, another configuration
			pg += "¹"
			wal += "¹"
		}
		fmt.Fprintf(w, "%-11s %5d %9d %10.0f %9.2fx %9.1f %10s %9s %11s %11s\n", v, len(a.rates), a.records, median(a.rates), median(a.rates)/base,
			median(a.damUS), pg, wal, ms(median(a.p50)), ms(median(a.p99)))
	}
	fmt.Fprintf(w, "dam-citus / dam-single: %.2fx records/s; PostgreSQL CPU per record %.2fx (%.1f vs %.1f µs)\n",
		median(citusRuns.rates)/base, median(citusRuns.pgUS)/median(single.pgUS), median(citusRuns.pgUS), median(single.pgUS))
	var parts []string
	for _, n := range citus.nodes {
		parts = append(parts, fmt.Sprintf("%s %.1f", n.role, median(citusRuns.nodes[n.role])))
	}
	fmt.Fprintf(w, "dam-citus PostgreSQL µs per record by node: %s; background processes %.1f and autovacuum %.1f not counted (dam-single: %.1f and %.1f)\n",
		strings.Join(parts, ", "), median(citusRuns.bg), median(citusRuns.av), median(single.bg), median(single.av))
	// The targets: the rate against one server on the same machine (the
	// medians), and the steady p50 of every Citus run (its worst shown).
	x, p50 := median(citusRuns.rates)/base, slices.Max(citusRuns.p50)
	fmt.Fprintln(w, "targets (dam-citus):")
	fmt.Fprintf(w, "  dam-citus >= 0.5x dam-single %6.2fx  %s  (records/s, medians)\n", x, verdict(x >= 0.5))
	if !math.IsNaN(p50) { // (no steady phase: -steady 0s)
		fmt.Fprintf(w, "  p50 (steady) < 50 ms %14s  %s  (the worst of its %d run(s))\n", ms(p50), verdict(p50 < 0.050), len(citusRuns.p50))
	}
	fmt.Fprintln(w, "PG µs/r of dam-single and dam-citus: every backend of every node over the backlog (those that exited included, and the postmaster's forks), from /proc; WAL B/r: summed over the nodes")
	if _, ok := by["dam"]; ok {
		fmt.Fprintln(w, "¹ dam on the shared server (fsync on, full_page_writes on): its own backends only; not comparable with the two rows below it")
	}
}

// printPlans prints how the Citus cluster runs each statement of dam's
// store (tests/citusplan).
func printPlans(ctx context.Context, w io.Writer, dsn string) {
	sts, err := citusplan.Capture(ctx, dsn, citusplan.Options{Logf: logf})
	if err != nil {
		logf("citusplan: %v", err)
		fmt.Fprintf(w, "statement plans on Citus: failed: %v\n", err)
		return
	}
	fmt.Fprintf(w, "\nstatements of dam's store on the same cluster (EXPLAIN (VERBOSE, COSTS OFF), a batch of 1000 records; tests/citusplan):\n")
	citusplan.Print(w, sts, false)
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
