package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// budgetConfig is a configuration whose in-flight budget (10 records per
// partition) is far below what one halting job holds, so that a job whose
// budget were not given back would stop the poll loop for every partition.
func budgetConfig(t *testing.T, kc *testkafka.Cluster, dsn string, rt config.Route, delivery string) config.Config {
	cfg := inMode(testConfig(t, kc, dsn, rt), delivery)
	cfg.Pipeline.BatchSize = 10
	cfg.Pipeline.MaxInFlight = 10
	cfg.Pipeline.MaxBatch = 200
	return cfg
}

// A partition that halts gives back every record it took from the shared
// in-flight budget, whichever side stops it: the other partitions go on
// polling and delivering, and dam_records_in_flight falls back to zero.
// The halting job holds more records than the whole budget, so a single
// record not given back would stall the instance.
func TestHaltedPartitionGivesBackItsBudget(t *testing.T) {
	t.Parallel()
	halts := []struct {
		name string
		// poison builds partition 0's records: some good, one that halts
		// the partition, and many behind it in the same batch.
		poison func() *kgo.Record
		says   string
	}{
		// The deliverer fails the job: Kafka refuses a record for good.
		{"refused by Kafka", func() *kgo.Record { return bigKeyed(140_000) }, "MESSAGE_TOO_LARGE"},
		// The decider halts: bad input without a dead-letter topic.
		{"bad input", func() *kgo.Record { return rec("bad", `{"unterminated`) }, "offset 3"},
	}
	for _, h := range halts {
		for _, delivery := range deliveries {
			t.Run(h.name+"/"+delivery, func(t *testing.T) {
				t.Parallel()
				kc := testkafka.New(t, 2, "in")
				kc.CreateTopic("out", 2, "max.message.bytes", "200000")
				dsn := pgtest.DSN(t)
				rt := route("svc", "in", "out")
				rt.MaxSize = 150_000
				cfg := budgetConfig(t, kc, dsn, rt, delivery)
				store := openStore(t, dsn)

				p0 := append(keyed(0, "a", 3), h.poison())
				p0[3].Partition = 0
				p0 = append(p0, keyed(0, "after", 60)...)
				produceTo(t, kc, "in", p0...)
				r := start(t, cfg, store)
				var err error
				waitFor(t, "in/0 halted", func() (bool, string) {
					err = r.pl.Ready()
					return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
				})
				if !contains(err.Error(), h.says) {
					t.Errorf("halt %q does not say %q", err, h.says)
				}
				// The other partition: more records than the budget, after
				// the halt.
				produceTo(t, kc, "in", keyed(1, "b", 80)...)
				waitDelivered(t, kc, "b", 80)
				waitFor(t, "the in-flight budget given back", func() (bool, string) {
					n := r.gauge0("dam_records_in_flight")
					return n == 0, fmt.Sprintf("dam_records_in_flight %v", n)
				})
				r.stop()
			})
		}
	}
}

// A fenced partition (another owner bumped its epoch) gives back its
// budget too: the other partition keeps delivering.
func TestFencedPartitionGivesBackItsBudget(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := budgetConfig(t, kc, dsn, route("svc", "in", "out"), config.DeliveryAtLeastOnce)
	store := openStore(t, dsn)
	r := start(t, cfg, store)
	produceTo(t, kc, "in", keyed(0, "a", 5)...)
	produceTo(t, kc, "in", keyed(1, "b", 5)...)
	r.waitRecords("svc", 10)

	// Another owner takes partition 0 in the store; the next decide of
	// partition 0 is fenced.
	if _, err := store.Acquire(context.Background(), dedup.Partition{Group: cfg.Kafka.Group, Topic: "in", Partition: 0}); err != nil {
		t.Fatal(err)
	}
	produceTo(t, kc, "in", keyed(0, "c", 60)...)
	produceTo(t, kc, "in", keyed(1, "d", 80)...)
	waitDelivered(t, kc, "d", 80)
	r.stop()
}

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
