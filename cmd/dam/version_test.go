package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// What the release build stamps wins; the toolchain's build information
// fills the rest; "dev" and "unknown" remain when nothing is known.
func TestFromBuildInfo(t *testing.T) {
	info := func(mainVersion string, settings ...string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/dam-dedup/dam", Version: mainVersion}}
			for i := 0; i+1 < len(settings); i += 2 {
				bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
			}
			return bi, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	for _, tc := range []struct {
		name         string
		v, c, d      string
		read         func() (*debug.BuildInfo, bool)
		wantV, wantC string
		wantD        string
	}{
		{"stamped", "0.1.0", "abc", "2026-11-24T13:00:00Z", info("v9.9.9", "vcs.revision", "def", "vcs.time", "2000-01-01T00:00:00Z"),
			"0.1.0", "abc", "2026-11-24T13:00:00Z"},
		{"go install @v0.1.0", "dev", "", "", info("v0.1.0"), "v0.1.0", unknown, unknown},
		{"go build in a checkout", "dev", "", "", info("(devel)", "vcs.revision", "def", "vcs.time", "2026-11-24T13:00:00Z"),
			"dev", "def", "2026-11-24T13:00:00Z"},
		{"go build -buildvcs=false", "dev", "", "", info("(devel)"), "dev", unknown, unknown},
		{"no build information", "dev", "", "", none, "dev", unknown, unknown},
	} {
		v, c, d := fromBuildInfo(tc.v, tc.c, tc.d, tc.read)
		if v != tc.wantV || c != tc.wantC || d != tc.wantD {
			t.Errorf("%s: %q %q %q, want %q %q %q", tc.name, v, c, d, tc.wantV, tc.wantC, tc.wantD)
		}
	}
}

func TestVersionCommand(t *testing.T) {
	var stdout, stderr strings.Builder
	if code := run([]string{"version"}, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("dam version: %d %q", code, stderr.String())
	}
	want := fmt.Sprintf("dam %s (commit %s, %s) %s %s/%s\n", version, commit, date, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if stdout.String() != want {
		t.Fatalf("dam version: %q, want %q", stdout.String(), want)
	}
	if code := run([]string{"version", "extra"}, strings.NewReader(""), &stdout, &stderr); code != 2 {
		t.Fatalf("dam version extra: exit %d, want 2", code)
	}
}
