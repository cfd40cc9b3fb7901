package pipeline_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// partitionLag returns dam_consumer_lag of one partition, or -1 without
// such a series.
func (r *running) partitionLag(service, partition string) float64 {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "dam_consumer_lag" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["service"] == service && labels["partition"] == partition {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// A halted partition stays assigned in the metrics, and its lag counts
// from the committed offset, so it keeps growing as records arrive behind
// the halt; a partition that delivers everything has none.
func TestHaltedPartitionStaysAssignedAndLags(t *testing.T) {
	t.Parallel()
	for _, delivery := range deliveries {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 2, "in", "out")
			dsn := pgtest.DSN(t)
			cfg := inMode(testConfig(t, kc, dsn, route("svc", "in", "out")), delivery)
			bad := rec("bad", `{"unterminated`)
			bad.Partition = 0
			produceTo(t, kc, "in", append(keyed(0, "a", 1), bad)...)
			produceTo(t, kc, "in", keyed(1, "b", 3)...)
			r := start(t, cfg, openStore(t, dsn))
			waitFor(t, "in/0 halted", func() (bool, string) {
				err := r.pl.Ready()
				return errors.Is(err, pipeline.ErrHalted), fmt.Sprint(err)
			})
			waitDelivered(t, kc, "b", 3)
			produceTo(t, kc, "in", keyed(0, "after", 5)...)
			// Partition 0 ends at 7, committed at 1 (a delivered); in
			// exactly-once mode at 0: a, decided in the halt's round,
			// waits with it (docs/delivery.md).
			want := 6.0
			if delivery == config.DeliveryExactlyOnce {
				want = 7
			}
			waitFor(t, "the halted partition's lag", func() (bool, string) {
				l0, l1 := r.partitionLag("svc", "0"), r.partitionLag("svc", "1")
				return l0 == want && l1 == 0, fmt.Sprintf("lag of partition 0 %v (want %v), of partition 1 %v (want 0)", l0, want, l1)
			})
			if n := r.gauge("dam_partitions_assigned", "svc"); n != 2 {
				t.Errorf("dam_partitions_assigned %v with one of two partitions halted, want 2", n)
			}
			if n := r.gauge("dam_halted", "svc"); n != 1 {
				t.Errorf("dam_halted %v, want 1", n)
			}
			r.stop()
		})
	}
}
