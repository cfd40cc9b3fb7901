package main

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

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
