package dedup_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pgtest"
)

// TestBreakNewStoreExecModes: a Store built by NewStore on the caller's own
// pool (the library use; the pool has none of registerArrays' codecs) must
// decide in every query exec mode a DSN may choose, as it did before the
// named array types (8fa0737). In the exec and simple_protocol modes
// (pgbouncer's transaction pooling) pgx finds no encode plan for
// dedup.byteaArray, so every Decide fails: the partition never advances.
func TestBreakNewStoreExecModes(t *testing.T) {
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
