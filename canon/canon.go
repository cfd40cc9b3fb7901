// Package canon computes structural hashes of record values: two JSON
// values get the same Digest iff their trees are equal. That is its one job.
//
// Equality of trees (DESIGN.md §1): objects are sets of members (order is
// irrelevant; a name occurring twice in one object, compared decoded, is
// invalid); arrays are ordered; strings compare by decoded value ("\u0041"
// equals "A"; invalid UTF-8 and lone surrogates are invalid); numbers
// compare by their literal text after validation (1, 1.0 and 1e0 differ,
// so do -0 and 0); whitespace (space, tab, CR, LF) is irrelevant; anything
// after the top-level value is invalid, and so is a byte order mark.
// Values at ignore pointers (RFC 6901, "*" matching any member or index, a
// numeric token also matching that array index) are left out of the hash
// but still validated: whether an input is valid never depends on the
// ignore pointers. The input is only read, never modified.
//
// The hash is SHA-256 over a prefix-free binary encoding of the tree,
// version 1 (SchemeJSON1), built in one pass by an iterative parser (an
// explicit stack, no recursion) into pooled scratch buffers:
//
//	null, true, false   'n', 't', 'f'
//	number              'd' uvarint(len) literal text
//	string              's' uvarint(len) decoded UTF-8
//	array               'a' element... ']'
//	object              'o' (name as a string, value)... '}'
//	                    members sorted by name bytes, ignored ones removed
//
// Every value starts with a tag and every variable part carries its
// length, so distinct trees never share an encoding. The encoding is
// persisted through the digests: never change it without a new Scheme
// (testdata/digests.txt pins it).
//
// Prediction. The records of a topic repeat a few shapes, so the pooled
// parse state keeps recent object shapes: the first 8 bytes of each member
// name, in input order, and the members' sorted order. An object predicts
// the shape of the last object closed in its container (the previous
// element of an array; the previous record for the top-level object) or,
// when it is the first object there, of the last object whose first name
// began with the same four bytes. While the input holds the predicted names
// (of up to 6 bytes, compared as one masked word) with plain scalar values,
// members are parsed through fixed 64-byte windows (predict.go), and an
// object whose n name prefixes all equal a cached shape's is put in order
// by the cached permutation instead of sorted. A prediction decides which
// code runs, never the result: every predicted name is compared with the
// input byte for byte; another name, a value that is not a plain scalar,
// whitespace, or a pointer applying to the object hands over to the general
// loop at the last whole member (which finds any error); only shapes with
// pairwise distinct prefixes are cached, which makes the prefixes decide
// the order and rules out duplicate names. Golden digests, a plain
// reference encoder and a fuzz target that feeds sequences of documents
// through one state check that no output depends on earlier inputs.
//
// Values. A Hasher built WithValues also reads, in the same pass, the
// values at up to MaxValues RFC 6901 pointers (no wildcard), for a
// route's identity inside the record (entity: /banana_id), a message id
// or a version: SumValues appends a string's decoded bytes, or any other
// value's JSON text without whitespace, to the caller's buffer and says
// which Kind it was. The value comes from the parser that validates the
// record, so invalid JSON (invalid UTF-8 and lone surrogates included) is
// an error, never a mangled identity. On FormatBytes a value is parsed for
// that, and the digest stays the raw bytes'. Values never change a digest.
//
// Batches. A Batch takes many values (a partition's batch of records),
// validates each and reads its values at once, and hashes their encodings
// together when flushed: on x86-64 CPUs with AVX2 but no SHA extensions,
// eight side by side in the lanes of vector registers (internal/sha256x8),
// where crypto/sha256 hashes one at a time at a third of the rate or
// less. The digests are Sum's, byte for byte; elsewhere a Batch hashes
// one at a time.
//
// Limits: nesting depth (default 128) and size (default 1 MiB); memory is
// proportional to the input, and no input panics or exhausts the stack. A
// nil value (a Kafka tombstone) hashes to Tombstone; FormatBytes hashes the
// raw bytes (SchemeBytes1).
package canon

import (
	"fmt"
	"hash/maphash"
	"sync"
)

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

func sizeDetail(n, max int) string {
	return fmt.Sprintf("%d bytes, limit %d", n, max)
}

// Hasher computes digests. It is safe for concurrent use; create it once
// per route with New.
type Hasher struct {
	format   Format
	maxDepth int
	maxSize  int
	ptrs     [][]token   // the ignore pointers, then the value pointers
	all      uint64      // bit set of every pointer
	values   uint64      // bit set of the value pointers
	nIgnore  int         // the bit of value pointer i is nIgnore+i
	vptrs    []string    // the value pointers as given
	local    *localSeeds // WithLocalDigest: the seeds, else nil (SHA-256)
	pool     sync.Pool
}

// New returns a Hasher, or an error naming the first invalid option.
func New(opts ...Option) (*Hasher, error) {
	o := options{maxDepth: DefaultMaxDepth, maxSize: DefaultMaxSize}
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxDepth < 1 {
		return nil, errorf("canon: max depth %d: must be at least 1", o.maxDepth)
	}
	if o.maxSize < 0 || o.maxSize > MaxSize {
		return nil, errorf("canon: max size %d: must be between 0 and %d", o.maxSize, MaxSize)
	}
	if o.format != FormatJSON && o.format != FormatBytes {
		return nil, errorf("canon: unknown format %d", o.format)
	}
	if len(o.ignore) > MaxIgnore {
		return nil, errorf("canon: %d ignore pointers: at most %d", len(o.ignore), MaxIgnore)
	}
	if len(o.values) > MaxValues {
		return nil, errorf("canon: %d value pointers: at most %d", len(o.values), MaxValues)
	}
	h := &Hasher{format: o.format, maxDepth: o.maxDepth, maxSize: o.maxSize, nIgnore: len(o.ignore)}
	if o.local {
		h.local = &localSeeds{maphash.MakeSeed(), maphash.MakeSeed()}
	}
	for i, p := range append(o.ignore[:len(o.ignore):len(o.ignore)], o.values...) {
		value := i >= len(o.ignore)
		toks, err := compilePointer(p, value)
		if err != nil {
			return nil, err
		}
		h.ptrs = append(h.ptrs, toks)
		h.all |= 1 << uint(i)
		if value {
			h.values |= 1 << uint(i)
			h.vptrs = append(h.vptrs, p)
		}
	}
	h.pool.New = func() any { return new(state) }
	return h, nil
}

// Format reports the hasher's format.
func (h *Hasher) Format() Format { return h.format }

// maxPooled bounds the scratch memory a pooled state keeps after a large
// input, so one huge record does not pin memory forever.
const maxPooled = 4 << 20

// Sum returns the digest of one record value. A nil value is a Kafka
// tombstone and yields Tombstone; an empty non-nil value is a value. For
// FormatJSON an invalid value yields an *Error.
func (h *Hasher) Sum(value []byte) (Digest, error) {
	if value == nil {
		return Tombstone, nil
	}
	if h.format == FormatBytes {
		if len(value) > h.maxSize {
			return Digest{}, tooLarge(h, value)
		}
		return h.digest(SchemeBytes1, value), nil
	}
	var d Digest
	st := h.pool.Get().(*state)
	err := h.encode(st, value)
	if err == nil {
		d = h.digest(SchemeJSON1, st.out)
	}
	h.put(st)
	return d, err
}

// AppendCanonical appends the canonical form of value to dst: the tree
// that is hashed, as indented JSON with members sorted by name and ignored
// values removed. For FormatBytes it appends value unchanged. It is meant
// for people (dam hash --explain); the hash is not computed over this text.
func (h *Hasher) AppendCanonical(dst, value []byte) ([]byte, error) {
	if value == nil {
		return append(dst, "(tombstone)"...), nil
	}
	if h.format == FormatBytes {
		if len(value) > h.maxSize {
			return dst, tooLarge(h, value)
		}
		return append(dst, value...), nil
	}
	st := h.pool.Get().(*state)
	defer h.put(st)
	if err := h.encode(st, value); err != nil {
		return dst, err
	}
	return appendText(dst, st.out), nil
}

// encode leaves the canonical encoding of a JSON value in st.out. The
// tests call it with their own state to see the encoded bytes.
func (h *Hasher) encode(st *state, value []byte) error {
	if len(value) > h.maxSize {
		return tooLarge(h, value)
	}
	return st.encode(h, value)
}

func tooLarge(h *Hasher, value []byte) error {
	return &Error{Offset: h.maxSize, Err: ErrTooLarge, Detail: sizeDetail(len(value), h.maxSize)}
}

func (h *Hasher) put(st *state) {
	if cap(st.buf) > maxPooled || cap(st.tmp) > maxPooled || cap(st.members) > maxPooled/32 {
		return
	}
	h.pool.Put(st)
}
