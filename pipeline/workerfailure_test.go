package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// On Citus a worker lost in the middle of a statement reaches dam through
// the coordinator as internal_error (XX000). These tests run on plain
// PostgreSQL with Citus's catalog faked (pgtest.FakeCitusDSN), and a
// trigger raising that error stands for the lost worker.

// A fresh dam on Citus whose recovery meets a lost worker (a worker
// restarted while dam starts, or during a rebalance) waits it out and
// goes on: recovery runs before any decide, and the store knows its
// engine by then.
func TestRecoveryWaitsOutALostWorker(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1, "in", "out")
			dsn := pgtest.FakeCitusDSN(t)
			loseWorker(t, dsn, "progress", "true", 2)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			produceTo(t, kc, "in", rec("a", `1`), rec("b", `1`))
			r := start(t, cfg, openStore(t, dsn))
			if got := values(waitOutput(t, kc, "out", 2)); !slices.Equal(got, []string{"1", "1"}) {
				t.Errorf("delivered %q", got)
			}
			r.stop()
		})
	}
}

// A partition whose recovery failed on an error that the store judges
// transient once it knows its engine (a worker lost while the store
// believed its tables local: they were distributed under it) is not left
// halted until it is reassigned: it is recovered again, as a fenced one.
func TestRecoveryFailedOnATransientErrorRunsAgain(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			kc := testkafka.New(t, 1, "in", "out")
			dsn := pgtest.FakeCitusDSN(t)
			admin := openStore(t, dsn)
			if _, err := admin.Pool().Exec(ctx, `DELETE FROM pg_catalog.pg_dist_partition`); err != nil {
				t.Fatal(err)
			}
			store := openStore(t, dsn)
			if dist, err := store.Distributed(ctx); err != nil || dist {
				t.Fatalf("Distributed = %v, %v; want false", dist, err)
			}
			// `dam migrate` on Citus, under the running dam.
			if _, err := admin.Pool().Exec(ctx, `INSERT INTO pg_catalog.pg_dist_partition VALUES ('state'), ('progress'), ('decision_log')`); err != nil {
				t.Fatal(err)
			}
			loseWorker(t, dsn, "progress", "true", 1)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			produceTo(t, kc, "in", rec("a", `1`), rec("b", `1`))
			r := start(t, cfg, store)
			if got := values(waitOutput(t, kc, "out", 2)); !slices.Equal(got, []string{"1", "1"}) {
				t.Errorf("delivered %q", got)
			}
			if dist, _ := store.Distributed(ctx); !dist {
				t.Error("the store did not learn that its tables are distributed")
			}
			r.stop()
		})
	}
}

// A record whose write keeps failing on a Citus worker's relayed error
// (XX000) while the store answers for its identity is bad input, as a
// record the store refuses is: after a bounded number of tries its batch
// is decided a record at a time, and that record alone is dead-lettered,
// or, without a dead-letter topic, halts its partition naming topic,
// partition and offset. Unbounded, the partition retried it forever.
func TestRecordFailingOnAWorkerIsBadInput(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		for _, dlq := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s dead_letter=%v", delivery, dlq), func(t *testing.T) {
				t.Parallel()
				kc := testkafka.New(t, 1, "in", "out", "dlq")
				dsn := pgtest.FakeCitusDSN(t)
				rt := route("svc", "in", "out")
				if dlq {
					rt.DeadLetter = "dlq"
				}
				cfg := inMode(testConfig(t, kc, dsn, rt), delivery)
				store := openStore(t, dsn)
				loseWorker(t, dsn, "state", `NEW.entity = 'poison'::bytea`, 1<<30)
				r := start(t, cfg, store)
				one(t, kc, "in", rec("a", `1`))
				r.waitRecords("svc", 1)
				one(t, kc, "in", rec("b", `1`), rec("a", `1`), rec("poison", `1`), rec("c", `1`), rec("a", `2`))
				if !dlq {
					var err error
					waitFor(t, "the partition halted", func() (bool, string) {
						err = r.pl.Ready()
						return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
					})
					if !strings.Contains(err.Error(), "in/0 offset 3") || !strings.Contains(err.Error(), "Citus worker's error") || !strings.Contains(err.Error(), "XX000") {
						t.Errorf("Ready: %v; want the offset and the cause", err)
					}
					wantOut, wantC := []string{"1", "1"}, int64(3)
					if delivery == config.DeliveryExactlyOnce {
						wantOut, wantC = []string{"1"}, 1 // the round holding the record aborts
					}
					waitCommitted(t, kc, cfg.Kafka.Group, "in", 0, wantC)
					r.stop()
					if got := values(kc.ReadAll("out")); !slices.Equal(got, wantOut) {
						t.Errorf("delivered %q, want %q", got, wantOut)
					}
					return
				}
				r.waitRecords("svc", 6)
				got := byKey(waitOutput(t, kc, "out", 4))
				want := map[string][]string{"a": {"1", "2"}, "b": {"1"}, "c": {"1"}}
				for k, w := range want {
					if !slices.Equal(got[k], w) {
						t.Errorf("%s: %q, want %q", k, got[k], w)
					}
				}
				dl := waitOutput(t, kc, "dlq", 1)
				if h := headers(dl[0]); string(dl[0].Key) != "poison" || !strings.Contains(h[pipeline.HeaderError], "Citus worker's error") ||
					!strings.Contains(h[pipeline.HeaderError], "XX000") {
					t.Errorf("dead letter %s: %v", dl[0].Key, h)
				}
				if err := r.pl.Ready(); err != nil {
					t.Errorf("not ready: %v", err)
				}
				r.stop()
			})
		}
	}
}

// A record whose write fails on a Citus worker's error while the store
// does not answer for its identity either (its worker is down) is waited
// for, however many tries it takes, and forwarded once the worker is
// back: never taken for bad input.
func TestWorkerOutageIsNotBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	dsn := pgtest.FakeCitusDSN(t)
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	cfg := testConfig(t, kc, dsn, rt)
	store := openStore(t, dsn)
	if _, err := store.Pool().Exec(ctx, `CREATE TABLE worker_down (); INSERT INTO worker_down DEFAULT VALUES`); err != nil {
		t.Fatal(err)
	}
	loseWorker(t, dsn, "state", `NEW.entity = 'x'::bytea AND EXISTS (SELECT FROM worker_down)`, 1<<30)
	// The worker holding x's shard is down: a read of x fails too (here
	// after the lock timeout: the read also looks into versions).
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	down, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = down.Rollback(ctx) }()
	if _, err := down.Exec(ctx, `LOCK TABLE versions IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	r := start(t, cfg, store)
	one(t, kc, "in", rec("x", `1`), rec("y", `1`))
	// Its batch, then x alone, tried up to the bound (4 failures each
	// retried), then x's identity read, and x tried again, three times.
	waitFor(t, "the record tried, alone, past the bound", func() (bool, string) {
		n := r.counter("dam_store_errors_total", "svc")
		return n >= 4+4+3, fmt.Sprintf("dam_store_errors_total=%v", n)
	})
	if _, err := store.Pool().Exec(ctx, `DELETE FROM worker_down`); err != nil {
		t.Fatal(err)
	}
	if err := down.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r.waitRecords("svc", 2)
	if got := byKey(waitOutput(t, kc, "out", 2)); !slices.Equal(got["x"], []string{"1"}) || !slices.Equal(got["y"], []string{"1"}) {
		t.Errorf("delivered %v", got)
	}
	if n := r.records("svc", "invalid"); n != 0 {
		t.Errorf("%d records taken for bad input", n)
	}
	r.stop()
	if dl := kc.ReadAll("dlq"); len(dl) != 0 {
		t.Errorf("dead letters: %s", dump(dl))
	}
}
