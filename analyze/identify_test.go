package analyze_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/analyze"
)

// runSource passes records in runs of size, fixing on its first Read the
// records taken (as every Source does).
type runSource struct {
	recs  []*kgo.Record
	size  int
	taken int // -1 until the first Read ends
}

func (s *runSource) Read(ctx context.Context, _ []string, fn func([]*kgo.Record) (int, error)) error {
	first, n := s.taken < 0, len(s.recs)
	if !first {
		n = s.taken
	}
	for i := 0; i < n; i += s.size {
		took, err := fn(s.recs[i:min(i+s.size, n)])
		if err != nil {
			if first {
				s.taken = i + took
			}
			if err == analyze.ErrStop {
				return nil
			}
			return err
		}
	}
	if first {
		s.taken = n
	}
	return nil
}
func (s *runSource) Rereadable() bool           { return true }
func (s *runSource) Where(r *kgo.Record) string { return fmt.Sprint(r.Offset) }

// A run is identified in parallel and decided in order: the report on
// runs of thousands of records (identified on several goroutines, in
// chunks) is the report on runs of one, whether the analysis reads to
// the end or stops in the middle of a run at the identity limit, its
// what-if runs reading the same records; bad records among them too.
func TestParallelIdentifyDecidesInOrder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	recs := make([]*kgo.Record, 7000)
	for i := range recs {
		e := rng.IntN(900)
		v := fmt.Sprintf(`{"id":%d,"a":%d,"b":%d,"at":%d}`, e, rng.IntN(2), rng.IntN(3), rng.IntN(2))
		if i%97 == 0 {
			v = `{"broken`
		}
		recs[i] = &kgo.Record{Topic: "t", Offset: int64(i), Key: fmt.Appendf(nil, "e%d", e), Value: []byte(v),
			Timestamp: time.Unix(1_700_000_000, 0).Add(time.Duration(i) * time.Second)}
	}
	for _, o := range []analyze.Options{
		{},                   // to the end, churn and what-if runs
		{MaxIdentities: 600}, // stops within a run
		{MaxRecords: 5555},   // likewise
	} {
		one := run(t, &runSource{recs: recs, size: 1, taken: -1}, routeOf(t, nil), o)
		for _, size := range []int{255, 256, 3000, len(recs)} {
			many := run(t, &runSource{recs: recs, size: size, taken: -1}, routeOf(t, nil), o)
			if !reflect.DeepEqual(one, many) {
				t.Fatalf("options %+v: in runs of %d:\n%+v\nin runs of 1:\n%+v", o, size, many, one)
			}
		}
		if o.MaxIdentities > 0 && one.Stopped == "" || one.Routes[0].DeadLetters == 0 || one.Routes[0].Dropped == 0 {
			t.Fatalf("options %+v: the case does not hold what it tests: %+v", o, one)
		}
	}
}
