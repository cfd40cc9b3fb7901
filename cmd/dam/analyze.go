package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/analyze"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/progress"
	"github.com/dam-dedup/dam/pipeline"
)

// The dam analyze command: flags, the routes and the source, and the
// report printed; package analyze decides.

// analyzeRoute is a route given by flags instead of a configuration.
type analyzeRoute struct {
	entity, mode, idFrom, versionFrom, format string
	ignore                                    []string
	window, refreshAfter                      time.Duration
	sliding                                   bool
}

// routeFlags are the flags that give a route without a configuration.
var routeFlags = []string{"entity", "ignore", "mode", "id-from", "version-from", "format", "window", "sliding", "refresh-after"}

func newAnalyzeCmd() *cobra.Command {
	var (
		path, service, file, brokers, topic, from string
		rf                                        analyzeRoute
		o                                         analyze.Options
		noKeys                                    bool
	)
	cmd := &cobra.Command{
		Use:   "analyze (--config FILE | route flags) [--file F | --topic T] [flags]",
		Short: "Say what dam would drop on a stream, and which paths to ignore, before deploying it",
		Long: `Read records and decide them as dam run would, in memory: no PostgreSQL,
and nothing is written anywhere. For each route it reports the records,
how many it would forward and drop (duplicates, and in version mode stale
records), its dead letters by reason, and the entities it would drop most.

For the records it would forward, it reports which JSON paths changed
since the same entity's previous forwarded record, and for the most
changed paths (--what-if) the drop rate the route would reach if that
path were ignored too: the same records decided again by the route with
the path added to its ignore list (one more read of the input).

The routes come from a configuration (--config; --service or --topic picks
one), or from flags for one route (--entity, --ignore, --mode, ...). The
records come from Kafka (the routes' topics, or --topic, read_committed,
from --from up to their current end or --max-records), or from a file
(--file, "-" for standard input): one record a line, either kcat's -J
envelope ({"topic":..,"partition":..,"offset":..,"key":..,"payload":..})
or a value, with its key and a tab before it when the line has a tab
(kcat -C -K '\t').

The rules run with each record's timestamp as their clock (--clock
start: the analysis's start for every record). Memory is bounded: at most
--max-identities identities (about 100 bytes each) are held at once; the
reading stops when it is reached, and the report says where.`,
		Example: `  dam analyze --config dam.yaml --from earliest
  dam analyze --config dam.yaml --service customer-2 --max-records 1000000 -o json
  dam analyze --brokers localhost:9092 --topic projections.customer-2 --ignore /updated_at
  kcat -b localhost:9092 -C -t projections.customer-2 -J -e | dam analyze --entity /banana_id --file -`,
		Args:                  argsUsage(cobra.NoArgs),
		DisableFlagsInUseLine: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := outputJSON(cmd)
			if err != nil {
				return err
			}
			byFlags := false
			for _, f := range routeFlags {
				byFlags = byFlags || cmd.Flags().Changed(f)
			}
			withConfig := cmd.Flags().Changed("config")
			switch {
			case withConfig && byFlags:
				return usagef("analyze: give --config or route flags (--%s), not both", strings.Join(routeFlags, ", --"))
			case file != "" && (cmd.Flags().Changed("from") || cmd.Flags().Changed("brokers")):
				return usagef("analyze: --from and --brokers read Kafka: not with --file")
			case !withConfig && file == "" && (topic == "" || brokers == ""):
				return usagef("analyze: give --config FILE, or --file F, or --brokers and --topic")
			case o.MaxRecords < 0:
				return usagef("analyze: --max-records must not be negative")
			case o.MaxIdentities <= 0:
				return usagef("analyze: --max-identities must be positive")
			case o.Clock != analyze.ClockRecord && o.Clock != analyze.ClockStart:
				return usagef("analyze: --clock %q: want %s or %s", o.Clock, analyze.ClockRecord, analyze.ClockStart)
			}
			start, err := analyze.ParseStart(from)
			if err != nil {
				return usagef("--from: %v", err)
			}
			cfg, routes, err := analyzeRoutes(path, withConfig, service, topic, rf)
			if err != nil {
				return err
			}
			if o.WhatIf == 0 {
				o.WhatIf = -1 // --what-if 0: none
			}
			if o.SummaryBytes == 0 {
				o.SummaryBytes = -1
			}
			var src analyze.Source
			if file != "" {
				maxLine := 0
				for _, r := range routes {
					maxLine = max(maxLine, r.MaxSize)
				}
				maxLine = 6*maxLine + 64<<10 // an envelope escapes its payload
				var fs *analyze.FileSource
				if file == "-" {
					fs = analyze.NewReaderSource(cmd.InOrStdin(), routes[0].From, maxLine)
				} else {
					fs = analyze.NewFileSource(file, routes[0].From, maxLine)
				}
				if len(routes) == 1 {
					fs.AllToTopic()
				}
				if noKeys {
					fs.WithoutKeys()
				}
				src = fs
			} else {
				if brokers != "" {
					cfg.Kafka.Brokers = strings.Split(brokers, ",")
				}
				if len(cfg.Kafka.Brokers) == 0 {
					return usagef("analyze: reading Kafka needs kafka.brokers (or --brokers)")
				}
				kopts, err := pipeline.KafkaOptions(cfg.Kafka)
				if err != nil {
					return usageError{err}
				}
				kopts = append(kopts, kgo.SeedBrokers(cfg.Kafka.Brokers...), kgo.ClientID(cfg.Kafka.ClientID+"-analyze"))
				var topics []string
				for _, r := range routes {
					topics = append(topics, r.From)
				}
				src = analyze.NewKafkaSource(kopts, topics, start, cfg.Pipeline.MaxDecompressedBatchBytes)
			}
			pr, err := newAnalyzeProgress(cmd)
			if err != nil {
				return err
			}
			o.Progress = pr.step
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			rep, err := analyze.Run(ctx, src, routes, o)
			pr.done()
			if err != nil {
				return err
			}
			if rep.Stopped != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "dam: analyze %s\n", rep.Stopped)
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			return printAnalysis(cmd.OutOrStdout(), rep)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&path, "config", "c", "dam.yaml", "configuration `file`: its routes (and kafka)")
	fl.StringVar(&service, "service", "", "analyze this route of the configuration only (with route flags: the route's name, default analyze)")
	fl.StringVar(&file, "file", "", "read records from this `file` (\"-\": standard input) instead of Kafka")
	fl.BoolVar(&noKeys, "no-keys", false, "with --file: a plain line is a value, tabs included, without a key")
	fl.StringVar(&brokers, "brokers", "", "Kafka brokers, host:port[,host:port...] (default: the configuration's kafka.brokers)")
	fl.StringVar(&topic, "topic", "", "input topic (with --config: analyze the route reading it)")
	fl.StringVar(&from, "from", "earliest", "where each partition is read from: earliest, an offset, or an RFC 3339 time")
	fl.Int64Var(&o.MaxRecords, "max-records", 0, "stop after this many records (0: read to the current end)")
	fl.StringVar(&rf.entity, "entity", "key", "route flag: where the entity comes from: key, a JSON pointer (/banana_id) or header:NAME")
	fl.StringArrayVar(&rf.ignore, "ignore", nil, "route flag: a JSON pointer left out of the hash (repeatable)")
	fl.StringVar(&rf.mode, "mode", config.ModeLastSeen, "route flag: last-seen, window or version")
	fl.StringVar(&rf.idFrom, "id-from", "", "route flag, window mode: where the message id comes from (default header:Idempotency-Key)")
	fl.StringVar(&rf.versionFrom, "version-from", "", "route flag, version mode: where the version comes from (default /version)")
	fl.StringVar(&rf.format, "format", config.FormatJSON, "route flag: json or bytes")
	fl.DurationVar(&rf.window, "window", 0, "route flag, window mode: how long an id is remembered")
	fl.BoolVar(&rf.sliding, "sliding", false, "route flag, window mode: a repeat extends its id's window")
	fl.DurationVar(&rf.refreshAfter, "refresh-after", 0, "route flag, last-seen mode: forward an unchanged record when its entity was last forwarded longer ago")
	fl.Int64Var(&o.MaxIdentities, "max-identities", analyze.DefaultMaxIdentities, "identities held in memory at once, about 100 bytes each; the reading stops at the limit")
	fl.Int64Var(&o.SummaryBytes, "summary-bytes", analyze.DefaultSummaryBytes, "memory for the changed-paths summaries of the forwarded records, in bytes (0: no changed paths)")
	fl.IntVar(&o.WhatIf, "what-if", analyze.DefaultWhatIf, "most changed paths per route given a what-if drop rate, each decided again with the path ignored (0: none)")
	fl.IntVar(&o.TopEntities, "top", analyze.DefaultTopEntities, "entities with the most drops listed per route")
	fl.IntVar(&o.TopPaths, "paths", analyze.DefaultTopPaths, "changed paths listed per route")
	fl.StringVar(&o.Clock, "clock", analyze.ClockRecord, "the rules' clock: record (each record's timestamp) or start (the analysis's start)")
	addOutputFlag(cmd)
	addProgressFlag(cmd)
	return cmd
}

// analyzeRoutes returns the configuration and the routes to analyze: the
// configuration's (all, or the one --service or --topic names), or the
// one route the flags give.
func analyzeRoutes(path string, withConfig bool, service, topic string, rf analyzeRoute) (config.Config, []config.Route, error) {
	if withConfig {
		cfg, err := config.LoadAnalyze(path, os.Environ())
		if err != nil {
			return cfg, nil, usageError{configError{path: path, err: err}}
		}
		var routes []config.Route
		for _, r := range cfg.Routes {
			if (service == "" || r.Service == service) && (topic == "" || r.From == topic) {
				routes = append(routes, r)
			}
		}
		if len(routes) == 0 {
			return cfg, nil, usagef("analyze: no route of %s has service %q and topic %q", path, service, topic)
		}
		return cfg, routes, nil
	}
	cfg := config.Default()
	r := config.DefaultRoute()
	r.Service, r.From = service, topic
	if r.Service == "" {
		r.Service = "analyze"
	}
	if r.From == "" {
		r.From = "input"
	}
	r.To = r.From + ".analyzed" // required by the configuration; never written
	r.Entity, r.Mode, r.IDFrom, r.VersionFrom, r.Format = rf.entity, rf.mode, rf.idFrom, rf.versionFrom, rf.format
	r.Ignore, r.Window, r.Sliding, r.RefreshAfter = rf.ignore, rf.window, rf.sliding, rf.refreshAfter
	cfg.Routes = []config.Route{r}
	if err := cfg.ValidateForAnalyze(); err != nil {
		return cfg, nil, usageError{flagError{err}}
	}
	return cfg, cfg.Routes, nil
}

// flagError words a configuration problem of the route flags by flag:
// "routes[0].ignore[0]: ..." as "--ignore: ...".
type flagError struct{ err error }

func (e flagError) Error() string {
	s := e.err.Error()
	for _, key := range []string{"id_from", "version_from", "refresh_after", "entity", "mode", "format", "window", "sliding", "ignore"} {
		s = strings.ReplaceAll(s, "routes[0]."+key, "--"+strings.ReplaceAll(key, "_", "-"))
	}
	return strings.ReplaceAll(s, "\n", "\ndam: ")
}

func (e flagError) Unwrap() error { return e.err }

// analyzeProgress prints where a long analysis is on stderr: a line
// redrawn in place on a terminal, else a line every few seconds; nothing
// in the first second.
type analyzeProgress struct {
	w     io.Writer
	mode  string
	last  time.Time
	drawn bool
}

func newAnalyzeProgress(cmd *cobra.Command) (*analyzeProgress, error) {
	mode, _ := cmd.Flags().GetString("progress")
	w := cmd.ErrOrStderr()
	switch mode {
	case progress.Auto:
		mode = progress.Lines
		if progress.IsTerminal(w) {
			mode = progress.Bar
		}
	case progress.Bar, progress.Lines, progress.None:
	default:
		return nil, usagef("--progress %q: %v", mode, progress.ErrMode)
	}
	return &analyzeProgress{w: w, mode: mode}, nil
}

func (p *analyzeProgress) step(s analyze.Progress) {
	if p.mode == progress.None || s.Elapsed < time.Second {
		return
	}
	what := "deciding"
	if s.Pass > 1 {
		what = fmt.Sprintf("what-if run %d of %d", s.Pass-1, s.Passes-1)
	}
	line := fmt.Sprintf("analyze: %s: %d records read, %s", what, s.Records, s.Elapsed.Round(time.Second))
	switch p.mode {
	case progress.Bar:
		fmt.Fprintf(p.w, "\r%-70s", line)
		p.drawn = true
	case progress.Lines:
		if now := time.Now(); s.Done || now.Sub(p.last) >= 5*time.Second {
			p.last = now
			fmt.Fprintln(p.w, line)
		}
	}
}

func (p *analyzeProgress) done() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}

// printAnalysis prints a report as a person reads it.
func printAnalysis(w io.Writer, rep *analyze.Report) error {
	clock := "each record's timestamp"
	if rep.Clock == analyze.ClockStart {
		clock = "the analysis's start"
	}
	fmt.Fprintf(w, "%d records read (%d passes); the rules' clock: %s\n", rep.Records, rep.Passes, clock)
	if rep.Unrouted > 0 {
		fmt.Fprintf(w, "%d records of topics no route reads\n", rep.Unrouted)
	}
	if rep.Stopped != "" {
		fmt.Fprintf(w, "STOPPED: %s\n", rep.Stopped)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, r := range rep.Routes {
		fmt.Fprintf(w, "\n%s (%s): %s\n", r.Service, r.Topic, r.Mode)
		row := func(label string, n int64, note string) {
			fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("  %-14s %10d  %s", label, n, note), " "))
		}
		row("records", r.Records, "")
		fwd := ""
		if r.Refreshed > 0 {
			fwd = fmt.Sprintf("(%d refreshed)", r.Refreshed)
		}
		row("would forward", r.Forwarded, fwd)
		drop := fmt.Sprintf("%.1f%%", r.DropRate)
		if r.Stale > 0 {
			drop += fmt.Sprintf(" (%d duplicates, %d stale)", r.Duplicates, r.Stale)
		}
		if r.Shadow {
			drop += " (shadow: marked, not dropped)"
		}
		row("would drop", r.Dropped, drop)
		dl := ""
		if r.Halts {
			dl = "(no dead_letter: the first would halt its partition)"
		}
		row("dead letters", r.DeadLetters, dl)
		row("identities", r.Identities, "")
		if len(r.BadRecords) > 0 {
			fmt.Fprintln(w, "  dead letters by reason:")
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			for _, b := range r.BadRecords {
				fmt.Fprintf(tw, "    %d\t%s\tfirst at %s: %s\n", b.Count, b.Reason, b.At, b.Example)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		if len(r.TopEntities) > 0 {
			fmt.Fprintln(w, "  entities with the most drops:")
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			for _, e := range r.TopEntities {
				fmt.Fprintf(tw, "    %s\t%d\n", e.Entity, e.Drops)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		if err := printChurn(w, r); err != nil {
			return err
		}
	}
	return nil
}

func printChurn(w io.Writer, r analyze.RouteReport) error {
	c := r.Churn
	if c == nil {
		return nil
	}
	fmt.Fprintf(w, "  changed paths of the forwards (%d compared with their entity's previous forward, %d first of their entity", c.Compared, c.First)
	if c.NotCompared > 0 {
		fmt.Fprintf(w, ", %d not compared", c.NotCompared)
	}
	if c.Unchanged > 0 {
		fmt.Fprintf(w, ", %d unchanged", c.Unchanged)
	}
	fmt.Fprintln(w, "):")
	if len(c.Paths) == 0 {
		fmt.Fprintln(w, "    none")
		return nil
	}
	var buf strings.Builder
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "    path\tchanged\tshare\tif ignored too\n")
	for _, p := range c.Paths {
		path := p.Path
		if path == "" {
			path = "(the whole value)"
		}
		whatIf := ""
		switch {
		case p.WhatIf == nil:
		case p.WhatIf.Error != "":
			whatIf = "cannot: " + p.WhatIf.Error
		default:
			whatIf = fmt.Sprintf("drop rate %.1f%% -> %.1f%%", r.DropRate, p.WhatIf.DropRate)
		}
		fmt.Fprintf(tw, "    %s\t%d\t%.1f%%\t%s\n", path, p.Changed, p.Share, whatIf)
	}
	if c.OtherPaths > 0 {
		fmt.Fprintf(tw, "    (other paths)\t%d\t\t\n", c.OtherPaths)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if line != "" {
			fmt.Fprintln(w, strings.TrimRight(line, " \n"))
		}
	}
	return nil
}
