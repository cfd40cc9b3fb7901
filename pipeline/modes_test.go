package pipeline_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// copies returns fresh copies of recs (a produced record cannot be
// produced again).
func copies(recs []*kgo.Record) []*kgo.Record {
	out := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		out[i] = &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers}
	}
	return out
}

// TestWindowMode: the identity is the message id; a repeated id is a
// duplicate even when its content changed; records without an id are dead
// letters; a shadow route forwards everything, marking the repeats.
func TestWindowMode(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, modeTopics("hdr", "ptr", "shadow")...)
	dsn := pgtest.DSN(t)
	hdr := modeRoute("hdr", config.ModeWindow)
	ptr := modeRoute("ptr", config.ModeWindow)
	ptr.IDFrom = "/meta/id"
	shadow := modeRoute("shadow", config.ModeWindow)
	shadow.Shadow = true
	r := start(t, testConfig(t, kc, dsn, hdr, ptr, shadow), openStore(t, dsn))

	const key = "Idempotency-Key"
	byHeader := []*kgo.Record{
		hrec("a", `{"n":1}`, key, "m1"),
		hrec("a", `{"n":2}`, key, "m1"), // changed content, same id: duplicate
		hrec("b", `{"n":1}`, key, "m2"),
		hrec("c", `{"n":3}`),          // no id: dead letter
		hrec("c", `{"n":4}`, key, ""), // empty id: dead letter
		hrec("d", `{"n":1}`, key, "m3"),
		hrec("a", `{"n":1}`, key, "m1"),
	}
	byPointer := []*kgo.Record{
		rec("a", `{"meta":{"id":"m1"},"n":1}`),
		rec("a", `{"meta":{"id":"m1"},"n":2}`),
		rec("b", `{"meta":{"id":7},"n":1}`),
		rec("b", `{"meta":{"id":"7"},"n":2}`), // the string "7" names the same id as the number 7
		rec("c", `{"meta":{"id":null},"n":1}`),
		rec("c", `{"meta":{},"n":1}`),
		rec("b", `{"meta":{"id":7},"n":3}`),
	}
	kc.Produce("in.hdr", copies(byHeader)...)
	kc.Produce("in.ptr", byPointer...)
	kc.Produce("in.shadow", copies(byHeader)...)
	r.waitRecords("", 3*7)

	if got, want := values(kc.ReadAll("out.hdr")), []string{`{"n":1}`, `{"n":1}`, `{"n":1}`}; !slices.Equal(got, want) {
		t.Errorf("hdr forwarded %q, want %q", got, want)
	}
	if got, want := values(kc.ReadAll("out.ptr")), []string{`{"meta":{"id":"m1"},"n":1}`, `{"meta":{"id":7},"n":1}`}; !slices.Equal(got, want) {
		t.Errorf("ptr forwarded %q, want %q", got, want)
	}
	want := []string{`{"n":1}`, `{"n":2}(dup)`, `{"n":1}`, `{"n":1}`, `{"n":1}(dup)`}
	if got := values(kc.ReadAll("out.shadow")); !slices.Equal(got, want) {
		t.Errorf("shadow forwarded %q, want %q", got, want)
	}
	for _, svc := range []string{"hdr", "ptr"} {
		dl := kc.ReadAll("dlq." + svc)
		if len(dl) != 2 {
			t.Fatalf("%s: %d dead letters, want 2: %s", svc, len(dl), dump(dl))
		}
		for _, d := range dl {
			if e := headers(d)[pipeline.HeaderError]; !strings.Contains(e, "missing message id") {
				t.Errorf("%s: dead letter error %q", svc, e)
			}
		}
	}
	for svc, want := range map[string][3]int{"hdr": {3, 2, 2}, "ptr": {2, 3, 2}, "shadow": {3, 2, 2}} {
		got := [3]int{r.records(svc, "forwarded"), r.records(svc, "duplicate"), r.records(svc, "invalid")}
		if got != want {
			t.Errorf("%s: forwarded, duplicate, invalid = %v, want %v", svc, got, want)
		}
	}
	r.stop()
}

// TestWindowExpiryAndSliding: on the database's clock, an id is new again
// once its window is over; with sliding, each repeat pushes the end back.
// (3 s windows, records 2 s apart: a second of slack for a busy machine.)
func TestWindowExpiryAndSliding(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, modeTopics("fixed", "sliding")...)
	dsn := pgtest.DSN(t)
	fixed := modeRoute("fixed", config.ModeWindow)
	sliding := modeRoute("sliding", config.ModeWindow)
	fixed.Window, sliding.Window, sliding.Sliding = 3*time.Second, 3*time.Second, true
	r := start(t, testConfig(t, kc, dsn, fixed, sliding), openStore(t, dsn))

	for i := range 3 {
		if i > 0 {
			time.Sleep(2 * time.Second)
		}
		for _, svc := range []string{"fixed", "sliding"} {
			kc.Produce("in."+svc, hrec("k", fmt.Sprintf(`{"n":%d}`, i), "Idempotency-Key", "m1"))
		}
		r.waitRecords("", 2*(i+1))
	}
	// fixed: 0 forwarded, 2 s a duplicate, 4 s past the end (3 s): new.
	if got, want := values(kc.ReadAll("out.fixed")), []string{`{"n":0}`, `{"n":2}`}; !slices.Equal(got, want) {
		t.Errorf("fixed window forwarded %q, want %q", got, want)
	}
	// sliding: the repeat at 2 s moved the end to 5 s.
	if got, want := values(kc.ReadAll("out.sliding")), []string{`{"n":0}`}; !slices.Equal(got, want) {
		t.Errorf("sliding window forwarded %q, want %q", got, want)
	}
	r.stop()
}

// TestVersionMode: forward iff the version is above the one forwarded; an
// equal version is a duplicate, a lower one stale; a missing or
// non-integer version is a dead letter. Versions from a pointer and from a
// header; a shadow route marks duplicates and stale records alike.
func TestVersionMode(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, modeTopics("ptr", "hdr", "shadow")...)
	dsn := pgtest.DSN(t)
	ptr := modeRoute("ptr", config.ModeVersion)
	hdr := modeRoute("hdr", config.ModeVersion)
	hdr.VersionFrom = "header:Version"
	shadow := modeRoute("shadow", config.ModeVersion)
	shadow.Shadow = true
	r := start(t, testConfig(t, kc, dsn, ptr, hdr, shadow), openStore(t, dsn))

	byPointer := []*kgo.Record{
		rec("o1", `{"version":1,"s":"new"}`),
		rec("o1", `{"version":1,"s":"again"}`), // duplicate, whatever the content
		rec("o1", `{"version":3,"s":"paid"}`),
		rec("o1", `{"version":2,"s":"late"}`), // stale
		rec("o2", `{"version":2,"s":"new"}`),
		rec("o1", `{"s":"none"}`),            // no version: dead letter
		rec("o1", `{"version":"4","s":"x"}`), // a string: dead letter
		rec("o1", `{"version":4.0,"s":"x"}`), // not an integer: dead letter
		tomb("o1"),                           // a tombstone has no version: dead letter
		rec("o1", `{"version":4,"s":"shipped"}`),
	}
	byHeader := []*kgo.Record{
		hrec("o1", `"new"`, "Version", "1"),
		hrec("o1", `"again"`, "Version", "1"),
		hrec("o1", `"paid"`, "Version", "3"),
		hrec("o1", `"late"`, "Version", "2"),
		hrec("o2", `"new"`, "Version", "2"),
		hrec("o1", `"none"`),
		hrec("o1", `"x"`, "Version", "four"),
		hrec("o1", `"x"`, "Version", "4.0"),
		hrec("o1", `"x"`, "Version", "99999999999999999999"),
		hrec("o1", `"shipped"`, "Version", "4"),
	}
	kc.Produce("in.ptr", copies(byPointer)...)
	kc.Produce("in.hdr", byHeader...)
	kc.Produce("in.shadow", copies(byPointer)...)
	r.waitRecords("", 30)

	if got, want := values(kc.ReadAll("out.ptr")), []string{`{"version":1,"s":"new"}`, `{"version":3,"s":"paid"}`, `{"version":2,"s":"new"}`, `{"version":4,"s":"shipped"}`}; !slices.Equal(got, want) {
		t.Errorf("ptr forwarded %q, want %q", got, want)
	}
	if got, want := values(kc.ReadAll("out.hdr")), []string{`"new"`, `"paid"`, `"new"`, `"shipped"`}; !slices.Equal(got, want) {
		t.Errorf("hdr forwarded %q, want %q", got, want)
	}
	want := []string{`{"version":1,"s":"new"}`, `{"version":1,"s":"again"}(dup)`, `{"version":3,"s":"paid"}`, `{"version":2,"s":"late"}(dup)`,
		`{"version":2,"s":"new"}`, `{"version":4,"s":"shipped"}`}
	if got := values(kc.ReadAll("out.shadow")); !slices.Equal(got, want) {
		t.Errorf("shadow forwarded %q, want %q", got, want)
	}
	for _, svc := range []string{"ptr", "hdr", "shadow"} {
		got := [4]int{r.records(svc, "forwarded"), r.records(svc, "duplicate"), r.records(svc, "stale"), r.records(svc, "invalid")}
		if want := [4]int{4, 1, 1, 4}; got != want {
			t.Errorf("%s: forwarded, duplicate, stale, invalid = %v, want %v", svc, got, want)
		}
		for _, d := range kc.ReadAll("dlq." + svc) {
			if e := headers(d)[pipeline.HeaderError]; !strings.Contains(e, "missing or invalid version") {
				t.Errorf("%s: dead letter error %q", svc, e)
			}
		}
	}
	r.stop()
}

// TestRefreshAfter: an unchanged record is forwarded anyway once its
// identity was last forwarded longer ago than refresh_after (counted
// refreshed); a route without it never refreshes.
func TestRefreshAfter(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, modeTopics("refresh", "plain")...)
	dsn := pgtest.DSN(t)
	refresh := modeRoute("refresh", config.ModeLastSeen)
	refresh.RefreshAfter = 2 * time.Second
	plain := modeRoute("plain", config.ModeLastSeen)
	r := start(t, testConfig(t, kc, dsn, refresh, plain), openStore(t, dsn))

	for _, svc := range []string{"refresh", "plain"} {
		kc.Produce("in."+svc, rec("k", `"A"`), rec("k", `"A"`))
	}
	r.waitRecords("", 4)
	time.Sleep(2500 * time.Millisecond)
	for _, svc := range []string{"refresh", "plain"} {
		kc.Produce("in."+svc, rec("k", `"A"`), rec("k", `"A"`), rec("k", `"B"`))
	}
	r.waitRecords("", 10)
	if got, want := values(kc.ReadAll("out.refresh")), []string{`"A"`, `"A"`, `"B"`}; !slices.Equal(got, want) {
		t.Errorf("refresh route forwarded %q, want %q", got, want)
	}
	if got, want := values(kc.ReadAll("out.plain")), []string{`"A"`, `"B"`}; !slices.Equal(got, want) {
		t.Errorf("plain route forwarded %q, want %q", got, want)
	}
	if got := [3]int{r.records("refresh", "forwarded"), r.records("refresh", "refreshed"), r.records("refresh", "duplicate")}; got != [3]int{2, 1, 2} {
		t.Errorf("refresh: forwarded, refreshed, duplicate = %v, want [2 1 2]", got)
	}
	r.stop()
}

// TestModesRecovery: the decision log lets recovery re-deliver the
// forwards of every mode (a refresh included) decided but not delivered
// before a crash.
func TestModesRecovery(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{config.ModeWindow, config.ModeVersion, "refresh"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			kc := testkafka.New(t, 1, "in", "out")
			gate := newProduceGate(t, kc, "out")
			dsn := pgtest.DSN(t)
			rt := route("svc", "in", "out")
			first, next, want := rec("k", `"A"`), []*kgo.Record{rec("k", `"A"`), rec("j", `"B"`)}, []string{`"A"`, `"A"`, `"B"`}
			switch mode {
			case config.ModeWindow:
				rt.Mode, rt.Window = mode, time.Hour
				first = hrec("k", `"A"`, "Idempotency-Key", "m1")
				next = []*kgo.Record{hrec("k", `"A2"`, "Idempotency-Key", "m1"), hrec("k", `"C"`, "Idempotency-Key", "m2")}
				want = []string{`"A"`, `"C"`}
			case config.ModeVersion:
				rt.Mode, rt.VersionFrom = mode, "header:V"
				first = hrec("k", `"A"`, "V", "2")
				next = []*kgo.Record{hrec("k", `"A1"`, "V", "1"), hrec("k", `"A3"`, "V", "3")}
				want = []string{`"A"`, `"A3"`}
			default:
				rt.RefreshAfter = time.Second
			}
			cfg := testConfig(t, kc, dsn, rt)
			cfg.Pipeline.ShutdownGrace = 300 * time.Millisecond
			cfg.Pipeline.RetryMax = 200 * time.Millisecond
			store := openStore(t, dsn)
			r := start(t, cfg, store)
			one(t, kc, "in", first)
			r.waitRecords("svc", 1) // delivered and committed: C = 1
			if mode == "refresh" {
				time.Sleep(1500 * time.Millisecond)
			}
			gate.close()
			one(t, kc, "in", next...) // decided and logged, not delivered
			waitProgress(t, store, cfg, "in", 0, 3)
			r.crash()
			if got := values(kc.ReadAll("out")); !slices.Equal(got, want[:1]) {
				t.Fatalf("before the restart: %q delivered", got)
			}
			gate.open()
			r = start(t, cfg, store)
			waitFor(t, fmt.Sprintf("out to hold %q", want), func() (bool, string) {
				got := values(kc.ReadAll("out"))
				return slices.Equal(got, want), fmt.Sprint(got)
			})
			if got := r.records("svc", "rebuilt"); got != 2 {
				t.Errorf("rebuilt %d, want 2", got)
			}
			r.stop()
		})
	}
}

// TestWindowCleanupPlateau: under a steady stream of new ids, the
// background cleanup keeps the window table at about rate x (window +
// interval) rows instead of growing with the stream, and empties it once
// the stream stops; it counts what it deleted.
func TestWindowCleanupPlateau(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, modeTopics("win")...)
	dsn := pgtest.DSN(t)
	rt := modeRoute("win", config.ModeWindow)
	rt.Window, rt.CleanupInterval, rt.CleanupBatch = 500*time.Millisecond, 250*time.Millisecond, 40
	r := start(t, testConfig(t, kc, dsn, rt), openStore(t, dsn))
	pool := openStore(t, dsn).Pool()
	rows := func() int {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM window_ids`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// 200 new ids a second for 8 seconds.
	const rate, seconds = 200, 8
	var produced atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		cl := kc.Client()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < rate*seconds; i += rate / 20 {
			<-tick.C
			var batch []*kgo.Record
			for j := i; j < i+rate/20; j++ {
				batch = append(batch, &kgo.Record{Topic: "in.win", Value: []byte(`{}`),
					Headers: []kgo.RecordHeader{{Key: "Idempotency-Key", Value: fmt.Appendf(nil, "id-%d", j)}}})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := cl.ProduceSync(ctx, batch...).FirstErr()
			cancel()
			if err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			produced.Add(int64(len(batch)))
		}
	}()
	var samples []int
	for {
		select {
		case <-done:
		case <-time.After(250 * time.Millisecond):
			if produced.Load() >= 2*rate { // past the first window and cleanup
				samples = append(samples, rows())
			}
			continue
		}
		break
	}
	r.waitRecords("win", rate*seconds)
	// Steady state: rate x (window + interval) = 150 rows, plus what one
	// slow round lets pile up; without the cleanup, up to 1600.
	const bound = 450
	peak := slices.Max(samples)
	t.Logf("window_ids rows while %d ids streamed in: %v", rate*seconds, samples)
	if peak > bound {
		t.Errorf("the window table grew to %d rows (bound %d): the cleanup does not keep up", peak, bound)
	}
	third := len(samples) / 3
	if late, early := slices.Max(samples[2*third:]), slices.Max(samples[:third]); late > 2*early+50 {
		t.Errorf("the window table keeps growing: %d rows in the last third, %d in the first", late, early)
	}
	waitFor(t, "the window table to empty once every id expired", func() (bool, string) {
		n := rows()
		return n == 0, fmt.Sprint(n, " rows")
	})
	waitFor(t, "dam_window_expired_total to count every id", func() (bool, string) {
		n := r.counter("dam_window_expired_total", "win")
		return n == rate*seconds, fmt.Sprint(n)
	})
	if n := r.counter("dam_window_cleanups_total", "win"); n < 10 {
		t.Errorf("%v cleanup rounds, want one every 250ms", n)
	}
	r.stop()
}
