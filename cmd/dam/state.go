package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/explain"
	"github.com/dam-dedup/dam/internal/progress"
	"github.com/dam-dedup/dam/migrations"
)

func newStateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "state",
		Short: "Inspect, reset and prune the stored state; skip a record",
		Long: `Inspect and change what dam remembers per identity, in every mode: per
(service, entity) the digest of the content last forwarded (last-seen) or
the highest version forwarded (version), per (service, message id) when the
id expires (window). Resetting an identity makes its next record forwarded
(to re-deliver on purpose: reset, then replay upstream).

dam state skip steps a halted partition past one record, recorded as an
operator skip in the decision log.

Entities (and window ids) are given as text, or as hex with --hex for keys
that are not text.`,
	}
	addDSNFlag(cmd, true)
	cmd.PersistentFlags().Bool("hex", false, "ENTITY arguments are hex-encoded bytes")
	cmd.AddCommand(newStateGetCmd(), newStateResetCmd(), newStatePruneCmd(), newStateStatsCmd(), newStateSkipCmd())
	return cmd
}

// openStore opens the store named by the command's DSN, once its schema
// is the version this dam knows (checkSchema).
func openStore(cmd *cobra.Command) (*dedup.Store, error) {
	dsn, err := resolveDSN(cmd)
	if err != nil {
		return nil, err
	}
	s, err := dedup.Open(cmd.Context(), dsn, dedup.Config{MaxConns: 2})
	if err != nil {
		return nil, err
	}
	if err = s.Ping(cmd.Context()); err == nil {
		err = checkSchema(cmd.Context(), s)
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// checkSchema refuses a schema of another version than this dam knows,
// naming both versions, as dam run and dam serve do (schemaWithRetry): a
// newer schema's tables may not fit this dam's queries, an older one
// lacks what they need. The commands that read or change the state never
// migrate; it changes nothing.
func checkSchema(ctx context.Context, s *dedup.Store) error {
	c, err := s.Pool().Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer c.Release()
	if err := migrations.Check(ctx, c.Conn()); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	return nil
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

// showService prints a service name as it is when it is printable text,
// else Go-quoted with its escapes spelled out ("evil\x1b]0;..."): a name
// stored by an older dam may hold terminal escapes (or bidirectional
// overrides, tabs), which must not reach the operator's terminal as such.
func showService(s string) string {
	if !utf8.ValidString(s) || strings.HasPrefix(s, `"`) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

func newStateGetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get SERVICE ENTITY",
		Short: "Show the stored state of one identity (an entity, or a window id)",
		Args:  argsUsage(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := outputJSON(cmd)
			if err != nil {
				return err
			}
			entities, err := entityArgs(cmd, args[1:])
			if err != nil {
				return err
			}
			if err := checkService(cmd, args[0]); err != nil {
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
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), stateJSON{
					Service: st.Service, Entity: explain.ShowEntity(st.Entity), EntityHex: hex.EncodeToString(st.Entity),
					Stored: *explain.StoredOf(&st),
				})
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "service\t%s\n", showService(st.Service))
			fmt.Fprintf(w, "mode\t%s\n", st.Mode)
			if st.Mode == dedup.Window {
				fmt.Fprintf(w, "id\t%s\n", explain.ShowEntity(st.Entity))
			} else {
				fmt.Fprintf(w, "entity\t%s\n", explain.ShowEntity(st.Entity))
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
	addOutputFlag(cmd)
	return cmd
}

// stateJSON is state get's JSON output.
type stateJSON struct {
	Service   string `json:"service"`
	Entity    string `json:"entity"` // text, or "hex:..." for a key that is not
	EntityHex string `json:"entity_hex"`
	explain.Stored
}

func newStateResetCmd() *cobra.Command {
	var (
		all          bool
		yes          bool
		entitiesFrom string
		batch        int
	)
	cmd := &cobra.Command{
		Use:   "reset SERVICE [ENTITY...] [--entities-from FILE] | SERVICE --all --yes",
		Short: "Forget identities so their next records are forwarded",
		Long: `Delete the stored state of the given entities of SERVICE (arguments, and
one entity per line of --entities-from FILE, "-" for stdin; --hex applies to
both), or of the whole service with --all, which also requires --yes so
that a slip cannot wipe a service. Their next records are forwarded.

Resets run in batches of --batch identities, each a short statement of its
own, so no lock is held for long; a large reset shows its progress on
stderr (a bar on a terminal, plain lines otherwise).`,
		Args:                  argsUsage(cobra.MinimumNArgs(1)),
		DisableFlagsInUseLine: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			service := args[0]
			listed := len(args) > 1 || entitiesFrom != ""
			switch {
			case all && listed:
				return usagef("reset: --all excludes ENTITY arguments and --entities-from")
			case all && !yes:
				return usagef("reset: --all deletes the state of every identity of service %q: add --yes to confirm", service)
			case !all && !listed:
				return usagef("reset: give ENTITY arguments or --entities-from FILE, or --all --yes to reset the whole service %q", service)
			case batch <= 0:
				return usagef("reset: --batch must be positive")
			}
			if err := checkService(cmd, service); err != nil {
				return err
			}
			entities, err := entityArgs(cmd, args[1:])
			if err != nil {
				return err
			}
			if entitiesFrom != "" {
				more, err := readEntities(cmd, entitiesFrom)
				if err != nil {
					return err
				}
				entities = append(entities, more...)
			}
			pr, err := newProgress(cmd, "reset", "identities", progress.IsTerminal)
			if err != nil {
				return err
			}
			s, err := openStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			opts := []dedup.OpOption{dedup.WithBatchSize(batch), dedup.WithProgress(pr.Step)}
			var n int64
			if all {
				n, err = s.ResetService(cmd.Context(), service, opts...)
			} else {
				n, err = s.ResetEntities(cmd.Context(), service, entities, opts...)
			}
			pr.Done()
			if err != nil {
				return fmt.Errorf("reset of service %s stopped after %d identities: %w", showService(service), n, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "reset %d identities of service %s\n", n, showService(service))
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "reset every identity of the service (requires --yes)")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm --all")
	cmd.Flags().StringVar(&entitiesFrom, "entities-from", "", "read entities from this `FILE`, one per line (\"-\": stdin)")
	cmd.Flags().IntVar(&batch, "batch", 5000, "identities per statement")
	addProgressFlag(cmd)
	return cmd
}

// readEntities reads one entity per line of name ("-": stdin), skipping
// blank lines; with --hex every line is hex. Errors name the line.
func readEntities(cmd *cobra.Command, name string) ([][]byte, error) {
	isHex, _ := cmd.Flags().GetBool("hex")
	in := cmd.InOrStdin()
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, usagef("--entities-from: %v", err)
		}
		defer f.Close()
		in = f
	}
	var out [][]byte
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(text) == "" {
			continue
		}
		if !isHex {
			out = append(out, []byte(text))
			continue
		}
		b, err := hex.DecodeString(strings.TrimSpace(text))
		if err != nil {
			return nil, usagef("%s:%d: entity %q: not hex: %v", name, line, text, err)
		}
		out = append(out, b)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--entities-from %s: %w", name, err)
	}
	return out, nil
}

func newStatePruneCmd() *cobra.Command {
	var olderThan time.Duration
	var service string
	var yes bool
	var batch, windowBatch int
	cmd := &cobra.Command{
		Use:   "prune [--older-than DURATION (--service S | --yes)]",
		Short: "Delete expired window ids, and state not forwarded for a while",
		Long: `Delete the expired ids of window-mode services (of one service, or of
all), in statements of --window-batch rows, each its own short transaction:
what the background cleanup of 'dam run' does, on demand. Expired ids
already read as absent, so this changes no decision.

With --older-than, also delete the last-seen and version state of
identities not forwarded for that long; of every service unless --service
is given, which requires --yes, as reset --all does. A pruned identity's next record is
forwarded (in version mode, even an older version): prune only beyond the
age at which a repeat no longer matters. It walks the state in batches of
--batch rows, each a short statement of its own (rows being decided are
skipped; on Citus, waited for, and kept if forwarded meanwhile), showing
its progress on stderr (a bar on a terminal, plain lines otherwise).`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("older-than") && olderThan <= 0 {
				return usagef("prune: --older-than must be a positive duration, e.g. 720h")
			}
			if batch <= 0 {
				return usagef("prune: --batch must be positive")
			}
			if windowBatch <= 0 {
				return usagef("prune: --window-batch must be positive")
			}
			if service != "" {
				if err := checkService(cmd, service); err != nil {
					return err
				}
			}
			if olderThan > 0 && service == "" && !yes {
				return usagef("prune: --older-than %s without --service forgets the state of every service not forwarded for that long: add --yes to confirm, or name one with --service", olderThan)
			}
			s, err := openStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			n, err := s.PruneWindow(cmd.Context(), service, dedup.WithBatchSize(windowBatch))
			if err != nil {
				return fmt.Errorf("prune stopped after deleting %d expired window ids: %w", n, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %d expired window ids\n", n)
			if olderThan <= 0 {
				return nil
			}
			pr, err := newProgress(cmd, "prune", "rows walked", progress.IsTerminal)
			if err != nil {
				return err
			}
			n, err = s.PruneState(cmd.Context(), service, olderThan, dedup.WithBatchSize(batch), dedup.WithProgress(pr.Step))
			pr.Done()
			if err != nil {
				return fmt.Errorf("prune stopped after deleting %d identities: %w", n, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pruned %d identities not forwarded for %s\n", n, olderThan)
			return nil
		},
	}
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "also prune last-seen and version state not forwarded for this long (e.g. 720h)")
	cmd.Flags().StringVar(&service, "service", "", "only this service (default: all; with --older-than, all requires --yes)")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm --older-than for every service")
	cmd.Flags().IntVar(&batch, "batch", 10000, "state rows walked per statement (with --older-than)")
	cmd.Flags().IntVar(&windowBatch, "window-batch", dedup.DefaultCleanupBatch, "expired window ids deleted per statement")
	addProgressFlag(cmd)
	return cmd
}

func newStateStatsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Count stored identities per service and mode",
		Args:  argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := outputJSON(cmd)
			if err != nil {
				return err
			}
			s, err := openStore(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			stats, err := s.Stats(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				out := make([]statsJSON, len(stats))
				for i, st := range stats {
					out[i] = statsJSON{Service: st.Service, Rows: st.Rows, Oldest: st.Oldest.UTC(), Newest: st.Newest.UTC()}
				}
				return writeJSON(cmd.OutOrStdout(), out)
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
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", showService(st.Service), st.Mode, st.Rows, expired,
					st.Oldest.UTC().Format(time.RFC3339), st.Newest.UTC().Format(time.RFC3339))
			}
			return w.Flush()
		},
	}
	addOutputFlag(cmd)
	return cmd
}

// statsJSON is one service of state stats' JSON output.
type statsJSON struct {
	Service string    `json:"service"`
	Rows    int64     `json:"rows"`
	Oldest  time.Time `json:"oldest"` // earliest updated_at
	Newest  time.Time `json:"newest"` // latest updated_at
}
