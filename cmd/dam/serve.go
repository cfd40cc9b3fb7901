package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/serve"
)

func newServeCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the synchronous check service (HTTP): forward or duplicate?",
		Long: `Serve the check API on serve.listen (default :8080): POST /v1/check answers
whether a payload is a change ("forward") or a duplicate for a (service,
entity), on the same PostgreSQL state and with the same semantics as the
sidecar (a service's route options hash its payloads). Also
POST /v1/check:batch, GET and DELETE /v1/state/{service}/{entity}, and the
service's own /metrics, /healthz and /readyz.

Kafka settings and routes are optional here; at least one token is
required (serve.tokens, or DAM_SERVE_TOKEN for every service). SIGTERM or
SIGINT lets the requests in flight finish and exits 0.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.LoadServe(path, os.Environ())
			if err != nil {
				return usageError{configError{path: path, err: err}}
			}
			log, err := newLogger(cfg.Log)
			if err != nil {
				return usagef("%v", err)
			}
			defer func() { _ = log.Sync() }()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runServe(ctx, cfg, log)
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "dam.yaml", "configuration file")
	return cmd
}

// runServe runs the check service until ctx is canceled.
func runServe(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newBuildInfo())
	if err := schemaWithRetry(ctx, cfg, log); err != nil {
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
	store, err := dedup.Open(ctx, cfg.Postgres.DSN, dedup.Config{
		MaxConns:                 cfg.Postgres.MaxConns,
		StatementTimeout:         cfg.Postgres.StatementTimeout,
		LockTimeout:              cfg.Postgres.LockTimeout,
		IdleInTransactionTimeout: cfg.Postgres.IdleInTransactionTimeout,
		ApplicationName:          "dam-serve",
	})
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer store.Close()
	srv, err := serve.New(cfg, store, serve.WithLogger(log), serve.WithRegistry(reg))
	if err != nil {
		return usageError{err}
	}
	ln, err := net.Listen("tcp", cfg.Serve.Listen)
	if err != nil {
		return fmt.Errorf("serve.listen: %w", err)
	}
	log.Info("serve: listen", zap.String("listen", cfg.Serve.Listen), zap.String("interfaces", listenInterfaces(cfg.Serve.Listen)))
	return srv.Run(ctx, ln)
}
