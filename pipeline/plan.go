package pipeline

import (
	"fmt"
	"strings"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// planRecovery is DESIGN §2's recovery table as a pure function: from what
// recovery knows of a partition (planInput) it returns what to do
// (recoveryPlan). Some facts cost a round trip and matter in some cases
// only (the decision log over a range that depends on P, C and the
// delivered offset; the partition's first offset on a first join): the
// plan then names the one it needs, and the caller reads it, fills it in
// and plans again (planWith). planPartition gathers and executes; the
// tests drive planRecovery from testdata/plan.

// planInput is what recovery plans one partition from.
type planInput struct {
	part dedup.Partition // named in a halt's error
	// progress: P (Next, HasNext), the delivered offset dam last knew
	// (Delivered, -1: none) and the topic id bound to P (TopicID).
	progress dedup.Progress
	// committed is Kafka's committed offset C, if hasCommitted.
	committed    int64
	hasCommitted bool
	start        string // kafka.start: config.StartLatest or config.StartEarliest
	// input is what the input topic holds now, checked against the
	// progress (recreated, truncated); nil: not checked (a partition
	// planned again while it stays ours).
	input *inputFacts

	// Facts read on demand (recoveryPlan.need): nil until read.
	bound      *[16]byte     // the topic id the progress holds after binding the input's (dedup.Store.BindTopic)
	first      *int64        // the partition's first offset
	lastStable *int64        // the partition's last stable offset (its end, read_committed)
	logStart   *logStartFact // the first offset of the decision log (dedup.Store.LogStart)
	log        *logCover     // whether the log covers [log.from, P) (dedup.Store.Logged)
}

// inputFacts is what the input topic holds now, for one partition.
type inputFacts struct {
	id     [16]byte // the topic's id; zero: unknown
	end    int64    // the partition's end (high watermark), if hasEnd
	hasEnd bool
}

type logStartFact struct {
	first int64
	ok    bool // false: the partition has no log rows
}

type logCover struct {
	from    int64
	covered bool
}

// need is a fact a plan needs read before it can be made.
type need int

const (
	needNothing    need = iota
	needBind            // bind the input's id to the progress (a write): planInput.bound
	needFirst           // planInput.first
	needLastStable      // planInput.lastStable
	needLogStart        // planInput.logStart
	needLog             // planInput.log over [recoveryPlan.replayFrom, P)
)

func (n need) String() string {
	return [...]string{"nothing", "bind", "first offset", "last stable offset", "log start", "log"}[n]
}

// recoveryPlan is what recovery does with a partition.
type recoveryPlan struct {
	// need: a fact to read before planning again; the fields below are
	// unset (but replayFrom, with needLog).
	need need
	// halt: the partition cannot go on (its input lost what dam decided
	// of it, or dam cannot tell): it is assigned halted (ErrDataLoss).
	halt error
	// init: P was never set: set it to startAt. firstJoin: neither was C
	// (the group's first join): log the start against first, the
	// partition's first offset.
	init      bool
	firstJoin bool
	first     int64
	// replay: re-deliver the logged decisions of [replayFrom, P), read
	// from replayFrom on.
	replay     bool
	replayFrom int64
	// catchUpTo > P: decide [P, catchUpTo) without forwarding.
	catchUpTo int64
	// startAt: where fetching starts.
	startAt int64
}

// planRecovery compares C with P for one partition (DESIGN §2, and
// recover.go's summary).
func planRecovery(in planInput) recoveryPlan {
	if in.input != nil {
		if pl := checkInput(in); pl.need != needNothing || pl.halt != nil {
			return pl
		}
	}
	prog, c := in.progress, in.committed
	switch {
	case !prog.HasNext:
		if in.hasCommitted {
			return recoveryPlan{init: true, startAt: c}
		}
		if in.first == nil {
			return recoveryPlan{need: needFirst}
		}
		start := *in.first
		if in.start != config.StartEarliest {
			if in.lastStable == nil {
				return recoveryPlan{need: needLastStable}
			}
			start = *in.lastStable
		}
		return recoveryPlan{init: true, firstJoin: true, first: *in.first, startAt: start}
	case !in.hasCommitted:
		// The group's offsets expired (or were never committed): the log
		// holds what may not be delivered, from the committed offset dam
		// last knew (the log rows below it, not yet pruned, were
		// delivered).
		if in.logStart == nil {
			return recoveryPlan{need: needLogStart}
		}
		if first := max(in.logStart.first, prog.Delivered); in.logStart.ok && first < prog.Next {
			return fromLog(in, first)
		}
		return recoveryPlan{startAt: prog.Next}
	case c == prog.Next:
		return recoveryPlan{startAt: prog.Next}
	case c < prog.Next:
		// What dam recorded as delivered was committed in Kafka once: a C
		// below it was moved back by hand, and [C, delivered) is not
		// delivered again (DESIGN §2: deliberate re-delivery is a state
		// reset and a replay upstream).
		if from := max(c, prog.Delivered); from < prog.Next {
			return fromLog(in, from)
		}
		return recoveryPlan{startAt: prog.Next}
	default: // c > P
		return recoveryPlan{catchUpTo: c, startAt: prog.Next}
	}
}

// fromLog replays [from, P) if the log covers it; otherwise it continues
// from P.
func fromLog(in planInput, from int64) recoveryPlan {
	if in.log == nil || in.log.from != from {
		return recoveryPlan{need: needLog, replayFrom: from}
	}
	if in.log.covered {
		return recoveryPlan{replay: true, replayFrom: from, startAt: from}
	}
	return recoveryPlan{startAt: in.progress.Next}
}

// checkInput halts a partition whose input lost what dam decided of it:
// the topic recreated under the same name (its id is not the one the
// progress was made on), or truncated (P is past its end). DESIGN §2: never
// skip silently, never read a new topic's records against the old one's
// progress. A progress without a topic id gets the current one (needBind),
// unless dam cannot tell the topic from a new one (below). The zero plan:
// the input is the one the progress was made on.
func checkInput(in planInput) recoveryPlan {
	var zero [16]byte
	dp, prog, input := in.part, in.progress, in.input
	lost := func(format string, args ...any) recoveryPlan {
		return recoveryPlan{halt: fmt.Errorf("%w: %s/%d: %s; the partition halts: to go on, reset its progress and the group's offset deliberately (see docs/delivery.md, the input recreated)",
			ErrDataLoss, dp.Topic, dp.Partition, fmt.Sprintf(format, args...))}
	}
	if input.id != zero && prog.TopicID != zero && input.id != prog.TopicID {
		return lost("the topic was recreated: its id is %s, dam's progress was made on %s", uuidString(input.id), uuidString(prog.TopicID))
	}
	if input.hasEnd && prog.HasNext && prog.Next > input.end {
		return lost("dam decided up to offset %d but the partition ends at %d: records dam had reached are gone (was the topic deleted, recreated or truncated?)", prog.Next, input.end)
	}
	if input.id == zero || prog.TopicID != zero {
		return recoveryPlan{}
	}
	if prog.HasNext && !in.hasCommitted {
		// P was set by a dam from before topic ids were recorded (or by
		// hand), and the group has no committed offset. Kafka deletes a
		// topic's committed offsets with it, so this is what a topic
		// recreated while dam was stopped looks like; its end alone
		// does not tell (the new topic may hold as many records as the
		// old). Bound now, its offsets below P would be skipped. Offsets
		// that expired look the same: the operator tells which.
		q := func(s string) string { return strings.ReplaceAll(s, "'", "''") }
		return recoveryPlan{halt: fmt.Errorf("%w: %s/%d: dam's progress (offset %d) was recorded without the topic's id, and the group has no committed offset: the topic may have been recreated (Kafka deletes a topic's committed offsets with it), which would skip the new topic's offsets below %d; the partition halts. If the topic was not recreated (the group's offsets expired), record its id and restart: UPDATE progress SET topic_id = '%s' WHERE grp = '%s' AND topic = '%s' AND part = %d; if it was, reset the partition (see docs/delivery.md, the input recreated)",
			ErrDataLoss, dp.Topic, dp.Partition, prog.Next, prog.Next, uuidString(input.id), q(dp.Group), q(dp.Topic), dp.Partition)}
	}
	if in.bound == nil {
		return recoveryPlan{need: needBind}
	}
	if *in.bound != input.id {
		return lost("the topic was recreated: its id is %s, dam's progress was made on %s", uuidString(input.id), uuidString(*in.bound))
	}
	return recoveryPlan{}
}

// planWith plans in, reading each fact the plan needs with read (which
// fills it in): the plan and read's first error.
func planWith(in planInput, read func(need, int64, *planInput) error) (recoveryPlan, error) {
	read1 := map[need]bool{}
	for {
		pl := planRecovery(in)
		if pl.need == needNothing {
			return pl, nil
		}
		if read1[pl.need] {
			return pl, fmt.Errorf("planning the recovery of %s/%d: the %s was needed again once read", in.part.Topic, in.part.Partition, pl.need)
		}
		read1[pl.need] = true
		if err := read(pl.need, pl.replayFrom, &in); err != nil {
			return pl, err
		}
	}
}

func uuidString(id [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:16])
}
