package explain_test

import (
	"context"
	"errors"
	"strings"
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

	res := e.offset(1)
	decided(t, "offset 1", res.Decision, res.Reason, "duplicate", "duplicate of the id forwarded from offset 0 at 2030-01-02T03:04:05Z",
		"(1h0m0s, fixed, until 2030-01-02T04:04:05Z) was still open", "whatever its content (its content differs from the forwarded record's)")
	has(t, "offset 1", res.Rule, "window: id from header:Idempotency-Key, window 1h0m0s (fixed")
	has(t, "offset 1", diffText(res), "/amount: 10 -> 12 (offset 0 -> 1)")
	if res.Entity != "A" {
		t.Errorf("offset 1: id %q", res.Entity)
	}
	res = e.offset(2)
	decided(t, "offset 2", res.Decision, res.Reason, "forward", "its id had no open window when it was decided",
		"last forwarded from offset 0 at 2030-01-02T03:04:05Z, and that window ended at 2030-01-02T04:04:05Z; this record was decided at 2030-01-02T04:04:05Z",
		"it set the id's stored state, still current")
	if res.Mode != "window" || !res.DecidedAt.Equal(t0.Add(time.Hour)) || res.Window == nil || !res.Window.Expired ||
		!res.Window.ExpiresAt.Equal(t0.Add(time.Hour)) || res.Window.Window != "1h0m0s" {
		t.Fatalf("offset 2: %+v", res)
	}
	res = e.offset(3)
	decided(t, "offset 3", res.Decision, res.Reason, "invalid", `bad input (missing message id: no header "Idempotency-Key"); it went to the dead-letter topic dlq`)

	// Not decided yet: the stored window of A (from offset 2) ends at
	// t0+2h. A microsecond before, a duplicate; at it, forwarded.
	e.at(t0.Add(2*time.Hour - us))
	res = e.offset(4)
	decided(t, "offset 4 before expiry", res.Decision, res.Reason, "undecided",
		"it would be a duplicate: the id was forwarded at 2030-01-02T04:04:05Z and its window lasts until 2030-01-02T05:04:05Z")
	e.at(t0.Add(2 * time.Hour))
	res = e.offset(4)
	has(t, "offset 4 at expiry", res.Reason, "it would be forwarded: the id's window ended at 2030-01-02T05:04:05Z (now is 2030-01-02T05:04:05Z")

	// Would a payload with id A be forwarded? The same boundary.
	p := text(`{"amount":99}`)
	e.at(t0.Add(2*time.Hour - us))
	pr := e.payload("svc", "A", p)
	decided(t, "payload before expiry", pr.Decision, pr.Reason, "duplicate",
		"the id was forwarded at 2030-01-02T04:04:05Z and its window lasts until 2030-01-02T05:04:05Z",
		"(its content differs from the forwarded record's)")
	has(t, "payload before expiry", pr.Stored.String(), "01", "from in/0@2, expires 2030-01-02T05:04:05Z")
	if pr.Entity != "A" || !pr.Now.Equal(t0.Add(2*time.Hour-us)) || pr.Difference == nil || pr.Difference.String() != "/amount: 10 -> 99" {
		t.Errorf("payload before expiry: %+v", pr)
	}
	if pr.Stored == nil || pr.Stored.Mode != "window" || !pr.Stored.ExpiresAt.Equal(t0.Add(2*time.Hour)) ||
		pr.Window == nil || pr.Window.Expired || pr.Window.NewExpiry != nil || pr.Cause != "in-window" {
		t.Fatalf("payload before expiry: %+v", pr)
	}
	e.at(t0.Add(2 * time.Hour))
	pr = e.payload("svc", "A", p)
	if pr.Decision != "forward" || !pr.Window.Expired || !pr.Window.NewExpiry.Equal(t0.Add(3*time.Hour)) ||
		!strings.Contains(pr.Reason, "an expired id reads as absent") || pr.Cause != "expired" {
		t.Fatalf("payload at expiry: %+v", pr)
	}
	// The sidecar agrees: decided exactly then, offset 4 is forwarded.
	if got := e.decideAt(t0.Add(2*time.Hour), 1); got != "forward" {
		t.Fatalf("offset 4 decided at the expiry: %s", got)
	}

	// Without a payload: what a record with the id gets now.
	pr = e.payload("svc", "A", nil)
	has(t, "no payload", pr.Reason, "no payload given: a record with this id would be a duplicate now")
	pr = e.payload("svc", "Z", p)
	decided(t, "new id", pr.Decision, pr.Reason, "forward", "the id was not seen within the window")
	if pr.Stored != nil {
		t.Errorf("new id: stored %v", pr.Stored)
	}

	// Once the log is pruned, offset 1 is answered from the state and the
	// input, and says so.
	e.pruneLog(5)
	res = e.offset(1)
	decided(t, "offset 1 pruned", res.Decision, res.Reason, "unknown", "the id's stored state was since set from offset 4",
		"the input before it holds an earlier record of this id (offset 0", "a duplicate if that id's window (1h0m0s) was still open")
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
	res := e.offset(1)
	decided(t, "offset 1", res.Decision, res.Reason, "duplicate",
		"duplicate of the id forwarded from offset 0 at 2030-01-02T03:04:05Z: its window (1h0m0s, sliding, extended by each repeat) was still open")
	has(t, "offset 1", res.Rule, "window: id from /meta/id, window 1h0m0s (sliding")
	has(t, "offset 1", diffText(res), "/n: 1 -> 2 (offset 0 -> 1)")

	// Past the first window's end (t0+1h), inside the extended one (to
	// t0+1h50m): a duplicate, which extends the window again.
	e.at(t0.Add(70 * time.Minute))
	pr := e.payload("svc", "A", text(`{"meta":{"id":"A"},"n":1}`))
	if pr.Decision != "duplicate" || !pr.Window.ExpiresAt.Equal(t0.Add(110*time.Minute)) || !pr.Window.NewExpiry.Equal(t0.Add(130*time.Minute)) ||
		!strings.Contains(pr.Reason, "sliding: this repeat extends the window to 2030-01-02T05:14:05Z") ||
		!strings.Contains(pr.Reason, "its content is the same as the forwarded record's") {
		t.Fatalf("sliding payload: %+v", pr)
	}
	pr = e.payload("svc", "A", text(`{"meta":{"other":"A"}}`))
	decided(t, "no id", pr.Decision, pr.Reason, "invalid", "the payload is bad input: missing message id: canon: no value at \"/meta/id\"",
		"the route has no dead_letter topic: it would halt the partition")
	pr = e.payload("svc", "A", text(`{"meta":{"id":null}}`))
	decided(t, "null id", pr.Decision, pr.Reason, "invalid", "missing message id at /meta/id: not a non-empty string or a number")
	_, err := e.payloadErr("svc", "A", text(`{"meta":{"id":"B"}}`))
	if !errors.Is(err, explain.ErrOtherIdentity) || !strings.Contains(err.Error(), `the payload's identity (id_from /meta/id) is "B", not "A"`) {
		t.Fatalf("another id: %v", err)
	}
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
	res := e.offset(1)
	decided(t, "offset 1", res.Decision, res.Reason, "duplicate",
		"its version 3 equals the version stored when it was decided, forwarded from offset 0 at", "(its content differs from the forwarded record's)")
	has(t, "offset 1", res.Rule, "version: entity from key, version from /version")
	has(t, "offset 1", diffText(res), `/s: "a" -> "b" (offset 0 -> 1)`)
	has(t, "offset 1", evidence(res), "decision log: offset 1 is in the batch [1, 7) decided", "not forwarded, a duplicate or stale")
	if res.Version == nil || *res.Version != 3 {
		t.Errorf("offset 1: version %v", res.Version)
	}
	res = e.offset(2)
	decided(t, "offset 2", res.Decision, res.Reason, "stale", "its version 2 is below the version 3 stored when it was decided, forwarded from offset 0 at")
	res = e.offset(3)
	decided(t, "offset 3", res.Decision, res.Reason, "forward", "its version 4 is above the version 3 stored when it was decided, forwarded from offset 0",
		"it set the stored version, still current")
	res = e.offset(4)
	decided(t, "offset 4", res.Decision, res.Reason, "invalid", "bad input (missing or invalid version at /version: 5 is not a 64-bit integer); it went to the dead-letter topic dlq")
	res = e.offset(5)
	decided(t, "offset 5", res.Decision, res.Reason, "invalid", "7.0 is not a 64-bit integer")
	res = e.offset(6)
	if res.Mode != "version" || res.Decision != "stale" || *res.Version != 3 || res.StaleAgainst == nil || res.StaleAgainst.Offset != 3 ||
		*res.StaleAgainst.Version != 4 || res.StaleAgainst.From != "state" {
		t.Fatalf("offset 6: %+v", res)
	}
	res = e.offset(7)
	decided(t, "offset 7", res.Decision, res.Reason, "undecided", "it would be forwarded: its version 5 is above the stored version 4")

	// Would a payload be forwarded now?
	pr := e.payload("svc", "E", text(`{"version":4,"s":"d"}`))
	decided(t, "equal payload", pr.Decision, pr.Reason, "duplicate",
		"its version 4 equals the stored version 4: a repeated version is a duplicate whatever its content (its content differs")
	has(t, "equal payload", pr.Stored.String(), "version 4, 01", "from in/0@3")
	if *pr.Version != 4 || pr.Difference == nil || pr.Difference.String() != `/s: "c" -> "d"` {
		t.Errorf("equal payload: %+v", pr)
	}
	pr = e.payload("svc", "E", text(`{"version":3,"s":"c"}`))
	decided(t, "lower payload", pr.Decision, pr.Reason, "stale", "its version 3 is below the stored version 4: an out-of-order update")
	pr = e.payload("svc", "E", text(`{"version":5,"s":"c"}`))
	if pr.Decision != "forward" || *pr.Version != 5 || *pr.Stored.Version != 4 || pr.Stored.Mode != "version" || pr.Cause != "newer" {
		t.Fatalf("greater payload: %+v", pr)
	}
	pr = e.payload("svc", "E", text(`{"version":"5"}`))
	decided(t, "string version", pr.Decision, pr.Reason, "invalid",
		"the payload is bad input: missing or invalid version at /version: 5 is not a 64-bit integer; dam would send it to the dead-letter topic dlq")
	pr = e.payload("svc", "F", text(`{"version":-2}`))
	decided(t, "new entity", pr.Decision, pr.Reason, "forward", "no version stored for this entity: its first version (-2) is forwarded")
	pr = e.payload("svc", "E", nil)
	has(t, "no payload", pr.Reason, "a record of this entity is forwarded iff its version is above 4 (equal: a duplicate, lower: stale)")

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
	pr = e.payload("svc2", "E", text(`{}`))
	decided(t, "no version header", pr.Decision, pr.Reason, "invalid",
		`the payload is bad input: missing or invalid version: no header "Version" (the version is read from a header: give it with --header Version=N)`)
	pr = e.payload("svc2", "E", text(`{}`), "Version", "x")
	has(t, "bad version header", pr.Reason, `header "Version": "x" is not a 64-bit integer`)
	pr = e.payload("svc2", "E", text(`{}`), "Version", "9")
	decided(t, "version header", pr.Decision, pr.Reason, "forward", "its version 9 is above the stored version 8")

	// The first batch's log is pruned: offset 1's log entry still says
	// "not forwarded", the state has moved on to offset 3, and only the
	// input still shows version 3 at offset 0. With the input read back
	// to the partition's start, a duplicate; without it, explain cannot
	// tell duplicate from stale and says so.
	e.pruneLog(1)
	res = e.offset(1)
	decided(t, "offset 1, first batch pruned", res.Decision, res.Reason, "duplicate", "forwarded from offset 0")
	res = e.offsetLookback(1, 0)
	decided(t, "offset 1, lookback 0", res.Decision, res.Reason, "dropped",
		"a duplicate or stale, and which is no longer known: the version stored when it was decided is gone")
	res = e.offsetLookback(2, 0)
	decided(t, "offset 2, lookback 0", res.Decision, res.Reason, "dropped")
	res = e.offsetLookback(2, 1)
	decided(t, "offset 2, lookback 1", res.Decision, res.Reason, "stale", "its version 2 is below version 3 of the earlier record at offset 1")

	// The whole log pruned: the state answers for offset 6 (it holds the
	// version it lost to); offsets 1 and 2 only by what the input suggests.
	e.pruneLog(7)
	res = e.offset(6)
	decided(t, "offset 6 pruned", res.Decision, res.Reason, "stale", "below the version 4 stored when it was decided, forwarded from offset 3")
	has(t, "offset 6 pruned", evidence(res), "no longer covers offset 6")
	res = e.offset(1)
	decided(t, "offset 1 pruned", res.Decision, res.Reason, "unknown", "the stored version (4) was since set from offset 3", "suggests a duplicate of version 3 at offset 0")
	res = e.offset(2)
	decided(t, "offset 2 pruned", res.Decision, res.Reason, "unknown", "suggests it was stale: its version 2 is below version 3 at offset 0")
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
	res := e.offset(1)
	decided(t, "offset 1", res.Decision, res.Reason, "dropped", "the decision log says it was not forwarded, a duplicate or stale",
		"the record, whose version would tell which, is no longer readable")
	has(t, "offset 1", evidence(res), "kafka: in/0@1: not readable: below the log start offset 2")
	res = e.offset(2)
	decided(t, "offset 2", res.Decision, res.Reason, "stale", "its version 0 is below the version 1 stored when it was decided, forwarded from offset 0")
	res = e.offset(3)
	decided(t, "offset 3", res.Decision, res.Reason, "forward",
		"no earlier version of this entity is known in the state, the decision log or the input read, [2, 3): its first version, or the forward before it is deleted by retention (the partition starts at 2)")
	e.pruneLog(4)
	if _, err := e.offsetErr(1, -1); !errors.Is(err, explain.ErrGone) {
		t.Fatalf("offset 1 unreadable and unlogged: %v", err)
	}
	res = e.offset(2)
	decided(t, "offset 2 unlogged", res.Decision, res.Reason, "stale", "forwarded from offset 0")
	has(t, "offset 2 unlogged", evidence(res), "decision log: no longer covers offset 2")
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
	res := e.offset(1)
	decided(t, "offset 1", res.Decision, res.Reason, "duplicate", "duplicate of the content forwarded from offset 0 at 2030-01-02T03:04:05Z",
		"not refreshed: decided at 2030-01-02T04:04:05Z, 1h0m0s after that forward, not longer than refresh_after 1h0m0s")
	has(t, "offset 1", res.Rule, "last-seen: entity from key, refresh_after 1h0m0s")
	res = e.offset(2)
	decided(t, "offset 2", res.Decision, res.Reason, "refresh",
		"refreshed: its content equals the previous record of this entity (offset 1), but the identity was last forwarded from offset 0 at 2030-01-02T03:04:05Z, 1h0m0.000001s before this record was decided (2030-01-02T04:04:05.000001Z): longer than refresh_after 1h0m0s")
	has(t, "offset 2", evidence(res), "forward (or a refresh: the log records refreshes as forwards)")
	if res.Refresh == nil || !res.Refresh.Refreshed || !res.Refresh.LastForwarded.Equal(t0) || res.Refresh.After != "1h0m0s" {
		t.Fatalf("offset 2: %+v", res.Refresh)
	}

	// Now: the identity was last forwarded (refreshed) at t0+1h+1µs. At
	// exactly refresh_after later, a duplicate; a microsecond after, a
	// refresh.
	p := text(`{"v":1,"ts":9}`)
	e.at(t0.Add(2*time.Hour + us))
	pr := e.payload("svc", "K", p)
	decided(t, "payload at the limit", pr.Decision, pr.Reason, "duplicate",
		"its digest equals the stored digest: the same content as the record last forwarded, 1h0m0s ago (at 2030-01-02T04:04:05.000001Z); not refreshed")
	if !pr.Now.Equal(t0.Add(2*time.Hour+us)) || pr.Refresh.Refreshed || !pr.Refresh.DueAfter.Equal(t0.Add(2*time.Hour+us)) {
		t.Fatalf("payload at the limit: %+v", pr)
	}
	res = e.offset(3)
	decided(t, "offset 3 at the limit", res.Decision, res.Reason, "undecided", "it would be a duplicate")
	e.at(t0.Add(2*time.Hour + 2*us))
	pr = e.payload("svc", "K", p)
	if pr.Decision != "refresh" || !pr.Refresh.Refreshed || !strings.Contains(pr.Reason, "longer than refresh_after 1h0m0s: refreshed (forwarded)") || pr.Cause != "refresh-due" {
		t.Fatalf("payload past the limit: %+v", pr)
	}
	res = e.offset(3)
	has(t, "offset 3 past the limit", res.Reason, "it would be refreshed (forwarded)")
	pr = e.payload("svc", "K", nil)
	has(t, "no payload", pr.Reason, "a record equal to the stored content would be refreshed (forwarded) now")
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
	res := e.offset(1)
	decided(t, "offset 1", res.Decision, res.Reason, "undecided", "it would be forwarded: no version stored for this entity")
	has(t, "offset 1", evidence(res), "state: none stored in mode version", "the identity was last forwarded under mode last-seen",
		"but the route is in mode version: the service changed mode", "mode version holds none for it")
	pr := e.payload("svc", "E", text(`{"version":1}`))
	if pr.Decision != "forward" || pr.Stored != nil || pr.OtherMode == nil || pr.OtherMode.Mode != "last-seen" || !strings.Contains(pr.ModeChange, "the service changed mode") {
		t.Fatalf("payload: %+v", pr)
	}

	// A version state older than the last-seen one: Get returns the
	// last-seen state, but the version state decides.
	dig := sumOf(t, `{"version":1}`)
	if _, err := e.store.Pool().Exec(context.Background(), `INSERT INTO versions (service, entity, version, digest, updated_at)
		VALUES ('svc', 'E', 1, $1, now() - interval '1 day')`, dig[:]); err != nil {
		t.Fatal(err)
	}
	pr = e.payload("svc", "E", text(`{"version":1}`))
	decided(t, "older version state", pr.Decision, pr.Reason, "duplicate", "its version 1 equals the stored version 1")
	has(t, "older version state", pr.Stored.String(), "version 1", "by a check")
	has(t, "older version state", pr.ModeChange, "mode version's state, set ")
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
