// Package interop shows that a Kafka client that is neither franz-go nor
// librdkafka can use dam: kafkajs 2.2.4, a pure-JavaScript client (pinned in
// package-lock.json, installed by `make deps`), produces the projections
// and reads the deliveries with its default settings, as a new user would.
// The tests fail, never skip, when Node.js or the package is missing.
package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// kafkajsVersion is the version package-lock.json pins.
const kafkajsVersion = "2.2.4"

// node returns the path of node, failing the test when Node.js or the
// pinned kafkajs is missing: CI must not pass by skipping the interop.
func node(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found (%v): install Node.js; this test runs kafkajs under it", err)
	}
	b, err := os.ReadFile(filepath.Join("node_modules", "kafkajs", "package.json"))
	if err != nil {
		t.Fatalf("kafkajs is not installed (%v): run `make deps` (npm ci in tests/interop)", err)
	}
	var pkg struct{ Version string }
	if err := json.Unmarshal(b, &pkg); err != nil || pkg.Version != kafkajsVersion {
		t.Fatalf("node_modules holds kafkajs %q (%v), want %s: run `make deps`", pkg.Version, err, kafkajsVersion)
	}
	return path
}

// message is a record as interop.js reads it; a nil Value is a tombstone.
type message struct {
	Partition int32   `json:"partition"`
	Offset    int64   `json:"offset"`
	Key       string  `json:"key"`
	Value     *string `json:"value"`
}

// kafkajs runs interop.js with args and stdin, within a minute.
func kafkajs(t *testing.T, stdin []byte, args ...string) (stdout []byte, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node(t), append([]string{"interop.js"}, args...)...)
	cmd.Env = append(os.Environ(), "KAFKAJS_NO_PARTITIONER_WARNING=1")
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("node interop.js %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return out.Bytes(), nil
}

// dam runs the pipeline from projections to deliveries with compression,
// in the given delivery mode, until the end of the test, and returns its
// metrics registry.
func dam(t *testing.T, kc *testkafka.Cluster, compression config.Codecs, delivery string) *prometheus.Registry {
	t.Helper()
	dsn := pgtest.DSN(t)
	cfg := config.Default()
	cfg.Kafka.Brokers = []string{kc.Addr()}
	cfg.Kafka.Group = "dam-" + strings.ReplaceAll(t.Name(), "/", "-")
	cfg.Kafka.Start = config.StartEarliest
	cfg.Kafka.Compression = compression
	cfg.Kafka.Delivery = delivery
	cfg.Postgres.DSN = dsn
	cfg.HTTP.Listen = ""
	cfg.Pipeline.RetryMax = time.Second
	rt := config.DefaultRoute()
	rt.Service, rt.From, rt.To = "customer-2", "projections", "deliveries"
	rt.Ignore = []string{"/updated_at"}
	cfg.Routes = []config.Route{rt}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := dedup.Open(ctx, dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	reg := prometheus.NewRegistry()
	pl, err := pipeline.New(cfg, store, pipeline.WithLogger(zaptest.NewLogger(t)), pipeline.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- pl.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-errc; err != nil {
			t.Errorf("pipeline: %v", err)
		}
	})
	return reg
}

// waitDecided waits until dam has decided and delivered n input records.
func waitDecided(t *testing.T, reg *prometheus.Registry, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got := 0.0
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "dam_records_total" {
				for _, m := range mf.GetMetric() {
					got += m.GetCounter().GetValue()
				}
			}
		}
		if int(got) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("dam decided %v of %d records within a minute", got, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// input is what kafkajs produces: JSON values (one with a member order,
// whitespace and an ignored field that differ from an earlier value), text
// beyond ASCII, and a tombstone.
type input struct {
	Key   string  `json:"key"`
	Value *string `json:"value"`
}

func str(s string) *string { return &s }

var (
	projections = []input{
		{"B-007", str(`{"banana_id":"B-007","ripeness":"green","updated_at":"t1"}`)},
		{"B-007", str(`{ "ripeness": "green", "banana_id": "B-007", "updated_at": "t2" }`)}, // duplicate
		{"B-007", str(`{"banana_id":"B-007","ripeness":"yellow","updated_at":"t3"}`)},
		{"B-008", str(`{"banana_id":"B-008","origin":"Tenerife – Canarias 🍌"}`)},
		{"B-008", str(`{"banana_id":"B-008","origin":"Tenerife – Canarias 🍌"}`)}, // duplicate
		{"B-009", str(`{"banana_id":"B-009"}`)},
		{"B-009", nil},
		{"B-009", nil}, // duplicate tombstone
		{"B-010", str(`{"banana_id":"B-010","ripeness":"green"}`)},
		{"B-010", str(`{"banana_id":"B-010","ripeness":"yellow"}`)},
		{"B-010", str(`{"banana_id":"B-010","ripeness":"green"}`)},
	}
	// wantDeliveries are each key's deliveries in order ("<nil>": tombstone).
	wantDeliveries = map[string][]string{
		"B-007": {`{"banana_id":"B-007","ripeness":"green","updated_at":"t1"}`, `{"banana_id":"B-007","ripeness":"yellow","updated_at":"t3"}`},
		"B-008": {`{"banana_id":"B-008","origin":"Tenerife – Canarias 🍌"}`},
		"B-009": {`{"banana_id":"B-009"}`, "<nil>"},
		"B-010": {`{"banana_id":"B-010","ripeness":"green"}`, `{"banana_id":"B-010","ripeness":"yellow"}`, `{"banana_id":"B-010","ripeness":"green"}`},
	}
)

func wantCount() int {
	n := 0
	for _, v := range wantDeliveries {
		n += len(v)
	}
	return n
}

// produce has kafkajs write the projections.
func produce(t *testing.T, kc *testkafka.Cluster) {
	t.Helper()
	in, err := json.Marshal(projections)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kafkajs(t, in, "produce", "--brokers", kc.Addr(), "--topic", "projections"); err != nil {
		t.Fatal(err)
	}
}

// kafkajs produces the projections and reads dam's deliveries, both with
// its defaults: each key's changes arrive once, in order, tombstones as
// tombstones, and on the partition kafkajs's own partitioner chose for the
// input (dam partitions with murmur2, as the Java client and kafkajs do).
// In exactly-once mode kafkajs reads read_committed, as adapters must.
func TestKafkajsProducesAndReads(t *testing.T) {
	t.Parallel()
	for _, delivery := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(delivery, func(t *testing.T) { t.Parallel(); testKafkajs(t, delivery) })
	}
}

func testKafkajs(t *testing.T, delivery string) {
	kc := testkafka.New(t, 3, "projections", "deliveries")
	reg := dam(t, kc, nil, delivery) // compression: the default, none
	produce(t, kc)
	waitDecided(t, reg, len(projections))

	out, err := kafkajs(t, nil, "consume", "--brokers", kc.Addr(), "--topic", "deliveries",
		"--count", fmt.Sprint(wantCount()), "--isolation-level", "read_committed")
	if err != nil {
		t.Fatal(err)
	}
	var got []message
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var m message
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("interop.js printed %q: %v", sc.Text(), err)
		}
		got = append(got, m)
	}
	if len(got) != wantCount() {
		t.Fatalf("kafkajs read %d deliveries, want %d", len(got), wantCount())
	}
	slices.SortStableFunc(got, func(a, b message) int { return int(a.Offset - b.Offset) }) // per partition order
	byKey := map[string][]string{}
	for _, m := range got {
		v := "<nil>"
		if m.Value != nil {
			v = *m.Value
		}
		byKey[m.Key] = append(byKey[m.Key], v)
	}
	for k, want := range wantDeliveries {
		if !slices.Equal(byKey[k], want) {
			t.Errorf("%s: kafkajs read %q, want %q", k, byKey[k], want)
		}
	}
	if all := kc.ReadAll("deliveries"); len(all) != wantCount() {
		t.Errorf("deliveries holds %d records, want %d", len(all), wantCount())
	}
	inPart := map[string]int32{}
	for _, r := range kc.ReadAll("projections") {
		inPart[string(r.Key)] = r.Partition
	}
	for _, m := range got {
		if m.Partition != inPart[m.Key] {
			t.Errorf("%s delivered on partition %d, produced by kafkajs on %d", m.Key, m.Partition, inPart[m.Key])
		}
	}
}

// The failure kafka.compression's default prevents: with snappy (franz-go's
// own default) kafkajs cannot read dam's output at all.
func TestKafkajsCannotReadSnappy(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "projections", "deliveries")
	reg := dam(t, kc, config.Codecs{"snappy"}, config.DeliveryAtLeastOnce)
	produce(t, kc)
	// franz-go sends a batch uncompressed when snappy does not make it
	// smaller, as for a batch of one short record: a record that
	// compresses well makes sure a snappy batch is there to read.
	kc.Produce("projections", &kgo.Record{Key: []byte("B-011"), Value: []byte(`{"banana_id":"B-011","notes":"` + strings.Repeat("ripe ", 1000) + `"}`)})
	waitDecided(t, reg, len(projections)+1)
	_, err := kafkajs(t, nil, "consume", "--brokers", kc.Addr(), "--topic", "deliveries",
		"--count", fmt.Sprint(wantCount()+1), "--timeout-ms", "20000")
	if err == nil || !strings.Contains(err.Error(), "Snappy compression not implemented") {
		t.Fatalf("kafkajs reading snappy batches: %v, want Snappy compression not implemented", err)
	}
	t.Logf("as expected: %v", err)
}
