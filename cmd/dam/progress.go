package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dam-dedup/dam/dedup"
)

// Progress modes of --progress.
const (
	progressAuto  = "auto"  // a bar on a terminal, lines otherwise
	progressBar   = "bar"   // a bar redrawn in place
	progressLines = "lines" // plain lines, for logs
	progressNone  = "none"
)

func addProgressFlag(cmd *cobra.Command) {
	cmd.Flags().String("progress", progressAuto, "progress on stderr: auto (a bar on a terminal, plain lines otherwise), bar, lines or none")
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// newProgress returns the reporter --progress asks for, writing to the
// command's stderr; terminal decides auto.
func newProgress(cmd *cobra.Command, what, unit string, terminal func(io.Writer) bool) (*progress, error) {
	mode, _ := cmd.Flags().GetString("progress")
	w := cmd.ErrOrStderr()
	switch mode {
	case progressAuto:
		mode = progressLines
		if terminal(w) {
			mode = progressBar
		}
	case progressBar, progressLines, progressNone:
	default:
		return nil, usagef("--progress %q: want auto, bar, lines or none", mode)
	}
	return &progress{w: w, mode: mode, what: what, unit: unit, now: time.Now}, nil
}

// progress reports the steps of a batched state operation: a bar redrawn
// in place on a terminal, or otherwise plain lines: the first batch, then
// at most one every lineEvery, and the last.
type progress struct {
	w          io.Writer
	mode       string
	what, unit string
	now        func() time.Time
	last       time.Time  // when the last line was printed
	printed    dedup.Step // the last step printed
	drawn      bool
	final      dedup.Step // the last step reported
}

// lineEvery spaces the plain lines of a long operation.
const lineEvery = time.Second

// barWidth is the bar's length in characters.
const barWidth = 30

func (p *progress) step(st dedup.Step) {
	p.final = st
	switch p.mode {
	case progressBar:
		fmt.Fprintf(p.w, "\r%s %s", p.what, p.bar(st))
		p.drawn = true
	case progressLines:
		if now := p.now(); p.last.IsZero() || now.Sub(p.last) >= lineEvery {
			p.last, p.printed = now, st
			fmt.Fprintf(p.w, "%s: %s\n", p.what, p.counts(st))
		}
	}
}

// done ends the report: the bar's line, or the last line if it was not
// printed yet.
func (p *progress) done() {
	switch p.mode {
	case progressBar:
		if p.drawn {
			fmt.Fprintln(p.w)
		}
	case progressLines:
		if p.final != p.printed {
			fmt.Fprintf(p.w, "%s: %s\n", p.what, p.counts(p.final))
		}
	}
}

func (p *progress) counts(st dedup.Step) string {
	if st.Total <= 0 {
		return fmt.Sprintf("%d %s, %d deleted", st.Done, p.unit, st.Deleted)
	}
	return fmt.Sprintf("%d/%d %s (%d%%), %d deleted", st.Done, st.Total, p.unit, percent(st), st.Deleted)
}

func (p *progress) bar(st dedup.Step) string {
	filled := 0
	if st.Total > 0 {
		filled = int(min(st.Done, st.Total) * barWidth / st.Total)
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", barWidth-filled) + "] " + p.counts(st)
}

func percent(st dedup.Step) int64 {
	if st.Total <= 0 {
		return 0
	}
	return min(st.Done, st.Total) * 100 / st.Total
}
