package canon

// This file: hashing many values together (Batch), for the pipeline's
// batches of records.

import (
	"slices"

	"github.com/dam-dedup/dam/internal/sha256x8"
)

// Batch computes the digests of many values, as Sum and SumValues do,
// with SHA-256 run over several encodings at once where that is faster:
// on x86-64 CPUs with AVX2 but without SHA extensions it hashes eight
// side by side (about 3.5x the rate of one at a time); elsewhere, or for
// fewer than three values, one at a time. The digests are those of Sum,
// byte for byte.
//
// Add validates a value and reads its values at once (its errors are
// Sum's and SumValues'); its digest comes from Flush. A Batch keeps at most
// 64 encodings or 256 KiB of them before it hashes them (then only their
// digests), and hashes an encoding over 8 KiB at once. It is not safe for
// concurrent use; after Flush it is empty and ready for the next batch.
type Batch struct {
	h       *Hasher
	buf     []byte // pending encodings, each padded for SHA-256
	pending []pending
	msgs    [][]byte // scratch for hash: the padded encodings
	lens    []int
	sums    [][32]byte
	done    []indexed // hashed since the last Flush
}

// pending is an encoding in buf waiting to be hashed.
type pending struct {
	i          int // the caller's index
	start, len int // in buf, before padding
	scheme     Scheme
}

// indexed is a digest and the index its value was added with.
type indexed struct {
	i int
	d Digest
}

const (
	// batchBytes bounds the encodings a Batch keeps before hashing
	// them: past it, Add hashes what is pending.
	batchBytes = 256 << 10
	// batchValues is the most values hashed in one go: enough that
	// lanes rarely idle, few enough to stay in the cache.
	batchValues = 64
	// laneMax is the longest encoding hashed in lanes: a lane that runs
	// alone for long wastes the others, so longer ones go one at a time.
	laneMax = 8 << 10
	// laneMin is the fewest values worth hashing in lanes: eight lanes
	// cost about 2.3 single hashes of the same length.
	laneMin = 3
)

// NewBatch returns an empty Batch of h.
func (h *Hasher) NewBatch() *Batch { return &Batch{h: h} }

// Add validates value and reads its values as SumValues does (vals must
// have one element per value pointer; with none, as Sum), and queues its
// digest, which Flush reports with index i. On error nothing is queued.
func (b *Batch) Add(i int, value, dst []byte, vals []Value) ([]byte, error) {
	h := b.h
	st := h.pool.Get().(*state)
	scheme, msg, dst, err := h.prepare(st, value, dst, vals)
	switch {
	case err != nil:
	case scheme == SchemeTombstone || !sha256x8.Enabled || len(msg) > laneMax || h.local != nil:
		b.done = append(b.done, indexed{i, h.digest(scheme, msg)})
	default:
		start := len(b.buf)
		b.buf = sha256x8.Pad(append(b.buf, msg...), len(msg))
		b.pending = append(b.pending, pending{i: i, start: start, len: len(msg), scheme: scheme})
	}
	h.put(st)
	if len(b.buf) >= batchBytes || len(b.pending) >= batchValues {
		b.hash()
	}
	return dst, err
}

// hash computes the pending digests.
func (b *Batch) hash() {
	n := len(b.pending)
	if n == 0 {
		return
	}
	if n < laneMin {
		for _, p := range b.pending {
			b.done = append(b.done, indexed{p.i, digest(p.scheme, b.buf[p.start:p.start+p.len])})
		}
	} else {
		// Longest first: the lanes then finish close together, instead of
		// a long encoding running alone at the end while seven lanes idle.
		slices.SortFunc(b.pending, func(x, y pending) int { return y.len - x.len })
		b.msgs, b.lens = b.msgs[:0], b.lens[:0]
		for _, p := range b.pending {
			end := p.start + sha256x8.PaddedLen(p.len)
			b.msgs = append(b.msgs, b.buf[p.start:end:end])
			b.lens = append(b.lens, p.len)
		}
		if cap(b.sums) < n {
			b.sums = make([][32]byte, n, batchValues)
		}
		b.sums = b.sums[:n]
		sha256x8.Sum(b.msgs, b.lens, b.sums)
		for k, p := range b.pending {
			d := Digest{byte(p.scheme)}
			copy(d[1:], b.sums[k][:])
			b.done = append(b.done, indexed{p.i, d})
		}
	}
	b.buf, b.pending = b.buf[:0], b.pending[:0]
}

// Flush hashes what is pending and calls set with each digest queued
// since the last Flush and the index it was added with, in no particular
// order. The Batch is then empty.
func (b *Batch) Flush(set func(i int, d Digest)) {
	b.hash()
	for _, x := range b.done {
		set(x.i, x.d)
	}
	b.done = b.done[:0]
}

// Lanes names how a Batch runs SHA-256 on this CPU: "avx512vl" or "avx2"
// (eight values side by side), or "off" (one at a time, crypto/sha256:
// the CPU has SHA extensions, or no AVX2).
func Lanes() string {
	if !sha256x8.Enabled || sha256x8.Kernel() == "" {
		return "off"
	}
	return sha256x8.Kernel()
}
