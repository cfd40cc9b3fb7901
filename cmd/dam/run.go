package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/retry"
	"github.com/dam-dedup/dam/migrations"
	"github.com/dam-dedup/dam/pipeline"
)

func newRunCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the sidecar: consume, decide, deliver, commit",
		Long: `Run the sidecar with the configuration in --config (YAML, overlaid by
DAM_* environment variables). SIGTERM or SIGINT finishes the batches in
flight, commits, leaves the group and exits 0.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			log, err := newLogger(cfg.Log)
			if err != nil {
				return usagef("%v", err)
			}
			defer func() { _ = log.Sync() }()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runSidecar(ctx, cfg, log, prometheus.NewRegistry(), nil)
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "dam.yaml", "configuration file")
	return cmd
}

// newLogger builds the process logger from log.level and log.format.
func newLogger(c config.Log) (*zap.Logger, error) {
	zc, err := loggerConfig(c)
	if err != nil {
		return nil, err
	}
	return zc.Build()
}

// loggerConfig is newLogger's zap configuration.
func loggerConfig(c config.Log) (zap.Config, error) {
	level, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return zap.Config{}, fmt.Errorf("log.level: %w", err)
	}
	zc := zap.NewProductionConfig()
	if c.Format == "console" {
		zc = zap.NewDevelopmentConfig()
		zc.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.DisableStacktrace = true
	// ISO 8601 (with milliseconds and the zone), not an epoch float:
	// what people and log stores read.
	zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return zc, nil
}

// sidecarHooks lets the demo observe a running sidecar.
type sidecarHooks struct {
	// started is called once the HTTP listener and the pipeline exist.
	started func(pl *pipeline.Pipeline, httpAddr string)
	// pipelineOpts are extra pipeline options.
	pipelineOpts []pipeline.Option
}

// runSidecar runs the pipeline and the HTTP server (/metrics, /healthz,
// /readyz) until ctx is canceled or one of them fails.
func runSidecar(ctx context.Context, cfg config.Config, log *zap.Logger, reg *prometheus.Registry, hooks *sidecarHooks) error {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newBuildInfo())
	log = log.With(zap.String("group", cfg.Kafka.Group))

	if err := checkKafka(ctx, cfg, log); err != nil {
		return err
	}

	if err := schemaWithRetry(ctx, cfg, log); err != nil {
		return err
	}
	store, err := dedup.Open(ctx, cfg.Postgres.DSN, dedup.Config{
		MaxConns:                 cfg.Postgres.MaxConns,
		StatementTimeout:         cfg.Postgres.StatementTimeout,
		LockTimeout:              cfg.Postgres.LockTimeout,
		IdleInTransactionTimeout: cfg.Postgres.IdleInTransactionTimeout,
	})
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer store.Close()
	reg.MustRegister(store.PoolCollector())

	opts := []pipeline.Option{pipeline.WithLogger(log), pipeline.WithRegisterer(reg)}
	if hooks != nil {
		opts = append(opts, hooks.pipelineOpts...)
	}
	if pause, err := pauseHook(log); err != nil {
		return usageError{err}
	} else if pause != nil {
		opts = append(opts, pause)
	}
	pl, err := pipeline.New(cfg, store, opts...)
	if err != nil {
		return usageError{err}
	}
	obs, err := newSidecarViews(cfg.HTTP.Tap, pl, log) // /v1/status, /v1/tap (tap.go)
	if err != nil {
		return usageError{err}
	}

	g, gctx := errgroup.WithContext(ctx)
	var srv *http.Server
	addr := ""
	if cfg.HTTP.Listen != "" {
		ln, err := net.Listen("tcp", cfg.HTTP.Listen)
		if err != nil {
			return fmt.Errorf("http.listen: %w", err)
		}
		addr = ln.Addr().String()
		srv = newHTTPServer(obs.mount(httpHandler(reg, pl, log)), sidecarHTTP, log)
		g.Go(func() error {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("http: %w", err)
			}
			return nil
		})
		log.Info("http listening", zap.String("addr", addr), zap.String("listen", cfg.HTTP.Listen),
			zap.String("interfaces", listenInterfaces(cfg.HTTP.Listen)))
	}
	pipeCtx, stopPipe := context.WithCancel(gctx)
	defer stopPipe()
	g.Go(func() error {
		err := pl.Run(pipeCtx)
		// The pipeline is the process: once it has stopped, so does HTTP.
		obs.close()
		if srv != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}
		return err
	})
	if hooks != nil && hooks.started != nil {
		hooks.started(pl, addr)
	}
	if err := g.Wait(); errors.Is(err, pipeline.ErrConfig) {
		return usageError{err} // the cluster contradicts the configuration
	} else {
		return err
	}
}

// listenInterfaces says which interfaces a listen address binds: "all"
// (no host, 0.0.0.0 or [::]: the default, right in a container, where
// the pod's network is the boundary; set a host to narrow it),
// "loopback", or "one" (the address's host).
func listenInterfaces(listen string) string {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return "unknown"
	}
	ip := net.ParseIP(host)
	switch {
	case host == "" || ip != nil && ip.IsUnspecified():
		return "all"
	case host == "localhost" || ip != nil && ip.IsLoopback():
		return "loopback"
	}
	return "one"
}

// httpTimeouts bound every phase of an HTTP connection, so that no client
// (a slow reader of /metrics, an idle keep-alive connection, a trickled
// header) holds one for good.
type httpTimeouts struct {
	header, read, write, idle time.Duration
}

// sidecarHTTP are the timeouts of the sidecar's /metrics, /healthz and
// /readyz (GET requests without a body; /metrics may be large with many
// partitions). A variable so that a test can shorten them.
var sidecarHTTP = httpTimeouts{header: 5 * time.Second, read: 10 * time.Second, write: 30 * time.Second, idle: 2 * time.Minute}

// newHTTPServer returns a server of h with the timeouts t and small
// request headers (16 KiB).
func newHTTPServer(h http.Handler, t httpTimeouts, log *zap.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.header,
		ReadTimeout:       t.read,
		WriteTimeout:      t.write,
		IdleTimeout:       t.idle,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}
}

// checkKafka asks the brokers for metadata before anything starts. A
// broker refusing dam (TLS handshake, SASL credentials) or a kafka.tls file
// that cannot be used is a configuration problem no retry fixes: dam exits,
// naming it. Unreachable brokers are waited for by the pipeline, not ready
// meanwhile, as during any outage.
func checkKafka(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err := pipeline.CheckBrokers(cctx, cfg.Kafka)
	var ce *config.Error
	var ae *pipeline.AuthError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return usageError{err}
	case errors.As(err, &ae):
		return err
	case ctx.Err() != nil:
		return ctx.Err()
	}
	log.Warn("no Kafka broker answers yet: starting, not ready until one does", zap.Error(err))
	return nil
}

// httpHandler serves /metrics, /healthz (the process is up) and /readyz
// (the pipeline is making progress; 503 with the reason otherwise).
// /readyz is unauthenticated: it answers the reason in fixed words (what
// kind of stop, on which partition), never the detail: PostgreSQL's and
// Kafka's errors name hosts, users and databases. The detail is logged
// when the reason changes (however often /readyz is asked).
func httpHandler(reg *prometheus.Registry, pl *pipeline.Pipeline, log *zap.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	var (
		mu   sync.Mutex
		last string // the reason last logged; "" for ready
	)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		err := pl.Ready()
		reason := ""
		if err != nil {
			reason = "unknown"
			if ne := (*pipeline.NotReadyError)(nil); errors.As(err, &ne) {
				reason = ne.Reason
			}
		}
		mu.Lock()
		if reason != last {
			if err != nil {
				log.Warn("readyz: not ready", zap.String("reason", reason), zap.Error(err))
			} else {
				log.Info("readyz: ready")
			}
			last = reason
		}
		mu.Unlock()
		if err != nil {
			http.Error(w, pipeline.ErrNotReady.Error()+": "+reason+" (the log has the detail)", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}

// schemaWithRetry makes sure at start that the schema is the version this
// binary knows: it applies the migrations when postgres.migrate allows,
// and refuses a schema newer than it knows (whatever postgres.migrate
// says) or older (when it may not migrate), naming both versions. It
// waits with capped backoff while PostgreSQL is unreachable. Any other
// error (a wrong password, a migration that does not apply, a version
// mismatch) needs a person: it is returned at once, and dam exits saying
// so.
func schemaWithRetry(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	pol := retry.Policy{Min: cfg.Pipeline.RetryMin, Max: cfg.Pipeline.RetryMax}
	migrated := false
	err := retry.Run(ctx, pol, func(err error, wait time.Duration) {
		log.Warn("postgres: unreachable while checking the schema; retrying", zap.Duration("retry_in", wait), zap.Error(err))
	}, func() error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(cctx, cfg.Postgres.DSN)
		if err == nil {
			defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
			err = migrations.Check(ctx, conn)
			if errors.Is(err, migrations.ErrOlder) && cfg.Postgres.Migrate {
				migrated = true
				if err = migrations.Up(ctx, conn); err == nil {
					err = migrations.Check(ctx, conn)
				}
			}
		}
		if err != nil && !dedup.Transient(err) {
			return retry.Permanent(err)
		}
		return err
	})
	if err != nil && ctx.Err() == nil {
		if migrated && !errors.Is(err, migrations.ErrNewer) && !errors.Is(err, migrations.ErrOlder) {
			return fmt.Errorf("postgres: migrating the schema: %w", err)
		}
		return fmt.Errorf("postgres: %w", err)
	}
	return err
}
