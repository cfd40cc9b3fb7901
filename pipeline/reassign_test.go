package pipeline_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// TestPartitionsComeBackAfterPause: franz-go keeps a paused partition
// paused across reassignment. A's partitions are paused most of the time
// (a tiny in-flight limit over a backlog); B joins and takes some, then
// leaves, and they come back to A, which must fetch them again and finish
// every record: a partition left paused would stall silently.
func TestPartitionsComeBackAfterPause(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 4, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.BatchSize = 2
	cfg.Pipeline.MaxInFlight = 4
	const perPartition = 400
	var in []*kgo.Record
	for p := range int32(4) {
		for i := range perPartition {
			// Every record a new content of its entity: all are forwarded.
			in = append(in, &kgo.Record{Partition: p, Key: []byte(fmt.Sprintf("e%d-%d", p, i%20)), Value: []byte(fmt.Sprint(i))})
		}
	}
	produceTo(t, kc, "in", in...)

	a := start(t, cfg, openStore(t, dsn))
	waitFor(t, "A deciding", func() (bool, string) {
		n := a.records("svc")
		return n > 0, fmt.Sprintf("%d decided", n)
	})
	b := start(t, cfg, openStore(t, dsn))
	waitFor(t, "B owning partitions", func() (bool, string) {
		n := b.gauge("dam_partitions_assigned", "svc")
		return n > 0, fmt.Sprintf("B owns %v", n)
	})
	b.stop()
	waitFor(t, "every record decided by A or B", func() (bool, string) {
		n := a.records("svc") + b.records("svc")
		return n >= len(in), fmt.Sprintf("%d of %d (A %d, B %d)", n, len(in), a.records("svc"), b.records("svc"))
	})
	a.stop()
	out := kc.ReadAll("out")
	seen := map[string]bool{}
	for _, r := range out {
		seen[fmt.Sprintf("%d/%s=%s", r.Partition, r.Key, r.Value)] = true
	}
	if got := len(byKey(out)); got != 4*20 {
		t.Errorf("forwarded entities: %d, want %d", got, 4*20)
	}
	if len(out) < len(in) {
		t.Errorf("forwarded %d records, want at least %d (every record is a change)", len(out), len(in))
	}
}

// TestStandbyIsReady: with more instances than partitions, the one without
// a partition is a ready standby, not a pod that never becomes ready.
func TestStandbyIsReady(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	a := start(t, cfg, openStore(t, dsn))
	waitFor(t, "A ready", func() (bool, string) {
		err := a.pl.Ready()
		return err == nil, fmt.Sprint(err)
	})
	b := start(t, cfg, openStore(t, dsn))
	waitFor(t, "B (no partition) ready", func() (bool, string) {
		err := b.pl.Ready()
		return err == nil, fmt.Sprint(err)
	})
	// Ready does not wait for the group's assignment: the partition is
	// owned once the join completes, by one of them.
	waitFor(t, "the one partition owned exactly once", func() (bool, string) {
		na, nb := a.gauge("dam_partitions_assigned", "svc"), b.gauge("dam_partitions_assigned", "svc")
		return na+nb == 1, fmt.Sprintf("A owns %v, B owns %v", na, nb)
	})
}

// An idle exactly-once member that loses partitions in two rebalances
// hears of both: after each, it holds no worker of a partition it no
// longer owns (dam_partitions_assigned, the poll budget max_in_flight x
// partitions and /readyz count only what it holds). franz-go's
// GroupTransactSession calls the application's OnPartitionsRevoked only
// for the first revocation between two End calls (its wrapper returns
// early while s.revoked is set, and only End clears it), and a round ends
// with End only when it delivers or commits something. A worker kept for
// a partition the member no longer owns would be planned against the new
// owner's epoch: fenced, it would force a rebalance, and onJoined would
// recover a partition this member does not hold, bumping the epoch under
// its real owner.
func TestExactlyOnceEveryRevocationReleasesPartitions(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 4, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := eosConfig(t, kc, dsn, "a", route("svc", "in", "out"))
	a := start(t, cfg, openStore(t, dsn))
	waitFor(t, "a owning the 4 partitions", func() (bool, string) {
		n := a.gauge("dam_partitions_assigned", "svc")
		return n == 4, fmt.Sprint(n)
	})
	cfgB := cfg
	cfgB.Kafka.TransactionalID = cfg.Kafka.Group + "-b"
	b := start(t, cfgB, openStore(t, dsn))
	waitFor(t, "a giving 2 partitions to b", func() (bool, string) {
		n, m := a.gauge("dam_partitions_assigned", "svc"), b.gauge("dam_partitions_assigned", "svc")
		return n == 2 && m == 2, fmt.Sprint(n, m)
	})
	b.stop()
	waitFor(t, "a owning the 4 partitions again", func() (bool, string) {
		n := a.gauge("dam_partitions_assigned", "svc")
		return n == 4, fmt.Sprint(n)
	})
	cfgC := cfg
	cfgC.Kafka.TransactionalID = cfg.Kafka.Group + "-c"
	c := start(t, cfgC, openStore(t, dsn))
	waitFor(t, "c owning 2 partitions", func() (bool, string) {
		m := c.gauge("dam_partitions_assigned", "svc")
		return m == 2, fmt.Sprint(m)
	})
	time.Sleep(3 * time.Second)
	if n := a.gauge("dam_partitions_assigned", "svc"); n != 2 {
		t.Errorf("a reports %v partitions assigned (workers registered) while it holds 2 and c holds the other 2", n)
	}
	c.stop()
	a.stop()
}
