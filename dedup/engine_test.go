package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
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

// loseWorkerOnce makes the next write to progress on dsn fail as a Citus
// coordinator reports a worker lost in the middle of a statement
// (internal_error), once; the writes after it succeed.
func loseWorkerOnce(t *testing.T, dsn string) (arm func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{
		`CREATE SEQUENCE lose_worker START 2`, // nextval 1: lose it
		`CREATE FUNCTION lose_worker() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('lose_worker') = 1 THEN
				RAISE EXCEPTION 'connection to the remote node lost (the test''s)' USING ERRCODE = 'XX000';
			END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER lose_worker BEFORE INSERT OR UPDATE ON progress FOR EACH ROW EXECUTE FUNCTION lose_worker()`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `SELECT setval('lose_worker', 1, false)`); err != nil {
			t.Fatal(err)
		}
	}
}

// A store opened on Citus knows it before its first statement. Recovery
// (Acquire, InitProgress, BindTopic) runs before any Decide in a fresh
// process: a worker lost under one of them is an outage to wait out
// (ErrUnavailable), not an error that halts the partition for good.
func TestEngineKnownBeforeRecovery(t *testing.T) {
	t.Parallel()
	dsn := pgtest.FakeCitusDSN(t)
	arm := loseWorkerOnce(t, dsn)
	ctx := context.Background()
	ops := []struct {
		name string
		op   func(s *dedup.Store, p dedup.Partition) error
	}{
		{"acquire", func(s *dedup.Store, p dedup.Partition) error {
			_, err := s.Acquire(ctx, p)
			return err
		}},
		{"init progress", func(s *dedup.Store, p dedup.Partition) error {
			prog, err := s.Acquire(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			arm()
			return s.InitProgress(ctx, p, prog.Epoch, 0)
		}},
		{"bind topic", func(s *dedup.Store, p dedup.Partition) error {
			prog, err := s.Acquire(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			arm()
			_, err = s.BindTopic(ctx, p, prog.Epoch, [16]byte{1})
			return err
		}},
	}
	for i, tc := range ops {
		s, err := dedup.Open(ctx, dsn, dedup.Config{})
		if err != nil {
			t.Fatal(err)
		}
		p := dedup.Partition{Group: "g", Topic: "in", Partition: int32(i)}
		if tc.name == "acquire" {
			arm()
		}
		err = tc.op(s, p)
		s.Close()
		if !errors.Is(err, dedup.ErrUnavailable) {
			t.Errorf("%s, a worker lost, on a fresh store on Citus: %v; want %v (retried until the worker is back)", tc.name, err, dedup.ErrUnavailable)
		}
	}
}

// A store that believed its tables local learns the engine again when it
// judges a worker's relayed failure (Store.Transient): the tables were
// distributed under it, and the failure is an outage there.
func TestTransientRelearnsEngine(t *testing.T) {
	t.Parallel()
	dsn := pgtest.FakeCitusDSN(t)
	ctx := context.Background()
	catalog := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	catalog(`DELETE FROM pg_catalog.pg_dist_partition`) // local tables
	s, err := dedup.Open(ctx, dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if dist, err := s.Distributed(ctx); err != nil || dist {
		t.Fatalf("Distributed = %v, %v; want false", dist, err)
	}
	lost := fmt.Errorf("dedup: acquire: %w", &pgconn.PgError{Code: "XX000"})
	if s.Transient(ctx, lost) {
		t.Fatal("an internal error of one server is transient")
	}
	catalog(`INSERT INTO pg_catalog.pg_dist_partition VALUES ('state'), ('progress')`) // `dam migrate` on Citus
	if !s.Transient(ctx, lost) {
		t.Fatal("a worker's relayed failure is not transient once the tables are distributed")
	}
	if dist, _ := s.Distributed(ctx); !dist {
		t.Fatal("the store did not learn that its tables are distributed")
	}
}
