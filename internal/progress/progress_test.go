package progress_test

import (
	"os"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/progress"
)

func TestIsTerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if progress.IsTerminal(w) || progress.IsTerminal(&strings.Builder{}) {
		t.Fatal("a pipe or a buffer is not a terminal")
	}
	if f, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		defer f.Close()
		if !progress.IsTerminal(f) {
			t.Fatal("/dev/tty is a terminal")
		}
	}
}

// Lines mode prints the first step, then at most one a second, and the
// last; a bar is redrawn in place and ended by a newline.
func TestReporter(t *testing.T) {
	var b strings.Builder
	pr, err := progress.New(&b, progress.Lines, "reset", "identities", false)
	if err != nil {
		t.Fatal(err)
	}
	for i := int64(1); i <= 3; i++ {
		pr.Step(dedup.Step{Done: i, Total: 3, Deleted: i})
	}
	pr.Done()
	if got := b.String(); got != "reset: 1/3 identities (33%), 1 deleted\nreset: 3/3 identities (100%), 3 deleted\n" {
		t.Errorf("lines: %q", got)
	}
	b.Reset()
	if pr, err = progress.New(&b, progress.Auto, "prune", "rows walked", true); err != nil {
		t.Fatal(err)
	}
	pr.Step(dedup.Step{Done: 5})
	pr.Done()
	if got := b.String(); !strings.HasPrefix(got, "\rprune [") || !strings.HasSuffix(got, "5 rows walked, 0 deleted\n") {
		t.Errorf("bar: %q", got)
	}
	if _, err := progress.New(&b, "fancy", "x", "y", false); err == nil {
		t.Error("an unknown mode is accepted")
	}
}
