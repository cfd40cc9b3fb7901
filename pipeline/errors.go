package pipeline

import "errors"

// Sentinel errors of the pipeline. Match them with errors.Is; the errors
// returned wrap them with what happened and where (service, topic,
// partition, offset).
var (
	// ErrNotReady is wrapped by Ready while the pipeline cannot make
	// progress: not yet consuming, a broker or PostgreSQL unreachable, or a
	// partition paused or halted.
	ErrNotReady = errors.New("pipeline: not ready")
	// ErrConfig is wrapped by New for a configuration that does not
	// validate, and by Run for one that contradicts the cluster (a route's
	// max_size above what its output topic accepts, a preserve route whose
	// output has fewer partitions than its input).
	ErrConfig = errors.New("pipeline: invalid configuration")
	// ErrHalted: a partition stopped at a record it cannot pass on (bad
	// input on a route without a dead-letter topic, or a record Kafka
	// refuses for good with nowhere to send it). The partition stays
	// assigned and decides nothing more; its committed offset stays at that
	// record, so the next start resumes there. The other partitions go on.
	ErrHalted = errors.New("pipeline: partition halted")
	// ErrDataLoss: records of a partition that dam had reached are gone from
	// Kafka (the topic was recreated or truncated under dam). The partition
	// halts rather than skip or re-read silently.
	ErrDataLoss = errors.New("pipeline: input data loss")
	// ErrUndecompressable: a compressed record batch of the input inflates
	// past pipeline.max_decompressed_batch_bytes. Each of its offsets is
	// bad input (a dead letter without key or value), or, on a route
	// without a dead-letter topic, its partition halts at the first.
	ErrUndecompressable = errors.New("pipeline: record batch inflates past its bound")
)
