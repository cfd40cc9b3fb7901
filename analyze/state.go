package analyze

import (
	"encoding/binary"
	"hash/maphash"
	"time"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
)

// The in-memory state of one run of a route's rule: what PostgreSQL holds
// for dam run (dedup.Stored), kept as digests.

// idKey is an identity's key in memory: two 64-bit hashes of the
// identity's bytes (any bytes, not only text) under seeds drawn for the
// process, so that a producer cannot choose identities that share a key.
// Two identities share one with a probability of about n²/2¹²⁹ for n
// identities. (SHA-256 took a twentieth of an analysis's CPU, for no
// more than that.)
type idKey [16]byte

var keySeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

func keyOf(identity []byte) idKey {
	var k idKey
	binary.LittleEndian.PutUint64(k[:8], maphash.Bytes(keySeeds[0], identity))
	binary.LittleEndian.PutUint64(k[8:], maphash.Bytes(keySeeds[1], identity))
	return k
}

// slot is an identity's stored state: the part of dedup.Stored its
// route's mode reads (a slot exists only for a found identity). Its
// digest is cut to its scheme and 15 bytes of its sum (the rules only
// compare digests for equality); at is, as Unix nanoseconds (0: the zero
// time), when the identity was last forwarded in last-seen mode (what
// refresh_after reads), or its window's expiry in window mode, or its
// version in version mode.
type slot struct {
	digest [16]byte
	at     int64
	drops  uint32 // the identity's would-be drops (duplicate or stale)
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

// stored is what a rule of mode m reads of s.
func (s *slot) stored(m dedup.Mode) dedup.Stored {
	st := dedup.Stored{Found: true}
	copy(st.Digest[:16], s.digest[:])
	switch m {
	case dedup.Window:
		st.Expires = fromNanos(s.at)
	case dedup.Version:
		st.Version = s.at
	default:
		st.Forwarded = fromNanos(s.at)
	}
	return st
}

// set stores what a rule of mode m reads of st, the state it left.
func (s *slot) set(m dedup.Mode, st dedup.Stored) {
	copy(s.digest[:], st.Digest[:16])
	switch m {
	case dedup.Window:
		s.at = nanos(st.Expires)
	case dedup.Version:
		s.at = st.Version
	default:
		s.at = nanos(st.Forwarded)
	}
}

// slotBytes bounds what one identity takes in memory, the map's
// overhead included: 48 bytes a key and slot, in a map between 7/16 and
// 7/8 full (TestStateMemoryPerIdentity measures it).
const slotBytes = 120
