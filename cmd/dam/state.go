package main

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/dam-dedup/dam/dedup"
)

func newStateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "state",
		Short: "Inspect, reset and prune the stored state",
		Long: `Inspect and change what dam remembers per identity, in every mode: per
(service, entity) the digest of the content last forwarded (last-seen) or
the highest version forwarded (version), per (service, message id) when the
id expires (window). Resetting an identity makes its next record forwarded
(to re-deliver on purpose: reset, then replay upstream).

Entities (and window ids) are given as text, or as hex with --hex for keys
that are not text.`,
	}
	addDSNFlag(cmd, true)
	cmd.PersistentFlags().Bool("hex", false, "ENTITY arguments are hex-encoded bytes")
	cmd.AddCommand(newStateGetCmd(), newStateResetCmd(), newStatePruneCmd(), newStateStatsCmd())
	return cmd
}

// openStore opens the store named by the command's DSN.
func openStore(cmd *cobra.Command) (*dedup.Store, error) {
	dsn, err := resolveDSN(cmd)
	if err != nil {
		return nil, err
	}
	return dedup.Open(cmd.Context(), dsn, dedup.Config{MaxConns: 2})
}

// entityArgs decodes ENTITY arguments (text, or hex with --hex).
func entityArgs(cmd *cobra.Command, args []string) ([][]byte, error) {
	isHex, _ := cmd.Flags().GetBool("hex")
	entities := make([][]byte, len(args))
	for i, a := range args {
		if !isHex {
			entities[i] = []byte(a)
			continue
		}
		b, err := hex.DecodeString(a)
		if err != nil {
			return nil, usagef("entity %q: not hex: %v", a, err)
		}
		entities[i] = b
	}
	return entities, nil
}

// showEntity prints a key as text when it is printable text, else as hex.
func showEntity(e []byte) string {
	if utf8.Valid(e) && strconv.CanBackquote(string(e)) {
		return string(e)
	}
	return "hex:" + hex.EncodeToString(e)
}

func newStateGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get SERVICE ENTITY",
		Short: "Show the stored state of one identity (an entity, or a window id)",
		Args:  argsUsage(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			entities, err := entityArgs(cmd, args[1:])
			if err != nil {
				return err
			}
			s, err := openStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			st, err := s.Get(cmd.Context(), args[0], entities[0])
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "service\t%s\n", st.Service)
			fmt.Fprintf(w, "mode\t%s\n", st.Mode)
			if st.Mode == dedup.Window {
				fmt.Fprintf(w, "id\t%s\n", showEntity(st.Entity))
			} else {
				fmt.Fprintf(w, "entity\t%s\n", showEntity(st.Entity))
			}
			if st.Mode == dedup.Version {
				fmt.Fprintf(w, "version\t%d\n", st.Version)
			}
			fmt.Fprintf(w, "digest\t%s\n", st.Digest)
			fmt.Fprintf(w, "forwarded_at\t%s\n", st.UpdatedAt.UTC().Format(time.RFC3339Nano))
			if st.Mode == dedup.Window {
				exp := st.ExpiresAt.UTC().Format(time.RFC3339Nano)
				if !time.Now().Before(st.ExpiresAt) {
					exp += " (expired: the id reads as absent; the cleanup deletes it)"
				}
				fmt.Fprintf(w, "expires_at\t%s\n", exp)
			}
			if st.Topic != "" {
				fmt.Fprintf(w, "source\t%s/%d@%d\n", st.Topic, st.Partition, st.Offset)
			} else {
				fmt.Fprintf(w, "source\t-\n")
			}
			return w.Flush()
		},
	}
}

func newStateResetCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "reset SERVICE [ENTITY...]",
		Short: "Forget identities so their next records are forwarded",
		Long: `Delete the stored state of the given entities of SERVICE, or of the whole
service with --all (required, so that a missing argument cannot wipe a
service). Their next records are forwarded.`,
		Args: argsUsage(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 && !all {
				return usagef("reset: give ENTITY arguments, or --all to reset the whole service %q", args[0])
			}
			if len(args) > 1 && all {
				return usagef("reset: --all and ENTITY arguments exclude each other")
			}
			entities, err := entityArgs(cmd, args[1:])
			if err != nil {
				return err
			}
			s, err := openStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			n, err := s.Reset(cmd.Context(), args[0], entities...)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "reset %d identities of service %s\n", n, args[0])
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "reset every identity of the service")
	return cmd
}

func newStatePruneCmd() *cobra.Command {
	var olderThan time.Duration
	var service string
	var batch int
	cmd := &cobra.Command{
		Use:   "prune [--older-than DURATION] [--service S]",
		Short: "Delete expired window ids, and state not forwarded for a while",
		Long: `Delete the expired ids of window-mode services (of one service, or of
all), in batches of --batch rows, each its own short transaction: what the
background cleanup of 'dam run' does, on demand. Expired ids already read
as absent, so this changes no decision.

With --older-than, also delete the last-seen and version state of
identities not forwarded for that long, in batches. A pruned identity's
next record is forwarded (in version mode, even an older version): prune
only beyond the age at which a repeat no longer matters.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("older-than") && olderThan <= 0 {
				return usagef("prune: --older-than must be a positive duration, e.g. 720h")
			}
			if batch <= 0 {
				return usagef("prune: --batch must be positive")
			}
			s, err := openStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			n, err := s.PruneWindow(cmd.Context(), service, batch)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %d expired window ids\n", n)
			if olderThan <= 0 {
				return nil
			}
			n, err = s.PruneState(cmd.Context(), service, olderThan)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pruned %d identities not forwarded for %s\n", n, olderThan)
			return nil
		},
	}
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "also prune last-seen and version state not forwarded for this long (e.g. 720h)")
	cmd.Flags().StringVar(&service, "service", "", "only this service (default: all)")
	cmd.Flags().IntVar(&batch, "batch", dedup.DefaultCleanupBatch, "expired window ids deleted per statement")
	return cmd
}

func newStateStatsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Count stored identities per service and mode",
		Args:  argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := openStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			stats, err := s.Stats(cmd.Context())
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			// OLDEST and NEWEST: when identities were last forwarded;
			// EXPIRED: window ids waiting for the cleanup.
			fmt.Fprintln(w, "SERVICE\tMODE\tROWS\tEXPIRED\tOLDEST\tNEWEST")
			for _, st := range stats {
				expired := "-"
				if st.Mode == dedup.Window {
					expired = strconv.FormatInt(st.Expired, 10)
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", st.Service, st.Mode, st.Rows, expired,
					st.Oldest.UTC().Format(time.RFC3339), st.Newest.UTC().Format(time.RFC3339))
			}
			return w.Flush()
		},
	}
}
