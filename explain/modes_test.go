package explain_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/explain"
	"github.com/dam-dedup/dam/pipeline"
)

// Window mode, a fixed window: a repeated id inside the window is a
// duplicate whatever its content; an id exactly at its expiry is forwarded
// afresh; a record without an id is bad input. Both questions, on the
// boundary.
func TestWindow(t *testing.T) {
	e := newEnv(t, "    mode: window\n    window: 1h\n    dead_letter: dlq\n")
	e.kc.Produce("in",
		hrec("k", `{"amount":10}`, "Idempotency-Key", "A"), // 0 forward at t0
		hrec("k", `{"amount":12}`, "Idempotency-Key", "A"), // 1 duplicate at t0+1h-1µs
		hrec("k", `{"amount":10}`, "Idempotency-Key", "A"), // 2 forward at t0+1h: the window ended
		hrec("k", `{"amount":1}`),                          // 3 invalid: no id
		hrec("k", `{"amount":10}`, "Idempotency-Key", "A"), // 4 not decided
	)
	got := e.decideAt(t0, 1) + " " + e.decideAt(t0.Add(time.Hour-us), 1) + " " + e.decideAt(t0.Add(time.Hour), 2)
	if got != "forward duplicate forward invalid" {
		t.Fatalf("decisions: %s", got)
	}
	g := newTranscript(t)

	res := e.offset(1)
	g.offset("offset 1", res)
	if res.Entity != "A" {
		t.Errorf("offset 1: id %q", res.Entity)
	}
	res = e.offset(2)
	g.offset("offset 2", res)
	if res.Mode != "window" || !res.DecidedAt.Equal(t0.Add(time.Hour)) || res.Window == nil || !res.Window.Expired ||
		!res.Window.ExpiresAt.Equal(t0.Add(time.Hour)) || res.Window.Window != "1h0m0s" {
		t.Fatalf("offset 2: %+v", res)
	}
	g.offset("offset 3", e.offset(3))

	// Not decided yet: the stored window of A (from offset 2) ends at
	// t0+2h. A microsecond before, a duplicate; at it, forwarded.
	e.at(t0.Add(2*time.Hour - us))
	g.offset("offset 4 before expiry", e.offset(4))
	e.at(t0.Add(2 * time.Hour))
	g.offset("offset 4 at expiry", e.offset(4))

	// Would a payload with id A be forwarded? The same boundary.
	p := text(`{"amount":99}`)
	e.at(t0.Add(2*time.Hour - us))
	pr := e.payload("svc", "A", p)
	g.payload("payload before expiry", pr)
	if pr.Entity != "A" || !pr.Now.Equal(t0.Add(2*time.Hour-us)) || pr.Difference == nil {
		t.Errorf("payload before expiry: %+v", pr)
	}
	if pr.Stored == nil || pr.Stored.Mode != "window" || !pr.Stored.ExpiresAt.Equal(t0.Add(2*time.Hour)) ||
		pr.Window == nil || pr.Window.Expired || pr.Window.NewExpiry != nil || pr.Cause != "in-window" {
		t.Fatalf("payload before expiry: %+v", pr)
	}
	e.at(t0.Add(2 * time.Hour))
	pr = e.payload("svc", "A", p)
	if pr.Decision != "forward" || !pr.Window.Expired || !pr.Window.NewExpiry.Equal(t0.Add(3*time.Hour)) || pr.Cause != "expired" {
		t.Fatalf("payload at expiry: %+v", pr)
	}
	g.payload("payload at expiry", pr)
	// The sidecar agrees: decided exactly then, offset 4 is forwarded.
	if got := e.decideAt(t0.Add(2*time.Hour), 1); got != "forward" {
		t.Fatalf("offset 4 decided at the expiry: %s", got)
	}

	// Without a payload: what a record with the id gets now.
	g.payload("no payload", e.payload("svc", "A", nil))
	pr = e.payload("svc", "Z", p)
	g.payload("new id", pr)
	if pr.Stored != nil {
		t.Errorf("new id: stored %v", pr.Stored)
	}

	// Once the log is pruned, offset 1 is answered from the state and the
	// input, and says so.
	e.pruneLog(5)
	g.offset("offset 1 pruned", e.offset(1))
}

// Window mode, sliding, the id read at a pointer: a repeat extends the
// window; a payload without the id is bad input; a payload of another id
// than the one asked about is refused.
func TestWindowSliding(t *testing.T) {
	e := newEnv(t, "    mode: window\n    id_from: /meta/id\n    window: 1h\n    sliding: true\n")
	e.produce("k", `{"meta":{"id":"A"},"n":1}`, "k", `{"meta":{"id":"A"},"n":2}`)
	if got := e.decideAt(t0, 1) + " " + e.decideAt(t0.Add(50*time.Minute), 1); got != "forward duplicate" {
		t.Fatalf("decisions: %s", got)
	}
	g := newTranscript(t)
	g.offset("offset 1", e.offset(1))

	// Past the first window's end (t0+1h), inside the extended one (to
	// t0+1h50m): a duplicate, which extends the window again.
	e.at(t0.Add(70 * time.Minute))
	pr := e.payload("svc", "A", text(`{"meta":{"id":"A"},"n":1}`))
	if pr.Decision != "duplicate" || !pr.Window.ExpiresAt.Equal(t0.Add(110*time.Minute)) || !pr.Window.NewExpiry.Equal(t0.Add(130*time.Minute)) {
		t.Fatalf("sliding payload: %+v", pr)
	}
	g.payload("sliding payload", pr)
	g.payload("no id", e.payload("svc", "A", text(`{"meta":{"other":"A"}}`)))
	g.payload("null id", e.payload("svc", "A", text(`{"meta":{"id":null}}`)))
	_, err := e.payloadErr("svc", "A", text(`{"meta":{"id":"B"}}`))
	if !errors.Is(err, explain.ErrOtherIdentity) {
		t.Fatalf("another id: %v", err)
	}
	g.err("another id", err)
}

// Version mode: greater forwards, equal is a duplicate, lower is stale,
// a version that is not an integer is bad input; the log does not say
// duplicate from stale, the version does, and when it cannot, explain
// says so.
func TestVersion(t *testing.T) {
	e := newEnv(t, "    mode: version\n    dead_letter: dlq\n",
		"  - service: svc2\n    from: in2\n    to: out2\n    mode: version\n    version_from: header:Version\n")
	e.produce(
		"E", `{"version":3,"s":"a"}`, // 0 forward
		"E", `{"version":3,"s":"b"}`, // 1 duplicate: equal
		"E", `{"version":2}`, // 2 stale: lower
		"E", `{"version":4,"s":"c"}`, // 3 forward
		"E", `{"version":"5"}`, // 4 invalid: a string
		"E", `{"version":7.0}`, // 5 invalid: not an integer literal
		"E", `{"version":3}`, // 6 stale: below 4
		"E", `{"version":5}`, // 7 not decided
	)
	if got := e.decide(1) + " " + e.decide(6); got != "forward duplicate stale forward invalid invalid stale" {
		t.Fatalf("decisions: %s", got)
	}
	g := newTranscript(t)
	res := e.offset(1)
	g.offset("offset 1", res)
	if res.Version == nil || *res.Version != 3 {
		t.Errorf("offset 1: version %v", res.Version)
	}
	g.offset("offset 2", e.offset(2))
	g.offset("offset 3", e.offset(3))
	g.offset("offset 4", e.offset(4))
	g.offset("offset 5", e.offset(5))
	res = e.offset(6)
	g.offset("offset 6", res)
	if res.Mode != "version" || res.Decision != "stale" || *res.Version != 3 || res.StaleAgainst == nil || res.StaleAgainst.Offset != 3 ||
		*res.StaleAgainst.Version != 4 || res.StaleAgainst.From != "state" {
		t.Fatalf("offset 6: %+v", res)
	}
	g.offset("offset 7", e.offset(7))

	// Would a payload be forwarded now?
	pr := e.payload("svc", "E", text(`{"version":4,"s":"d"}`))
	g.payload("equal payload", pr)
	if *pr.Version != 4 || pr.Difference == nil {
		t.Errorf("equal payload: %+v", pr)
	}
	g.payload("lower payload", e.payload("svc", "E", text(`{"version":3,"s":"c"}`)))
	pr = e.payload("svc", "E", text(`{"version":5,"s":"c"}`))
	if pr.Decision != "forward" || *pr.Version != 5 || *pr.Stored.Version != 4 || pr.Stored.Mode != "version" || pr.Cause != "newer" {
		t.Fatalf("greater payload: %+v", pr)
	}
	g.payload("greater payload", pr)
	g.payload("string version", e.payload("svc", "E", text(`{"version":"5"}`)))
	g.payload("new entity", e.payload("svc", "F", text(`{"version":-2}`)))
	g.payload("no payload", e.payload("svc", "E", nil))

	// The version in a header, given with the query's headers.
	p2 := dedup.Partition{Group: "g", Topic: "in2"}
	acq, err := e.store.Acquire(context.Background(), p2)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.InitProgress(context.Background(), p2, acq.Epoch, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Decide(context.Background(), &dedup.Batch{Service: "svc2", Rule: dedup.Rule{Mode: dedup.Version}, Partition: p2, Epoch: acq.Epoch, End: 1,
		Records: []dedup.Record{{Entity: []byte("E"), Version: 8, Digest: sumOf(t, `{}`)}}}, nil); err != nil {
		t.Fatal(err)
	}
	g.payload("no version header", e.payload("svc2", "E", text(`{}`)))
	g.payload("bad version header", e.payload("svc2", "E", text(`{}`), "Version", "x"))
	g.payload("version header", e.payload("svc2", "E", text(`{}`), "Version", "9"))

	// The first batch's log is pruned: offset 1's log entry still says
	// "not forwarded", the state has moved on to offset 3, and only the
	// input still shows version 3 at offset 0. With the input read back
	// to the partition's start, a duplicate; without it, explain cannot
	// tell duplicate from stale and says so.
	e.pruneLog(1)
	g.offset("offset 1, first batch pruned", e.offset(1))
	g.offset("offset 1, lookback 0", e.offsetLookback(1, 0))
	g.offset("offset 2, lookback 0", e.offsetLookback(2, 0))
	g.offset("offset 2, lookback 1", e.offsetLookback(2, 1))

	// The whole log pruned: the state answers for offset 6 (it holds the
	// version it lost to); offsets 1 and 2 only by what the input suggests.
	e.pruneLog(7)
	g.offset("offset 6 pruned", e.offset(6))
	g.offset("offset 1 pruned", e.offset(1))
	g.offset("offset 2 pruned", e.offset(2))
}

// Version mode once retention deleted the start of the input: the log
// still says "not forwarded" for an unreadable record, but not whether it
// was a duplicate or stale, and explain says so; the state still answers
// for what it covers.
func TestVersionRetention(t *testing.T) {
	e := newEnv(t, "    mode: version\n")
	e.produce("E", `{"version":1}`, "E", `{"version":1}`, "E", `{"version":0}`, "F", `{"version":5}`)
	if got := e.decide(4); got != "forward duplicate stale forward" {
		t.Fatalf("decisions: %s", got)
	}
	e.deleteRecords(2)
	g := newTranscript(t)
	g.offset("offset 1", e.offset(1))
	g.offset("offset 2", e.offset(2))
	g.offset("offset 3", e.offset(3))
	e.pruneLog(4)
	if _, err := e.offsetErr(1, -1); !errors.Is(err, explain.ErrGone) {
		t.Fatalf("offset 1 unreadable and unlogged: %v", err)
	}
	g.offset("offset 2 unlogged", e.offset(2))
}

// Last-seen with refresh_after: an unchanged record is refreshed once
// decided strictly later than refresh_after after the last forward; exactly
// at the limit it is still a duplicate. Both questions.
func TestRefresh(t *testing.T) {
	e := newEnv(t, "    refresh_after: 1h\n    ignore: [/ts]\n")
	e.produce("K", `{"v":1,"ts":1}`, "K", `{"v":1,"ts":2}`, "K", `{"v":1,"ts":3}`, "K", `{"v":1,"ts":4}`)
	got := e.decideAt(t0, 1) + " " + e.decideAt(t0.Add(time.Hour), 1) + " " + e.decideAt(t0.Add(time.Hour+us), 1)
	if got != "forward duplicate refresh" {
		t.Fatalf("decisions: %s", got)
	}
	g := newTranscript(t)
	g.offset("offset 1", e.offset(1))
	res := e.offset(2)
	g.offset("offset 2", res)
	if res.Refresh == nil || !res.Refresh.Refreshed || !res.Refresh.LastForwarded.Equal(t0) || res.Refresh.After != "1h0m0s" {
		t.Fatalf("offset 2: %+v", res.Refresh)
	}

	// Now: the identity was last forwarded (refreshed) at t0+1h+1µs. At
	// exactly refresh_after later, a duplicate; a microsecond after, a
	// refresh.
	p := text(`{"v":1,"ts":9}`)
	e.at(t0.Add(2*time.Hour + us))
	pr := e.payload("svc", "K", p)
	g.payload("payload at the limit", pr)
	if !pr.Now.Equal(t0.Add(2*time.Hour+us)) || pr.Refresh.Refreshed || !pr.Refresh.DueAfter.Equal(t0.Add(2*time.Hour+us)) {
		t.Fatalf("payload at the limit: %+v", pr)
	}
	g.offset("offset 3 at the limit", e.offset(3))
	e.at(t0.Add(2*time.Hour + 2*us))
	pr = e.payload("svc", "K", p)
	if pr.Decision != "refresh" || !pr.Refresh.Refreshed || pr.Cause != "refresh-due" {
		t.Fatalf("payload past the limit: %+v", pr)
	}
	g.payload("payload past the limit", pr)
	g.offset("offset 3 past the limit", e.offset(3))
	g.payload("no payload", e.payload("svc", "K", nil))
	// The sidecar agrees.
	if got := e.decideAt(t0.Add(2*time.Hour+2*us), 1); got != "refresh" {
		t.Fatalf("offset 3 decided past the limit: %s", got)
	}
}

// A service that changed mode: each mode keeps its own state, and explain
// says which one decides.
func TestModeChange(t *testing.T) {
	e := newEnv(t, "    mode: version\n")
	e.produce("E", `{"version":1}`, "E", `{"version":1}`)
	// Offset 0 was decided while the route was last-seen.
	versionRoute := e.route
	e.route = lastSeenRoute(t, e)
	if got := e.decide(1); got != "forward" {
		t.Fatalf("decisions: %s", got)
	}
	e.route = versionRoute
	g := newTranscript(t)
	g.offset("offset 1", e.offset(1))
	pr := e.payload("svc", "E", text(`{"version":1}`))
	if pr.Decision != "forward" || pr.Stored != nil || pr.OtherMode == nil || pr.OtherMode.Mode != "last-seen" {
		t.Fatalf("payload: %+v", pr)
	}
	g.payload("payload", pr)

	// A version state older than the last-seen one: Get returns the
	// last-seen state, but the version state decides.
	dig := sumOf(t, `{"version":1}`)
	if _, err := e.store.Pool().Exec(context.Background(), `INSERT INTO versions (service, entity, version, digest, updated_at)
		VALUES ('svc', 'E', 1, $1, now() - interval '1 day')`, dig[:]); err != nil {
		t.Fatal(err)
	}
	g.payload("older version state", e.payload("svc", "E", text(`{"version":1}`)))
}

// lastSeenRoute returns route "svc" on "in" compiled as last-seen: the
// configuration's route as it was before the service changed mode.
func lastSeenRoute(t *testing.T, e *env) *pipeline.Route {
	t.Helper()
	cfg := e.cfg
	rc := config.DefaultRoute()
	rc.Service, rc.From, rc.To = "svc", "in", "out"
	cfg.Routes = []config.Route{rc}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	route, err := pipeline.CompileRoute(cfg.Routes[0])
	if err != nil {
		t.Fatal(err)
	}
	if route.Rule() != (dedup.Rule{}) {
		t.Fatalf("compiled rule %+v, want last-seen", route.Rule())
	}
	return route
}
