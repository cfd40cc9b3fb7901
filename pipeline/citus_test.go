package pipeline_test

// Tests of the sidecar on Citus (the store's own are in
// dedup/citus_test.go).

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/pglocal"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

func citusAdmin(t *testing.T, sql ...string) { t.Helper(); pgtest.Admin(t, sql...) }

// routeWorkerThrough points the coordinator at worker w through addr
// (pgtest.RouteWorker), with Citus's automatic recovery of prepared
// transactions off until the test ends: a COMMIT PREPARED the test drops
// stays undone until the test recovers it.
func routeWorkerThrough(t *testing.T, w *pglocal.Cluster, addr string) {
	t.Helper()
	citusAdmin(t, `ALTER SYSTEM SET citus.recover_2pc_interval = -1`, `SELECT pg_reload_conf()`)
	t.Cleanup(func() { citusAdmin(t, `ALTER SYSTEM RESET citus.recover_2pc_interval`, `SELECT pg_reload_conf()`) })
	pgtest.RouteWorker(t, w, addr)
}

// On Citus, a replay after a crash delivers no stale version, and loses
// none of the newer ones, when the batch it replays committed on the
// coordinator but is still prepared on the worker that holds the entity
// (a worker lost between the two phases of the commit).
//
// Version mode, the input compacted (docs/delivery.md, "Retention or
// compaction"): o1 (k1 version 5) was forwarded and not delivered, o2 (k1
// version 3, stale) superseded it in compaction. On one server the replay
// does not deliver o2: it reads k1's stored version (5) and delivers only a
// record of that version (TestVersionReplayDeliversNoStaleVersion), then
// resets k1 so that its next record is forwarded. On Citus the batch of o1
// and o2 is one distributed transaction: its progress and log commit on
// the progress worker, k1's new version on another; if that worker does
// not get COMMIT PREPARED (it crashed after PREPARE; the coordinator had
// committed and answered the COMMIT with success), k1's row stays prepared,
// invisible, until Citus recovers it. The new owner's recovery is not held
// up (P and the log are committed), and pipeline/recover.go's owes() reads
// k1's version once it has settled (dedup's SettledVersion waits for the
// prepared row). A plain read, not waiting, would see no state, take o2
// (version 3) for the record to deliver and deliver the stale version;
// once Citus recovered the transaction, k1 would hold version 5, its next
// record (version 4) would be stale and never delivered, and the adapter's
// last k1 would be version 3 while 5 was forwarded.
func TestCitusVersionReplayReadsAPreparedEntity(t *testing.T) {
	cc := pgtest.NeedCitusCluster(t)
	kc := testkafka.New(t, 1, "out.v", "dlq.v")
	kc.CreateTopic("in.v", 1, "cleanup.policy", "compact")
	gate := newProduceGate(t, kc, "out.v")
	dsn := pgtest.DSN(t)
	ctx := context.Background()
	probe := openStore(t, dsn)
	shardPort := func(table, value string) int {
		var port int
		if err := probe.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column('%s', %s)`, table, value)).Scan(&port); err != nil {
			t.Fatal(err)
		}
		return port
	}
	// The entity's worker is not the one of the partition's progress.
	progressPort := shardPort("progress", "0")
	wi := 0
	if cc.Worker(0).Port() == progressPort {
		wi = 1
	}
	var k1 string
	for i := 0; k1 == "" && i < 100; i++ {
		if k := fmt.Sprint("k1-", i); shardPort("versions", "'"+k+"'::bytea") == cc.Worker(wi).Port() {
			k1 = k
		}
	}
	if k1 == "" {
		t.Fatal("no key on the other worker")
	}
	dropper := newCommitPreparedDropper(t, fmt.Sprintf("127.0.0.1:%d", cc.Worker(wi).Port()))
	routeWorkerThrough(t, cc.Worker(wi), dropper.ln.Addr().String())

	cfg := testConfig(t, kc, dsn, modeRoute("v", config.ModeVersion))
	cfg.Pipeline.ShutdownGrace = 300 * time.Millisecond
	cfg.Pipeline.RetryMax = 200 * time.Millisecond
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	one(t, kc, "in.v", rec("k0", `{"version":1}`))
	r.waitRecords("v", 1)
	gate.close()
	// One batch: o1 k1 v5 (forwarded, not delivered), o2 k1 v3 (stale; it
	// supersedes o1 in compaction). Its commit reaches the progress worker,
	// not k1's. o3 (k9) keeps o2 out of the input's last record batch, which
	// compaction never touches.
	dropper.armed.Store(true)
	one(t, kc, "in.v", rec(k1, `{"version":5}`), rec(k1, `{"version":3}`))
	one(t, kc, "in.v", rec("k9", `{"version":1}`))
	waitProgress(t, store, cfg, "in.v", 0, 4)
	select {
	case <-dropper.dropped:
	case <-time.After(10 * time.Second):
		t.Fatal("the batch's COMMIT PREPARED to k1's worker was never seen")
	}
	r.crash()
	kc.Compact()
	if got := kc.ReadAll("in.v"); len(got) != 3 || got[1].Offset != 2 {
		t.Fatalf("after compaction the input holds %s; want offsets 0, 2, 3", dump(got))
	}
	gate.open()
	r = start(t, cfg, store) // the new owner, while k1's worker still holds the batch prepared
	// The replay waits for the prepared batch (its read of k1's version
	// times out and is retried) until Citus recovers it: its interval,
	// here a few seconds later.
	recovered := make(chan struct{})
	go func() {
		defer close(recovered)
		time.Sleep(3 * time.Second)
		citusAdmin(t, `SELECT recover_prepared_transactions()`)
	}()
	waitCommitted(t, kc, cfg.Kafka.Group, "in.v", 0, 4)
	<-recovered
	for _, o := range kc.ReadAll("out.v") {
		if string(o.Key) == k1 && strings.Contains(string(o.Value), `"version":3`) {
			t.Errorf("the replay delivered the stale version 3 of %s (version 5 was forwarded and is stored once the worker's "+
				"prepared transaction is recovered): %s", k1, dump(kc.ReadAll("out.v")))
		}
	}
	// On one server the replay reset k1 (its forward unreadable, no record
	// of the stored version to deliver): its next record is forwarded.
	one(t, kc, "in.v", rec(k1, `{"version":4}`))
	waitCommitted(t, kc, cfg.Kafka.Group, "in.v", 0, 5)
	r.stop()
	var last string
	for _, o := range kc.ReadAll("out.v") {
		if string(o.Key) == k1 {
			last = string(o.Value)
		}
	}
	if last != `{"version":4}` {
		t.Errorf("%s's last delivered record is %s, want version 4: the adapter never gets versions 4 and 5 (lost): %s",
			k1, last, dump(kc.ReadAll("out.v")))
	}
}
