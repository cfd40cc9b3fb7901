package dedup

import "github.com/dam-dedup/dam/canon"

// Decision is the outcome for one record. It is an explicit type, never a
// bool, so that a zero value is never mistaken for a verdict.
type Decision uint8

const (
	// Forward: the record's content differs from the stored content for its
	// identity (or the identity is new); the state now holds its digest.
	Forward Decision = iota + 1
	// Duplicate: the record's content equals the stored content; the state
	// is unchanged.
	Duplicate
	// Invalid: the record could not be decided (bad input); it changes no
	// state and goes to the dead-letter topic (or halts the partition).
	Invalid
)

// String returns "forward", "duplicate" or "invalid".
func (d Decision) String() string {
	switch d {
	case Forward:
		return "forward"
	case Duplicate:
		return "duplicate"
	case Invalid:
		return "invalid"
	}
	return "unknown"
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
	// Entity is the identity within the service; arbitrary bytes.
	Entity []byte
	// Digest is the structural hash of the value. Ignored when Invalid.
	Digest canon.Digest
	// Invalid marks a record that failed to hash or lacks an identity. It
	// is logged (so recovery re-delivers its dead letter) but changes no
	// state.
	Invalid bool
}

// Batch is a run of consecutive records of one partition, decided in one
// transaction.
type Batch struct {
	// Service is the route's name; state is keyed by (Service, Entity).
	Service string
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
}

// LoggedDecision is one entry of the decision log: a record that was
// forwarded or dead-lettered. Offsets in a logged range that have no entry
// were duplicates.
type LoggedDecision struct {
	Offset   int64
	Decision Decision // Forward or Invalid
	Entity   []byte   // for Forward
}
