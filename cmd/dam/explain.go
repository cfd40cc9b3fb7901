package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/explain"
	"github.com/dam-dedup/dam/pipeline"
)

func newExplainCmd() *cobra.Command {
	var (
		path      string
		isHex     bool
		headers   []string
		topic     string
		partition int32
		offset    int64
		lookback  int64
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "explain --config FILE (SERVICE ENTITY [PAYLOAD_FILE|-] | --topic T --partition P --offset O)",
		Short: "Say why a record was (or would be) forwarded or dropped",
		Long: `Explain a decision under the route's mode (last-seen, window or version),
reading the state, the decision log and Kafka; it changes nothing. Windows
and refreshes are measured on the database's clock, as the sidecar does.

With SERVICE ENTITY [PAYLOAD_FILE|-]: would this payload be forwarded now?
ENTITY is the identity: the entity, or in window mode the message id. The
payload's record has ENTITY as its key and, when the route reads its
identity from a header, in that header; other headers (a version in a
header) are given with --header. Prints the stored state in the route's
mode (the digest, when and from which input record it was set; the
version; the window's expiry), the payload's digest under the route's own
options, the decision (forward, refresh, duplicate, stale or invalid: bad
input, with the reason), and when the content differs from the stored
content the first structural difference, taken from the stored content
read back from Kafka at its source offset (or "stored content no longer
readable"). Without a payload it shows the stored state and what the
route's rule makes of it.

With --topic, --partition and --offset: reads that input record and says
what dam decided for it and why ("duplicate of the content forwarded from
offset N at T", "stale: its version 5 is below the version 7 ...", for a
forward the change that made it differ). It answers from the decision log
while it still covers the offset (it is pruned below the group's committed
offset), otherwise from the state and the input before the offset, and
says which.`,
		Example: `  dam explain --config dam.yaml customer-2 B-007 payload.json
  kcat -C -t projections.customer-2 -p 0 -o 1240 -c 1 -e | dam explain -c dam.yaml customer-2 B-007 -
  dam explain --config dam.yaml orders O-1 order.json --header Version=8
  dam explain --config dam.yaml --topic projections.customer-2 --partition 0 --offset 1240 -o json`,
		Args:                  argsUsage(cobra.MaximumNArgs(3)),
		DisableFlagsInUseLine: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := outputJSON(cmd)
			if err != nil {
				return err
			}
			byOffset := cmd.Flags().Changed("topic") || cmd.Flags().Changed("partition") || cmd.Flags().Changed("offset")
			switch {
			case byOffset && len(args) > 0:
				return usagef("explain: give SERVICE ENTITY [PAYLOAD] or --topic/--partition/--offset, not both")
			case byOffset && (topic == "" || !cmd.Flags().Changed("partition") || !cmd.Flags().Changed("offset")):
				return usagef("explain: --topic, --partition and --offset go together")
			case byOffset && (partition < 0 || offset < 0):
				return usagef("explain: --partition and --offset must not be negative")
			case !byOffset && len(args) < 2:
				return usagef("explain: give SERVICE ENTITY [PAYLOAD_FILE|-], or --topic, --partition and --offset")
			case len(headers) > 0 && len(args) < 3:
				return usagef("explain: --header goes with a PAYLOAD_FILE: it is a header of the payload's record")
			}
			if lookback < 0 {
				return usagef("explain: --lookback must not be negative")
			}
			hdrs, err := parseHeaders(headers)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			// By offset, the route reading the topic; else the service's, if
			// any (without one, explained as dam serve's checks decide).
			route, err := compiledRoute(cfg, func(r config.Route) bool {
				return byOffset && r.From == topic || !byOffset && r.Service == args[0]
			})
			if err != nil {
				return err
			}
			if byOffset && route == nil {
				return usagef("no route of the configuration reads topic %q", topic)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			store, err := dedup.Open(ctx, cfg.Postgres.DSN, dedup.Config{MaxConns: 2, ApplicationName: "dam-explain"})
			if err != nil {
				return fmt.Errorf("postgres: %w", err)
			}
			defer store.Close()
			if err := store.Ping(ctx); err != nil {
				return fmt.Errorf("postgres %s: %w", config.RedactDSN(cfg.Postgres.DSN), err)
			}
			if err := checkSchema(ctx, store); err != nil {
				return err
			}
			kopts, err := pipeline.KafkaOptions(cfg.Kafka)
			if err != nil {
				return usageError{err}
			}
			kc, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Kafka.Brokers...), kgo.ClientID(cfg.Kafka.ClientID + "-explain")}, kopts...)...)
			if err != nil {
				return fmt.Errorf("kafka: %w", err)
			}
			defer kc.Close()
			ex := explain.New(store, kc, cfg.Kafka.Group, explain.WithLookback(lookback),
				explain.WithMaxDecompressedBatch(cfg.Pipeline.MaxDecompressedBatchBytes))
			out := cmd.OutOrStdout()
			if byOffset {
				res, err := ex.Offset(ctx, route, partition, offset)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(out, res)
				}
				return printOffset(out, res)
			}
			q := explain.Query{Service: args[0], Entity: []byte(args[1]), Headers: hdrs}
			if route != nil {
				q.Route = route
			}
			if isHex {
				if q.Entity, err = hex.DecodeString(args[1]); err != nil {
					return usagef("entity %q: not hex: %v", args[1], err)
				}
			}
			if len(args) == 3 {
				if q.Value, err = readPayload(cmd, args[2], route); err != nil {
					return err
				}
				q.HasValue = true
			}
			res, err := ex.Payload(ctx, q)
			if errors.Is(err, explain.ErrUnknownService) || errors.Is(err, explain.ErrOtherIdentity) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(out, res)
			}
			return printPayload(out, res)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&path, "config", "c", "dam.yaml", "configuration `file` (routes, PostgreSQL, Kafka, kafka.group)")
	fl.BoolVar(&isHex, "hex", false, "ENTITY is hex-encoded bytes")
	fl.StringArrayVar(&headers, "header", nil, "a header of the payload's record, `NAME=VALUE` (repeatable): a version or id read from a header")
	fl.StringVar(&topic, "topic", "", "input topic of the record to explain")
	fl.Int32Var(&partition, "partition", 0, "its partition")
	fl.Int64Var(&offset, "offset", 0, "its offset")
	fl.Int64Var(&lookback, "lookback", 10000, "input records read before the offset to find the content it repeated or changed")
	fl.DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	addOutputFlag(cmd)
	return cmd
}

// compiledRoute compiles the route of cfg that match selects (the last,
// if several), as the sidecar runs it; nil when none does.
func compiledRoute(cfg config.Config, match func(config.Route) bool) (*pipeline.Route, error) {
	var rc *config.Route
	for i := range cfg.Routes {
		if match(cfg.Routes[i]) {
			rc = &cfg.Routes[i]
		}
	}
	if rc == nil {
		return nil, nil
	}
	r, err := pipeline.CompileRoute(*rc)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", rc.Service, err)
	}
	return r, nil
}

// parseHeaders parses --header NAME=VALUE flags.
func parseHeaders(flags []string) ([]kgo.RecordHeader, error) {
	var hs []kgo.RecordHeader
	for _, f := range flags {
		name, value, ok := strings.Cut(f, "=")
		if !ok || name == "" {
			return nil, usagef("--header %q: want NAME=VALUE", f)
		}
		hs = append(hs, kgo.RecordHeader{Key: name, Value: []byte(value)})
	}
	return hs, nil
}

// readPayload reads PAYLOAD_FILE or stdin ("-"), up to one byte past the
// route's size limit (so that a larger value is reported as too large).
func readPayload(cmd *cobra.Command, name string, route *pipeline.Route) ([]byte, error) {
	limit := canon.DefaultMaxSize
	if route != nil {
		limit = route.Config().MaxSize
	}
	in := cmd.InOrStdin()
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		in = f
	}
	b, err := io.ReadAll(io.LimitReader(in, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if b == nil {
		b = []byte{}
	}
	return b, nil
}

func printPayload(w io.Writer, r *explain.PayloadExplanation) error {
	var now, version, diff string
	if r.Window != nil || r.Refresh != nil {
		now = r.Now.UTC().Format(time.RFC3339Nano) + " (the database's clock)"
	}
	if r.Version != nil {
		version = strconv.FormatInt(*r.Version, 10)
	}
	decision, note := r.Decision+": "+r.Reason, "" // without a payload, a note
	if r.Decision == "" {
		decision, note = "", r.Reason
	}
	if r.Difference != nil {
		diff = r.Difference.String() + " (stored -> payload)"
	}
	return printRows(w, [][2]string{{"service", r.Service}, {identityLabel(r.Mode), r.Entity}, {"mode", r.Rule},
		{"hashing", r.Hashing}, {"now", now}, {"stored", r.Stored.String()}, {"mode change", r.ModeChange},
		{"payload", r.Digest}, {"version", version}, {"decision", decision}, {"note", note},
		{"difference", diff}, {"difference", r.StoredContent}})
}

func printOffset(w io.Writer, r *explain.OffsetExplanation) error {
	rec := fmt.Sprintf("%s/%d@%d", r.Topic, r.Partition, r.Offset)
	if r.Timestamp != nil {
		rec += ", " + r.Timestamp.UTC().Format(time.RFC3339)
	}
	var version, diff string
	if r.Version != nil {
		version = strconv.FormatInt(*r.Version, 10)
	}
	if r.Difference != nil {
		diff = fmt.Sprintf("%s (offset %d -> %d)", r.Difference, r.DifferenceFrom, r.Offset)
	}
	rows := [][2]string{{"record", rec}, {"service", r.Service}, {"mode", r.Rule}, {identityLabel(r.Mode), r.Entity},
		{"digest", r.Digest}, {"version", version}, {"decision", r.Decision}, {"why", r.Reason}, {"difference", diff}}
	for _, e := range r.Evidence {
		rows = append(rows, [2]string{"evidence", e})
	}
	return printRows(w, rows)
}

// identityLabel names an explanation's identity: an id in window mode, else
// an entity.
func identityLabel(mode string) string {
	if mode == dedup.Window.String() {
		return "id"
	}
	return "entity"
}

// printRows prints label and value rows in two columns, leaving out the
// rows without a value.
func printRows(w io.Writer, rows [][2]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		if r[1] != "" {
			fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
		}
	}
	return tw.Flush()
}
