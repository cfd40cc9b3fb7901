package pipeline_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// TestOnStoreFailureForward: with on_store_failure: forward, records pass
// through undecided while PostgreSQL is down (bad input still goes to the
// dead-letter topic), and once it is back the state holds what was
// forwarded meanwhile: a repeat of the undecided forward is dropped, and a
// return to the content stored before the outage is forwarded, not lost.
func TestOnStoreFailureForward(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	target, rewrite := tcpproxy.PostgresDSN(t, pgtest.DSN(t))
	proxy := tcpproxy.New(t, target)
	dsn := rewrite(proxy.Addr())
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	rt.OnStoreFailure = config.OnStoreFailureForward
	cfg := testConfig(t, kc, dsn, rt)
	cfg.Pipeline.BatchSize = 2
	r := start(t, cfg, openStore(t, dsn))
	rec := func(k, v string) *kgo.Record { return &kgo.Record{Key: []byte(k), Value: []byte(v)} }

	produceTo(t, kc, "in", rec("k1", `"A"`), rec("k2", `"X"`))
	r.waitRecords("svc", 2)

	proxy.Cut()
	down := []*kgo.Record{rec("k1", `"A"`), rec("k1", `"B"`), rec("k3", `{bad`), rec("k2", `"X"`)}
	produceTo(t, kc, "in", down...)
	r.waitRecords("svc", 2+len(down))
	if n := r.records("svc", "undecided"); n != 3 {
		t.Fatalf("undecided forwards while the store was down: %d, want 3", n)
	}
	if n := r.records("svc", "invalid"); n != 1 {
		t.Fatalf("dead letters while the store was down: %d, want 1", n)
	}

	proxy.Restore()
	after := []*kgo.Record{rec("k1", `"B"`), rec("k1", `"A"`), rec("k2", `"X"`)}
	produceTo(t, kc, "in", after...)
	r.waitRecords("svc", 2+len(down)+len(after))
	r.stop()

	got := byKey(kc.ReadAll("out"))
	want := map[string][]string{
		// A; undecided A, B; then B dropped (it is what the adapter has)
		// and A forwarded (the store held A before the outage: without
		// the catch-up it would be dropped and lost).
		"k1": {`"A"`, `"A"`, `"B"`, `"A"`},
		"k2": {`"X"`, `"X"`}, // the undecided repeat passes; the later one is dropped
	}
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			t.Errorf("key %s: forwarded %q, want %q", k, got[k], w)
		}
	}
	if dl := kc.ReadAll("dlq"); len(dl) != 1 || string(dl[0].Key) != "k3" {
		t.Errorf("dead letters %v, want the one bad record", dump(dl))
	}
}

// A lone bad record decided while PostgreSQL is down (with
// on_store_failure: forward) is dead-lettered and its offset written back
// with the next batches: P covers it, so the next decide is not falsely
// fenced and the partition does not stay not-ready until a restart.
func TestLoneBadRecordDuringOutage(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	proxy, dsn, direct := pgProxy(t)
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	rt.OnStoreFailure = config.OnStoreFailureForward
	cfg := testConfig(t, kc, dsn, rt)
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	r := start(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("k1", `"A"`))
	r.waitRecords("svc", 1)

	proxy.Cut()
	one(t, kc, "in", rec("bad", `{bad`)) // alone in its batch
	r.waitRecords("svc", 2)
	proxy.Restore()
	one(t, kc, "in", rec("k1", `"B"`))
	r.waitRecords("svc", 3)
	waitModel(t, kc, "out", map[string][]string{"k1": {`"A"`, `"B"`}})
	waitFor(t, "ready again", func() (bool, string) {
		err := r.pl.Ready()
		return err == nil, fmt.Sprint(err)
	})
	waitProgress(t, openStore(t, direct), cfg, "in", 0, 3)
	if dl := kc.ReadAll("dlq"); len(dl) != 1 || string(dl[0].Key) != "bad" {
		t.Errorf("dead letters %s, want the bad record", dump(dl))
	}
	r.stop()
}

// No error of the store about one record halts a partition that has a
// dead-letter topic, a record forwarded undecided included. With
// on_store_failure: forward, a record decided while PostgreSQL is down is
// forwarded undecided and its batch kept pending, to be written back
// (flush) once the store answers. When the store then refuses that record
// (SQLSTATE class 22 or 54, what decideApart is for), the pending batch is
// decided apart like any other, whether the partition is idle (decideLoop's
// flush) or has new records (the flush's error is not taken for the new
// batch's, which decided apart from the wrong start would be fenced). A
// partition parked on the flush's error would stay halted, not ready, with
// the raw store error naming no offset, until a restart.
func TestUndecidedForwardTheStoreRefusesDoesNotHalt(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	proxy, dsn, direct := pgProxy(t)
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	rt.OnStoreFailure = config.OnStoreFailureForward
	cfg := testConfig(t, kc, dsn, rt)
	cfg.Pipeline.RetryMin = 50 * time.Millisecond
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	r := start(t, cfg, openStore(t, dsn))
	one(t, kc, "in", rec("a", `1`))
	r.waitRecords("svc", 1)
	storeRefuses(t, direct)

	proxy.Cut()
	one(t, kc, "in", rec("poison", `1`)) // forwarded undecided
	r.waitRecords("svc", 2)
	proxy.Restore()
	time.Sleep(2 * time.Second) // the write-back of the undecided batch
	one(t, kc, "in", rec("a", `2`))
	var last error
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if last = r.pl.Ready(); last == nil && r.records("svc") == 3 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last != nil || r.records("svc") != 3 {
		t.Errorf("a partition with a dead-letter topic is halted by one record the store refuses: Ready() = %v, %d of 3 records through", last, r.records("svc"))
	}
}
