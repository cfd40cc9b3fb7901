package pipeline_test

import (
	"fmt"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// On a group's first join (no committed offset, no progress) with
// kafka.start: latest, each partition's start is logged with the records
// it leaves behind; with earliest, its start. A later start, from a
// position, logs neither.
func TestFirstJoinLogsStart(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out")
	cfg := testConfig(t, kc, pgtest.DSN(t), route("svc", "in", "out"))
	cfg.Kafka.Start = config.StartLatest
	for i := range 3 {
		r := rec(fmt.Sprint("k", i), fmt.Sprint(i))
		r.Partition = 0
		produceTo(t, kc, "in", r)
	}
	r, logs := startObserved(t, cfg)
	const latest = "first join: the partition starts at its end (kafka.start: latest), leaving its earlier records behind: they are not forwarded (to start from the first, see docs/cutover.md)"
	waitFor(t, "the first join's start logged", func() (bool, string) {
		e := logs.FilterMessage(latest).FilterField(zap.Int32("partition", 0)).All()
		return len(e) == 1, fmt.Sprint(e)
	})
	got := logs.FilterMessage(latest).FilterField(zap.Int32("partition", 0)).All()[0].ContextMap()
	if got["start"] != int64(3) || got["first"] != int64(0) || got["offsets_left_behind"] != int64(3) || got["topic"] != "in" || got["service"] != "svc" {
		t.Errorf("partition 0's first start logged %v, want start 3, first 0, 3 offsets left behind", got)
	}
	waitFor(t, "partition 1's start logged", func() (bool, string) {
		n := logs.FilterMessage("first join: the partition starts at its end (kafka.start: latest); it holds no earlier record").FilterField(zap.Int32("partition", 1)).Len()
		return n == 1, fmt.Sprintf("logged %d times", n)
	})
	r.stop()

	r, logs = startObserved(t, cfg)
	waitFor(t, "assigned again", func() (bool, string) {
		n := logs.FilterMessage("partition assigned").Len()
		return n == 2, fmt.Sprintf("%d assigned", n)
	})
	if e := logs.Filter(func(e observer.LoggedEntry) bool { return len(e.Message) > 10 && e.Message[:10] == "first join" }).All(); len(e) != 0 {
		t.Errorf("a start from a position logged %v", e)
	}
	r.stop()

	cfg.Kafka.Group += "-earliest"
	cfg.Kafka.Start = config.StartEarliest
	r, logs = startObserved(t, cfg)
	waitFor(t, "the first join's start logged with earliest", func() (bool, string) {
		e := logs.FilterMessage("first join: the partition starts at its first offset (kafka.start: earliest)").FilterField(zap.Int32("partition", 0)).All()
		return len(e) == 1 && e[0].ContextMap()["start"] == int64(0), fmt.Sprint(e)
	})
	r.stop()
}
