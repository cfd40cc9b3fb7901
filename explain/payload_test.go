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
	g := newTranscript(t)

	res := e.payload("svc", "B-007", text(`{"ts":9,"tags":["a","b"],"ripe":"mostly yellow","id":"B-007"}`))
	g.payload("duplicate payload", res)
	if res.Cause != "unchanged" {
		t.Errorf("duplicate payload: cause %q", res.Cause)
	}

	res = e.payload("svc", "B-007", text(`{"id":"B-007","ripe":"mostly yellow","tags":["a","c"]}`))
	g.payload("changed payload", res)
	if res.Difference == nil || res.Cause != "changed" {
		t.Errorf("changed payload: %+v", res)
	}
	res = e.payload("svc", "B-007", text(`{"id":"B-007","ripe":"mostly yellow","tags":["a","b"],"new":true}`))
	g.payload("added member", res)
	if res.Decision != "forward" || res.Difference == nil || res.Difference.Path != "/new" || res.Difference.Old != "(absent)" ||
		res.Stored.Source == nil || res.Stored.Source.Offset != 0 {
		t.Errorf("added member: %+v", res)
	}

	// No state: forward. A bad payload: invalid, with the byte.
	res = e.payload("svc", "B-999", text(`{"id":"B-999"}`))
	g.payload("new identity", res)
	if res.Stored != nil {
		t.Errorf("new identity: stored %v", res.Stored)
	}
	g.payload("bad payload", e.payload("svc", "B-007", text(`{"id":1,"id":2}`)))

	// Stored content no longer readable: set by a check, or deleted by
	// retention.
	if _, err := e.store.Check(context.Background(), "svc", []byte("checked"), canon.Tombstone); err != nil {
		t.Fatal(err)
	}
	g.payload("set by a check", e.payload("svc", "checked", text(`{"v":1}`)))
	e.deleteRecords(1)
	g.payload("deleted source", e.payload("svc", "B-007", text(`{"v":1}`)))

	// Without a payload: the stored state.
	res = e.payload("svc", "B-007", nil)
	if res.Decision != "" || !strings.HasPrefix(res.Stored.Digest, "01") {
		t.Errorf("no payload: %+v", res)
	}
	g.payload("no payload", res)
}

// A service without a route is explained as dam serve's checks decide it,
// if it has state; else it is unknown.
func TestPayloadWithoutRoute(t *testing.T) {
	e := newEnv(t, "")
	g := newTranscript(t)
	_, err := e.payloadErr("nosuch", "e", nil)
	if !errors.Is(err, explain.ErrUnknownService) {
		t.Fatalf("unknown service: %v", err)
	}
	g.err("unknown service", err)
	if _, err := e.store.Check(context.Background(), "checks", []byte("e"), sumOf(t, `{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	g.payload("checked service", e.payload("checks", "e", text(`{ "a" : 1 }`)))
}
