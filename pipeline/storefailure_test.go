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

// Finding 3: a lone bad record decided while PostgreSQL is down (with
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
