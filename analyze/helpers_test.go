package analyze_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/analyze"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// routeOf returns a validated route reading topic "t", set by set.
func routeOf(t *testing.T, set func(r *config.Route)) config.Route {
	t.Helper()
	r := config.DefaultRoute()
	r.Service, r.From, r.To = "svc", "t", "out"
	if set != nil {
		set(&r)
	}
	cfg := config.Default()
	cfg.Routes = []config.Route{r}
	if err := cfg.ValidateForAnalyze(); err != nil {
		t.Fatal(err)
	}
	return cfg.Routes[0]
}

// run analyzes src under route r with o, failing the test on an error.
func run(t *testing.T, src analyze.Source, r config.Route, o analyze.Options) *analyze.Report {
	t.Helper()
	rep, err := analyze.Run(context.Background(), src, []config.Route{r}, o)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// writeFile writes lines, one a line, to a fresh file and returns its
// path.
func writeFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "records")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
