package dedup_test

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// TestArrayParameters: the decide's arrays, encoded by dam's own plan, reach
// PostgreSQL as the same values as pgx's encoding of the plain slices
// (compared by the server, as text), NULLs and empty arrays included, in
// every query exec mode a DSN may choose.
func TestArrayParameters(t *testing.T) {
	for _, mode := range []string{"", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run("mode="+mode, func(t *testing.T) {
			dsn := pgtest.DSN(t)
			if mode != "" {
				dsn += "&default_query_exec_mode=" + mode
			}
			s, err := dedup.Open(context.Background(), dsn, dedup.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			testArrayParameters(t, s)
		})
	}
}

func testArrayParameters(t *testing.T, s *dedup.Store) {
	ctx := context.Background()
	tid := func(b uint32, o uint16) pgtype.TID { return pgtype.TID{BlockNumber: b, OffsetNumber: o, Valid: true} }
	long := make([]byte, 70000)
	for i := range long {
		long[i] = byte(i)
	}
	cases := []struct {
		name        string
		cast        string
		fast, plain any
	}{
		{"bytea", "bytea[]", dedup.ByteaArray{[]byte("a"), {}, {0, 0xff, '"', ','}, long}, [][]byte{[]byte("a"), {}, {0, 0xff, '"', ','}, long}},
		{"bytea null element", "bytea[]", dedup.ByteaArray{[]byte("a"), nil}, [][]byte{[]byte("a"), nil}},
		{"bytea empty", "bytea[]", dedup.ByteaArray{}, [][]byte{}},
		{"bytea nil", "bytea[]", dedup.ByteaArray(nil), [][]byte(nil)},
		{"int8", "bigint[]", dedup.Int8Array{0, -1, math.MaxInt64, math.MinInt64, 42}, []int64{0, -1, math.MaxInt64, math.MinInt64, 42}},
		{"int8 empty", "bigint[]", dedup.Int8Array{}, []int64{}},
		{"int8 nil", "bigint[]", dedup.Int8Array(nil), []int64(nil)},
		{"int2", "smallint[]", dedup.Int2Array{0, 1, -1, math.MaxInt16, math.MinInt16}, []int16{0, 1, -1, math.MaxInt16, math.MinInt16}},
		{"int2 empty", "smallint[]", dedup.Int2Array{}, []int16{}},
		{"tid", "tid[]", dedup.TIDArray{tid(0, 1), tid(math.MaxUint32, math.MaxUint16), tid(7, 3)}, []pgtype.TID{tid(0, 1), tid(math.MaxUint32, math.MaxUint16), tid(7, 3)}},
		{"tid null element", "tid[]", dedup.TIDArray{tid(1, 1), {}}, []pgtype.TID{tid(1, 1), {}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := "SELECT $1::" + c.cast + "::text, $2::" + c.cast + "::text, $1::" + c.cast + " IS NOT DISTINCT FROM $2::" + c.cast
			var fast, plain *string
			var same bool
			if err := s.Pool().QueryRow(ctx, q, c.fast, c.plain).Scan(&fast, &plain, &same); err != nil {
				t.Fatal(err)
			}
			if !same || (fast == nil) != (plain == nil) || fast != nil && *fast != *plain {
				t.Fatalf("dam's encoding reads as %v, pgx's as %v", deref(fast), deref(plain))
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	if len(*s) > 80 {
		return (*s)[:80] + "..."
	}
	return *s
}

// TestNewStoreExecModes: a Store built by NewStore on the caller's own
// pool (the library use; the pool has none of registerArrays' codecs)
// decides in the exec and simple_protocol query exec modes
// (pgbouncer's transaction pooling), where pgx needs an encode plan for
// the decide's named array types without dam's codecs: without one every
// Decide fails and the partition never advances.
func TestNewStoreExecModes(t *testing.T) {
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			pool, err := pgxpool.New(context.Background(), pgtest.DSN(t)+"&default_query_exec_mode="+mode)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			s := dedup.NewStore(pool)
			p, epoch := partition(t, s, "in")
			got := decideAll(t, s, "svc", p, epoch, []rec{{"a", "1"}, {"b", "1"}, {"a", "1"}, {"a", "2"}}, 2)
			if want := []dedup.Decision{F, F, D, F}; !slices.Equal(got, want) {
				t.Fatalf("got %v, want %v", got, want)
			}
		})
	}
}
