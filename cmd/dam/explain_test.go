package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// The logic of dam explain is package explain's, tested there; the
// command's own part is its flags, its wiring and its printing:
// TestWorkedExample prints both questions, as text and JSON, against the
// real sidecar, and this test its usage errors and failures.

func TestExplainErrors(t *testing.T) {
	unsetDSN(t)
	path := writeRunConfig(t, pgtest.DSN(t), "")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"nosuch", "e"}, 2, `unknown service "nosuch"`},
		{[]string{"--hex", "s", "zz"}, 2, `entity "zz": not hex`},
		{[]string{"s"}, 2, "give SERVICE ENTITY"},
		{[]string{"--topic", "in", "--offset", "1"}, 2, "go together"},
		{[]string{"--topic", "in", "--partition", "0", "--offset", "1", "s", "e"}, 2, "not both"},
		{[]string{"--topic", "in", "--partition", "-1", "--offset", "1"}, 2, "must not be negative"},
		{[]string{"--topic", "nope", "--partition", "0", "--offset", "1"}, 2, `no route of the configuration reads topic "nope"`},
		{[]string{"-o", "yaml", "s", "e"}, 2, "want text or json"},
		{[]string{"--lookback", "-1", "s", "e"}, 2, "--lookback must not be negative"},
		{[]string{"s", "e", "--header", "Version=9"}, 2, "--header goes with a PAYLOAD_FILE"},
		{[]string{"s", "e", "p.json", "--header", "Version"}, 2, "want NAME=VALUE"},
		{[]string{"s", "e", "/no/such/file"}, 1, "no such file"},
	} {
		code, _, errOut := runDam(t, append([]string{"explain", "--config", path}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: %d %q, want %d ...%s...", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	// An unreachable database is named, and fails (1).
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte(fmt.Sprintf("kafka: {brokers: [%s], group: g}\npostgres: {dsn: \"postgres://nobody:secret@127.0.0.1:1/x?connect_timeout=2\"}\nroutes: [{service: svc, from: in, to: out}]\n", "127.0.0.1:1")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runDam(t, "explain", "--config", bad, "svc", "e")
	if code != 1 || !strings.Contains(errOut, "postgres postgres://nobody:xxxxx@127.0.0.1:1/x") || strings.Contains(errOut, "secret") {
		t.Fatalf("unreachable database: %d %q", code, errOut)
	}
}
