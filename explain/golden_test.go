package explain

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.golden with the wording the tests produce")

// CheckGolden compares got, the wording a test's explanations produced,
// with testdata/<name>.golden, or with -rewrite writes it there. Times of
// the database's clock (within a month of now: the tests pin theirs in
// 2030) vary from run to run and are compared as "<db clock>"; durations
// between two of them do not appear in the tests' wording. A test that
// already failed writes nothing.
func CheckGolden(t *testing.T, name, got string) {
	t.Helper()
	got = dbClockTimes(got, time.Now())
	path := filepath.Join("testdata", name+".golden")
	if *rewrite {
		if t.Failed() {
			t.Logf("%s not rewritten: the test failed", path)
			return
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./explain -rewrite writes it)", err)
	}
	if got != string(want) {
		t.Errorf("the wording differs from %s (go test ./explain -rewrite rewrites it):\n%s", path, lineDiff(string(want), got))
	}
}

var timeRE = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)

// dbClockTimes replaces the times in s within a month of now by
// "<db clock>".
func dbClockTimes(s string, now time.Time) string {
	return timeRE.ReplaceAllStringFunc(s, func(m string) string {
		at, err := time.Parse(time.RFC3339Nano, m)
		if err != nil || at.Sub(now).Abs() > 31*24*time.Hour {
			return m
		}
		return "<db clock>"
	})
}

// lineDiff shows the lines of want and got that differ, in order.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want: %s\n  got:  %s\n", i+1, wl, gl)
		}
	}
	return b.String()
}

// TestDBClockTimes: a time near now is replaced, a pinned one (2030) is
// kept.
func TestDBClockTimes(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	got := dbClockTimes("set 2026-05-01T11:59:58.123456Z, expires 2030-01-02T04:04:05Z, 2026-03-01T00:00:00Z", now)
	if want := "set <db clock>, expires 2030-01-02T04:04:05Z, 2026-03-01T00:00:00Z"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
