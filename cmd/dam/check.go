package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/migrations"
	"github.com/dam-dedup/dam/pipeline"
)

func newCheckCmd() *cobra.Command {
	var path string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check the configuration against Kafka and PostgreSQL before starting",
		Long: `Check what dam run needs, changing nothing, and print one line per check:
the configuration is valid; a Kafka broker answers and accepts the
credentials; each route's from, to and dead_letter topics exist (with
their partition counts and max.message.bytes, against the route's
max_size and, for partitioning: preserve, the input's partition count);
PostgreSQL answers, and dam's schema is at the version this dam needs.
A failure's line is followed by its fix (the command that creates a
missing topic, dam migrate, the setting to change).

Exit status 0 when every check passes (warnings included), 1 naming the
checks that fail, 2 for an invalid configuration. dam run makes the same
topic checks at start.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := outputJSON(cmd)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			routes := fmt.Sprintf("%d routes", len(cfg.Routes))
			if len(cfg.Routes) == 1 {
				routes = "1 route"
			}
			checks := []pipeline.Check{{Name: "config", Detail: fmt.Sprintf("%s: %s, group %s", path, routes, cfg.Kafka.Group)}}
			kctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			checks = append(checks, pipeline.Preflight(kctx, cfg)...)
			cancel()
			pctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			checks = append(checks, checkPostgres(pctx, cfg, path))
			cancel()
			var failed []string
			for _, c := range checks {
				if c.Status == pipeline.CheckFail {
					failed = append(failed, c.Name)
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := writeJSON(out, checkJSON(checks)); err != nil {
					return err
				}
			} else {
				printChecks(out, checks)
			}
			if len(failed) > 0 {
				return fmt.Errorf("check failed: %s", strings.Join(failed, ", "))
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "dam.yaml", "configuration `file`")
	cmd.Flags().DurationVar(&timeout, "timeout", 15*time.Second, "how long the Kafka checks, and then the PostgreSQL check, may take")
	addOutputFlag(cmd)
	return cmd
}

// printChecks writes one line per check (status, name, detail), and a
// failure's or a warning's fix on the next line.
func printChecks(w io.Writer, checks []pipeline.Check) {
	width := 0
	for _, c := range checks {
		width = max(width, len(c.Name))
	}
	for _, c := range checks {
		fmt.Fprintf(w, "%-4s  %-*s  %s\n", c.Status, width, c.Name, c.Detail)
		if c.Fix != "" {
			fmt.Fprintf(w, "%-4s  %-*s  fix: %s\n", "", width, "", c.Fix)
		}
	}
}

// checkJSON is dam check -o json's form of the checks.
func checkJSON(checks []pipeline.Check) any {
	type line struct {
		Name   string `json:"name"`
		Status string `json:"status"`
		Detail string `json:"detail"`
		Fix    string `json:"fix,omitempty"`
		Topic  string `json:"topic,omitempty"`
	}
	out := make([]line, len(checks))
	for i, c := range checks {
		out[i] = line{Name: c.Name, Status: strings.ToLower(c.Status.String()), Detail: c.Detail, Fix: c.Fix, Topic: c.Topic}
	}
	return out
}

// checkPostgres checks that PostgreSQL answers on postgres.dsn and that
// dam's schema is at the version this dam needs. An older schema is a
// warning when dam run migrates it at start (postgres.migrate: true).
func checkPostgres(ctx context.Context, cfg config.Config, path string) pipeline.Check {
	c := pipeline.Check{Name: "postgres"}
	where := config.RedactDSN(cfg.Postgres.DSN)
	conn, err := pgx.Connect(ctx, cfg.Postgres.DSN)
	if err != nil {
		c.Status, c.Detail = pipeline.CheckFail, fmt.Sprintf("connecting to %s: %v", where, err)
		c.Fix = "check postgres.dsn (or DAM_POSTGRES_DSN): host, port, user, password and database, that the server runs, and that it accepts this host (pg_hba.conf)"
		return c
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var schema *string
	if err := conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		c.Status, c.Detail, c.Fix = pipeline.CheckFail, fmt.Sprintf("%s: %v", where, err), "see PostgreSQL's log"
		return c
	}
	in := "the search_path's schema, which does not exist yet"
	if schema != nil {
		in = "schema " + *schema
	}
	migrate := "dam migrate --config " + path
	var ve *migrations.VersionError
	err = migrations.Check(ctx, conn)
	switch {
	case err == nil:
		c.Detail = fmt.Sprintf("%s: %s at version %d, the one this dam needs", where, in, migrations.Latest())
	case errors.As(err, &ve) && ve.Applied < ve.Latest:
		c.Status, c.Fix = pipeline.CheckFail, migrate
		if ve.Applied == 0 {
			c.Detail = fmt.Sprintf("%s: no dam schema in %s (this dam needs version %d)", where, in, ve.Latest)
		} else {
			c.Detail = fmt.Sprintf("%s: %s at version %d, older than this dam needs (%d)", where, in, ve.Applied, ve.Latest)
		}
		if cfg.Postgres.Migrate {
			c.Status = pipeline.CheckWarn
			c.Detail += ": dam run applies the migrations at start (postgres.migrate: true)"
			c.Fix = "nothing, or to apply them now: " + migrate
		}
	case errors.As(err, &ve):
		c.Status, c.Detail = pipeline.CheckFail, fmt.Sprintf("%s: %s at version %d, newer than this dam knows (%d)", where, in, ve.Applied, ve.Latest)
		c.Fix = "run a dam that knows the schema (the version that migrated it, or newer)"
	default:
		c.Status, c.Detail = pipeline.CheckFail, fmt.Sprintf("%s: reading the schema's version: %v", where, err)
		c.Fix = "grant dam's role USAGE on the schema and SELECT on " + migrations.VersionTable
	}
	return c
}
