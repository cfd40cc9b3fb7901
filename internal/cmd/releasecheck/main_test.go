package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const (
	testVersion = "1.2.3-snapshot-0123abc"
	testCommit  = "0123abc0123abc0123abc0123abc0123abc0123a"
)

// buildFake builds testdata/fakedam for this platform as the release
// builds dam, changed by extra go build arguments.
func buildFake(t *testing.T, dir string, env []string, args ...string) []byte {
	t.Helper()
	out := filepath.Join(dir, "fakedam")
	ldflags := fmt.Sprintf("-X main.version=%s -X main.commit=%s -X main.date=2026-11-24T13:00:00Z", testVersion, testCommit)
	cmd := exec.Command("go", append(append([]string{"build", "-o", out, "-ldflags", ldflags}, args...), "./testdata/fakedam")...)
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// release is a dist directory's content, to be written by write.
type release struct {
	commit  string
	files   map[string][]byte // archive members
	extra   map[string][]byte // other files of dist
	sbom    string
	badSum  bool
	skipSum string // a file the checksums file leaves out
}

func (r release) write(t *testing.T) string {
	t.Helper()
	dist := t.TempDir()
	put := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dist, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("metadata.json", fmt.Appendf(nil, `{"project_name":"dam","version":%q,"commit":%q}`, testVersion, r.commit))
	var archive bytes.Buffer
	zw := gzip.NewWriter(&archive)
	tw := tar.NewWriter(zw)
	for _, name := range []string{"dam", "README.md", "CHANGELOG.md", "LICENSE"} {
		b, ok := r.files[name]
		if !ok {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(b))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("dam_%s_%s_%s.tar.gz", testVersion, runtime.GOOS, runtime.GOARCH)
	put(name, archive.Bytes())
	put(name+".sbom.json", []byte(r.sbom))
	for n, b := range r.extra {
		put(n, b)
	}
	var sums strings.Builder
	for _, n := range []string{name, name + ".sbom.json"} {
		if n == r.skipSum {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(dist, n))
		s := sha256.Sum256(b)
		if r.badSum {
			s[0] ^= 1
		}
		fmt.Fprintf(&sums, "%s  %s\n", hex.EncodeToString(s[:]), n)
	}
	put(fmt.Sprintf("dam_%s_checksums.txt", testVersion), []byte(sums.String()))
	return dist
}

// The check passes a release as goreleaser makes it, and fails each way a
// release can be wrong, naming what is.
func TestCheck(t *testing.T) {
	defer func(p []platform, m string) { platforms, mainPath = p, m }(platforms, mainPath)
	platforms = []platform{{runtime.GOOS, runtime.GOARCH}}
	mainPath = "github.com/dam-dedup/dam/internal/cmd/releasecheck/testdata/fakedam"
	dir := t.TempDir()
	static := []string{"CGO_ENABLED=0"}
	good := buildFake(t, dir, static, "-trimpath")
	const sbom = `{"spdxVersion":"SPDX-2.3","packages":[{"name":"github.com/dam-dedup/dam"}]}`
	base := func() release {
		return release{commit: testCommit, sbom: sbom,
			files: map[string][]byte{"dam": good, "README.md": []byte("# dam"), "CHANGELOG.md": []byte("# Changelog"), "LICENSE": []byte("Apache")}}
	}

	var out strings.Builder
	if err := check(&out, base().write(t), testCommit, true); err != nil {
		t.Fatalf("a good release: %v", err)
	}
	for _, want := range []string{"checksums: 2 files", "static, -trimpath, stamped " + testVersion + ", README.md, CHANGELOG.md, LICENSE, SBOM",
		"dam version: dam " + testVersion + " (commit " + testCommit + ", 2026-11-24T13:00:00Z)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}

	for _, tc := range []struct {
		name   string
		change func(*release)
		want   string
	}{
		{"another commit", func(r *release) { r.commit = "none" }, `commit "none", want HEAD`},
		{"no CHANGELOG", func(r *release) { delete(r.files, "CHANGELOG.md") }, "no CHANGELOG.md"},
		{"no LICENSE", func(r *release) { delete(r.files, "LICENSE") }, "no LICENSE"},
		{"no binary", func(r *release) { delete(r.files, "dam") }, "no dam"},
		{"a checksum wrong", func(r *release) { r.badSum = true }, "the checksums file says"},
		{"the SBOM not summed", func(r *release) { r.skipSum = r.sbomName() }, "not in the checksums file"},
		{"an archive too many", func(r *release) { r.extra = map[string][]byte{"dam_old.tar.gz": nil} }, "archives in"},
		{"an SBOM without dam", func(r *release) { r.sbom = `{"spdxVersion":"SPDX-2.3","packages":[]}` }, "no package github.com/dam-dedup/dam"},
		{"not an SBOM", func(r *release) { r.sbom = `{}` }, "not an SPDX document"},
		{"without -trimpath", func(r *release) { r.files["dam"] = buildFake(t, t.TempDir(), static) }, `-trimpath="", want "true"`},
		{"not a Go binary", func(r *release) { r.files["dam"] = []byte("#!/bin/sh\necho dam\n") }, "no Go build information"},
	} {
		r := base()
		tc.change(&r)
		err := check(&strings.Builder{}, r.write(t), testCommit, true)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

func (r release) sbomName() string {
	return fmt.Sprintf("dam_%s_%s_%s.tar.gz.sbom.json", testVersion, runtime.GOOS, runtime.GOARCH)
}

func TestCheckVersionOutput(t *testing.T) {
	for _, tc := range []struct{ out, want string }{
		{"dam 1.0.0 (commit abc, 2026-11-24T13:00:00Z) go1.26.8 linux/amd64\n", ""},
		{"dam dev (commit abc, 2026-11-24T13:00:00Z) go1.26.8 linux/amd64\n", `version "dev"`},
		{"dam 1.0.0 (commit unknown, 2026-11-24T13:00:00Z) go1.26.8 linux/amd64\n", `commit "unknown"`},
		{"dam 1.0.0 (commit abc, unknown) go1.26.8 linux/amd64\n", `the date "unknown"`},
		{"dam 1.0.0 go1.26.8\n", "not \"dam VERSION"},
	} {
		err := checkVersionOutput(tc.out, "1.0.0", "abc")
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.out, err, tc.want)
		}
	}
}
