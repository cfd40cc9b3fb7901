package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/explain"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// committedAt reads the group's committed offset of topic/0 (-1: none).
func committedAt(t *testing.T, kc *testkafka.Cluster, group, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(kc.Client()).FetchOffsets(kadm.RequireStable(ctx), group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup(topic, 0); ok && o.Err == nil && o.At >= 0 {
		return o.At
	}
	return -1
}

// explainOffset explains the record of cfg's first route at offset of
// partition 0, as dam explain --offset does.
func explainOffset(t *testing.T, cfg config.Config, kc *testkafka.Cluster, store *dedup.Store, offset int64) *explain.OffsetExplanation {
	t.Helper()
	validate(t, &cfg)
	rt, err := pipeline.CompileRoute(cfg.Routes[0])
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := explain.New(store, kc.Client(), cfg.Kafka.Group).Offset(ctx, rt, 0, offset)
	if err != nil {
		t.Fatalf("explain offset %d: %v", offset, err)
	}
	return res
}

// haltAtBadRecord produces a good record, a bad one and two good ones to a
// route without a dead-letter topic, and waits for the partition to halt
// at the bad one (offset 1); the halt names the command that skips it.
func haltAtBadRecord(t *testing.T, kc *testkafka.Cluster, r *running) {
	t.Helper()
	one(t, kc, "in", rec("a", `1`), rec("bad", `{"x":`), rec("b", `1`), rec("c", `1`))
	var err error
	waitFor(t, "the partition halted", func() (bool, string) {
		err = r.pl.Ready()
		return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
	})
	if !strings.Contains(err.Error(), "dam state skip -c CONFIG --topic in --partition 0 --offset 1") {
		t.Errorf("halt: %v; want it to name the command that skips offset 1", err)
	}
}

// checkSkipped checks the output and the explanation after the skip of
// offset 1: every other record delivered once, the bad one never, and
// explain names the operator, the reason and the time.
func checkSkipped(t *testing.T, cfg config.Config, kc *testkafka.Cluster, store *dedup.Store, r *running) {
	t.Helper()
	waitModel(t, kc, "out", map[string][]string{"a": {"1"}, "b": {"1"}, "c": {"1"}})
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 4)
	waitFor(t, "the partition ready again", func() (bool, string) {
		err := r.pl.Ready()
		return err == nil, fmt.Sprint(err)
	})
	one(t, kc, "in", rec("d", `1`))
	waitModel(t, kc, "out", map[string][]string{"a": {"1"}, "b": {"1"}, "c": {"1"}, "d": {"1"}})
	r.stop()
	if out := kc.ReadAll("out"); len(out) != 4 {
		t.Errorf("delivered %s, want a, b, c and d once each, the skipped record never", dump(out))
	}
	res := explainOffset(t, cfg, kc, store, 1)
	if res.Decision != "skipped" || res.Skip == nil || res.Skip.By != "alice" || res.Skip.Reason != "malformed, INC-42" ||
		res.Skip.Was != "undecided" || res.DecidedAt == nil {
		t.Fatalf("explain offset 1: %s: %s (%+v)", res.Decision, res.Reason, res.Skip)
	}
	if !strings.Contains(res.Reason, "skipped by an operator: alice at ") || !strings.Contains(res.Reason, "malformed, INC-42") {
		t.Errorf("explain offset 1: %s", res.Reason)
	}
}

// A partition halted at bad input without a dead-letter topic, while dam
// runs: an operator skip of the record makes the running sidecar recover
// the partition, which goes on after it, in both delivery modes.
func TestOperatorSkipResumesRunningPartition(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1, "in", "out")
			dsn := pgtest.DSN(t)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			store := openStore(t, dsn)
			r := start(t, cfg, store)
			haltAtBadRecord(t, kc, r)
			p := dedup.Partition{Group: cfg.Kafka.Group, Topic: "in", Partition: 0}
			if _, err := store.Skip(context.Background(), p, 1, committedAt(t, kc, cfg.Kafka.Group, "in"), "alice", "malformed, INC-42"); err != nil {
				t.Fatal(err)
			}
			checkSkipped(t, cfg, kc, store, r)
		})
	}
}

// The same with dam stopped: the skip is recorded in the store, and the
// next start recovers the partition past the record.
func TestOperatorSkipWhileStopped(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	haltAtBadRecord(t, kc, r)
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
	r.stop()
	p := dedup.Partition{Group: cfg.Kafka.Group, Topic: "in", Partition: 0}
	if _, err := store.Skip(context.Background(), p, 1, committedAt(t, kc, cfg.Kafka.Group, "in"), "alice", "malformed, INC-42"); err != nil {
		t.Fatal(err)
	}
	checkSkipped(t, cfg, kc, store, start(t, cfg, store))
}

// The decision log is kept after delivery (decision_log.keep): a
// duplicate's decision is read from it once a later change has moved the
// state on, long after its offset was committed. (It was pruned at the
// first commit, and explain could only say "unknown … suggests a
// duplicate".)
func TestExplainDuplicateFromKeptLog(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	one(t, kc, "in", rec("x", `{"v":1}`), rec("x", `{"v":1}`))
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 2)
	one(t, kc, "in", rec("x", `{"v":2}`))
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 3)
	time.Sleep(2 * time.Second) // a pruning round or more
	r.stop()
	res := explainOffset(t, cfg, kc, store, 1)
	if res.Decision != "duplicate" || res.DuplicateOf == nil || res.DuplicateOf.Offset != 0 || res.DecidedAt == nil ||
		!strings.Contains(res.Reason, "decided at ") || !strings.Contains(res.Reason, "with the same content") {
		t.Fatalf("explain offset 1: %s: %s\n%s", res.Decision, res.Reason, strings.Join(res.Evidence, "\n"))
	}
}

// Recovery reads the decision log only from the committed offset up: the
// batches kept below it (decision_log.keep) are never replayed, whether
// Kafka holds the committed offset or it expired.
func TestKeptLogLeavesRecoveryUnchanged(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	store := openStore(t, dsn)
	ctx := context.Background()
	p := dedup.Partition{Group: cfg.Kafka.Group, Topic: "in", Partition: 0}
	r := start(t, cfg, store)
	one(t, kc, "in", rec("a", `1`))
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 1)
	one(t, kc, "in", rec("b", `1`), rec("c", `1`))
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 3)
	r.stop()
	if first, ok, err := store.LogStart(ctx, p); err != nil || !ok || first != 0 {
		t.Fatalf("log start %d %v %v: want the delivered batches kept from 0", first, ok, err)
	}

	// Decided and not delivered: [3, 5) logged with its forwards, as a
	// crash between decide and delivery leaves it (C 3 < P 5).
	one(t, kc, "in", rec("d", `1`), rec("e", `1`))
	pr, err := store.Acquire(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	d := canon.Digest{byte(canon.SchemeJSON1), 9}
	if _, err := store.Decide(ctx, &dedup.Batch{Service: "svc", Partition: p, Epoch: pr.Epoch, Start: 3, End: 5,
		Records: []dedup.Record{{Offset: 3, Entity: []byte("d"), Digest: d}, {Offset: 4, Entity: []byte("e"), Digest: d}}}, nil); err != nil {
		t.Fatal(err)
	}
	r = start(t, cfg, store)
	waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, 5)
	r.stop()
	if out := kc.ReadAll("out"); len(out) != 5 {
		t.Fatalf("delivered %s, want a to e once each: the replay covers [3, 5) alone", dump(out))
	}

	// The group's offsets expire: recovery starts from the committed offset
	// dam recorded, not from the log's first kept batch.
	if _, err := kadm.NewClient(kc.Client()).DeleteGroup(ctx, cfg.Kafka.Group); err != nil {
		t.Fatal(err)
	}
	r = start(t, cfg, store)
	one(t, kc, "in", rec("f", `1`))
	waitModel(t, kc, "out", map[string][]string{"a": {"1"}, "b": {"1"}, "c": {"1"}, "d": {"1"}, "e": {"1"}, "f": {"1"}})
	r.stop()
	if out := kc.ReadAll("out"); len(out) != 6 {
		t.Errorf("delivered %s, want each record once", dump(out))
	}
	if first, ok, err := store.LogStart(ctx, p); err != nil || !ok || first != 0 {
		t.Errorf("log start %d %v %v: want the delivered batches still kept", first, ok, err)
	}
}
