package pipeline_test

import (
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/pipeline"
)

// TestCompileRouteRule: a compiled route carries its mode's rule, and
// identifies records as the sidecar does (dam explain relies on both).
func TestCompileRouteRule(t *testing.T) {
	win := modeRoute("w", config.ModeWindow)
	win.Sliding = true
	ver := modeRoute("v", config.ModeVersion)
	ref := modeRoute("r", config.ModeLastSeen)
	ref.RefreshAfter = time.Minute
	for _, tc := range []struct {
		rc     config.Route
		want   dedup.Rule
		rec    []string // key, value, header pairs
		ident  string
		ver    int64
		errMsg string
	}{
		{win, dedup.Rule{Mode: dedup.Window, Window: time.Hour, Sliding: true}, []string{"k", `{}`, "Idempotency-Key", "id-1"}, "id-1", 0, ""},
		{win, dedup.Rule{Mode: dedup.Window, Window: time.Hour, Sliding: true}, []string{"k", `{}`}, "", 0, `missing message id: no header "Idempotency-Key"`},
		{ver, dedup.Rule{Mode: dedup.Version}, []string{"k", `{"version":7}`}, "k", 7, ""},
		{ver, dedup.Rule{Mode: dedup.Version}, []string{"k", `{"version":7.0}`}, "", 0, "missing or invalid version at /version: 7.0 is not a 64-bit integer"},
		{ref, dedup.Rule{RefreshAfter: time.Minute}, []string{"k", `{}`}, "k", 0, ""},
	} {
		cfg := config.Config{Routes: []config.Route{tc.rc}}
		_ = cfg.Validate() // fills the route's parsed sources; kafka and postgres are left unset here
		rt, err := pipeline.CompileRoute(cfg.Routes[0])
		if err != nil {
			t.Fatal(err)
		}
		if rt.Rule() != tc.want {
			t.Errorf("%s: Rule() = %+v, want %+v", tc.rc.Service, rt.Rule(), tc.want)
		}
		id, v, _, err := rt.Identify(hrec(tc.rec[0], tc.rec[1], tc.rec[2:]...))
		switch {
		case tc.errMsg != "" && (err == nil || err.Error() != tc.errMsg):
			t.Errorf("%s %v: error %v, want %q", tc.rc.Service, tc.rec, err, tc.errMsg)
		case tc.errMsg == "" && (err != nil || string(id) != tc.ident || v != tc.ver):
			t.Errorf("%s %v: %q %d %v, want %q %d", tc.rc.Service, tc.rec, id, v, err, tc.ident, tc.ver)
		}
	}
}
