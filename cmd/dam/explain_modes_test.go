package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/pipeline"
)

// t0 is the decision time the mode tests start from: the clock is given
// (Batch.Now, and dam explain's stopped clock), so boundaries are exact to
// the microsecond.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

const us = time.Microsecond

// hrec builds an input record with headers given as name, value pairs.
func hrec(key, value string, headers ...string) *kgo.Record {
	r := &kgo.Record{Key: []byte(key), Value: []byte(value)}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
	}
	return r
}

// payloadFile writes a payload to a file of the test and returns its path.
func payloadFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "payload.json")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// explained runs dam explain, wants exit 0, and returns its output.
func (e *explainEnv) explained(args ...string) string {
	e.t.Helper()
	code, out, errOut := e.explain(args...)
	if code != 0 {
		e.t.Fatalf("explain %v: exit %d: %s", args, code, errOut)
	}
	return out
}

// explainedJSON runs dam explain -o json into v.
func (e *explainEnv) explainedJSON(v any, args ...string) {
	e.t.Helper()
	out := e.explained(append([]string{"-o", "json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		e.t.Fatalf("explain %v -o json: %v\n%s", args, err, out)
	}
}

func offsetArgs(offset string) []string {
	return []string{"--topic", "in", "--partition", "0", "--offset", offset}
}

// modeJSON holds the mode-specific fields of both forms' JSON.
type modeJSON struct {
	Mode       string
	Entity     string
	Decision   string
	Reason     string
	Version    *int64
	Now        time.Time
	DecidedAt  *time.Time `json:"decided_at"`
	ModeChange string     `json:"mode_change"`
	Stored     *struct {
		Mode      string
		Version   *int64
		ExpiresAt *time.Time `json:"expires_at"`
		UpdatedAt time.Time  `json:"updated_at"`
	}
	OtherMode *struct{ Mode string } `json:"other_mode"`
	Window    *struct {
		Window    string
		Sliding   bool
		ExpiresAt *time.Time `json:"expires_at"`
		Expired   bool
		NewExpiry *time.Time `json:"new_expiry"`
	}
	Refresh *struct {
		After         string
		LastForwarded time.Time `json:"last_forwarded"`
		DueAfter      time.Time `json:"due_after"`
		Refreshed     bool
	}
	DuplicateOf  *struct{ Offset int64 } `json:"duplicate_of"`
	StaleAgainst *struct {
		Offset  int64
		Version *int64
		From    string
	} `json:"stale_against"`
	Difference *struct{ Path, Old, New string }
}

func decisions(ds []dedup.Decision) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.String())
	}
	return strings.Join(s, " ")
}

// Window mode, a fixed window: a repeated id inside the window is a
// duplicate whatever its content; an id exactly at its expiry is forwarded
// afresh; a record without an id is bad input. Both forms, on the boundary.
func TestExplainWindow(t *testing.T) {
	e := newModeEnv(t, "    mode: window\n    window: 1h\n    dead_letter: dlq\n")
	e.kc.Produce("in",
		hrec("k", `{"amount":10}`, "Idempotency-Key", "A"), // 0 forward at t0
		hrec("k", `{"amount":12}`, "Idempotency-Key", "A"), // 1 duplicate at t0+1h-1µs
		hrec("k", `{"amount":10}`, "Idempotency-Key", "A"), // 2 forward at t0+1h: the window ended
		hrec("k", `{"amount":1}`),                          // 3 invalid: no id
		hrec("k", `{"amount":10}`, "Idempotency-Key", "A"), // 4 not decided
	)
	got := decisions(e.decideAt(t0, 1)) + " " + decisions(e.decideAt(t0.Add(time.Hour-us), 1)) + " " + decisions(e.decideAt(t0.Add(time.Hour), 2))
	if got != "forward duplicate forward invalid" {
		t.Fatalf("decisions: %s", got)
	}

	out := e.explained(offsetArgs("1")...)
	mustContain(t, "offset 1", out, "mode window: id from header:Idempotency-Key, window 1h0m0s (fixed", "id A",
		"decision duplicate", "duplicate of the id forwarded from offset 0 at 2030-01-02T03:04:05Z",
		"(1h0m0s, fixed, until 2030-01-02T04:04:05Z) was still open", "whatever its content (its content differs from the forwarded record's)",
		"difference /amount: 10 -> 12 (offset 0 -> 1)")
	out = e.explained(offsetArgs("2")...)
	mustContain(t, "offset 2", out, "decision forward", "its id had no open window when it was decided",
		"last forwarded from offset 0 at 2030-01-02T03:04:05Z, and that window ended at 2030-01-02T04:04:05Z; this record was decided at 2030-01-02T04:04:05Z",
		"it set the id's stored state, still current")
	var j modeJSON
	e.explainedJSON(&j, offsetArgs("2")...)
	if j.Mode != "window" || j.Decision != "forward" || !j.DecidedAt.Equal(t0.Add(time.Hour)) || j.Window == nil || !j.Window.Expired ||
		!j.Window.ExpiresAt.Equal(t0.Add(time.Hour)) || j.Window.Window != "1h0m0s" {
		t.Fatalf("offset 2 -o json: %+v", j)
	}
	out = e.explained(offsetArgs("3")...)
	mustContain(t, "offset 3", out, "decision invalid", `bad input (missing message id: no header "Idempotency-Key"); it went to the dead-letter topic dlq`)

	// Not decided yet: the stored window of A (from offset 2) ends at
	// t0+2h. A microsecond before, a duplicate; at it, forwarded.
	e.at(t0.Add(2*time.Hour - us))
	out = e.explained(offsetArgs("4")...)
	mustContain(t, "offset 4 before expiry", out, "decision undecided", "it would be a duplicate: the id was forwarded at 2030-01-02T04:04:05Z and its window lasts until 2030-01-02T05:04:05Z")
	e.at(t0.Add(2 * time.Hour))
	out = e.explained(offsetArgs("4")...)
	mustContain(t, "offset 4 at expiry", out, "it would be forwarded: the id's window ended at 2030-01-02T05:04:05Z (now is 2030-01-02T05:04:05Z")

	// Would a payload with id A be forwarded? The same boundary.
	p := payloadFile(t, `{"amount":99}`)
	e.at(t0.Add(2*time.Hour - us))
	out = e.explained("svc", "A", p)
	mustContain(t, "payload before expiry", out, "id A", "now 2030-01-02T05:04:04.999999Z (the database's clock)",
		"stored 01", "from in/0@2, expires 2030-01-02T05:04:05Z",
		"decision duplicate: the id was forwarded at 2030-01-02T04:04:05Z and its window lasts until 2030-01-02T05:04:05Z",
		"(its content differs from the forwarded record's)", "difference /amount: 10 -> 99 (stored -> payload)")
	e.explainedJSON(&j, "svc", "A", p)
	if j.Decision != "duplicate" || j.Stored == nil || j.Stored.Mode != "window" || !j.Stored.ExpiresAt.Equal(t0.Add(2*time.Hour)) ||
		j.Window == nil || j.Window.Expired || j.Window.NewExpiry != nil || !j.Now.Equal(t0.Add(2*time.Hour-us)) {
		t.Fatalf("payload before expiry -o json: %+v", j)
	}
	e.at(t0.Add(2 * time.Hour))
	e.explainedJSON(&j, "svc", "A", p)
	if j.Decision != "forward" || !j.Window.Expired || !j.Window.NewExpiry.Equal(t0.Add(3*time.Hour)) ||
		!strings.Contains(j.Reason, "an expired id reads as absent") {
		t.Fatalf("payload at expiry -o json: %+v", j)
	}
	// The sidecar agrees: decided exactly then, offset 4 is forwarded.
	if got := decisions(e.decideAt(t0.Add(2*time.Hour), 1)); got != "forward" {
		t.Fatalf("offset 4 decided at the expiry: %s", got)
	}

	// Without a payload: what a record with the id gets now.
	out = e.explained("svc", "A")
	mustContain(t, "no payload", out, "note no payload given: a record with this id would be a duplicate now")
	out = e.explained("svc", "Z", p)
	mustContain(t, "new id", out, "stored none", "decision forward: the id was not seen within the window")

	// Once the log is pruned, offset 1 is answered from the state and the
	// input, and says so.
	if _, err := e.store.PruneLog(context.Background(), e.p, 5); err != nil {
		t.Fatal(err)
	}
	out = e.explained(offsetArgs("1")...)
	mustContain(t, "offset 1 pruned", out, "decision unknown", "the id's stored state was since set from offset 4",
		"the input before it holds an earlier record of this id (offset 0", "a duplicate if that id's window (1h0m0s) was still open")
}

// Window mode, sliding, the id read at a pointer: a repeat extends the
// window; a payload without the id is bad input; a payload of another id
// than ENTITY is refused.
func TestExplainWindowSliding(t *testing.T) {
	e := newModeEnv(t, "    mode: window\n    id_from: /meta/id\n    window: 1h\n    sliding: true\n")
	e.produce("k", `{"meta":{"id":"A"},"n":1}`, "k", `{"meta":{"id":"A"},"n":2}`)
	got := decisions(e.decideAt(t0, 1)) + " " + decisions(e.decideAt(t0.Add(50*time.Minute), 1))
	if got != "forward duplicate" {
		t.Fatalf("decisions: %s", got)
	}
	out := e.explained(offsetArgs("1")...)
	mustContain(t, "offset 1", out, "mode window: id from /meta/id, window 1h0m0s (sliding", "decision duplicate",
		"duplicate of the id forwarded from offset 0 at 2030-01-02T03:04:05Z: its window (1h0m0s, sliding, extended by each repeat) was still open",
		"difference /n: 1 -> 2 (offset 0 -> 1)")

	// Past the first window's end (t0+1h), inside the extended one (to
	// t0+1h50m): a duplicate, which extends the window again.
	e.at(t0.Add(70 * time.Minute))
	var j modeJSON
	e.explainedJSON(&j, "svc", "A", payloadFile(t, `{"meta":{"id":"A"},"n":1}`))
	if j.Decision != "duplicate" || !j.Window.ExpiresAt.Equal(t0.Add(110*time.Minute)) || !j.Window.NewExpiry.Equal(t0.Add(130*time.Minute)) ||
		!strings.Contains(j.Reason, "sliding: this repeat extends the window to 2030-01-02T05:14:05Z") ||
		!strings.Contains(j.Reason, "its content is the same as the forwarded record's") {
		t.Fatalf("sliding payload -o json: %+v", j)
	}
	out = e.explained("svc", "A", payloadFile(t, `{"meta":{"other":"A"}}`))
	mustContain(t, "no id", out, "decision invalid: the payload is bad input: missing message id: canon: no value at \"/meta/id\"",
		"the route has no dead_letter topic: it would halt the partition")
	out = e.explained("svc", "A", payloadFile(t, `{"meta":{"id":null}}`))
	mustContain(t, "null id", out, "decision invalid", "missing message id at /meta/id: not a non-empty string or a number")
	code, _, errOut := e.explain("svc", "A", payloadFile(t, `{"meta":{"id":"B"}}`))
	if code != 2 || !strings.Contains(errOut, `the payload's identity (id_from /meta/id) is "B", not "A"`) {
		t.Fatalf("another id: %d %s", code, errOut)
	}
}

// Version mode: greater forwards, equal is a duplicate, lower is stale,
// a version that is not an integer is bad input; the log does not say
// duplicate from stale, the version does, and when it cannot, explain
// says so.
func TestExplainVersion(t *testing.T) {
	e := newModeEnv(t, "    mode: version\n    dead_letter: dlq\n",
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
	got := decisions(e.decide(1)) + " " + decisions(e.decide(6))
	if got != "forward duplicate stale forward invalid invalid stale" {
		t.Fatalf("decisions: %s", got)
	}
	out := e.explained(offsetArgs("1")...)
	mustContain(t, "offset 1", out, "mode version: entity from key, version from /version", "version 3", "decision duplicate",
		"its version 3 equals the version stored when it was decided, forwarded from offset 0 at",
		"(its content differs from the forwarded record's)", `difference /s: "a" -> "b" (offset 0 -> 1)`,
		"evidence decision log: offset 1 is in the batch [1, 7) decided", "not forwarded, a duplicate or stale")
	out = e.explained(offsetArgs("2")...)
	mustContain(t, "offset 2", out, "decision stale", "its version 2 is below the version 3 stored when it was decided, forwarded from offset 0 at")
	out = e.explained(offsetArgs("3")...)
	mustContain(t, "offset 3", out, "decision forward", "its version 4 is above the version 3 stored when it was decided, forwarded from offset 0",
		"it set the stored version, still current")
	out = e.explained(offsetArgs("4")...)
	mustContain(t, "offset 4", out, "decision invalid", "bad input (missing or invalid version at /version: 5 is not a 64-bit integer); it went to the dead-letter topic dlq")
	out = e.explained(offsetArgs("5")...)
	mustContain(t, "offset 5", out, "decision invalid", "7.0 is not a 64-bit integer")
	var j modeJSON
	e.explainedJSON(&j, offsetArgs("6")...)
	if j.Mode != "version" || j.Decision != "stale" || *j.Version != 3 || j.StaleAgainst == nil || j.StaleAgainst.Offset != 3 ||
		*j.StaleAgainst.Version != 4 || j.StaleAgainst.From != "state" {
		t.Fatalf("offset 6 -o json: %+v", j)
	}
	out = e.explained(offsetArgs("7")...)
	mustContain(t, "offset 7", out, "decision undecided", "it would be forwarded: its version 5 is above the stored version 4")

	// Would a payload be forwarded now?
	out = e.explained("svc", "E", payloadFile(t, `{"version":4,"s":"d"}`))
	mustContain(t, "equal payload", out, "stored version 4, 01", "from in/0@3", "version 4",
		"decision duplicate: its version 4 equals the stored version 4: a repeated version is a duplicate whatever its content (its content differs",
		`difference /s: "c" -> "d" (stored -> payload)`)
	out = e.explained("svc", "E", payloadFile(t, `{"version":3,"s":"c"}`))
	mustContain(t, "lower payload", out, "decision stale: its version 3 is below the stored version 4: an out-of-order update")
	e.explainedJSON(&j, "svc", "E", payloadFile(t, `{"version":5,"s":"c"}`))
	if j.Decision != "forward" || *j.Version != 5 || *j.Stored.Version != 4 || j.Stored.Mode != "version" {
		t.Fatalf("greater payload -o json: %+v", j)
	}
	out = e.explained("svc", "E", payloadFile(t, `{"version":"5"}`))
	mustContain(t, "string version", out, "decision invalid: the payload is bad input: missing or invalid version at /version: 5 is not a 64-bit integer; dam would send it to the dead-letter topic dlq")
	out = e.explained("svc", "F", payloadFile(t, `{"version":-2}`))
	mustContain(t, "new entity", out, "stored none", "decision forward: no version stored for this entity: its first version (-2) is forwarded")
	out = e.explained("svc", "E")
	mustContain(t, "no payload", out, "a record of this entity is forwarded iff its version is above 4 (equal: a duplicate, lower: stale)")

	// The version in a header: given with --header.
	p2 := dedup.Partition{Group: "g", Topic: "in2"}
	pr, err := e.store.Acquire(context.Background(), p2)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.InitProgress(context.Background(), p2, pr.Epoch, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Decide(context.Background(), &dedup.Batch{Service: "svc2", Rule: dedup.Rule{Mode: dedup.Version}, Partition: p2, Epoch: pr.Epoch, End: 1,
		Records: []dedup.Record{{Entity: []byte("E"), Version: 8, Digest: sumOf(t, `{}`)}}}, nil); err != nil {
		t.Fatal(err)
	}
	out = e.explained("svc2", "E", payloadFile(t, `{}`))
	mustContain(t, "no version header", out, `decision invalid: the payload is bad input: missing or invalid version: no header "Version" (the version is read from a header: give it with --header Version=N)`)
	out = e.explained("svc2", "E", payloadFile(t, `{}`), "--header", "Version=x")
	mustContain(t, "bad version header", out, `header "Version": "x" is not a 64-bit integer`)
	out = e.explained("svc2", "E", payloadFile(t, `{}`), "--header", "Version=9")
	mustContain(t, "version header", out, "decision forward: its version 9 is above the stored version 8")
	if code, _, errOut := e.explain("svc2", "E", "--header", "Version=9"); code != 2 || !strings.Contains(errOut, "--header goes with a PAYLOAD_FILE") {
		t.Fatalf("--header without a payload: %d %s", code, errOut)
	}
	if code, _, errOut := e.explain("svc2", "E", payloadFile(t, `{}`), "--header", "Version"); code != 2 || !strings.Contains(errOut, "want NAME=VALUE") {
		t.Fatalf("--header without =: %d %s", code, errOut)
	}

	// The first batch's log is pruned: offset 1's log entry still says
	// "not forwarded", the state has moved on to offset 3, and only the
	// input still shows version 3 at offset 0. With the input read back
	// to the partition's start, a duplicate; without it, explain cannot
	// tell duplicate from stale and says so.
	if _, err := e.store.PruneLog(context.Background(), e.p, 1); err != nil {
		t.Fatal(err)
	}
	out = e.explained(offsetArgs("1")...)
	mustContain(t, "offset 1, first batch pruned", out, "decision duplicate", "forwarded from offset 0")
	out = e.explained(append(offsetArgs("1"), "--lookback", "0")...)
	mustContain(t, "offset 1 --lookback 0", out, "decision dropped",
		"a duplicate or stale, and which is no longer known: the version stored when it was decided is gone")
	out = e.explained(append(offsetArgs("2"), "--lookback", "0")...)
	mustContain(t, "offset 2 --lookback 0", out, "decision dropped")
	out = e.explained(append(offsetArgs("2"), "--lookback", "1")...)
	mustContain(t, "offset 2 --lookback 1", out, "decision stale", "its version 2 is below version 3 of the earlier record at offset 1")

	// The whole log pruned: the state answers for offset 6 (it holds the
	// version it lost to); offsets 1 and 2 only by what the input suggests.
	if _, err := e.store.PruneLog(context.Background(), e.p, 7); err != nil {
		t.Fatal(err)
	}
	out = e.explained(offsetArgs("6")...)
	mustContain(t, "offset 6 pruned", out, "decision stale", "below the version 4 stored when it was decided, forwarded from offset 3", "no longer covers offset 6")
	out = e.explained(offsetArgs("1")...)
	mustContain(t, "offset 1 pruned", out, "decision unknown", "the stored version (4) was since set from offset 3", "suggests a duplicate of version 3 at offset 0")
	out = e.explained(offsetArgs("2")...)
	mustContain(t, "offset 2 pruned", out, "decision unknown", "suggests it was stale: its version 2 is below version 3 at offset 0")
}

// Version mode once retention deleted the start of the input: the log
// still says "not forwarded" for an unreadable record, but not whether it
// was a duplicate or stale, and explain says so; the state still answers
// for what it covers.
func TestExplainVersionRetention(t *testing.T) {
	e := newModeEnv(t, "    mode: version\n")
	e.produce("E", `{"version":1}`, "E", `{"version":1}`, "E", `{"version":0}`, "F", `{"version":5}`)
	if got := decisions(e.decide(4)); got != "forward duplicate stale forward" {
		t.Fatalf("decisions: %s", got)
	}
	adm := kadm.NewClient(e.kc.Client())
	to := kadm.Offsets{}
	to.AddOffset("in", 0, 2, -1)
	if _, err := adm.DeleteRecords(context.Background(), to); err != nil {
		t.Fatal(err)
	}
	out := e.explained(offsetArgs("1")...)
	mustContain(t, "offset 1", out, "decision dropped", "the decision log says it was not forwarded, a duplicate or stale",
		"the record, whose version would tell which, is no longer readable", "kafka: in/0@1: not readable: below the log start offset 2")
	out = e.explained(offsetArgs("2")...)
	mustContain(t, "offset 2", out, "decision stale", "its version 0 is below the version 1 stored when it was decided, forwarded from offset 0")
	out = e.explained(offsetArgs("3")...)
	mustContain(t, "offset 3", out, "decision forward",
		"no earlier version of this entity is known in the state, the decision log or the input read, [2, 3): its first version, or the forward before it is deleted by retention (the partition starts at 2)")
	if _, err := e.store.PruneLog(context.Background(), e.p, 4); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := e.explain(offsetArgs("1")...); code != 1 || !strings.Contains(errOut, "nothing left to explain it from") {
		t.Fatalf("offset 1 unreadable and unlogged: %d %s", code, errOut)
	}
	out = e.explained(offsetArgs("2")...)
	mustContain(t, "offset 2 unlogged", out, "decision stale", "forwarded from offset 0", "decision log: no longer covers offset 2")
}

// Last-seen with refresh_after: an unchanged record is refreshed once
// decided strictly later than refresh_after after the last forward; exactly
// at the limit it is still a duplicate. Both forms.
func TestExplainRefresh(t *testing.T) {
	e := newModeEnv(t, "    refresh_after: 1h\n    ignore: [/ts]\n")
	e.produce("K", `{"v":1,"ts":1}`, "K", `{"v":1,"ts":2}`, "K", `{"v":1,"ts":3}`, "K", `{"v":1,"ts":4}`)
	got := decisions(e.decideAt(t0, 1)) + " " + decisions(e.decideAt(t0.Add(time.Hour), 1)) + " " + decisions(e.decideAt(t0.Add(time.Hour+us), 1))
	if got != "forward duplicate refresh" {
		t.Fatalf("decisions: %s", got)
	}
	out := e.explained(offsetArgs("1")...)
	mustContain(t, "offset 1", out, "mode last-seen: entity from key, refresh_after 1h0m0s", "decision duplicate",
		"duplicate of the content forwarded from offset 0 at 2030-01-02T03:04:05Z",
		"not refreshed: decided at 2030-01-02T04:04:05Z, 1h0m0s after that forward, not longer than refresh_after 1h0m0s")
	out = e.explained(offsetArgs("2")...)
	mustContain(t, "offset 2", out, "decision refresh",
		"refreshed: its content equals the previous record of this entity (offset 1), but the identity was last forwarded from offset 0 at 2030-01-02T03:04:05Z, 1h0m0.000001s before this record was decided (2030-01-02T04:04:05.000001Z): longer than refresh_after 1h0m0s",
		"forward (or a refresh: the log records refreshes as forwards)")
	var j modeJSON
	e.explainedJSON(&j, offsetArgs("2")...)
	if j.Decision != "refresh" || j.Refresh == nil || !j.Refresh.Refreshed || !j.Refresh.LastForwarded.Equal(t0) || j.Refresh.After != "1h0m0s" {
		t.Fatalf("offset 2 -o json: %+v", j)
	}

	// Now: the identity was last forwarded (refreshed) at t0+1h+1µs. At
	// exactly refresh_after later, a duplicate; a microsecond after, a
	// refresh.
	p := payloadFile(t, `{"v":1,"ts":9}`)
	e.at(t0.Add(2*time.Hour + us))
	out = e.explained("svc", "K", p)
	mustContain(t, "payload at the limit", out, "now 2030-01-02T05:04:05.000001Z (the database's clock)",
		"decision duplicate: its digest equals the stored digest: the same content as the record last forwarded, 1h0m0s ago (at 2030-01-02T04:04:05.000001Z); not refreshed")
	e.explainedJSON(&j, "svc", "K", p)
	if j.Decision != "duplicate" || j.Refresh.Refreshed || !j.Refresh.DueAfter.Equal(t0.Add(2*time.Hour+us)) {
		t.Fatalf("payload at the limit -o json: %+v", j)
	}
	out = e.explained(offsetArgs("3")...)
	mustContain(t, "offset 3 at the limit", out, "decision undecided", "it would be a duplicate")
	e.at(t0.Add(2*time.Hour + 2*us))
	e.explainedJSON(&j, "svc", "K", p)
	if j.Decision != "refresh" || !j.Refresh.Refreshed || !strings.Contains(j.Reason, "longer than refresh_after 1h0m0s: refreshed (forwarded)") {
		t.Fatalf("payload past the limit -o json: %+v", j)
	}
	out = e.explained(offsetArgs("3")...)
	mustContain(t, "offset 3 past the limit", out, "it would be refreshed (forwarded)")
	out = e.explained("svc", "K")
	mustContain(t, "no payload", out, "a record equal to the stored content would be refreshed (forwarded) now")
	// The sidecar agrees.
	if got := decisions(e.decideAt(t0.Add(2*time.Hour+2*us), 1)); got != "refresh" {
		t.Fatalf("offset 3 decided past the limit: %s", got)
	}
}

// A service that changed mode: each mode keeps its own state, and explain
// says which one decides.
func TestExplainModeChange(t *testing.T) {
	e := newModeEnv(t, "    mode: version\n")
	e.produce("E", `{"version":1}`, "E", `{"version":1}`)
	// Offset 0 was decided while the route was last-seen.
	e.route = lastSeenRoute(t, e)
	if got := decisions(e.decide(1)); got != "forward" {
		t.Fatalf("decisions: %s", got)
	}
	out := e.explained(offsetArgs("1")...)
	mustContain(t, "offset 1", out, "decision undecided", "it would be forwarded: no version stored for this entity",
		"state: none stored in mode version", "the identity was last forwarded under mode last-seen", "but the route is in mode version: the service changed mode",
		"mode version holds none for it")
	var j modeJSON
	e.explainedJSON(&j, "svc", "E", payloadFile(t, `{"version":1}`))
	if j.Decision != "forward" || j.Stored != nil || j.OtherMode == nil || j.OtherMode.Mode != "last-seen" || !strings.Contains(j.ModeChange, "the service changed mode") {
		t.Fatalf("payload -o json: %+v", j)
	}

	// A version state older than the last-seen one: Get returns the
	// last-seen state, but the version state decides.
	dig := sumOf(t, `{"version":1}`)
	if _, err := e.store.Pool().Exec(context.Background(), `INSERT INTO versions (service, entity, version, digest, updated_at)
		VALUES ('svc', 'E', 1, $1, now() - interval '1 day')`, dig[:]); err != nil {
		t.Fatal(err)
	}
	out = e.explained("svc", "E", payloadFile(t, `{"version":1}`))
	mustContain(t, "older version state", out, "stored version 1", "by a check", "mode version's state, set ",
		"decision duplicate: its version 1 equals the stored version 1")
}

// lastSeenRoute returns route "svc" on "in" compiled as last-seen: the
// configuration's route as it was before the service changed mode.
func lastSeenRoute(t *testing.T, e *explainEnv) *pipeline.Route {
	t.Helper()
	cfg, err := loadConfig(e.path)
	if err != nil {
		t.Fatal(err)
	}
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

// sumOf is value's digest under canon's defaults.
func sumOf(t *testing.T, value string) canon.Digest {
	t.Helper()
	h, err := canon.New()
	if err != nil {
		t.Fatal(err)
	}
	d, err := h.Sum([]byte(value))
	if err != nil {
		t.Fatal(err)
	}
	return d
}
