package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/config"
)

// TestLoadAnalyze: dam analyze's configuration may lack PostgreSQL, the
// consumer group and the brokers; every other problem is still reported.
func TestLoadAnalyze(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dam.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("routes:\n  - service: s\n    from: a\n    to: b\n    entity: /id\n")
	cfg, err := config.LoadAnalyze(path, nil)
	if err != nil {
		t.Fatalf("LoadAnalyze: %v", err)
	}
	if cfg.Routes[0].EntitySource().Pointer != "/id" {
		t.Errorf("the route's entity is not parsed: %+v", cfg.Routes[0].EntitySource())
	}
	if _, err := config.Load(path, nil); err == nil {
		t.Error("Load accepts a configuration without PostgreSQL and Kafka")
	}
	write("postgres:\n  dsn: mysql://x\nroutes:\n  - service: s\n    from: a\n    to: b\n    ignore: [nope]\n")
	_, err = config.LoadAnalyze(path, nil)
	for _, want := range []string{"postgres.dsn: unknown scheme", "routes[0].ignore[0]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadAnalyze: %v, want %q", err, want)
		}
	}
	c := config.Default()
	if err := c.ValidateForAnalyze(); err == nil || !strings.Contains(err.Error(), "routes") || strings.Contains(err.Error(), "postgres.dsn") {
		t.Errorf("ValidateForAnalyze without routes: %v", err)
	}
}
