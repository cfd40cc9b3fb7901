package explain_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/explain"
)

// Payload: would it be forwarded now, and what differs from the stored
// content, read back from Kafka.
func TestPayload(t *testing.T) {
	e := newEnv(t, "    ignore: [/ts]\n")
	e.produce("B-007", `{"id":"B-007","ripe":"mostly yellow","tags":["a","b"],"ts":1}`)
	e.decide(1)

	res := e.payload("svc", "B-007", text(`{"ts":9,"tags":["a","b"],"ripe":"mostly yellow","id":"B-007"}`))
	decided(t, "duplicate payload", res.Decision, res.Reason, "duplicate")
	has(t, "duplicate payload: stored", res.Stored.String(), "set ", "from in/0@0")
	has(t, "duplicate payload: hashing", res.Hashing, "ignore /ts")
	if res.Cause != "unchanged" {
		t.Errorf("duplicate payload: cause %q", res.Cause)
	}

	res = e.payload("svc", "B-007", text(`{"id":"B-007","ripe":"mostly yellow","tags":["a","c"]}`))
	decided(t, "changed payload", res.Decision, res.Reason, "forward")
	if res.Difference == nil || res.Difference.String() != `/tags/1: "b" -> "c"` || res.Cause != "changed" {
		t.Errorf("changed payload: %+v", res)
	}
	res = e.payload("svc", "B-007", text(`{"id":"B-007","ripe":"mostly yellow","tags":["a","b"],"new":true}`))
	if res.Decision != "forward" || res.Difference == nil || res.Difference.Path != "/new" || res.Difference.Old != "(absent)" ||
		res.Stored.Source == nil || res.Stored.Source.Offset != 0 {
		t.Errorf("added member: %+v", res)
	}

	// No state: forward. A bad payload: invalid, with the byte.
	res = e.payload("svc", "B-999", text(`{"id":"B-999"}`))
	decided(t, "new identity", res.Decision, res.Reason, "forward", "no stored state")
	if res.Stored != nil || res.Stored.String() != "none: its next valid record is forwarded (a new identity, or reset, pruned or expired since)" {
		t.Errorf("new identity: stored %v", res.Stored)
	}
	res = e.payload("svc", "B-007", text(`{"id":1,"id":2}`))
	decided(t, "bad payload", res.Decision, res.Reason, "invalid", "invalid JSON at byte 8")

	// Stored content no longer readable: set by a check, or deleted by
	// retention.
	if _, err := e.store.Check(context.Background(), "svc", []byte("checked"), canon.Tombstone); err != nil {
		t.Fatal(err)
	}
	res = e.payload("svc", "checked", text(`{"v":1}`))
	decided(t, "set by a check", res.Decision, res.Reason, "forward")
	has(t, "set by a check", res.StoredContent, "stored content no longer readable: it was set by a check")
	e.deleteRecords(1)
	res = e.payload("svc", "B-007", text(`{"v":1}`))
	decided(t, "deleted source", res.Decision, res.Reason, "forward")
	has(t, "deleted source", res.StoredContent, "stored content no longer readable: in/0@0: not readable: below the log start offset 1")

	// Without a payload: the stored state.
	res = e.payload("svc", "B-007", nil)
	if res.Decision != "" || !strings.HasPrefix(res.Stored.Digest, "01") {
		t.Errorf("no payload: %+v", res)
	}
	has(t, "no payload", res.Reason, "no payload given")
}

// A service without a route is explained as dam serve's checks decide it,
// if it has state; else it is unknown.
func TestPayloadWithoutRoute(t *testing.T) {
	e := newEnv(t, "")
	if _, err := e.payloadErr("nosuch", "e", nil); !errors.Is(err, explain.ErrUnknownService) || !strings.Contains(err.Error(), `unknown service "nosuch"`) {
		t.Fatalf("unknown service: %v", err)
	}
	if _, err := e.store.Check(context.Background(), "checks", []byte("e"), sumOf(t, `{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	res := e.payload("checks", "e", text(`{ "a" : 1 }`))
	decided(t, "checked service", res.Decision, res.Reason, "duplicate", "its digest equals the stored digest")
	has(t, "checked service", res.Rule, "last-seen, as dam serve's checks decide")
	has(t, "checked service", res.Hashing, "canon's defaults")
}
