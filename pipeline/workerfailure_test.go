package pipeline_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/dam-dedup/dam/internal/pgtest"
	"github.com/dam-dedup/dam/internal/testkafka"
)

// On Citus a worker lost in the middle of a statement reaches dam through
// the coordinator as internal_error (XX000). These tests run on plain
// PostgreSQL with Citus's catalog faked (pgtest.FakeCitusDSN), and a
// trigger raising that error stands for the lost worker.

// loseWorker makes the first n writes to table, from now on, fail as a
// Citus coordinator reports a worker lost mid-statement (only those whose
// row matches when, a condition on NEW).
func loseWorker(t *testing.T, dsn, table, when string, n int) {
	t.Helper()
	st := openStore(t, dsn)
	if _, err := st.Pool().Exec(context.Background(), `CREATE SEQUENCE lose_worker_`+table); err != nil {
		t.Fatal(err)
	}
	createTrigger(t, st, fmt.Sprintf(`CREATE FUNCTION lose_worker_%[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (%[2]s) AND nextval('lose_worker_%[1]s') <= %[3]d THEN
				RAISE EXCEPTION 'connection to the remote node lost (the test''s)' USING ERRCODE = 'XX000';
			END IF;
			RETURN NEW;
		END $$`, table, when, n),
		fmt.Sprintf(`CREATE TRIGGER lose_worker BEFORE INSERT OR UPDATE ON %[1]s FOR EACH ROW EXECUTE FUNCTION lose_worker_%[1]s()`, table))
}

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
