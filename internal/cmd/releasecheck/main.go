// Command releasecheck checks what `make release-snapshot` (goreleaser)
// left in dist/, as a user of the release would find it:
//
//   - one tar.gz archive per platform (linux and darwin, amd64 and arm64),
//     named dam_<version>_<os>_<arch>.tar.gz, and no other archive;
//   - the checksums file lists every archive and SBOM with its SHA-256, and
//     every file it lists has that SHA-256;
//   - each archive holds the dam binary, README.md, CHANGELOG.md and
//     LICENSE; the binary is for the archive's platform, static
//     (CGO_ENABLED=0), built with -trimpath, and stamped with the version
//     and the commit;
//   - each archive has its SPDX SBOM (<archive>.sbom.json) naming dam's
//     module, unless -sbom=false;
//   - the binary of the platform this runs on prints that version, commit
//     and a date with `dam version`.
//
// The version and commit are dist/metadata.json's; the commit must be the
// checkout's HEAD. It prints what it checked and exits non-zero on the
// first archive or file that is wrong.
package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"
)

// platforms are the release's targets (.goreleaser.yaml).
var platforms = []platform{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}}

type platform struct{ os, arch string }

func (p platform) String() string { return p.os + "/" + p.arch }

// mainPath is the package the binary must be built from.
var mainPath = "github.com/dam-dedup/dam/cmd/dam"

// required are the files every archive holds beside the binary.
var required = []string{"README.md", "CHANGELOG.md", "LICENSE"}

func main() {
	dist := flag.String("dist", "dist", "goreleaser's dist directory")
	sbom := flag.Bool("sbom", true, "require an SBOM per archive")
	head := flag.String("commit", "", "the commit the release must be stamped with (default: git rev-parse HEAD)")
	flag.Parse()
	if *head == "" {
		out, err := exec.Command("git", "rev-parse", "HEAD").Output()
		if err != nil {
			fail(fmt.Errorf("git rev-parse HEAD: %w", err))
		}
		*head = strings.TrimSpace(string(out))
	}
	if err := check(os.Stdout, *dist, *head, *sbom); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "releasecheck:", err)
	os.Exit(1)
}

// metadata is the part of goreleaser's dist/metadata.json checked here.
type metadata struct {
	ProjectName string `json:"project_name"`
	Version     string `json:"version"`
	Commit      string `json:"commit"`
}

// check checks dist against the commit head and reports to w.
func check(w io.Writer, dist, head string, sbom bool) error {
	var md metadata
	b, err := os.ReadFile(filepath.Join(dist, "metadata.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &md); err != nil {
		return fmt.Errorf("metadata.json: %w", err)
	}
	if md.Commit != head {
		return fmt.Errorf("metadata.json: commit %q, want HEAD %s (goreleaser reads it with git; it says \"none\" when git fails)", md.Commit, head)
	}
	if md.Version == "" {
		return errors.New("metadata.json: no version")
	}
	fmt.Fprintf(w, "release %s at commit %s\n", md.Version, md.Commit)

	var want []string
	for _, p := range platforms {
		want = append(want, fmt.Sprintf("dam_%s_%s_%s.tar.gz", md.Version, p.os, p.arch))
	}
	got, err := filepath.Glob(filepath.Join(dist, "*.tar.gz"))
	if err != nil {
		return err
	}
	for i := range got {
		got[i] = filepath.Base(got[i])
	}
	slices.Sort(got)
	if sorted := slices.Sorted(slices.Values(want)); !slices.Equal(got, sorted) {
		return fmt.Errorf("archives in %s: %q, want %q", dist, got, sorted)
	}

	sums, err := readChecksums(filepath.Join(dist, fmt.Sprintf("dam_%s_checksums.txt", md.Version)))
	if err != nil {
		return err
	}
	for name, sum := range sums {
		if err := checkSum(filepath.Join(dist, name), sum); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "checksums: %d files, every SHA-256 matches\n", len(sums))

	for i, p := range platforms {
		archive := filepath.Join(dist, want[i])
		if _, ok := sums[want[i]]; !ok {
			return fmt.Errorf("%s: not in the checksums file", want[i])
		}
		bin, err := readArchive(archive)
		if err != nil {
			return err
		}
		if err := checkBinary(bin, p, md.Version, md.Commit); err != nil {
			return fmt.Errorf("%s: dam: %w", want[i], err)
		}
		note := ", " + strings.Join(required, ", ")
		if sbom {
			doc := want[i] + ".sbom.json"
			if err := checkSBOM(filepath.Join(dist, doc)); err != nil {
				return err
			}
			if _, ok := sums[doc]; !ok {
				return fmt.Errorf("%s: not in the checksums file", doc)
			}
			note += ", SBOM " + doc
		}
		fmt.Fprintf(w, "%s: dam for %s, static, -trimpath, stamped %s%s\n", want[i], p, md.Version, note)
		if p.os == runtime.GOOS && p.arch == runtime.GOARCH {
			out, err := runVersion(bin)
			if err != nil {
				return fmt.Errorf("%s: dam version: %w", want[i], err)
			}
			if err := checkVersionOutput(out, md.Version, md.Commit); err != nil {
				return fmt.Errorf("%s: %w", want[i], err)
			}
			fmt.Fprintf(w, "%s: dam version: %s", want[i], out)
		}
	}
	return nil
}

// readChecksums reads a sha256sum-style file: "<hex>  <name>" per line.
func readChecksums(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 2*sha256.Size || name == "" {
			return nil, fmt.Errorf("%s: bad line %q", path, sc.Text())
		}
		sums[name] = sum
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(sums) == 0 {
		return nil, fmt.Errorf("%s: empty", path)
	}
	return sums, nil
}

func checkSum(path, want string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s: SHA-256 %s, the checksums file says %s", filepath.Base(path), got, want)
	}
	return nil
}

// readArchive returns the dam binary of a tar.gz archive; it fails when a
// required file is missing.
func readArchive(path string) (bin []byte, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	tr := tar.NewReader(zr)
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		seen[h.Name] = true
		if h.Name == "dam" {
			if h.Mode&0o111 == 0 {
				return nil, fmt.Errorf("%s: dam is not executable (mode %o)", path, h.Mode)
			}
			if bin, err = io.ReadAll(tr); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
		}
	}
	for _, name := range append([]string{"dam"}, required...) {
		if !seen[name] {
			return nil, fmt.Errorf("%s: no %s at the top of the archive", filepath.Base(path), name)
		}
	}
	return bin, nil
}

// checkBinary reads the Go build information of bin: its platform, cgo
// off, -trimpath; and finds the stamped version and commit in its data.
func checkBinary(bin []byte, p platform, version, commit string) error {
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("no Go build information: %w", err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	for key, want := range map[string]string{"GOOS": p.os, "GOARCH": p.arch, "CGO_ENABLED": "0", "-trimpath": "true"} {
		if settings[key] != want {
			return fmt.Errorf("built with %s=%q, want %q", key, settings[key], want)
		}
	}
	if bi.Path != mainPath {
		return fmt.Errorf("built from %s, want %s", bi.Path, mainPath)
	}
	for what, s := range map[string]string{"version": version, "commit": commit} {
		if !bytes.Contains(bin, []byte(s)) {
			return fmt.Errorf("the %s %q is not stamped in it", what, s)
		}
	}
	return nil
}

// spdx is the part of an SPDX JSON document checked here.
type spdx struct {
	SPDXVersion string `json:"spdxVersion"`
	Packages    []struct {
		Name string `json:"name"`
	} `json:"packages"`
}

func checkSBOM(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("SBOM: %w", err)
	}
	var doc spdx
	if err := json.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	if !strings.HasPrefix(doc.SPDXVersion, "SPDX-") {
		return fmt.Errorf("%s: not an SPDX document (spdxVersion %q)", filepath.Base(path), doc.SPDXVersion)
	}
	for _, p := range doc.Packages {
		if p.Name == "github.com/dam-dedup/dam" {
			return nil
		}
	}
	return fmt.Errorf("%s: no package github.com/dam-dedup/dam among %d", filepath.Base(path), len(doc.Packages))
}

// runVersion writes bin to a temporary file and runs `dam version`.
func runVersion(bin []byte) (string, error) {
	dir, err := os.MkdirTemp("", "releasecheck")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "dam")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		return "", err
	}
	out, err := exec.Command(path, "version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, out)
	}
	return string(out), nil
}

// versionLine is `dam version`'s output (cmd/dam/version.go).
var versionLine = regexp.MustCompile(`^dam (\S+) \(commit (\S+), (\S+)\) go\S+ \S+/\S+\n$`)

// checkVersionOutput checks that `dam version` printed version, commit
// and an RFC 3339 date.
func checkVersionOutput(out, version, commit string) error {
	m := versionLine.FindStringSubmatch(out)
	if m == nil {
		return fmt.Errorf("dam version printed %q, not \"dam VERSION (commit SHA, DATE) GO OS/ARCH\"", out)
	}
	if m[1] != version || m[2] != commit {
		return fmt.Errorf("dam version printed version %q commit %q, want %q %q", m[1], m[2], version, commit)
	}
	if _, err := time.Parse(time.RFC3339, m[3]); err != nil {
		return fmt.Errorf("dam version printed the date %q: %w", m[3], err)
	}
	return nil
}
