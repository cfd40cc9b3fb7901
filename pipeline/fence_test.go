package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// A partition fenced while this member still holds it is taken back, not
// parked for good. A zombie that paused past its session timeout can
// rejoin claiming what it had, and a cooperative rebalance then leaves it
// partitions without revoking or assigning them, while the interim
// owner's recovery bumped their epochs (found by `make chaos`: the
// zombie's partitions stayed parked, and the group's input with them).
// Here the epoch is bumped under the running member, as that interim owner
// did: the member must ask the coordinator (a rejoin), get the partition
// back, recover it and deliver what follows, in both delivery modes.
func TestFencedPartitionStillHeldIsRecovered(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1, "in", "out")
			dsn := pgtest.DSN(t)
			cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
			if mode == config.DeliveryExactlyOnce {
				cfg = eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
			}
			inspect := openStore(t, dsn)
			r := start(t, cfg, openStore(t, dsn))
			one(t, kc, "in", rec("k1", `"A"`))
			exactly(t, kc, "out", map[string][]string{"k1": {`"A"`}})

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := inspect.Acquire(ctx, dedup.Partition{Group: cfg.Kafka.Group, Topic: "in", Partition: 0}); err != nil {
				t.Fatal(err)
			}
			one(t, kc, "in", rec("k1", `"B"`), rec("k2", `"X"`))
			exactly(t, kc, "out", map[string][]string{"k1": {`"A"`, `"B"`}, "k2": {`"X"`}})
			r.stop()
		})
	}
}
