package analyze

import (
	"crypto/sha256"
	"time"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
)

// The in-memory state of one run of a route's rule: what PostgreSQL holds
// for dam run (dedup.Stored), kept as digests.

// idKey is an identity's key in memory: the first 16 bytes of the SHA-256
// of the identity's bytes (any bytes, not only text). Two identities
// share a key with a probability of about n²/2¹²⁹ for n identities.
type idKey [16]byte

func keyOf(identity []byte) idKey {
	sum := sha256.Sum256(identity)
	return idKey(sum[:16])
}

// slot is an identity's stored state: dedup.Stored without Found (a slot
// exists only for a found identity), its digest cut to its scheme and 15
// bytes of its SHA-256 (the rules only compare digests for equality), and
// its times as Unix nanoseconds (0: the zero time).
type slot struct {
	digest    [16]byte
	forwarded int64
	expires   int64
	version   int64
	drops     uint32 // the identity's would-be drops (duplicate or stale)
}

// short cuts a digest to a slot's: its scheme byte and 15 bytes of its
// sum. The rules compare a record's digest with the stored one, never
// read it otherwise, so Decide sees both cut the same way.
func short(d canon.Digest) canon.Digest {
	var s canon.Digest
	copy(s[:16], d[:16])
	return s
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// stored is what the rule reads of s.
func (s *slot) stored() dedup.Stored {
	var d canon.Digest
	copy(d[:16], s.digest[:])
	return dedup.Stored{Found: true, Digest: d, Forwarded: fromNanos(s.forwarded), Expires: fromNanos(s.expires), Version: s.version}
}

// set stores st, the state the rule left.
func (s *slot) set(st dedup.Stored) {
	copy(s.digest[:], st.Digest[:16])
	s.forwarded, s.expires, s.version = nanos(st.Forwarded), nanos(st.Expires), st.Version
}

// slotBytes is what one identity takes in memory, the map's overhead
// included (measured: see TestStateMemoryPerIdentity).
const slotBytes = 100
