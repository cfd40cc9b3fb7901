package dedup_test

import (
	"context"
	"crypto/sha256"
	"testing"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// exampleDSN returns a fresh schema for a testable example.
func exampleDSN() string {
	dsn, err := pgtest.Schema()
	if err != nil {
		panic(err)
	}
	return dsn
}

func newStore(t testing.TB) *dedup.Store {
	t.Helper()
	s, err := dedup.Open(context.Background(), pgtest.DSN(t), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// digest returns a JSON-scheme digest standing for content s.
func digest(s string) canon.Digest {
	var d canon.Digest
	d[0] = byte(canon.SchemeJSON1)
	sum := sha256.Sum256([]byte(s))
	copy(d[1:], sum[:])
	return d
}

// partition acquires a fresh partition starting at offset 0.
func partition(t testing.TB, s *dedup.Store, name string) (dedup.Partition, int64) {
	t.Helper()
	p := dedup.Partition{Group: "g", Topic: name, Partition: 0}
	pr, err := s.Acquire(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if !pr.HasNext {
		if err := s.InitProgress(context.Background(), p, pr.Epoch, 0); err != nil {
			t.Fatal(err)
		}
	}
	return p, pr.Epoch
}

type rec struct {
	entity  string
	content string // "" marks an invalid record
}

// decideAll decides recs as one stream in batches of size n and returns
// the decisions.
func decideAll(t testing.TB, s *dedup.Store, service string, p dedup.Partition, epoch int64, recs []rec, n int) []dedup.Decision {
	t.Helper()
	var all, out []dedup.Decision
	for start := 0; start < len(recs); start += n {
		end := min(start+n, len(recs))
		b := &dedup.Batch{Service: service, Partition: p, Epoch: epoch, Start: int64(start), End: int64(end)}
		for i := start; i < end; i++ {
			r := dedup.Record{Offset: int64(i), Entity: []byte(recs[i].entity)}
			if recs[i].content == "" {
				r.Invalid = true
			} else {
				r.Digest = digest(recs[i].content)
			}
			b.Records = append(b.Records, r)
		}
		var err error
		out, err = s.Decide(context.Background(), b, out)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, out...)
	}
	return all
}

// distributed reports whether s's tables are distributed (the tests run on
// Citus, make test-citus): Decide then claims its identities.
func distributed(t testing.TB, s *dedup.Store) bool {
	t.Helper()
	d, err := s.Distributed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// shapes runs fn once per statement shape of Decide that this server
// runs: on one server its own (SELECT ... FOR UPDATE) and Citus's (claims,
// locking by writing, which plain PostgreSQL runs too); on Citus the
// claims only. shape prepares each store the test opens.
func shapes(t *testing.T, fn func(t *testing.T, shape func(*dedup.Store) *dedup.Store)) {
	t.Run("one-server", func(t *testing.T) {
		t.Parallel()
		fn(t, func(s *dedup.Store) *dedup.Store { return s })
	})
	t.Run("claim", func(t *testing.T) {
		t.Parallel()
		fn(t, func(s *dedup.Store) *dedup.Store { dedup.SetClaims(s); return s })
	})
}

// waiting reports whether a session waits for a lock that another holds:
// on Citus the waits happen on the workers, and citus_lock_waits gathers
// them on the coordinator.
func waiting(ctx context.Context, t testing.TB, s *dedup.Store) bool {
	t.Helper()
	q := `SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted)`
	if distributed(t, s) {
		q = `SELECT EXISTS (SELECT FROM citus_lock_waits)`
	}
	var w bool
	if err := s.Pool().QueryRow(ctx, q).Scan(&w); err != nil {
		t.Fatal(err)
	}
	return w
}
