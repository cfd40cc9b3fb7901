package explain_test

import (
	"errors"
	"testing"

	"github.com/dam-dedup/dam/explain"
)

// Offset answers from the decision log while it covers the offset, from
// the state once it is pruned, and says which.
func TestOffset(t *testing.T) {
	e := newEnv(t, "    ignore: [/ts]\n")
	e.produce(
		"B-007", `{"id":"B-007","ripe":"mostly yellow","ts":1}`, // 0 forward
		"B-007", `{"ts":2,"ripe":"mostly yellow","id":"B-007"}`, // 1 duplicate of 0
		"B-008", `{"id":"B-008","ripe":"green"}`, // 2 forward
		"B-007", `{"id":"B-007","ripe":"perfectly yellow","ts":3}`, // 3 forward: changed
		"B-009", `{"id":"B-009",`, // 4 invalid
		"B-007", `{"id":"B-007","ripe":"perfectly yellow","ts":4}`, // 5 duplicate of 3
		"B-007", `{"id":"B-007","ripe":"brown"}`, // 6 not decided
	)
	if got := e.decide(6); got != "forward duplicate forward forward invalid duplicate" {
		t.Fatalf("decisions %s", got)
	}

	g := newTranscript(t)
	res := e.offset(1)
	g.offset("offset 1 (logged)", res)
	if res.Entity != "B-007" || res.DuplicateOf == nil || res.DuplicateOf.Offset != 0 || res.DuplicateOf.From != "decision log" {
		t.Errorf("offset 1: %+v", res)
	}
	res = e.offset(3)
	g.offset("offset 3 (logged)", res)
	if res.Previous == nil || res.Previous.Offset != 1 || len(res.Evidence) < 3 {
		t.Errorf("offset 3: %+v", res)
	}
	g.offset("offset 4", e.offset(4))
	g.offset("offset 5", e.offset(5))
	g.offset("offset 6", e.offset(6))

	// Delivered: the log is pruned below the committed offset. The state
	// still answers for offset 5 (it holds offset 3's content) and says the
	// log no longer covers it; offset 1 is answered from Kafka.
	e.pruneLog(6)
	g.offset("offset 5 (pruned)", e.offset(5))
	g.offset("offset 1 (pruned)", e.offset(1))

	// Retention removed the first records: offset 1 can no longer be read
	// and the log no longer covers it.
	e.deleteRecords(2)
	_, err := e.offsetErr(1, -1)
	if !errors.Is(err, explain.ErrGone) {
		t.Fatalf("explain of a deleted record: %v", err)
	}
	g.err("offset 1 (deleted)", err)
}

// A duplicate whose source is neither in the state nor in the log is found
// by reading the input before it.
func TestOffsetDuplicateFromKafka(t *testing.T) {
	e := newEnv(t, "    ignore: [/ts]\n")
	e.produce("k", `{"v":1}`, "other", `{"v":1}`, "k", `{"v":1}`, "k", `{"v":1}`, "k", `{"v":2}`)
	e.decide(5)
	e.pruneLog(5)
	g := newTranscript(t)
	// The state of k now holds offset 4's content; offset 3 repeated offset
	// 0's, which only the input still shows.
	g.offset("offset 3", e.offset(3))
	// Offset 4 changed k: the input before it shows from what.
	g.offset("offset 4", e.offset(4))
	// With a window too short to see offset 0, the run start is a bound.
	res := e.offsetLookback(3, 1)
	g.offset("offset 3, lookback 1", res)
	if res.DuplicateOf == nil || !res.DuplicateOf.AtOrBefore {
		t.Errorf("offset 3, lookback 1: %+v", res.DuplicateOf)
	}
}
