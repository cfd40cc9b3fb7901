package damproc_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/internal/testutil/damproc"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// serveConfig writes a `dam serve` configuration listening on addr.
func serveConfig(t *testing.T, dsn, addr string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "serve.yaml")
	cfg := fmt.Sprintf("postgres:\n  dsn: %q\n  migrate: true\nserve:\n  listen: %s\nroutes:\n  - service: s\n    from: in\n    to: out\n", dsn, addr)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestProcessLifecycle builds dam once for two callers, starts `dam
// serve`, waits until it is ready, scrapes a gauge from /metrics, and
// stops it with SIGTERM: it exits 0, unkilled, its log in the file.
func TestProcessLifecycle(t *testing.T) {
	o := damproc.BuildOptions{LDFlags: "-X main.version=v0.0.0-damproc"}
	bin, err := damproc.Build(o)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := damproc.Build(o); err != nil || again != bin {
		t.Fatalf("a second Build: %q, %v; want the first binary %q", again, err, bin)
	}
	addr, err := damproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p, err := damproc.Start(damproc.Options{
		Args: []string{bin, "serve", "--config", serveConfig(t, pgtest.DSN(t), addr)},
		Env:  []string{"DAM_SERVE_TOKEN=damproc-test-token-0123456789"},
		Log:  filepath.Join(t.TempDir(), "serve.log"),
		HTTP: addr,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.WaitReady(ctx, time.Minute); err != nil {
		p.Kill()
		t.Fatalf("%v\n%s", err, p.Tail(30))
	}
	m, err := p.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Has("dam_serve_in_flight") {
		t.Errorf("the scrape has no dam_serve_in_flight: %v", m.SampleNames())
	}
	if exited, _ := p.Exited(); exited {
		t.Fatal("exited while serving")
	}
	took, killed, err := p.Stop(30 * time.Second)
	if err != nil || killed {
		t.Fatalf("SIGTERM: exit %v, killed %v after %s; want a clean exit\n%s", err, killed, took, p.Tail(30))
	}
	if exited, err := p.Exited(); !exited || err != nil {
		t.Errorf("after Stop: exited %v, %v", exited, err)
	}
	if p.Tail(0) == "" {
		t.Error("the log file is empty")
	}
}

// TestWaitReadyFailsWhenTheProcessExits: a dam that cannot start (its
// configuration names no file) ends WaitReady at once with its exit, not
// after the limit.
func TestWaitReadyFailsWhenTheProcessExits(t *testing.T) {
	bin, err := damproc.Build(damproc.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := damproc.FreeAddr()
	p, err := damproc.Start(damproc.Options{Args: []string{bin, "serve", "--config", filepath.Join(t.TempDir(), "missing.yaml")}, HTTP: addr})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = p.WaitReady(context.Background(), time.Minute)
	if err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("WaitReady: %v; want an error saying it exited", err)
	}
	if time.Since(start) > 30*time.Second {
		t.Errorf("WaitReady took %s to see the exit", time.Since(start))
	}
}

// TestMetrics reads counters, gauges and a histogram from an exposition:
// sums over the series whose labels match, _sum and _count as names,
// buckets summed over the series.
func TestMetrics(t *testing.T) {
	const text = `# TYPE dam_records_total counter
dam_records_total{service="a",outcome="forwarded"} 3
dam_records_total{service="a",outcome="duplicate"} 4
dam_records_total{service="b",outcome="forwarded"} 5
# TYPE dam_halted gauge
dam_halted{service="a"} 1
# TYPE dam_poll_to_commit_seconds histogram
dam_poll_to_commit_seconds_bucket{service="a",le="0.01"} 1
dam_poll_to_commit_seconds_bucket{service="a",le="0.1"} 3
dam_poll_to_commit_seconds_bucket{service="a",le="+Inf"} 4
dam_poll_to_commit_seconds_sum{service="a"} 0.5
dam_poll_to_commit_seconds_count{service="a"} 4
dam_poll_to_commit_seconds_bucket{service="b",le="0.01"} 2
dam_poll_to_commit_seconds_bucket{service="b",le="0.1"} 2
dam_poll_to_commit_seconds_bucket{service="b",le="+Inf"} 2
dam_poll_to_commit_seconds_sum{service="b"} 0.01
dam_poll_to_commit_seconds_count{service="b"} 2
`
	m, err := damproc.Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"dam_records_total", nil, 12},
		{"dam_records_total", []string{"service", "a"}, 7},
		{"dam_records_total", []string{"service", "a", "outcome", "forwarded"}, 3},
		{"dam_records_total", []string{"service", "c"}, 0},
		{"dam_halted", nil, 1},
		{"dam_poll_to_commit_seconds_count", nil, 6},
		{"dam_poll_to_commit_seconds_sum", []string{"service", "b"}, 0.01},
		{"dam_missing", nil, 0},
	} {
		if got := m.Sum(c.name, c.labels...); got != c.want {
			t.Errorf("Sum(%s, %v) = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	h := m.Histogram("dam_poll_to_commit_seconds")
	if fmt.Sprint(h.Bounds) != "[0.01 0.1 +Inf]" || fmt.Sprint(h.Counts) != "[3 5 6]" {
		t.Errorf("Histogram = %v %v, want [0.01 0.1 +Inf] [3 5 6]", h.Bounds, h.Counts)
	}
	names := m.SampleNames()
	for _, n := range []string{"dam_records_total", "dam_halted", "dam_poll_to_commit_seconds_bucket", "dam_poll_to_commit_seconds_count"} {
		if !names[n] || !m.Has(n) {
			t.Errorf("sample name %s: missing", n)
		}
	}
}

// TestBuildRemovesOnlyExitedProcessesBuilds: a build directory of a
// process that has exited is removed by the next Build; one of a live
// process (this one) is kept.
func TestBuildRemovesOnlyExitedProcessesBuilds(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale, err := os.MkdirTemp("", fmt.Sprintf("damproc-%d-", dead.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	live, err := os.MkdirTemp("", fmt.Sprintf("damproc-%d-", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(live)
	if _, err := damproc.Build(damproc.BuildOptions{LDFlags: "-X main.version=v0.0.0-stale"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		os.RemoveAll(stale)
		t.Errorf("the exited process's %s is still there: %v", stale, err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the live process's %s: %v", live, err)
	}
}
