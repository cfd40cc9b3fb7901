// Package progress reports the progress of a long, batched operation on
// stored state (dam state reset, dam state prune) to a person: a bar
// redrawn in place on a terminal, or plain lines for a log.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

// The modes of a Reporter.
const (
	Auto  = "auto"  // a bar on a terminal, lines otherwise
	Bar   = "bar"   // a bar redrawn in place
	Lines = "lines" // plain lines, for logs
	None  = "none"  // nothing
)

// ErrMode is returned by New for a mode it does not know.
var ErrMode = fmt.Errorf("want %s, %s, %s or %s", Auto, Bar, Lines, None)

// IsTerminal reports whether w is a terminal (a character device).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// New returns a Reporter of mode writing to w, the operation named what
// counting unit (e.g. "reset", "identities"); terminal decides Auto.
func New(w io.Writer, mode, what, unit string, terminal bool) (*Reporter, error) {
	switch mode {
	case Auto:
		mode = Lines
		if terminal {
			mode = Bar
		}
	case Bar, Lines, None:
	default:
		return nil, ErrMode
	}
	return &Reporter{w: w, mode: mode, what: what, unit: unit, now: time.Now}, nil
}

// Reporter reports the steps of a batched state operation: a bar redrawn
// in place on a terminal, or otherwise plain lines: the first batch, then
// at most one every lineEvery, and the last.
type Reporter struct {
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

// Step reports one step of the operation (the callback of
// dedup.WithProgress).
func (p *Reporter) Step(st dedup.Step) {
	p.final = st
	switch p.mode {
	case Bar:
		fmt.Fprintf(p.w, "\r%s %s", p.what, p.bar(st))
		p.drawn = true
	case Lines:
		if now := p.now(); p.last.IsZero() || now.Sub(p.last) >= lineEvery {
			p.last, p.printed = now, st
			fmt.Fprintf(p.w, "%s: %s\n", p.what, p.counts(st))
		}
	}
}

// Done ends the report: the bar's line, or the last line if it was not
// printed yet.
func (p *Reporter) Done() {
	switch p.mode {
	case Bar:
		if p.drawn {
			fmt.Fprintln(p.w)
		}
	case Lines:
		if p.final != p.printed {
			fmt.Fprintf(p.w, "%s: %s\n", p.what, p.counts(p.final))
		}
	}
}

func (p *Reporter) counts(st dedup.Step) string {
	if st.Total <= 0 {
		return fmt.Sprintf("%d %s, %d deleted", st.Done, p.unit, st.Deleted)
	}
	return fmt.Sprintf("%d/%d %s (%d%%), %d deleted", st.Done, st.Total, p.unit, percent(st), st.Deleted)
}

func (p *Reporter) bar(st dedup.Step) string {
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
