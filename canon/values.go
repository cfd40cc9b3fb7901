package canon

// This file: values read at value pointers (WithValues) in the pass that
// hashes, for identities that live inside the record (entity: /banana_id).

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"strconv"
)

// Value is one value read by SumValues.
type Value struct {
	// Bytes is a string's decoded bytes, or any other value's JSON text
	// without whitespace (otherwise as written: 1 and 1.0 differ).
	Bytes []byte
	// Kind is the value's JSON type: Bytes alone does not tell the
	// number 7 from the string "7".
	Kind Kind
}

// Kind is the JSON type of a Value.
type Kind uint8

// The kinds of values. The zero Kind is no value.
const (
	KindString Kind = iota + 1
	KindNumber
	KindBool
	KindNull
	KindObject
	KindArray
)

// String returns "string", "number", "bool", "null", "object" or "array".
func (k Kind) String() string {
	switch k {
	case KindString:
		return "string"
	case KindNumber:
		return "number"
	case KindBool:
		return "bool"
	case KindNull:
		return "null"
	case KindObject:
		return "object"
	case KindArray:
		return "array"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// kindOf is the Kind of a value that starts with c.
func kindOf(c byte) Kind {
	switch c {
	case '"':
		return KindString
	case 't', 'f':
		return KindBool
	case 'n':
		return KindNull
	case '{':
		return KindObject
	case '[':
		return KindArray
	}
	return KindNumber
}

// SumValues returns the digest of value, as Sum does, and reads in the
// same pass the value at each of the hasher's value pointers
// (WithValues): a string yields its decoded bytes, any other value its
// JSON text without whitespace (see Value). It appends the values' bytes
// to dst in the order of the pointers, sets vals[i] to value i (its Bytes
// a slice of the returned buffer, capacity capped), and returns the
// extended buffer. len(vals) must be the number of value pointers (it
// panics otherwise). It allocates nothing but dst's growth: a caller may
// append many records' values to one buffer (an arena: earlier values
// stay valid), reuse it as dst[:0] (which overwrites them), or pass nil
// to get each record's own.
//
// A pointer that names nothing in a valid value is a *ValueError wrapping
// ErrNoValue; so is a nil value (a tombstone has no values). An invalid
// value is an *Error, as for Sum. For FormatBytes the digest stays the one
// of the raw bytes (SchemeBytes1), but the value must be JSON for its
// pointers to name anything: it is parsed, and invalid JSON is an *Error.
// On error dst is returned with its length on entry and vals is unchanged.
func (h *Hasher) SumValues(value, dst []byte, vals []Value) (Digest, []byte, error) {
	var d Digest
	st := h.pool.Get().(*state)
	scheme, msg, dst, err := h.prepare(st, value, dst, vals)
	if err == nil {
		d = h.digest(scheme, msg)
	}
	h.put(st)
	return d, dst, err
}

// prepare is SumValues up to the hash: it validates value, reads its
// values, and returns the scheme and the bytes to hash (st.out, value, or
// nil for a tombstone), valid until st goes back to the pool.
func (h *Hasher) prepare(st *state, value, dst []byte, vals []Value) (Scheme, []byte, []byte, error) {
	if len(vals) != len(h.vptrs) {
		panic(fmt.Sprintf("canon: SumValues with %d vals for %d value pointers", len(vals), len(h.vptrs)))
	}
	if len(vals) == 0 {
		switch {
		case value == nil:
			return SchemeTombstone, nil, dst, nil
		case h.format == FormatBytes:
			if len(value) > h.maxSize {
				return 0, nil, dst, tooLarge(h, value)
			}
			return SchemeBytes1, value, dst, nil
		}
		if err := h.encode(st, value); err != nil {
			return 0, nil, dst, err
		}
		return SchemeJSON1, st.out, dst, nil
	}
	if value == nil {
		return 0, nil, dst, &ValueError{Pointer: h.vptrs[0], Tombstone: true}
	}
	if err := h.encode(st, value); err != nil {
		return 0, nil, dst, err
	}
	var ends [MaxValues]int
	var kinds [MaxValues]Kind
	start := len(dst)
	for i := range vals {
		if st.found&(1<<uint(h.nIgnore+i)) == 0 {
			return 0, nil, dst[:start], &ValueError{Pointer: h.vptrs[i]}
		}
		dst, kinds[i&(MaxValues-1)] = appendValue(dst, value, int(st.vpos[i&(MaxValues-1)]))
		ends[i&(MaxValues-1)] = len(dst)
	}
	b := start
	for i := range vals {
		e := ends[i&(MaxValues-1)]
		vals[i] = Value{Bytes: dst[b:e:e], Kind: kinds[i&(MaxValues-1)]}
		b = e
	}
	if h.format == FormatBytes {
		return SchemeBytes1, value, dst, nil
	}
	return SchemeJSON1, st.out, dst, nil
}

// localSeeds seed a Hasher's local digests (WithLocalDigest).
type localSeeds struct{ a, b maphash.Seed }

// digest is h's Digest of msg under scheme, as prepare returned them:
// digest's, or with WithLocalDigest two seeded 64-bit hashes.
func (h *Hasher) digest(scheme Scheme, msg []byte) Digest {
	if h.local == nil || scheme == SchemeTombstone {
		return digest(scheme, msg)
	}
	d := Digest{byte(scheme)}
	binary.LittleEndian.PutUint64(d[1:], maphash.Bytes(h.local.a, msg))
	binary.LittleEndian.PutUint64(d[9:], maphash.Bytes(h.local.b, msg))
	return d
}

// digest is the Digest of msg under scheme, as prepare returned them.
func digest(scheme Scheme, msg []byte) Digest {
	if scheme == SchemeTombstone {
		return Tombstone
	}
	d := Digest{byte(scheme)}
	sum := sha256.Sum256(msg)
	copy(d[1:], sum[:])
	return d
}

// appendValue appends the value that starts at in[p] (maybe after
// whitespace) in a valid document, a string decoded, anything else as its
// text without the whitespace outside strings, and returns its kind.
func appendValue(dst, in []byte, p int) ([]byte, Kind) {
	for isWS(in[p]) {
		p++
	}
	k := kindOf(in[p])
	if k == KindString {
		if j, _ := scanRun(in, p+1); in[j] == '"' {
			return append(dst, in[p+1:j]...), k // no escapes
		}
		dst, _, _ = decodeStr(dst, in, p)
		return dst, k
	}
	return appendCompact(dst, in, p), k
}

// appendCompact appends the value (not a string) at in[p] in a valid
// document without the whitespace outside strings.
func appendCompact(dst, in []byte, p int) []byte {
	depth := 0
	for ; p < len(in); p++ {
		switch c := in[p]; c {
		case ' ', '\t', '\n', '\r':
			if depth == 0 {
				return dst
			}
		case '"':
			e := p + 1
			for in[e] != '"' {
				if in[e] == '\\' {
					e++
				}
				e++
			}
			dst = append(dst, in[p:e+1]...)
			p = e
		case '[', '{':
			depth++
			dst = append(dst, c)
		case ']', '}', ',':
			if depth == 0 {
				return dst
			}
			if dst = append(dst, c); c != ',' {
				if depth--; depth == 0 {
					return dst
				}
			}
		default:
			dst = append(dst, c)
		}
	}
	return dst
}
