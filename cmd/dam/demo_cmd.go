package main

import (
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/dam-dedup/dam/config"
)

// The dam demo command: flags and wiring around runDemo.

func newDemoCmd() *cobra.Command {
	var (
		records  int
		entities int
		port     int
		dsn      string
		rate     int
		delivery string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the sidecar on embedded defaults (kfake broker, local PostgreSQL) and show duplicates dropping",
		Long: `demo starts franz-go's in-process Kafka broker (kfake) on a TCP port,
uses the local PostgreSQL (or starts a throwaway cluster), runs the real
sidecar over four services' projection topics, and feeds it a projection
stream of bananas: changes only some services see, key-order changes,
changes only in ignored fields, and bad records. It prints a live line and
ends with a per-service summary checked against a reference model. Any Kafka
client (kcat) can read the delivery topics while it runs.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if records < 0 || entities <= 0 {
				return usagef("--records must be >= 0 and --entities > 0")
			}
			if delivery != config.DeliveryAtLeastOnce && delivery != config.DeliveryExactlyOnce {
				return usagef("--delivery: want %s or %s, got %q", config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce, delivery)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runDemo(ctx, cmd.OutOrStdout(), demoOptions{records: records, entities: entities, port: port, dsn: dsn, rate: rate, delivery: delivery})
		},
	}
	cmd.Flags().IntVar(&records, "records", 0, "input records to send, then summarise and exit (0: until Ctrl-C)")
	cmd.Flags().IntVar(&entities, "entities", 500, "distinct bananas")
	cmd.Flags().IntVar(&port, "port", 0, "kfake broker port on 127.0.0.1 (0: any free port)")
	cmd.Flags().StringVar(&dsn, "dsn", "", "PostgreSQL DSN (default $DAM_POSTGRES_DSN, else the local server, else a throwaway cluster)")
	cmd.Flags().IntVar(&rate, "rate", 0, "entity events per second (0: as fast as possible with --records, 500 without)")
	cmd.Flags().StringVar(&delivery, "delivery", config.DeliveryAtLeastOnce, "at-least-once or exactly-once (read the delivery topics read_committed)")
	return cmd
}
