package pipeline

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/sha256x8"
)

// TestClassifyInBatch: a batch's records classified through one
// canon.Batch (as decideBatch does, digests from its Flush) are what
// classify gives each alone, on every kind of route, with bad input mixed
// in: records bad before their value is hashed (no key), after it (an id
// that is null, a version that is not an integer), and the value itself.
func TestClassifyInBatch(t *testing.T) {
	old := sha256x8.Enabled
	sha256x8.Enabled = sha256x8.Supported // lanes wherever this CPU has them
	t.Cleanup(func() { sha256x8.Enabled = old })

	base := func(mode string) config.Route {
		rc := config.Route{Service: "s", From: "in", To: "out", DeadLetter: "dlq", Mode: mode, MaxDepth: 64, MaxSize: 1 << 20}
		if mode == config.ModeWindow {
			rc.Window = time.Hour
		}
		return rc
	}
	key := base(config.ModeLastSeen)
	ptr := base(config.ModeLastSeen)
	ptr.Entity = "/id"
	bytesRoute := base(config.ModeLastSeen)
	bytesRoute.Format = "bytes"
	bytesRoute.Entity = "/id"
	win := base(config.ModeWindow)
	win.IDFrom = "/id"
	ver := base(config.ModeVersion)
	ver.Entity = "/id"
	ign := base(config.ModeLastSeen)
	ign.Ignore = []string{"/ts"}

	var recs []*kgo.Record
	for i := range 200 {
		r := &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i%37)), Offset: int64(i)}
		switch i % 11 {
		case 3:
			r.Key = nil // no entity on a key route
		case 4:
			r.Value = []byte(`{"id":null,"version":1}`) // bad id after hashing
		case 5:
			r.Value = []byte(`{"id":"x","version":1.5}`) // bad version after hashing
		case 6:
			r.Value = []byte(`{"id":"x",`) // invalid JSON
		case 7:
			r.Value = nil // tombstone
		case 8:
			r.Value = []byte(`{"id":"big","pad":"` + strings.Repeat("p", 9000) + `"}`)
		default:
			r.Value = []byte(fmt.Sprintf(`{"ts":%d,"id":"e%d","version":%d,"v":"%s"}`, i, i%37, i, strings.Repeat("ü", i%90)))
		}
		recs = append(recs, r)
	}
	for _, rc := range []config.Route{key, ptr, bytesRoute, win, ver, ign} {
		cfg := config.Config{Routes: []config.Route{rc}}
		_ = cfg.Validate() // fills the parsed sources; kafka and postgres are unset here
		rt, err := compileRoute(cfg.Routes[0])
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("mode %s, entity %q, id_from %q, format %q", rc.Mode, rc.Entity, rc.IDFrom, rc.Format)
		b := rt.hasher.NewBatch()
		for round := range 2 {
			got := make([]dedup.Record, len(recs))
			errs := make([]error, len(recs))
			for i, r := range recs {
				got[i], errs[i] = rt.classifyIn(r, b, i)
			}
			b.Flush(func(i int, d canon.Digest) {
				if !got[i].Invalid {
					got[i].Digest = d
				}
			})
			for i, r := range recs {
				want, werr := rt.classify(r)
				if fmt.Sprint(werr) != fmt.Sprint(errs[i]) || fmt.Sprint(want) != fmt.Sprint(got[i]) {
					t.Fatalf("%s, round %d, record %d: batch %+v %v, alone %+v %v", name, round, i, got[i], errs[i], want, werr)
				}
			}
		}
	}
}
