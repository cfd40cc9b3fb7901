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
