package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// TestStateSkip steps a running sidecar's partition, halted at bad input
// on a route without a dead-letter topic, past that record: without --yes
// dam state skip only says what it would do; with it, the partition goes
// on, the records after the bad one are delivered and it is not, and dam
// explain --offset names who skipped it and why.
func TestStateSkip(t *testing.T) {
	unsetDSN(t) // not parallel
	const in, out = "projections.email", "delivery.email"
	kc := testkafka.New(t, 1, in, out)
	path := filepath.Join(t.TempDir(), "dam.yaml")
	yaml := fmt.Sprintf(`kafka:
  brokers: [%s]
  group: dam-email
  start: earliest
  session_timeout: 10s
  rebalance_timeout: 40s
  transaction_timeout: 8s
postgres:
  dsn: %q
  idle_in_transaction_timeout: 5s
http:
  listen: ""
routes:
  - service: email
    from: %s
    to: %s
`, kc.Addr(), pgtest.DSN(t), in, out)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- runSidecar(ctx, cfg, zaptest.NewLogger(t), prometheus.NewRegistry(), nil) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("sidecar: %v", err)
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	record := func(key, value string) *kgo.Record { return &kgo.Record{Key: []byte(key), Value: []byte(value)} }
	kc.Produce(in, record("a", `{"to":"a@example.com"}`), record("bad", `{"to":`), record("b", `{"to":"b@example.com"}`))
	waitFor("a delivered", func() bool { return len(kc.ReadAll(out)) == 1 })
	args := []string{"state", "skip", "-c", path, "--topic", in, "--partition", "0", "--offset", "1", "--by", "alice", "--reason", "malformed, INC-42"}

	// Without --yes: what it would do, nothing changed. The committed
	// offset reaches 1 once a's delivery is committed.
	var text, errOut string
	var code int
	waitFor("the preview to see the partition at offset 1", func() bool {
		code, text, errOut = runDam(t, args...)
		return code == 0 && strings.Contains(text, "committed offset 1, decided below 1")
	})
	mustContain(t, "skip without --yes", text, "offset 1 is not decided: it would be logged as skipped", "by alice: malformed, INC-42", "add --yes")
	time.Sleep(time.Second)
	if n := len(kc.ReadAll(out)); n != 1 {
		t.Fatalf("%d delivered after a skip without --yes, want 1", n)
	}

	code, text, errOut = runDam(t, append(args, "--yes")...)
	if code != 0 {
		t.Fatalf("skip --yes: %d %s %s", code, text, errOut)
	}
	mustContain(t, "skip --yes", text, "skipped projections.email/0@1 (group dam-email) by alice", "it was not decided")
	waitFor("b delivered", func() bool { return len(kc.ReadAll(out)) == 2 })
	kc.Produce(in, record("c", `{"to":"c@example.com"}`))
	waitFor("c delivered", func() bool { return len(kc.ReadAll(out)) == 3 })
	for _, r := range kc.ReadAll(out) {
		if string(r.Key) == "bad" {
			t.Errorf("the skipped record was delivered")
		}
	}

	code, text, errOut = runDam(t, "explain", "-c", path, "--topic", in, "--partition", "0", "--offset", "1")
	if code != 0 {
		t.Fatalf("explain: %d %s", code, errOut)
	}
	mustContain(t, "explain offset 1", text, "decision skipped", "skipped by an operator: alice at ", "malformed, INC-42")
	// A second skip of the same record is refused, naming the first.
	if code, _, errOut = runDam(t, append(args, "--yes")...); code != 2 || !strings.Contains(errOut, "skipped already, by alice") {
		t.Fatalf("second skip: %d %s", code, errOut)
	}
	if code, _, errOut = runDam(t, "state", "skip", "-c", path, "--topic", in, "--partition", "0", "--offset", "1", "--yes"); code != 2 || !strings.Contains(errOut, "--reason is required") {
		t.Fatalf("skip without --reason: %d %s", code, errOut)
	}
}
