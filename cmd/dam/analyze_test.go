package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/analyze"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

func runAnalyze(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(append([]string{"analyze", "--progress", "none"}, args...), strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// analyzeRecords are 40 records of 4 entities whose /at changes every
// second record and /v every tenth.
func analyzeRecords() string {
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, "e%d\t{\"v\":%d,\"meta\":{\"at\":%d}}\n", i%4, i/10, i/8)
	}
	return b.String()
}

// TestAnalyzeCmdFile analyzes a file with route flags: the table names
// the route, its counts and the what-if rate of the most changed path;
// -o json is the same report.
func TestAnalyzeCmdFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.tsv")
	if err := os.WriteFile(path, []byte(analyzeRecords()), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runAnalyze(t, "", "--file", path, "--service", "customer-3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"40 records read (2 passes)", "customer-3 (input): last-seen (entity key)", "would drop", "/meta/at", "drop rate 30.0% -> 60.0%"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = runAnalyze(t, "", "--file", path, "-o", "json", "--ignore", "/meta/at")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep analyze.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if r := rep.Routes[0]; r.Records != 40 || r.Forwarded+r.Dropped != 40 || r.Churn == nil || len(r.Churn.Paths) != 1 || r.Churn.Paths[0].Path != "/v" {
		t.Errorf("report %+v", rep.Routes[0])
	}
}

// TestAnalyzeCmdConfigAndKafka analyzes a configuration's route over its
// topic in Kafka; the configuration needs no PostgreSQL DSN or group.
func TestAnalyzeCmdConfigAndKafka(t *testing.T) {
	kc := testkafka.New(t, 2, "projections")
	var recs []*kgo.Record
	for _, line := range strings.Split(strings.TrimSpace(analyzeRecords()), "\n") {
		k, v, _ := strings.Cut(line, "\t")
		recs = append(recs, &kgo.Record{Key: []byte(k), Value: []byte(v)})
	}
	kc.Produce("projections", recs...)
	path := filepath.Join(t.TempDir(), "dam.yaml")
	cfg := fmt.Sprintf("kafka:\n  brokers: [%s]\nroutes:\n  - service: svc\n    from: projections\n    to: delivery\n    ignore: [/meta/at]\n", kc.Addr())
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runAnalyze(t, "", "--config", path, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep analyze.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	// /at ignored: each entity forwards its first record and each change
	// of /v (at records 10, 20 and 30): 4 times, of its 10 records.
	if r := rep.Routes[0]; r.Records != 40 || r.Forwarded != 16 || r.Dropped != 24 {
		t.Errorf("svc: %d records, %d forwarded, %d dropped; want 40, 16, 24", r.Records, r.Forwarded, r.Dropped)
	}
	code, _, errOut = runAnalyze(t, "", "--config", path, "--from", "1", "--max-records", "5")
	if code != 0 || !strings.Contains(errOut, "--max-records 5") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

// TestAnalyzeCmdUsage: contradictory or missing inputs are usage errors
// (exit status 2) that say what to give.
func TestAnalyzeCmdUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", "dam.yaml", "--ignore", "/a", "--file", "x"}, "not both"},
		{[]string{"--entity", "key"}, "give --config FILE"},
		{[]string{"--file", "x", "--from", "3"}, "not with --file"},
		{[]string{"--file", "x", "--ignore", "a"}, "--ignore[0]"},
		{[]string{"--file", "x", "--mode", "window"}, "--window"},
		{[]string{"--brokers", "b:9092", "--topic", "t", "--from", "yesterday"}, "--from"},
		{[]string{"--file", "x", "--clock", "wall"}, "clock"},
	} {
		code, _, errOut := runAnalyze(t, "", c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}
