package dedup

import (
	"time"

	"github.com/dam-dedup/dam/canon"
)

// Decision is the outcome for one record. It is an explicit type, never a
// bool, so that a zero value is never mistaken for a verdict.
type Decision uint8

const (
	// Forward: the record is new for its identity under the batch's rule
	// (last-seen: its content differs from the stored content; window: its
	// id was not seen within the window; version: its version is above the
	// stored one); the state now holds it.
	Forward Decision = iota + 1
	// Duplicate: last-seen: the content equals the stored content; window:
	// the id was seen within the window, whatever the content; version: the
	// version equals the stored one. The state is unchanged (but a sliding
	// window is extended).
	Duplicate
	// Invalid: the record could not be decided (bad input); it changes no
	// state and goes to the dead-letter topic (or halts the partition).
	Invalid
	// Stale: version mode: the version is below the stored one (an
	// out-of-order update). The state is unchanged.
	Stale
	// Refresh: last-seen with Rule.RefreshAfter: the content equals the
	// stored content, but the identity was last forwarded longer ago than
	// RefreshAfter, so the record is forwarded anyway. The decision log
	// records it as Forward.
	Refresh
	// Skipped: an operator stepped past the record (Store.Skip): it is
	// never delivered, and changes no state. Only the decision log holds
	// it; Decide never returns it.
	Skipped
)

// String returns "forward", "duplicate", "invalid", "stale", "refresh" or
// "skipped".
func (d Decision) String() string {
	switch d {
	case Forward:
		return "forward"
	case Duplicate:
		return "duplicate"
	case Invalid:
		return "invalid"
	case Stale:
		return "stale"
	case Refresh:
		return "refresh"
	case Skipped:
		return "skipped"
	}
	return "unknown"
}

// Forwards reports whether the record is delivered: Forward or Refresh.
func (d Decision) Forwards() bool { return d == Forward || d == Refresh }

// Mode is a decision rule (DESIGN §1). The zero value is LastSeen.
type Mode uint8

// The modes.
const (
	// LastSeen: identity (service, entity); forward iff the content's digest
	// differs from the one last forwarded. Table state.
	LastSeen Mode = iota
	// Window: identity (service, message id), the id in Record.Entity;
	// forward iff the id was not seen within Rule.Window. Table window_ids.
	Window
	// Version: identity (service, entity); forward iff Record.Version is
	// above the highest version forwarded. Table versions.
	Version
)

// String returns "last-seen", "window" or "version", the names of the
// configuration.
func (m Mode) String() string {
	switch m {
	case LastSeen:
		return "last-seen"
	case Window:
		return "window"
	case Version:
		return "version"
	}
	return "unknown"
}

// Rule is how a batch's records are decided: its Mode and that mode's
// settings. The zero value is last-seen without refresh.
type Rule struct {
	Mode Mode
	// Window is how long a window-mode id is remembered, from when it was
	// forwarded (or, with Sliding, last seen). Required (> 0) in Window
	// mode. An id is a duplicate while now < its expiry, and absent from
	// its expiry on: [seen, seen+Window) is the window.
	Window time.Duration
	// Sliding: in Window mode, a duplicate extends its id's window to
	// now + Window.
	Sliding bool
	// RefreshAfter: in LastSeen mode, a record equal to the stored content
	// is forwarded anyway (Refresh) when its identity was last forwarded
	// more than RefreshAfter ago (strictly). Zero: never.
	RefreshAfter time.Duration
}

// Partition names one input partition of one consumer group. Progress,
// fencing epochs and the decision log are kept per Partition.
type Partition struct {
	Group     string
	Topic     string
	Partition int32
}

// Record is one input record to decide.
type Record struct {
	// Offset is the record's Kafka offset.
	Offset int64
	// Entity is the identity within the service, arbitrary bytes: the
	// entity, or in Window mode the message id.
	Entity []byte
	// Digest is the structural hash of the value. Ignored when Invalid.
	// Every mode stores the digest of the record it forwarded.
	Digest canon.Digest
	// Version is the record's version, in Version mode.
	Version int64
	// Invalid marks a record that failed to hash or lacks an identity. It
	// is logged (so recovery re-delivers its dead letter) but changes no
	// state.
	Invalid bool
	// Cause says why an Invalid record is invalid (the error its dead
	// letter names). The decision log keeps it, cut to MaxCauseBytes, so
	// that recovery names the same cause (LoggedDecision.Cause) even when
	// the record alone no longer shows it. Ignored unless Invalid.
	Cause string
	// Forwarded, with Invalid, marks a record the caller delivered
	// already, undecided (while the store was down), and that the store
	// now refuses: it changes no state, as an invalid record, but is
	// logged as Forward, what it was, so that recovery delivers it again
	// as a forward and never as a dead letter. Decide returns Invalid for
	// it.
	Forwarded bool
}

// Batch is a run of consecutive records of one partition, decided in one
// transaction.
type Batch struct {
	// Service is the route's name; state is keyed by (Service, Entity).
	Service string
	// Rule is the decision rule. A service keeps one rule: each mode has
	// its own table, and a service that changes mode starts afresh.
	Rule Rule
	// Now is the decision time, against which windows and refreshes are
	// measured and which is stored. Zero (the sidecar): the database's
	// clock, the transaction's now(), so that every decider and the
	// cleanup share one clock. Set it to decide as of a given time (tests,
	// tools).
	Now time.Time
	// Partition is the input partition the records come from.
	Partition Partition
	// Epoch is the fencing epoch returned by Acquire. A batch whose epoch is
	// not the partition's current epoch fails with ErrFenced.
	Epoch int64
	// Start is the partition's progress before this batch (the P returned by
	// Acquire or the End of the previous batch). A mismatch with the stored
	// progress fails with ErrFenced: another decider moved it.
	Start int64
	// End is the progress after this batch: the offset of the last record
	// plus one (it may exceed that when the fetch skipped offsets).
	End int64
	// Records are in offset order, all in [Start, End).
	Records []Record
	// NoLog decides without appending to the decision log: used to catch the
	// state up over [P, C) when Kafka's committed offset is ahead.
	NoLog bool
	// Delivered is the committed offset the caller knows (Kafka's C, or
	// less), recorded with the progress (Progress.Delivered) for a recovery
	// that finds none in Kafka. Zero or negative: unknown, the recorded one
	// stays.
	Delivered int64
	// Sources, when the caller gives it one entry per record, asks Decide
	// where the state each record was decided against came from: Decide
	// sets entry k to the input record that last set record k's
	// identity's state before record k (for a Duplicate or Stale, the
	// record whose content, id or version it repeats; for a Forward, the
	// one it replaces), or to Offset -1 when there was no state or none is
	// known (a state set by Check). Reading it
	// costs three more columns per identity read: nil (the default) reads
	// none. After a failed Decide the entries are undefined.
	Sources []Source
}

// Source is an input record that set an identity's state: its topic,
// partition and offset. Offset -1: none or unknown.
type Source struct {
	Topic     string
	Partition int32
	Offset    int64
}

// LoggedDecision is one entry of the decision log: a record that was
// forwarded (in any mode, refreshes included) or dead-lettered. Offsets in
// a logged range that have no entry were duplicates (or stale).
type LoggedDecision struct {
	Offset   int64
	Decision Decision // Forward, Invalid, or Skipped (an operator's skip)
	Entity   []byte   // for Forward (and Invalid, Skipped when known)
	// Cause is the Record.Cause of an Invalid entry, as logged; empty when
	// none was given, or the batch was logged before the log kept causes
	// (schema version 8).
	Cause string
}

// MaxCauseBytes bounds a cause the decision log keeps (Record.Cause): a
// longer one is cut on a character boundary, marked with "…".
const MaxCauseBytes = 1024
