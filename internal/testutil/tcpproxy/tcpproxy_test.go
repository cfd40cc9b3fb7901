package tcpproxy

import (
	"encoding/binary"
	"testing"
)

// msg is a PostgreSQL frontend message: type, int32 length, body.
func msg(typ byte, body ...string) []byte {
	var b []byte
	for _, s := range body {
		b = append(b, s...)
	}
	out := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(4+len(b)))
	return append(out, b...)
}

func cat(ms ...[]byte) []byte {
	var b []byte
	for _, m := range ms {
		b = append(b, m...)
	}
	return b
}

// The spotter finds a COMMIT whichever way pgx sends it, and only when it
// is executed: a named statement's Parse is not yet the COMMIT, its Bind is.
func TestCommitSpotter(t *testing.T) {
	const name = "stmtcache_0123456789abcdef0123456789abcdef01234567"
	parseNamed := msg('P', name, "\x00COMMIT\x00", "\x00\x00")
	bindNamed := msg('B', "\x00", name, "\x00", "\x00\x00\x00\x00\x00\x00")
	for _, tc := range []struct {
		what   string
		chunks [][]byte
		want   []bool
	}{
		{"simple query", [][]byte{msg('Q', "COMMIT\x00")}, []bool{true}},
		{"unnamed statement", [][]byte{cat(msg('P', "\x00COMMIT\x00", "\x00\x00"), msg('B', "\x00\x00", "\x00\x00\x00\x00\x00\x00"), msg('E', "\x00\x00\x00\x00\x00"))}, []bool{true}},
		{"named: prepared, then bound", [][]byte{cat(parseNamed, msg('D', "S", name, "\x00")), cat(bindNamed, msg('E', "\x00\x00\x00\x00\x00"))}, []bool{false, true}},
		{"named: bound again", [][]byte{parseNamed, bindNamed, bindNamed}, []bool{false, true, true}},
		{"other statements", [][]byte{msg('Q', "SELECT 1\x00"), msg('P', "s1\x00", "SELECT 'COMMIT'\x00", "\x00\x00")}, []bool{false, false}},
	} {
		var c commitSpotter
		for i, chunk := range tc.chunks {
			if got := c.spot(chunk); got != tc.want[i] {
				t.Errorf("%s: chunk %d: spot = %v, want %v", tc.what, i, got, tc.want[i])
			}
		}
	}
	// The Parse's length is printable here (64 = '@'): the name must not
	// take it in.
	if p := parseNamed; p[4] != '@' {
		t.Fatalf("test setup: length byte %q, want '@'", p[4])
	}
}
