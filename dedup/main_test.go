package dedup_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
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

// lockTimeout reports whether err is an operation that waited past
// lock_timeout behind others, or past statement_timeout over several such
// waits: ErrUnavailable, which the pipeline retries, and so do the tests
// that run deciders beside each other and beside maintenance (under
// -race, with every package's tests at once, such waits happen now and
// then). A deadlock (40P01) that reaches the caller, or a Decide that gave
// up after losing too many races, is not excused.
func lockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	ok := errors.Is(err, dedup.ErrUnavailable) && errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "57014")
	if ok {
		timeouts[pgErr.Code].Add(1)
	}
	return ok
}

// timeouts counts the waits lockTimeout excused, by SQLSTATE, for the log.
var timeouts = map[string]*atomic.Int64{"55P03": {}, "57014": {}}

// The decisions, short, for the tables of expected decisions.
const (
	F = dedup.Forward
	D = dedup.Duplicate
	I = dedup.Invalid
)

// t0 is the decision time the mode tests start from: the clock is passed
// explicitly (Batch.Now), so boundaries are exact to the microsecond.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// vrec is a record of the mode tests: an identity, a content and, in
// version mode, a version.
type vrec struct {
	id      string
	content string
	version int64
}

// stream decides batches of one partition under one rule.
type stream struct {
	t     testing.TB
	s     *dedup.Store
	p     dedup.Partition
	epoch int64
	next  int64
	rule  dedup.Rule
	svc   string
}

// newStream returns a stream of service "svc" on a fresh partition named
// name.
func newStream(t testing.TB, s *dedup.Store, name string, rule dedup.Rule) *stream {
	p, epoch := partition(t, s, name)
	return &stream{t: t, s: s, p: p, epoch: epoch, rule: rule, svc: "svc"}
}

// decide decides recs as one batch at now (zero: the database's clock).
func (st *stream) decide(now time.Time, recs ...vrec) []dedup.Decision {
	st.t.Helper()
	b := &dedup.Batch{Service: st.svc, Partition: st.p, Epoch: st.epoch, Rule: st.rule, Now: now,
		Start: st.next, End: st.next + int64(len(recs))}
	for i, r := range recs {
		b.Records = append(b.Records, dedup.Record{Offset: st.next + int64(i), Entity: []byte(r.id),
			Digest: digest(r.content), Version: r.version, Invalid: r.content == ""})
	}
	got, err := st.s.Decide(context.Background(), b, nil)
	if err != nil {
		st.t.Fatalf("Decide at %v: %v", now, err)
	}
	st.next = b.End
	return got
}

// us is the clock's resolution in PostgreSQL (timestamptz).
const us = time.Microsecond

// decided is the outcome of a Decide run in the background.
type decided struct {
	got []dedup.Decision
	err error
}

// decideBlocked starts Decide of b and returns once it waits for
// transaction xid (what names the transaction in a failure), failing if
// it returns first or never waits; its outcome arrives on the channel.
func decideBlocked(ctx context.Context, t *testing.T, s *dedup.Store, b *dedup.Batch, xid, what string) <-chan decided {
	t.Helper()
	done := make(chan decided, 1)
	go func() {
		got, err := s.Decide(ctx, b, nil)
		done <- decided{got, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !waitsFor(ctx, t, s, xid) {
		select {
		case r := <-done:
			t.Fatalf("Decide returned %v, %v without waiting for %s", r.got, r.err, what)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("Decide never waited for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return done
}

// waitsFor reports whether a session waits for transaction xid (on Citus:
// for any lock, gathered from the workers).
func waitsFor(ctx context.Context, t *testing.T, s *dedup.Store, xid string) bool {
	t.Helper()
	if distributed(t, s) {
		return waiting(ctx, t, s)
	}
	var w bool
	if err := s.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks
		WHERE NOT granted AND locktype = 'transactionid' AND transactionid::text = $1)`, xid).Scan(&w); err != nil {
		t.Fatal(err)
	}
	return w
}

// errRollback is the error a test's transaction returns to roll back on
// purpose.
var errRollback = errors.New("rolled back on purpose")
