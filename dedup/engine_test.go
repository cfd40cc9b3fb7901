package dedup_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dam-dedup/dam/dedup"
)

// A worker lost in the middle of a statement reaches dam through the Citus
// coordinator as internal_error or io_error (seen when a worker restarts
// under load): transient on Citus, where they halted partitions before;
// an internal error of one server still needs a person.
func TestClassifyRemoteFailures(t *testing.T) {
	t.Parallel()
	cases := []struct {
		code        string
		distributed bool
		transient   bool
	}{
		{"XX000", true, true},   // "server closed the connection unexpectedly", relayed
		{"58030", true, true},   // "failed to COPY to shard ..."
		{"08006", true, true},   // "connection to the remote node ... failed"
		{"XX000", false, false}, // one server: a bug or corruption
		{"58030", false, false},
		{"23505", true, false},
		{"22021", true, false}, // bad input stays a record's error
	}
	for _, tc := range cases {
		err := dedup.Classify(tc.distributed, &pgconn.PgError{Code: tc.code})
		if got := errors.Is(err, dedup.ErrUnavailable); got != tc.transient {
			t.Errorf("%s distributed=%v: unavailable %v, want %v (%v)", tc.code, tc.distributed, got, tc.transient, err)
		}
	}
}
