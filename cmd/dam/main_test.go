package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// envExecDam makes the test binary run as dam itself (for tests that need
// a process of their own, e.g. to send it SIGTERM).
const envExecDam = "DAM_TEST_EXEC_DAM"

// TestMain gives the command tests a real PostgreSQL: the configured or
// local server, else a throwaway cluster; it fails loudly without one.
func TestMain(m *testing.M) {
	if os.Getenv(envExecDam) == "1" {
		os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	pgtest.Main(m)
}

// unsetDSN removes DAM_POSTGRES_DSN for the test (an empty value would
// override the file's postgres.dsn: set-but-empty is a value).
func unsetDSN(t *testing.T) {
	t.Helper()
	t.Setenv(envPostgresDSN, "") // registers the restore
	os.Unsetenv(envPostgresDSN)
}

// writeRunConfig writes a minimal valid configuration using dsn.
func writeRunConfig(t *testing.T, dsn, extra string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dam.yaml")
	body := "kafka:\n  brokers: [127.0.0.1:1]\n  group: g\npostgres:\n  dsn: \"" + dsn + "\"\nhttp:\n  listen: \"\"\n" +
		"routes:\n  - service: s\n    from: in\n    to: out\n" + extra
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// newDatabase creates a database for the test on the test server and
// returns its DSN; it is dropped after the test.
func newDatabase(t *testing.T) string {
	t.Helper()
	base, err := pgtest.Base()
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("dam_test_%d", time.Now().UnixNano())
	conn, err := pgx.Connect(context.Background(), base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	u.Path = "/" + name
	return u.String()
}

// runDam runs dam with args in this process, on an empty stdin, and
// returns its exit status, stdout and stderr.
func runDam(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// mustContain checks that out holds every want, runs of spaces counting as
// one (the text output is aligned in columns).
func mustContain(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	squeeze := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	for _, w := range wants {
		if !strings.Contains(squeeze(out), squeeze(w)) {
			t.Errorf("%s lacks %q:\n%s", what, w, out)
		}
	}
}

// runDamStdin is runDam with stdin.
func runDamStdin(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr strings.Builder
	code := run(args, strings.NewReader(stdin), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// deadline is ctx's deadline (zero without one).
func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// writeConfig writes text to dam.yaml in a fresh directory and returns
// its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dam.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// sidecarConfig is config.Default for one route s (in → out) on kc and
// the PostgreSQL at dsn (migrated at start), its HTTP endpoint on a free
// loopback port, retrying fast, validated.
func sidecarConfig(t *testing.T, kc *testkafka.Cluster, dsn string, mutate func(*config.Config)) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Kafka.Brokers, cfg.Kafka.Group = []string{kc.Addr()}, "g"
	// From the first offset: records produced before the group has joined
	// (under load it may join late) are decided too.
	cfg.Kafka.Start = config.StartEarliest
	cfg.Postgres.DSN = dsn
	cfg.Postgres.Migrate = true
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Pipeline.RetryMin, cfg.Pipeline.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	r := config.DefaultRoute()
	r.Service, r.From, r.To = "s", "in", "out"
	cfg.Routes = []config.Route{r}
	if mutate != nil {
		mutate(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startSidecar runs dam run's sidecar (runSidecar) on cfg until the end of
// the test, which requires it to stop cleanly, and returns the address of
// its HTTP endpoint once it listens, and its log (Info and above).
func startSidecar(t *testing.T, cfg config.Config) (addr string, logs *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- runSidecar(ctx, cfg, log, prometheus.NewRegistry(), &sidecarHooks{
			started: func(_ *pipeline.Pipeline, addr string) { addrc <- addr },
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("sidecar: %v", err)
		}
	})
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatalf("sidecar: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the sidecar did not start")
	}
	return addr, logs
}

// readyz is the sidecar's GET /readyz: its status and body.
func readyz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
