package explain_test

import (
	"context"
	"strings"
	"testing"
)

// Within decision_log.keep a duplicate is answered from the log itself,
// after a later change moved the state on: when it was decided, in which
// batch, and the forward it repeated, checked against its content.
func TestOffsetDuplicateFromKeptLog(t *testing.T) {
	e := newEnv(t, "")
	e.produce("x", `{"v":1}`, "x", `{"v":1}`, "x", `{"v":2}`)
	e.decide(2)
	e.decide(1) // the later change: the state now holds offset 2
	g := newTranscript(t)
	res := e.offset(1)
	g.offset("offset 1", res)
	if res.DecidedAt == nil || res.DuplicateOf == nil || res.DuplicateOf.From != "decision log" {
		t.Errorf("offset 1: %+v", res)
	}
}

// An operator's skip is explained with who skipped the record, when and
// why, and what it had been decided before: a record not decided (the
// partition halted before it), and a forward not delivered.
func TestOffsetSkipped(t *testing.T) {
	e := newEnv(t, "")
	e.produce("a", `1`, "b", `{"x":`, "c", `1`)
	e.decide(1)
	ctx := context.Background()
	if _, err := e.store.Skip(ctx, e.p, 1, 1, "alice", "malformed, INC-42"); err != nil {
		t.Fatal(err)
	}
	e.next = 2
	if _, err := e.store.Acquire(ctx, e.p); err != nil { // the next owner
		t.Fatal(err)
	}
	pr, err := e.store.ReadProgress(ctx, e.p)
	if err != nil {
		t.Fatal(err)
	}
	e.epoch = pr.Epoch
	e.decide(1)
	g := newTranscript(t)
	res := e.offset(1)
	g.offset("offset 1", res)
	if res.Skip == nil || res.Skip.By != "alice" || res.Skip.Was != "undecided" || res.DecidedAt == nil || !res.DecidedAt.Equal(res.Skip.At) {
		t.Errorf("offset 1: %+v", res.Skip)
	}

	// A forward decided and not delivered (C 2 < P 3), skipped.
	if _, err := e.store.Skip(ctx, e.p, 2, 2, "bob", "refused downstream"); err != nil {
		t.Fatal(err)
	}
	res = e.offset(2)
	g.offset("offset 2", res)
	if res.Skip == nil || res.Skip.Was != "forward" || res.Entity != "c" {
		t.Errorf("offset 2: %+v %+v", res, res.Skip)
	}
	if strings.Contains(res.Reason, "unknown") {
		t.Errorf("offset 2: %s", res.Reason)
	}
}
