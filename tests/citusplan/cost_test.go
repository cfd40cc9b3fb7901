package citusplan

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pglocal"
	"github.com/dam-dedup/dam/internal/testutil/pgcitus"
	"github.com/dam-dedup/dam/migrations"
)

// TestDecideCost measures what one decide costs PostgreSQL, by batch size,
// on one server and on a Citus cluster of two workers (Citus's default
// connection caching, then citus.max_cached_conns_per_worker = 4): the CPU
// of every process of each node (all dedicated to the test) per decide, and
// the connections each decide made the coordinator open to the workers.
// The decides run one at a time on one partition, on tables analyzed after
// a first batch. It prints a table (docs/performance.md, On Citus): the
// times are the machine's. What it checks is the connections: a decide on
// Citus, routed by shard, reuses the connections the coordinator keeps to
// the workers (even with Citus's default of one cached per worker), so it
// opens none: each new one costs the workers a backend fork, a TLS
// handshake and a cold cache, 10 to 15 ms of CPU a decide.
func TestDecideCost(t *testing.T) {
	if os.Getenv("DAM_TEST_CITUS") != "1" {
		t.Skip("DAM_TEST_CITUS=1 runs it on throwaway servers (make test-citus installs Citus)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var b strings.Builder
	fmt.Fprintln(&b, "| target | batch | wall ms/decide | CPU ms/decide by node | CPU µs/record, all nodes | new worker sessions/decide |")
	fmt.Fprintln(&b, "|---|---:|---:|---|---:|---:|")
	for _, target := range []string{"one server", "Citus, 2 workers", "Citus, 2 workers, cached conns 4"} {
		var dsns, roles []string
		var stop func() error
		if target == "one server" {
			c, err := pglocal.Start(ctx, t.Logf, pglocal.Durable())
			if err != nil {
				t.Fatal(err)
			}
			dsns, roles, stop = []string{c.DSN()}, []string{"server"}, c.Stop
		} else {
			cc, err := pgcitus.Start(ctx, t.Logf, 2)
			if err != nil {
				t.Fatal(err)
			}
			dsns, roles, stop = []string{cc.DSN()}, []string{"coordinator"}, cc.Stop
			for i, w := range cc.Workers() {
				dsns, roles = append(dsns, w.DSN()), append(roles, fmt.Sprintf("worker %d", i+1))
			}
			if strings.HasSuffix(target, "cached conns 4") {
				for _, sql := range []string{"ALTER SYSTEM SET citus.max_cached_conns_per_worker = 4", "SELECT pg_reload_conf()"} {
					if err := exec(ctx, dsns[0], sql); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		decideCost(ctx, t, &b, target, dsns, roles)
		if err := stop(); err != nil {
			t.Log(err)
		}
	}
	t.Log("\n" + b.String())
}

func decideCost(ctx context.Context, t *testing.T, w *strings.Builder, target string, dsns, roles []string) {
	conn, err := pgx.Connect(ctx, dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := migrations.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	var pms []int
	for _, d := range dsns {
		pm, err := postmaster(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		pms = append(pms, pm)
	}
	s, err := dedup.Open(ctx, dsns[0], dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := dedup.Partition{Group: "g", Topic: "t", Partition: 0}
	pr, err := s.Acquire(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.InitProgress(ctx, p, pr.Epoch, 0); err != nil {
		t.Fatal(err)
	}
	next, entity := int64(0), 0
	decide := func(n int) {
		b := &dedup.Batch{Service: "s", Partition: p, Epoch: pr.Epoch, Start: next, End: next + int64(n)}
		for k := range n {
			var d canon.Digest
			copy(d[:], fmt.Sprintf("digest-%d", next+int64(k)))
			b.Records = append(b.Records, dedup.Record{Offset: next + int64(k), Entity: fmt.Appendf(nil, "entity-%06d", entity%100000), Digest: d})
			entity++
		}
		if _, err := s.Decide(ctx, b, nil); err != nil {
			t.Fatal(err)
		}
		next = b.End
	}
	decide(5000)
	if err := exec(ctx, dsns[0], "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 100, 1000, 10000} {
		reps := max(5, min(200, 20000/n))
		cpu0, sess0 := make([]time.Duration, len(pms)), sessions(ctx, t, dsns)
		for i, pm := range pms {
			cpu0[i] = nodeCPUTotal(pm)
		}
		t0 := time.Now()
		for range reps {
			decide(n)
		}
		wall := time.Since(t0)
		sess1 := sessions(ctx, t, dsns)
		var parts []string
		var total time.Duration
		for i, pm := range pms {
			d := nodeCPUTotal(pm) - cpu0[i]
			total += d
			parts = append(parts, fmt.Sprintf("%s %.2f", roles[i], ms(d)/float64(reps)))
		}
		var opened int64
		for i := 1; i < len(dsns); i++ {
			opened += sess1[i] - sess0[i] - 1 // the count's own session
		}
		fmt.Fprintf(w, "| %s | %d | %.2f | %s | %.1f | %.2f |\n", target, n, ms(wall)/float64(reps), strings.Join(parts, ", "),
			float64(total.Microseconds())/float64(reps*n), float64(opened)/float64(reps))
		if opened > 0 {
			t.Errorf("%s, batches of %d: %d decides made the coordinator open %d connections to the workers; want none (each decide's router statements reuse the cached ones)", target, n, reps, opened)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func exec(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// sessions is the number of sessions each node's postgres database has
// had (pg_stat_database.sessions; the query's own included).
func sessions(ctx context.Context, t *testing.T, dsns []string) []int64 {
	var out []int64
	for _, d := range dsns {
		conn, err := pgx.Connect(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		err = conn.QueryRow(ctx, `SELECT sessions FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

func postmaster(ctx context.Context, dsn string) (int, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0, err
	}
	ppid, _, _ := stat(pid)
	return ppid, nil
}

// stat reads /proc/PID/stat: the parent, the process's own CPU and its
// reaped children's.
func stat(pid int) (ppid int, own, reaped time.Duration) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1, 0, 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 15 {
		return -1, 0, 0
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	tick := func(v int64) time.Duration { return time.Duration(v) * time.Second / 100 } // USER_HZ
	return int(n(1)), tick(n(11) + n(12)), tick(n(13) + n(14))
}

// nodeCPUTotal is the CPU of every process of the server whose postmaster
// is pm, exited backends included (the postmaster's reaped time).
func nodeCPUTotal(pm int) time.Duration {
	_, own, reaped := stat(pm)
	total := own + reaped
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, own, reaped := stat(pid); ppid == pm {
			total += own + reaped
		}
	}
	return total
}
