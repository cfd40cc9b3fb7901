package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// The routes of TestKill9Modes: one of each mode and a refresh route, in
// one `dam run`. The last-seen route is the default one (inTopic, ...).
const modeRoutes = `
  - service: e2e
    from: projections
    to: delivery
    dead_letter: delivery.dlq
  - service: window
    from: in.window
    to: out.window
    dead_letter: dlq.window
    mode: window
    window: 1h
    cleanup_interval: 1s
  - service: version
    from: in.version
    to: out.version
    dead_letter: dlq.version
    mode: version
  - service: refresh
    from: in.refresh
    to: out.refresh
    dead_letter: dlq.refresh
    refresh_after: 2s
`

// versioned is version mode's stream: events keyed by aggregate with a
// /version member; 60% raise the aggregate's version, 20% repeat it
// (duplicates), 20% carry an older one (stale).
func versioned(entities int) generator {
	version := make([]int, entities)
	return func(rng *rand.Rand, seq int) *kgo.Record {
		e := rng.IntN(entities)
		switch p := rng.Float64(); {
		case version[e] == 0 || p < 0.6:
			version[e]++
		case p < 0.8:
		default:
			v := max(1, version[e]-1-rng.IntN(3))
			return &kgo.Record{Key: fmt.Appendf(nil, "a%d", e), Value: fmt.Appendf(nil, `{"a":%d,"version":%d,"seq":%d}`, e, v, seq)}
		}
		return &kgo.Record{Key: fmt.Appendf(nil, "a%d", e), Value: fmt.Appendf(nil, `{"a":%d,"version":%d,"seq":%d}`, e, version[e], seq)}
	}
}

// versionModel forwards a record iff its version is above its key's
// highest so far.
func versionModel(in []*kgo.Record) map[string][]*kgo.Record {
	highest := map[string]int64{}
	m := map[string][]*kgo.Record{}
	for _, rec := range in {
		var v struct{ Version int64 }
		if err := json.Unmarshal(rec.Value, &v); err != nil {
			panic(err)
		}
		k := string(rec.Key)
		if h, ok := highest[k]; ok && v.Version <= h {
			continue
		}
		highest[k] = v.Version
		m[k] = append(m[k], rec)
	}
	return m
}

// TestKill9Modes runs a last-seen, a window, a version and a refresh route
// side by side in one `dam run` under load, kills it with SIGKILL at
// random moments and restarts it: for every mode, nothing its model
// forwards is lost, nothing it drops is forwarded, and per-key order
// holds. Then a refresh: unchanged records of the refresh route, sent
// after refresh_after, are forwarded again.
func TestKill9Modes(t *testing.T) {
	t.Parallel()
	needBinary(t)
	b := newBroker(t, false, "in.window", "out.window", "dlq.window", "in.version", "out.version", "dlq.version",
		"in.refresh", "out.refresh", "dlq.refresh")
	s := newSidecar(t, "a", sidecarOpts{brokers: b.addr(), dsn: pgtest.DSN(t), routes: modeRoutes})
	s.start()
	s.waitReady(30 * time.Second)

	const n, over = 8000, 40 * time.Second
	routes := []struct {
		check routeCheck
		load  *loadgen
	}{
		{defaultCheck, startLoad(t, b.addr(), n, 500, over)},
		{modeCheck("window", windowModel), startLoadTo(t, b.addr(), "in.window", n, over, idempotent())},
		{modeCheck("version", versionModel), startLoadTo(t, b.addr(), "in.version", n, over, versioned(500))},
		{modeCheck("refresh", lastSeenModel), startLoadTo(t, b.addr(), "in.refresh", n, over, projections(200))},
	}
	kills := 0
	for kills < 4 {
		s.waitReady(30 * time.Second)
		time.Sleep(time.Duration(1000+rand.IntN(2000)) * time.Millisecond)
		s.checkAlive()
		s.kill()
		kills++
		t.Logf("kill %d: %d records produced so far per route", kills, routes[0].load.produced.Load())
		s.start()
	}
	for _, rt := range routes {
		rt.load.wait(2 * time.Minute)
	}
	for _, rt := range routes {
		r := waitDeliveredRoute(t, b.addr(), rt.check, 90*time.Second, s)
		t.Logf("route %s: %d of %d input records forwarded by the model", rt.check.in, r.forwards, r.input)
		assertReport(t, r, rt.load, -1)
		if r.forwards == r.input {
			t.Errorf("route %s: the model drops nothing: the load tests nothing", rt.check.in)
		}
	}

	// Refresh: the refresh route's keys, sent again unchanged once
	// refresh_after (2s) has passed since their last forward, are
	// forwarded again.
	s.waitReady(30 * time.Second)
	in, err := testkafka.ReadAll(b.addr(), "in.refresh")
	if err != nil {
		t.Fatal(err)
	}
	last := map[string][]byte{}
	for _, r := range in {
		last[string(r.Key)] = r.Value
	}
	before, err := testkafka.ReadAll(b.addr(), "out.refresh")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	var again []*kgo.Record
	for k, v := range last {
		if len(again) == 5 {
			break
		}
		again = append(again, &kgo.Record{Topic: "in.refresh", Key: []byte(k), Value: v})
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addr()), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, again...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := testkafka.ReadAll(b.addr(), "out.refresh")
		refreshed, merr := s.metric("dam_records_total", "service", "refresh", "outcome", "refreshed")
		if err == nil && merr == nil && len(out) >= len(before)+len(again) && refreshed >= float64(len(again)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refresh: %d records delivered before, %d now (%v), %v refreshed (%v); want %d more refreshed",
				len(before), len(out), err, refreshed, merr, len(again))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The window route's cleanup ran in the last process (nothing expires
	// within the 1h window: it found nothing to delete).
	if done, err := s.metric("dam_window_cleanups_total", "service", "window", "result", "done"); err != nil || done < 1 {
		t.Errorf("window cleanup rounds done: %v, %v", done, err)
	}
	t.Logf("killed the sidecar %d times", kills)
}
