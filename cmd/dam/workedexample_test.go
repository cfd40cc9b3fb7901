package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// TestWorkedExample is the worked example of docs/operations.md#operations,
// against the real sidecar: a record is dropped as a duplicate, dam explain
// says why (as text and as JSON), and dam state reset plus a replay
// delivers it again.
func TestWorkedExample(t *testing.T) {
	unsetDSN(t) // not parallel
	const in, out = "projections.customer-2", "delivery.customer-2"
	kc := testkafka.New(t, 1, in, out)
	path := filepath.Join(t.TempDir(), "dam.yaml")
	yaml := fmt.Sprintf(`kafka:
  brokers: [%s]
  group: dam-customer-2
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
  - service: customer-2
    from: %s
    to: %s
    ignore: [/updated_at]
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
	waitDelivered := func(n int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for len(kc.ReadAll(out)) < n {
			if time.Now().After(deadline) {
				t.Fatalf("%s holds %d records, want %d", out, len(kc.ReadAll(out)), n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	record := func(value string) *kgo.Record { return &kgo.Record{Key: []byte("B-007"), Value: []byte(value)} }

	// Mr. Banana ripens; then an update of a field this projection leaves
	// out repeats the projection (only updated_at changed).
	kc.Produce(in, record(`{"banana_id":"B-007","ripeness_level":"Mostly Yellow","updated_at":"10:00"}`))
	waitDelivered(1)
	kc.Produce(in, record(`{"updated_at":"10:05","ripeness_level":"Mostly Yellow","banana_id":"B-007"}`))
	kc.Produce(in, &kgo.Record{Key: []byte("B-008"), Value: []byte(`{"banana_id":"B-008"}`)}) // to see offset 1 decided
	waitDelivered(2)
	if got := len(kc.ReadAll(out)); got != 2 {
		t.Fatalf("%d delivered, want 2 (offset 1 dropped)", got)
	}

	code, text, errOut := runDam(t, "explain", "--config", path, "--topic", in, "--partition", "0", "--offset", "1")
	if code != 0 {
		t.Fatalf("explain: %d %s", code, errOut)
	}
	mustContain(t, "explain offset 1", text, "decision duplicate", "duplicate of the content forwarded from offset 0 at")
	t.Logf("dam explain --offset 1:\n%s", text)
	code, text, _ = runDamStdin(t, `{"banana_id":"B-007","ripeness_level":"Mostly Yellow","updated_at":"11:00"}`,
		"explain", "--config", path, "customer-2", "B-007", "-")
	mustContain(t, "explain payload", text, "decision duplicate", "from projections.customer-2/0@0")
	if code != 0 {
		t.Fatal(code)
	}

	// The same answers as JSON, for scripts.
	var offsetJSON struct {
		Decision    string
		DuplicateOf struct{ Offset int64 } `json:"duplicate_of"`
		Evidence    []string
	}
	code, text, _ = runDam(t, "explain", "--config", path, "--topic", in, "--partition", "0", "--offset", "1", "-o", "json")
	if err := json.Unmarshal([]byte(text), &offsetJSON); code != 0 || err != nil || offsetJSON.Decision != "duplicate" ||
		offsetJSON.DuplicateOf.Offset != 0 || len(offsetJSON.Evidence) < 3 {
		t.Fatalf("explain offset 1 -o json: %d %v\n%s", code, err, text)
	}
	var payloadJSON struct {
		Decision, Cause string
		Stored          struct{ Source struct{ Offset int64 } }
	}
	code, text, _ = runDamStdin(t, `{"banana_id":"B-007","ripeness_level":"Green"}`,
		"explain", "--config", path, "-o", "json", "customer-2", "B-007", "-")
	if err := json.Unmarshal([]byte(text), &payloadJSON); code != 0 || err != nil || payloadJSON.Decision != "forward" ||
		payloadJSON.Cause != "changed" || payloadJSON.Stored.Source.Offset != 0 {
		t.Fatalf("explain payload -o json: %d %v\n%s", code, err, text)
	}

	// Re-deliver on purpose: reset the identity, replay upstream.
	if code, text, errOut := runDam(t, "state", "reset", "--config", path, "customer-2", "B-007"); code != 0 || text != "reset 1 identities of service customer-2\n" {
		t.Fatalf("reset: %d %q %q", code, text, errOut)
	}
	kc.Produce(in, record(`{"banana_id":"B-007","ripeness_level":"Mostly Yellow","updated_at":"10:05"}`))
	waitDelivered(3)
	got := kc.ReadAll(out)
	if string(got[2].Key) != "B-007" {
		t.Fatalf("replayed record not delivered: %v", got[2])
	}
	_, text, _ = runDam(t, "explain", "--config", path, "--topic", in, "--partition", "0", "--offset", "3")
	mustContain(t, "explain offset 3", text, "decision forward", "forwarded although the previous record of this entity (offset 1) has the same content: its state was reset or pruned in between")
	t.Logf("dam explain --offset 3:\n%s", text)
}
