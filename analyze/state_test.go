package analyze

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/pipeline"
)

// TestStateMemoryPerIdentity: an identity's state takes at most
// slotBytes of memory, the figure the identity limit's message and the
// docs give.
func TestStateMemoryPerIdentity(t *testing.T) {
	for _, n := range []int{100_000, 300_000} {
		memoryPerIdentity(t, n)
	}
}

func memoryPerIdentity(t *testing.T, n int) {
	r := config.DefaultRoute()
	r.Service, r.From, r.To = "svc", "t", "out"
	cfg := config.Default()
	cfg.Routes = []config.Route{r}
	if err := cfg.ValidateForAnalyze(); err != nil {
		t.Fatal(err)
	}
	rt, err := pipeline.CompileRoute(cfg.Routes[0])
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]kgo.Record, n)
	for i := range recs {
		recs[i] = kgo.Record{Key: fmt.Appendf(nil, "entity-%07d", i), Value: []byte(`{"v":1}`)}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d := newDecider(rt, Options{TopEntities: -1})
	now := time.Now()
	for i := range recs {
		id := d.identify(&recs[i])
		d.decide(&recs[i], &id, now, nil)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
	t.Logf("%d identities: %.1f bytes each", n, per)
	if per > slotBytes || d.identities != int64(n) {
		t.Fatalf("%.1f bytes an identity (%d identities), want at most %d", per, d.identities, slotBytes)
	}
	runtime.KeepAlive(d)
	runtime.KeepAlive(recs)
}
