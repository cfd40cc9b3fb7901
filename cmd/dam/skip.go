package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/explain"
	"github.com/dam-dedup/dam/pipeline"
)

// newStateSkipCmd is `dam state skip`: an operator steps a halted
// partition past one record (dedup.Store.Skip).
func newStateSkipCmd() *cobra.Command {
	var (
		topic     string
		partition int32
		offset    int64
		by        string
		reason    string
		yes       bool
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "skip --config FILE --topic T --partition P --offset O --reason TEXT [--by NAME] [--yes]",
		Short: "Step a halted partition past one record, recorded as an operator skip",
		Long: `Step a halted partition past the record it stands at: bad input on a route
without a dead_letter topic, or a record Kafka refuses for good. The record
is never delivered; every record after it is, as usual.

The skip is recorded in the decision log, with who skipped it (--by, default
$USER), why (--reason) and when: dam explain --offset shows it. Only a
record not delivered can be skipped: the one a halted partition stands at
(not decided yet, or decided and not delivered); a duplicate, a delivered
record and a record past the partition's progress are refused. dam may run
or be stopped: the skip bumps the
partition's fencing epoch, a running dam notices within seconds that its
halted partition moved and recovers it, a stopped one at its next start. A
skipped record that had been decided a forward leaves its entity's state;
the entity is reset, so that its next record is forwarded.

Without --yes it only says what it would do.`,
		Example: `  dam state skip -c dam.yaml --topic projections.email --partition 0 --offset 1 --reason "malformed, INC-42"
  dam state skip -c dam.yaml --topic projections.email --partition 0 --offset 1 --reason "malformed, INC-42" --yes`,
		Args:                  argsUsage(cobra.NoArgs),
		DisableFlagsInUseLine: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, _ := cmd.Flags().GetString("config")
			switch {
			case path == "":
				return usagef("skip: --config is required (the route, kafka.group and the brokers)")
			case topic == "" || !cmd.Flags().Changed("partition") || !cmd.Flags().Changed("offset"):
				return usagef("skip: --topic, --partition and --offset are required")
			case partition < 0 || offset < 0:
				return usagef("skip: --partition and --offset must not be negative")
			case reason == "":
				return usagef("skip: --reason is required: the decision log keeps why the record was skipped")
			}
			if by == "" {
				by = os.Getenv("USER")
			}
			if by == "" {
				return usagef("skip: --by is required ($USER is not set): the decision log keeps who skipped the record")
			}
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			var rc *config.Route
			for i := range cfg.Routes {
				if cfg.Routes[i].From == topic {
					rc = &cfg.Routes[i]
				}
			}
			if rc == nil {
				var froms []string
				for _, r := range cfg.Routes {
					froms = append(froms, r.From)
				}
				return usagef("skip: no route of %s reads topic %q (the routes read %q)", path, topic, froms)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			s, err := openStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			committed, err := committedOffset(ctx, cfg, topic, partition)
			if err != nil {
				return err
			}
			p := dedup.Partition{Group: cfg.Kafka.Group, Topic: topic, Partition: partition}
			out := cmd.OutOrStdout()
			if !yes {
				return previewSkip(ctx, out, s, p, rc.Service, offset, committed, by, reason)
			}
			sk, err := s.Skip(ctx, p, offset, committed, by, reason)
			if errors.Is(err, dedup.ErrSkip) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "skipped %s/%d@%d (group %s) by %s at %s: %s\n", topic, partition, offset, p.Group, sk.By,
				sk.At.UTC().Format(time.RFC3339Nano), sk.Reason)
			switch sk.Was {
			case 0:
				fmt.Fprintln(out, "it was not decided: it is logged as skipped, and the partition goes on after it")
			default:
				fmt.Fprintf(out, "it was decided %s (entity %s) and not delivered: the log now marks it skipped\n", sk.Was, explain.ShowEntity(sk.Entity))
			}
			if sk.Was == dedup.Forward {
				if _, err := s.Reset(ctx, rc.Service, sk.Entity); err != nil {
					return fmt.Errorf("the skip is recorded, but resetting entity %s of service %s failed (run dam state reset): %w",
						explain.ShowEntity(sk.Entity), rc.Service, err)
				}
				fmt.Fprintf(out, "reset entity %s of service %s: its next record is forwarded\n", explain.ShowEntity(sk.Entity), rc.Service)
			}
			fmt.Fprintln(out, "a running dam recovers the partition within seconds; a stopped one at its next start")
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&topic, "topic", "", "input `topic` of the record")
	fl.Int32Var(&partition, "partition", 0, "its partition")
	fl.Int64Var(&offset, "offset", 0, "its offset")
	fl.StringVar(&by, "by", "", "who skips it (default $USER)")
	fl.StringVar(&reason, "reason", "", "why it is skipped (kept in the decision log)")
	fl.BoolVar(&yes, "yes", false, "skip it (without: only say what would be done)")
	fl.DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}

// committedOffset reads the group's committed offset of topic/part from
// Kafka (-1: none).
func committedOffset(ctx context.Context, cfg config.Config, topic string, part int32) (int64, error) {
	kopts, err := pipeline.KafkaOptions(cfg.Kafka)
	if err != nil {
		return 0, usageError{err}
	}
	kc, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Kafka.Brokers...), kgo.ClientID(cfg.Kafka.ClientID + "-skip")}, kopts...)...)
	if err != nil {
		return 0, fmt.Errorf("kafka: %w", err)
	}
	defer kc.Close()
	offs, err := kadm.NewClient(kc).FetchOffsets(kadm.RequireStable(ctx), cfg.Kafka.Group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return -1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("kafka: fetching the committed offsets of group %s: %w", cfg.Kafka.Group, err)
	}
	if o, ok := offs.Lookup(topic, part); ok && o.Err == nil && o.At >= 0 {
		return o.At, nil
	}
	return -1, nil
}

// previewSkip says what a skip would do, changing nothing.
func previewSkip(ctx context.Context, out interface{ Write([]byte) (int, error) }, s *dedup.Store, p dedup.Partition, service string, offset, committed int64, by, reason string) error {
	pr, err := s.ReadProgress(ctx, p)
	if err != nil {
		return err
	}
	od, err := s.DecisionAt(ctx, p, offset)
	if err != nil {
		return err
	}
	c, next := "none", "not set"
	if committed >= 0 {
		c = fmt.Sprint(committed)
	}
	if pr.HasNext {
		next = fmt.Sprint(pr.Next)
	}
	fmt.Fprintf(out, "%s/%d group %s (service %s): committed offset %s, decided below %s\n", p.Topic, p.Partition, p.Group, service, c, next)
	switch {
	case pr.HasNext && offset == pr.Next:
		fmt.Fprintf(out, "offset %d is not decided: it would be logged as skipped, and the partition would go on at %d\n", offset, offset+1)
	case od.Covered && (od.Decision == dedup.Forward || od.Decision == dedup.Invalid):
		fmt.Fprintf(out, "offset %d was decided %s (entity %s): its log entry would be marked skipped, and it would not be delivered\n",
			offset, od.Decision, explain.ShowEntity(od.Entity))
	case od.Covered:
		fmt.Fprintf(out, "offset %d was decided %s: there is nothing to skip\n", offset, od.Decision)
	default:
		fmt.Fprintf(out, "offset %d is not where the partition stands: the skip would be refused\n", offset)
	}
	fmt.Fprintf(out, "recorded as an operator skip by %s: %s\n", by, reason)
	fmt.Fprintln(out, "nothing changed: add --yes to skip it")
	return nil
}
