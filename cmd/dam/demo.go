package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/demo"
	"github.com/dam-dedup/dam/pipeline"
)

// The dam demo command: flags and wiring around package demo.

func newDemoCmd() *cobra.Command {
	o := demo.Options{PrintExplanation: printOffset}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the sidecar on embedded defaults (kfake broker, local PostgreSQL) and show duplicates dropping",
		Long: `demo starts franz-go's in-process Kafka broker (kfake) on a TCP port,
uses the local PostgreSQL (or starts a throwaway cluster), runs the real
sidecar over four services' projection topics, and feeds it a projection
stream of bananas: changes only some services see, key-order changes,
changes only in ignored fields, and bad records. It prints a live line and
a per-service summary checked against a reference model, and ends with one
banana of customer-1: a forwarded record, the duplicate dropped after it,
and dam explain's answer for the drop. Any Kafka client (kcat) can read the
delivery topics while it runs; to try dam run yourself, see dam playground.

Its state goes to a schema dam_demo, which each run drops and makes again:
on $DAM_POSTGRES_DSN or --dsn, a dam_demo schema that dam demo did not make
(it marks its own with a comment) is refused unless --yes.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Records < 0 || o.Entities <= 0 {
				return usagef("--records must be >= 0 and --entities > 0")
			}
			if o.Delivery != config.DeliveryAtLeastOnce && o.Delivery != config.DeliveryExactlyOnce {
				return usagef("--delivery: want %s or %s, got %q", config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce, o.Delivery)
			}
			if o.DSN == "" {
				o.DSN = os.Getenv(envPostgresDSN)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			err := demo.Run(ctx, cmd.OutOrStdout(), o, demoSidecar)
			if errors.Is(err, demo.ErrNotTheDemos) {
				return usagef("%v; --yes drops it", err)
			}
			return err
		},
	}
	cmd.Flags().IntVar(&o.Records, "records", 0, "input records to send, then summarise and exit (0: until Ctrl-C)")
	cmd.Flags().IntVar(&o.Entities, "entities", 500, "distinct bananas")
	cmd.Flags().IntVar(&o.Port, "port", 0, "kfake broker port on 127.0.0.1 (0: any free port)")
	cmd.Flags().StringVar(&o.DSN, "dsn", "", "PostgreSQL DSN (default $DAM_POSTGRES_DSN, else the local server, else a throwaway cluster)")
	cmd.Flags().IntVar(&o.Rate, "rate", 0, "entity events per second (0: as fast as possible with --records, 500 without)")
	cmd.Flags().BoolVar(&o.Yes, "yes", false, "drop a schema "+demo.Schema+" that dam demo did not make, and everything in it")
	cmd.Flags().StringVar(&o.Delivery, "delivery", config.DeliveryAtLeastOnce, "at-least-once or exactly-once (read the delivery topics read_committed)")
	return cmd
}

// demoSidecar runs dam run's sidecar for the demo, with the demo's logger
// and Kafka options.
func demoSidecar(ctx context.Context, cfg config.Config, reg *prometheus.Registry, started func(string), kafka ...kgo.Opt) error {
	log, err := newLogger(cfg.Log)
	if err != nil {
		return err
	}
	return runSidecar(ctx, cfg, log, reg, &sidecarHooks{
		started:      func(_ *pipeline.Pipeline, addr string) { started(addr) },
		pipelineOpts: []pipeline.Option{pipeline.WithKafkaOptions(kafka...)},
	})
}
