package canon

import (
	"fmt"
	"strconv"
)

// Defaults for the limits.
const (
	// DefaultMaxDepth is the default maximum nesting of arrays and objects.
	DefaultMaxDepth = 128
	// DefaultMaxSize is the default maximum value size in bytes (1 MiB).
	DefaultMaxSize = 1 << 20
	// MaxSize is the largest accepted WithMaxSize (offsets are 32-bit).
	MaxSize = 1 << 30
	// MaxIgnore is the largest number of ignore pointers one Hasher takes
	// (with the value pointers, they are matched as one 64-bit set).
	MaxIgnore = 64 - MaxValues
	// MaxValues is the largest number of value pointers (WithValues) one
	// Hasher takes.
	MaxValues = 8
)

// Format selects how a value is hashed.
type Format uint8

// The formats.
const (
	// FormatJSON hashes the structure of a JSON value (scheme SchemeJSON1).
	FormatJSON Format = iota
	// FormatBytes hashes the raw bytes (scheme SchemeBytes1).
	FormatBytes
)

// String returns "json" or "bytes".
func (f Format) String() string {
	switch f {
	case FormatJSON:
		return "json"
	case FormatBytes:
		return "bytes"
	}
	return "Format(" + strconv.Itoa(int(f)) + ")"
}

// ParseFormat parses "json" or "bytes".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "json":
		return FormatJSON, nil
	case "bytes":
		return FormatBytes, nil
	}
	return 0, fmt.Errorf("canon: unknown format %q (want json or bytes)", s)
}

type options struct {
	ignore   []string
	values   []string
	maxDepth int
	maxSize  int
	format   Format
	local    bool
}

// Option configures a Hasher.
type Option func(*options)

// WithIgnore leaves the values at these RFC 6901 pointers out of the hash.
// A token "*" matches any member or array index; a numeric token also
// matches that array index.
func WithIgnore(ptrs ...string) Option {
	return func(o *options) { o.ignore = append(o.ignore, ptrs...) }
}

// WithValues makes SumValues read the values at these RFC 6901 pointers
// in the same pass as the hash: a route's entity ("/banana_id"), a
// message id, a version. Each pointer names one value: "*" is not a
// wildcard here and is rejected. A value pointer may point into an
// ignored member. Values do not change the digest.
func WithValues(ptrs ...string) Option {
	return func(o *options) { o.values = append(o.values, ptrs...) }
}

// WithMaxDepth sets the maximum nesting of arrays and objects (default 128).
func WithMaxDepth(n int) Option { return func(o *options) { o.maxDepth = n } }

// WithMaxSize sets the maximum value size in bytes (default 1 MiB).
func WithMaxSize(n int) Option { return func(o *options) { o.maxSize = n } }

// WithLocalDigest makes the Hasher's digests comparable only with digests
// of the same Hasher: instead of SHA-256, the encoding is hashed with two
// 64-bit hashes seeded at random (hash/maphash), several times cheaper.
// Two values equal as Sum defines it still have equal digests, and two
// that differ collide with a probability near 2^-128 per pair, but no
// other process, Hasher or release computes the same bytes: such digests
// are for comparisons in memory (dam analyze), never to be stored, sent
// or compared with a sidecar's. The scheme byte is kept.
func WithLocalDigest() Option { return func(o *options) { o.local = true } }

// WithFormat selects the format (default FormatJSON).
func WithFormat(f Format) Option { return func(o *options) { o.format = f } }
