package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/migrations"
)

// envPostgresDSN is where the PostgreSQL DSN comes from when --dsn is not
// given; envPostgresDSNFile names a file holding it (a mounted Secret).
const (
	envPostgresDSN     = "DAM_POSTGRES_DSN"
	envPostgresDSNFile = "DAM_POSTGRES_DSN_FILE"
)

// addDSNFlag adds --dsn to a command that talks to PostgreSQL.
func addDSNFlag(cmd *cobra.Command, persistent bool) {
	flags := cmd.Flags()
	if persistent {
		flags = cmd.PersistentFlags()
	}
	flags.String("dsn", "", "PostgreSQL `DSN` (default $"+envPostgresDSN+", or the content of the file $"+envPostgresDSNFile+"); its search_path selects dam's schema")
	flags.StringP("config", "c", "", "read postgres.dsn from this configuration `FILE` (and DAM_* variables)")
}

// resolveDSN returns the PostgreSQL DSN for a command: --dsn, else
// postgres.dsn of --config (with its DAM_* overlay: DAM_POSTGRES_DSN wins
// over the file, as for dam run), else $DAM_POSTGRES_DSN, else the content
// of the file $DAM_POSTGRES_DSN_FILE (less a trailing newline), as
// config.Load reads postgres.dsn_file; setting both variables is an error.
func resolveDSN(cmd *cobra.Command) (string, error) {
	if dsn, _ := cmd.Flags().GetString("dsn"); dsn != "" {
		return dsn, nil
	}
	if path, _ := cmd.Flags().GetString("config"); path != "" {
		cfg, err := loadConfig(path)
		if err != nil {
			return "", err
		}
		return cfg.Postgres.DSN, nil
	}
	dsn, file := os.Getenv(envPostgresDSN), os.Getenv(envPostgresDSNFile)
	switch {
	case dsn != "" && file != "":
		return "", usagef("%s and %s are both set: set only one of them", envPostgresDSN, envPostgresDSNFile)
	case dsn != "":
		return dsn, nil
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", usagef("%s: %v", envPostgresDSNFile, err)
		}
		if dsn = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"); dsn == "" {
			return "", usagef("%s: file %q is empty", envPostgresDSNFile, file)
		}
		return dsn, nil
	}
	return "", usagef("no PostgreSQL DSN: pass --dsn or --config, or set %s", envPostgresDSN)
}

func newMigrateCmd() *cobra.Command {
	var down, yes bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply (or revert) dam's PostgreSQL schema",
		Long: `Apply every migration not yet applied to the schema selected by the DSN's
search_path, printing the version before and after. Safe to run
concurrently (an advisory lock serialises runs) and to repeat.

--down reverts every migration: it drops dam's tables and all their state.
It requires --yes, and it is refused while a dam session (dam run, dam
serve, a state command) is connected to the schema: stop them first.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, err := resolveDSN(cmd)
			if err != nil {
				return err
			}
			if down && !yes {
				return usagef("migrate --down drops dam's tables and all their state in the schema of %s: add --yes to confirm", config.RedactDSN(dsn))
			}
			ctx := cmd.Context()
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				return fmt.Errorf("migrate: connecting to %s: %w", config.RedactDSN(dsn), err)
			}
			defer conn.Close(ctx)
			before, latest, err := migrations.Version(ctx, conn)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "schema version %d (this dam knows %d)\n", before, latest)
			if down {
				// Held until conn closes: no dam session connects meanwhile.
				if err := dedup.LockSchema(ctx, conn); err != nil {
					if errors.Is(err, dedup.ErrSchemaInUse) {
						return fmt.Errorf("migrate --down refused: %w: stop them first", err)
					}
					return err
				}
				err = migrations.Down(ctx, conn)
			} else {
				err = migrations.Up(ctx, conn)
			}
			if err != nil {
				return err
			}
			after, _, err := migrations.Version(ctx, conn)
			if err != nil {
				return err
			}
			if after == before {
				fmt.Fprintf(out, "schema version %d: nothing to do\n", after)
			} else {
				fmt.Fprintf(out, "schema version %d -> %d\n", before, after)
			}
			return nil
		},
	}
	addDSNFlag(cmd, false)
	cmd.Flags().BoolVar(&down, "down", false, "revert every migration (drops all state; requires --yes)")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm --down")
	return cmd
}
