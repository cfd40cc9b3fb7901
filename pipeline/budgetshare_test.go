package pipeline_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// A partition paused on trouble of its own (here a row of its entity
// locked in the store past lock_timeout, an error dam retries: the
// decide of partition 0 fails try after try) holds no more of the shared
// in-flight budget than its share: the poll loop does not fill its queue
// with the whole budget, and the other partition, whose entities nothing
// locks, keeps polling and delivering.
func TestPausedPartitionHoldsOnlyItsShareOfTheBudget(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := budgetConfig(t, kc, dsn, route("svc", "in", "out"), config.DeliveryAtLeastOnce)
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	produceTo(t, kc, "in", keyed(0, "x", 1)...)
	waitDelivered(t, kc, "x", 1)

	// Another session holds x-0's row: partition 0's next decide waits
	// for it, times out and retries, for as long as the lock is held.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx) //nolint:errcheck
	if _, err := conn.Exec(ctx, `SET idle_in_transaction_session_timeout = 0`); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SELECT 1 FROM state WHERE service = 'svc' AND entity = 'x-0'::bytea FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	p0 := append(keyed(0, "x", 1), keyed(0, "after", 100)...)
	p0[0].Value = []byte(`{"n":"changed"}`)
	produceTo(t, kc, "in", p0...)
	waitFor(t, "partition 0 paused on the lock", func() (bool, string) {
		err := r.pl.Ready()
		return err != nil, fmt.Sprint(err)
	})

	// Partition 1, healthy, goes on while partition 0 waits.
	produceTo(t, kc, "in", keyed(1, "b", 60)...)
	waitFor(t, "partition 1 delivered", func() (bool, string) {
		got := byKey(kc.ReadAll("out"))
		k := 0
		for i := range 60 {
			if got[fmt.Sprintf("b-%d", i)] != nil {
				k++
			}
		}
		return k == 60, fmt.Sprintf("%d of 60 delivered; dam_records_in_flight %v (budget: 2 partitions x %d)",
			k, r.gauge0("dam_records_in_flight"), cfg.Pipeline.MaxInFlight)
	})

	_ = tx.Rollback(ctx)
	waitDelivered(t, kc, "after", 100)
	r.stop()
}
