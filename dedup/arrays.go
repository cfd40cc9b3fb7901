package dedup

import (
	"encoding/binary"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The arrays a decide sends, one element per identity or record of the
// batch: pgx encodes a [][]byte or an []int64 element by element through
// reflection and an interface per element, which was a third of the
// client's CPU in a Decide (BenchmarkDecide, client-µs/record). These
// named slices are encoded in PostgreSQL's binary array format in one
// pass instead, by the codecs registerArrays puts on the connection: every
// decide does, on the connection it uses (a pool built by the caller,
// NewStore's, has none of its own; without them pgx cannot even type the
// named slices in the exec and simple protocol modes).
type (
	byteaArray [][]byte
	int8Array  []int64
	int2Array  []int16
	tidArray   []pgtype.TID
	xidArray   []uint32
)

// RegisterTypes makes conn able to send the parameters of the store's
// statements (the arrays a decide sends, encoded by dam in one pass), in
// every query exec mode. The store does it on each connection it uses; a
// tool that replays the store's statements and arguments on a connection
// of its own calls it first.
func RegisterTypes(conn *pgx.Conn) { registerArrays(conn) }

// registerArrays installs the fast encoders of the bulk array parameters
// on conn's type map (decoding is unchanged), once.
func registerArrays(conn *pgx.Conn) {
	m := conn.TypeMap()
	if t, ok := m.TypeForOID(pgtype.XIDArrayOID); ok {
		if _, ours := t.Codec.(arrayCodec); ours {
			return
		}
	}
	for _, a := range []struct {
		name      string
		oid, elem uint32
		value     any
	}{
		{"_bytea", pgtype.ByteaArrayOID, pgtype.ByteaOID, byteaArray(nil)},
		{"_int8", pgtype.Int8ArrayOID, pgtype.Int8OID, int8Array(nil)},
		{"_int2", pgtype.Int2ArrayOID, pgtype.Int2OID, int2Array(nil)},
		{"_tid", pgtype.TIDArrayOID, pgtype.TIDOID, tidArray(nil)},
		{"_xid", pgtype.XIDArrayOID, pgtype.XIDOID, xidArray(nil)},
	} {
		elem, ok := m.TypeForOID(a.elem)
		if !ok {
			continue
		}
		m.RegisterType(&pgtype.Type{Name: a.name, OID: a.oid, Codec: arrayCodec{&pgtype.ArrayCodec{ElementType: elem}}})
		// The type of a parameter the statement does not describe (the
		// exec and simple protocol modes a DSN may choose).
		m.RegisterDefaultPgType(a.value, a.name)
	}
}

// arrayCodec is pgx's array codec with a binary encode plan for the named
// slices above.
type arrayCodec struct{ *pgtype.ArrayCodec }

func (c arrayCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if format == pgtype.BinaryFormatCode {
		switch value.(type) {
		case byteaArray, int8Array, int2Array, tidArray, xidArray:
			return arrayPlan{}
		}
	}
	return c.ArrayCodec.PlanEncode(m, oid, format, value)
}

// arrayPlan appends one of the named slices in the binary array format:
// the header (dimensions, a has-null flag, the element type, the length
// and lower bound of the one dimension) and each element's length and
// bytes.
type arrayPlan struct{}

func (arrayPlan) Encode(value any, buf []byte) ([]byte, error) {
	switch a := value.(type) {
	case byteaArray:
		size, null := 0, int32(0)
		for _, e := range a {
			size += 4 + len(e)
			if e == nil {
				null = 1
			}
		}
		buf = arrayHeader(buf, len(a), null, pgtype.ByteaOID, size)
		for _, e := range a {
			if e == nil {
				buf = binary.BigEndian.AppendUint32(buf, math.MaxUint32) // -1: NULL
				continue
			}
			buf = binary.BigEndian.AppendUint32(buf, uint32(len(e)))
			buf = append(buf, e...)
		}
	case int8Array:
		buf = arrayHeader(buf, len(a), 0, pgtype.Int8OID, 12*len(a))
		for _, v := range a {
			buf = binary.BigEndian.AppendUint32(buf, 8)
			buf = binary.BigEndian.AppendUint64(buf, uint64(v))
		}
	case int2Array:
		buf = arrayHeader(buf, len(a), 0, pgtype.Int2OID, 6*len(a))
		for _, v := range a {
			buf = binary.BigEndian.AppendUint32(buf, 2)
			buf = binary.BigEndian.AppendUint16(buf, uint16(v))
		}
	case xidArray:
		buf = arrayHeader(buf, len(a), 0, pgtype.XIDOID, 8*len(a))
		for _, v := range a {
			buf = binary.BigEndian.AppendUint32(buf, 4)
			buf = binary.BigEndian.AppendUint32(buf, v)
		}
	case tidArray:
		null := int32(0)
		for _, t := range a {
			if !t.Valid {
				null = 1
			}
		}
		buf = arrayHeader(buf, len(a), null, pgtype.TIDOID, 10*len(a))
		for _, t := range a {
			if !t.Valid {
				buf = binary.BigEndian.AppendUint32(buf, math.MaxUint32)
				continue
			}
			buf = binary.BigEndian.AppendUint32(buf, 6)
			buf = binary.BigEndian.AppendUint32(buf, t.BlockNumber)
			buf = binary.BigEndian.AppendUint16(buf, t.OffsetNumber)
		}
	}
	return buf, nil
}

// arrayHeader appends the header of a one-dimensional array of n elements
// (none: zero dimensions, as PostgreSQL writes an empty array) and grows
// buf by size, the elements' bytes.
func arrayHeader(buf []byte, n int, null int32, elem uint32, size int) []byte {
	buf = growBuf(buf, 20+size)
	if n == 0 {
		buf = binary.BigEndian.AppendUint32(buf, 0)
		buf = binary.BigEndian.AppendUint32(buf, 0)
		return binary.BigEndian.AppendUint32(buf, elem)
	}
	buf = binary.BigEndian.AppendUint32(buf, 1)
	buf = binary.BigEndian.AppendUint32(buf, uint32(null))
	buf = binary.BigEndian.AppendUint32(buf, elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	return binary.BigEndian.AppendUint32(buf, 1)
}

// growBuf makes room for n more bytes at once, and for as many again: a
// statement's arrays are encoded one after another into one buffer, which
// pgx starts afresh (256 bytes) for each statement, and each of a batch's
// arrays is of about the same size (one element per identity or record).
// Growing by twice the buffer instead allocated three times the bytes a
// rewrite's five arrays needed.
func growBuf(buf []byte, n int) []byte {
	if cap(buf)-len(buf) < n {
		nb := make([]byte, len(buf), len(buf)+2*n)
		copy(nb, buf)
		buf = nb
	}
	return buf
}
