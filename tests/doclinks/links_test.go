package doclinks

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRepositoryLinks checks every link of the repository's Markdown files,
// and every reference into the documentation from its code and chart files.
func TestRepositoryLinks(t *testing.T) {
	root := repoRoot(t)
	files := repoFiles(t, root)
	var md int
	for _, f := range files {
		if isMarkdown(f) && !skipped(f) {
			md++
		}
	}
	if md < 2 {
		t.Fatalf("found %d Markdown files under %s: the file list is wrong", md, root)
	}
	problems, err := Check(root, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s", p)
	}
	t.Logf("checked the links of %d Markdown files and the references of the code files among %d files", md, len(files))
}

// TestCheckFixtures proves that Check finds each kind of broken link: every
// tree under testdata/broken holds one, and its WANT file the problems Check
// must report, exactly, one per line; testdata/good holds every kind of
// link that resolves, and Check must report nothing there.
func TestCheckFixtures(t *testing.T) {
	trees := []string{"good"}
	broken, err := os.ReadDir(filepath.Join("testdata", "broken"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range broken {
		trees = append(trees, "broken/"+d.Name())
	}
	if len(trees) < 10 {
		t.Fatalf("only %d fixture trees", len(trees))
	}
	for _, tree := range trees {
		t.Run(tree, func(t *testing.T) {
			root := filepath.Join("testdata", filepath.FromSlash(tree))
			var want []string
			if strings.HasPrefix(tree, "broken/") {
				b, err := os.ReadFile(filepath.Join(root, "WANT"))
				if err != nil {
					t.Fatalf("a broken tree needs a WANT file: %v", err)
				}
				want = strings.Split(strings.TrimSpace(string(b)), "\n")
			}
			problems, err := Check(root, walk(t, root))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range problems {
				got = append(got, p.String())
			}
			if !slices.Equal(got, want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

func TestSlug(t *testing.T) {
	tests := []struct{ heading, want string }{
		{"Delivery guarantees", "delivery-guarantees"},
		{"Check service (`dam serve`)", "check-service-dam-serve"},
		{"Chaos testing (`make chaos`)", "chaos-testing-make-chaos"},
		{"Exactly-once", "exactly-once"},
		{"`kafka.tls.cert_file` / `key_file`", "kafkatlscert_file--key_file"},
		{"What's *new* in **v2.0**?", "whats-new-in-v20"},
		{"_Emphasis_ and snake_case", "emphasis-and-snake_case"},
		{"A [link](https://example.com) inside", "a-link-inside"},
		{"Ünïcode Straße", "ünïcode-straße"},
		{"  Trailing spaces  ", "trailing-spaces"},
	}
	for _, tt := range tests {
		if got := Slug(tt.heading); got != tt.want {
			t.Errorf("Slug(%q) = %q, want %q", tt.heading, got, tt.want)
		}
	}
}

func TestAnchors(t *testing.T) {
	md := "# Title\n\n## Repeated\n\n## Repeated ##\n\n### Repeated\n\nText <a id=\"explicit\"></a> and <span name='named'>.\n\n" +
		"```\n# In a fence\n```\n\n`<a id=\"in-code\">`\n\n    # indented code\n\nSetext\n======\n\n# Repeated-1\n"
	got := Anchors(md)
	for _, want := range []string{"title", "repeated", "repeated-1", "repeated-2", "explicit", "named", "setext", "repeated-1-1"} {
		if !got[want] {
			t.Errorf("anchor %q missing from %v", want, got)
		}
	}
	for _, absent := range []string{"in-a-fence", "in-code", "indented-code"} {
		if got[absent] {
			t.Errorf("anchor %q should not be defined", absent)
		}
	}
}

// repoRoot is the directory holding go.mod, above this package.
func repoRoot(t *testing.T) string {
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// repoFiles lists the files a commit would hold: git's tracked and
// untracked-but-not-ignored files (a page being written counts before it is
// added), regular files only; without git, a walk of the tree.
func repoFiles(t *testing.T, root string) []string {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Logf("git ls-files: %v; walking %s instead", err, root)
		return walk(t, root)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		if fi, err := os.Lstat(filepath.Join(root, filepath.FromSlash(f))); err == nil && fi.Mode().IsRegular() {
			files = append(files, f)
		}
	}
	return files
}

// walk lists the regular files under root, slash-separated and relative to
// it, skipping .git, node_modules and bin.
func walk(t *testing.T, root string) []string {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "bin":
				if p != root {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
