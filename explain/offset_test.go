package explain_test

import (
	"errors"
	"strings"
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

	res := e.offset(1)
	decided(t, "offset 1 (logged)", res.Decision, res.Reason, "duplicate", "duplicate of the content forwarded from offset 0 at ")
	has(t, "offset 1 evidence", evidence(res), "decision log: offset 1 is in the batch [0, 6)")
	if res.Entity != "B-007" || res.DuplicateOf == nil || res.DuplicateOf.Offset != 0 || res.DuplicateOf.From != "decision log" {
		t.Errorf("offset 1: %+v", res)
	}
	res = e.offset(3)
	decided(t, "offset 3 (logged)", res.Decision, res.Reason, "forward", "its content differs from the previous record of this entity (offset 1)")
	has(t, "offset 3 difference", diffText(res), `/ripe: "mostly yellow" -> "perfectly yellow" (offset 1 -> 3)`)
	if res.Previous == nil || res.Previous.Offset != 1 || len(res.Evidence) < 3 {
		t.Errorf("offset 3: %+v", res)
	}
	res = e.offset(4)
	decided(t, "offset 4", res.Decision, res.Reason, "invalid", "bad input (invalid JSON at byte 14", "no dead_letter topic: it halted the partition")
	res = e.offset(5)
	decided(t, "offset 5", res.Decision, res.Reason, "duplicate", "duplicate of the content forwarded from offset 3 at")
	has(t, "offset 5 evidence", evidence(res), "state: 01")
	res = e.offset(6)
	decided(t, "offset 6", res.Decision, res.Reason, "undecided", "offsets below the partition's progress 6 are decided", "it would be forwarded")

	// Delivered: the log is pruned below the committed offset. The state
	// still answers for offset 5 (it holds offset 3's content) and says the
	// log no longer covers it; offset 1 is answered from Kafka.
	e.pruneLog(6)
	res = e.offset(5)
	decided(t, "offset 5 (pruned)", res.Decision, res.Reason, "duplicate", "duplicate of the content forwarded from offset 3 at")
	has(t, "offset 5 (pruned) evidence", evidence(res), "decision log: no longer covers offset 5")
	res = e.offset(1)
	decided(t, "offset 1 (pruned)", res.Decision, res.Reason, "unknown", "the stored digest was since set from offset 3")
	has(t, "offset 1 (pruned) evidence", evidence(res), "no longer covers offset 1")

	// Retention removed the first records: offset 1 can no longer be read
	// and the log no longer covers it.
	e.deleteRecords(2)
	if _, err := e.offsetErr(1, -1); !errors.Is(err, explain.ErrGone) || !strings.Contains(err.Error(), "below the log start offset 2") {
		t.Fatalf("explain of a deleted record: %v", err)
	}
}

// A duplicate whose source is neither in the state nor in the log is found
// by reading the input before it.
func TestOffsetDuplicateFromKafka(t *testing.T) {
	e := newEnv(t, "    ignore: [/ts]\n")
	e.produce("k", `{"v":1}`, "other", `{"v":1}`, "k", `{"v":1}`, "k", `{"v":1}`, "k", `{"v":2}`)
	e.decide(5)
	e.pruneLog(5)
	// The state of k now holds offset 4's content; offset 3 repeated offset
	// 0's, which only the input still shows.
	res := e.offset(3)
	decided(t, "offset 3", res.Decision, res.Reason, "unknown", "the stored digest was since set from offset 4",
		"the input before it suggests a duplicate of the content forwarded from offset 0 (unless")
	// Offset 4 changed k: the input before it shows from what.
	res = e.offset(4)
	decided(t, "offset 4", res.Decision, res.Reason, "forward", "it set the stored digest, still current")
	has(t, "offset 4 difference", diffText(res), "/v: 1 -> 2 (offset 3 -> 4)")
	// With a window too short to see offset 0, the run start is a bound.
	res = e.offsetLookback(3, 1)
	has(t, "offset 3, lookback 1", res.Reason, "forwarded from offset 2 or earlier")
	if res.DuplicateOf == nil || !res.DuplicateOf.AtOrBefore {
		t.Errorf("offset 3, lookback 1: %+v", res.DuplicateOf)
	}
}
