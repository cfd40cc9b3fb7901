package main

import (
	"errors"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/dam-dedup/dam/internal/demo"
)

// The dam playground command: flags and wiring around demo.Playground.

func newPlaygroundCmd() *cobra.Command {
	o := demo.PlaygroundOptions{Load: loadConfig}
	var partitions int
	cmd := &cobra.Command{
		Use:   "playground [--dir DIR] [--listen HOST:PORT]",
		Short: "Run a local Kafka broker (kfake) with a ready dam.yaml, to try dam run, explain, state and serve",
		Long: `playground runs franz-go's in-process Kafka broker (kfake) on --listen until
Ctrl-C or SIGTERM, so that dam run, dam explain, dam state and dam serve can
be tried on this machine with any Kafka client (kcat).

In --dir it writes, when missing, a dam.yaml for the broker: one route,
emails (projections.emails -> delivery.emails, dead letters to
delivery.emails.dlq, /updated_at ignored), and the local PostgreSQL (or
--dsn), which must answer, in the schema dam_playground. It never rewrites
it: edit it, and restart the playground to make the topics of new routes.
It also writes kcat.conf (kcat -F kcat.conf) and keeps the broker's records
in DIR/kafka across restarts.

The broker holds the topics of the configuration's routes; any other topic
is made on first use (a kcat producer makes it). With --config the broker
serves another configuration's topics, and dam.yaml is not written.

When the broker starts afresh (no DIR/kafka), the schema the configuration's
DSN selects (search_path) is dropped and made again, since state about
another broker's records would make dam drop or halt: only a schema
dam playground made (marked with a comment), else --yes is needed. It is
left alone when the configuration's kafka.brokers does not name --listen.

The broker tells its clients to connect to --listen: give an address they
reach (the default is loopback only).`,
		Example: `  dam playground
  dam playground --dir /tmp/pg --listen 127.0.0.1:19092
  dam playground --config my.yaml`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			host, _, err := net.SplitHostPort(o.Listen)
			if err != nil {
				return usagef("--listen %q: want HOST:PORT: %v", o.Listen, err)
			}
			if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
				return usagef("--listen %q: the broker tells its clients to connect to this address: name one they reach (127.0.0.1:9092, or this host's address), not all interfaces", o.Listen)
			}
			if partitions < 1 || partitions > 1000 {
				return usagef("--partitions must be between 1 and 1000")
			}
			o.Partitions = int32(partitions)
			if o.DSN == "" {
				o.DSN = os.Getenv(envPostgresDSN)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			err = demo.Playground(ctx, cmd.OutOrStdout(), o)
			switch {
			case errors.Is(err, demo.ErrForeignConfig):
				return usagef("%v: give it with --config to serve its topics, or choose another --dir", err)
			case errors.Is(err, demo.ErrNotThePlaygrounds):
				return usageError{err}
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Dir, "dir", ".", "the playground's `directory`: dam.yaml, kcat.conf and the broker's records (kafka/)")
	fl.StringVar(&o.Listen, "listen", playgroundListen(), "the broker's `address`")
	fl.StringVarP(&o.Config, "config", "c", "", "serve this configuration's topics instead of DIR/dam.yaml's (written when missing)")
	fl.StringVar(&o.DSN, "dsn", "", "PostgreSQL DSN that a new dam.yaml names, in the schema "+demo.PlaygroundSchema+" (default $DAM_POSTGRES_DSN, else the local server, "+demo.DefaultDSN+")")
	fl.IntVar(&partitions, "partitions", 1, "partitions of each topic the playground makes")
	fl.BoolVar(&o.Yes, "yes", false, "on a new broker, drop the configuration's schema even if dam playground did not make it")
	return cmd
}

// defaultPlaygroundListen is the broker's address by default: Kafka's port,
// on loopback only.
const defaultPlaygroundListen = "127.0.0.1:9092"

// envPlaygroundListen is the test suite's default of dam playground's
// --listen (the tutorial's test gives a free port, so that the tutorial's
// commands run as written beside other brokers). Like every DAM_TEST_
// variable it belongs to the test suite: only a dam built with -tags
// damtest reads it (playground_hook.go).
const envPlaygroundListen = "DAM_TEST_PLAYGROUND_LISTEN"
