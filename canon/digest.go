package canon

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// Size is the length of a Digest: one scheme byte followed by a SHA-256 sum.
const Size = 1 + sha256.Size

// Scheme identifies how a Digest was computed. It is stored with every
// digest so that a future change of encoding is detectable: digests of
// different schemes never compare equal.
type Scheme uint8

// The hash schemes. Values are persisted; never renumber them.
const (
	// SchemeJSON1 is SHA-256 over the canonical encoding (version 1) of a
	// JSON tree.
	SchemeJSON1 Scheme = 1
	// SchemeBytes1 is SHA-256 over the raw value bytes (format: bytes).
	SchemeBytes1 Scheme = 2
	// SchemeTombstone marks a record whose value is null (a Kafka tombstone).
	SchemeTombstone Scheme = 3
)

// Digest is the fixed-size structural hash of one record value: the scheme
// byte, then the SHA-256 sum. Digests are comparable with ==. The zero
// Digest is not a valid digest of anything (see IsZero).
type Digest [Size]byte

// Tombstone is the digest of a null value (a Kafka tombstone). It differs
// from the digest of the JSON value null and from the digest of empty bytes.
var Tombstone = Digest{byte(SchemeTombstone)}

// Scheme reports the scheme the digest was computed with.
func (d Digest) Scheme() Scheme { return Scheme(d[0]) }

// IsZero reports whether d is the zero Digest, which no hasher returns.
func (d Digest) IsZero() bool { return d == Digest{} }

// String returns the lowercase hex form of all Size bytes (scheme first).
func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// ParseDigest parses the binary form of a digest, as stored by package dedup.
func ParseDigest(b []byte) (Digest, error) {
	var d Digest
	if len(b) != Size {
		return d, fmt.Errorf("canon: digest is %d bytes, want %d", len(b), Size)
	}
	copy(d[:], b)
	switch d.Scheme() {
	case SchemeJSON1, SchemeBytes1, SchemeTombstone:
		return d, nil
	}
	return Digest{}, fmt.Errorf("canon: unknown digest scheme %d", d[0])
}
