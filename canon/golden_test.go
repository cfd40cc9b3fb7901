package canon

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// goldenFill adds the results of new golden documents (lines without one).
// It never changes an existing result: a changed digest is a failure.
var goldenFill = flag.Bool("golden.fill", false, "write the results of digests.txt lines that have none")

const goldenPath = "testdata/digests.txt"

// goldenErrs names the sentinels in digests.txt.
var goldenErrs = map[string]error{
	"syntax":           ErrSyntax,
	"invalid-utf8":     ErrInvalidUTF8,
	"duplicate-member": ErrDuplicateMember,
	"too-deep":         ErrTooDeep,
	"too-large":        ErrTooLarge,
	"trailing-data":    ErrTrailingData,
}

// goldenLine is one document of digests.txt and its pinned result.
type goldenLine struct {
	n      int    // line number
	doc    []byte // nil: a tombstone
	result string // hex digest or "error NAME OFFSET"; "" until filled
}

// goldenBlock is a "hasher" line and the documents hashed under it.
type goldenBlock struct {
	n     int
	spec  string
	opts  []Option
	lines []goldenLine
}

// hasher returns the block's "hasher" line.
func (b goldenBlock) hasher() string { return strings.TrimSpace("hasher " + b.spec) }

// parseHasherSpec parses the options of a "hasher" line:
// ignore=PTR (repeatable), max_depth=N, max_size=N, format=json|bytes.
func parseHasherSpec(spec string) ([]Option, error) {
	var opts []Option
	for _, f := range strings.Fields(spec) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("option %q: want key=value", f)
		}
		switch k {
		case "ignore":
			opts = append(opts, WithIgnore(v))
		case "max_depth", "max_size":
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, fmt.Errorf("option %q: %v", f, err)
			}
			if k == "max_depth" {
				opts = append(opts, WithMaxDepth(n))
			} else {
				opts = append(opts, WithMaxSize(n))
			}
		case "format":
			fm, err := ParseFormat(v)
			if err != nil {
				return nil, err
			}
			opts = append(opts, WithFormat(fm))
		default:
			return nil, fmt.Errorf("unknown option %q", k)
		}
	}
	return opts, nil
}

func readGolden(t *testing.T) (blocks []goldenBlock, raw []string) {
	t.Helper()
	f, err := os.Open(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		raw = append(raw, line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case line == "hasher" || strings.HasPrefix(line, "hasher "):
			spec := strings.TrimSpace(strings.TrimPrefix(line, "hasher"))
			opts, err := parseHasherSpec(spec)
			if err != nil {
				t.Fatalf("%s:%d: %v", goldenPath, n, err)
			}
			blocks = append(blocks, goldenBlock{n: n, spec: spec, opts: opts})
		default:
			if len(blocks) == 0 {
				t.Fatalf("%s:%d: document before the first hasher line", goldenPath, n)
			}
			var gl goldenLine
			gl.n = n
			rest := line
			if strings.HasPrefix(line, "nil") {
				rest = line[3:]
			} else {
				q, err := strconv.QuotedPrefix(line)
				if err != nil {
					t.Fatalf("%s:%d: want a Go-quoted document or nil: %v", goldenPath, n, err)
				}
				s, _ := strconv.Unquote(q)
				gl.doc = []byte(s)
				rest = line[len(q):]
			}
			gl.result = strings.TrimSpace(rest)
			b := &blocks[len(blocks)-1]
			b.lines = append(b.lines, gl)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks, raw
}

// goldenResult is what digests.txt pins for a Sum result.
func goldenResult(d Digest, err error) string {
	if err == nil {
		return d.String()
	}
	var e *Error
	if !errors.As(err, &e) {
		return "unexpected " + err.Error()
	}
	for name, s := range goldenErrs {
		if e.Err == s {
			return fmt.Sprintf("error %s %d", name, e.Offset)
		}
	}
	return "unexpected " + err.Error()
}

// TestGoldenDigests pins the digests (and the validity) of the documents
// in testdata/digests.txt. Every digest dam has ever stored must hash the
// same forever: a changed digest makes every identity's next record look
// changed, and a changed encoding could make different contents collide
// across versions. Each block is hashed twice: through one Hasher shared
// by its documents in order (the shape predictions of earlier documents
// apply to later ones) and through a fresh Hasher per document.
func TestGoldenDigests(t *testing.T) {
	blocks, raw := readGolden(t)
	docs, filled := 0, 0
	for _, b := range blocks {
		shared := mustNew(t, b.opts...)
		for i := range b.lines {
			gl := &b.lines[i]
			docs++
			got := goldenResult(shared.Sum(gl.doc))
			fresh := goldenResult(mustNew(t, b.opts...).Sum(gl.doc))
			if got != fresh {
				t.Errorf("%s:%d (%s): %s after the block's earlier documents, %s from a fresh hasher",
					goldenPath, gl.n, b.hasher(), got, fresh)
			}
			if gl.result == "" {
				if !*goldenFill {
					t.Errorf("%s:%d: no result: run go test ./canon -run TestGoldenDigests -golden.fill to add it", goldenPath, gl.n)
					continue
				}
				raw[gl.n-1] += "  " + fresh
				filled++
				continue
			}
			if fresh != gl.result || got != gl.result {
				t.Errorf("%s:%d (%s): document %.80q\n\tgot  %s\n\twant %s\n"+
					"A stored digest must never change: dam compares every new record with digests stored "+
					"by earlier versions. Revert the change of encoding or validity; a new encoding needs "+
					"a new scheme byte (a new Scheme in digest.go), never a new digest under scheme 1.",
					goldenPath, gl.n, b.hasher(), gl.doc, fresh, gl.result)
			}
		}
	}
	// Reading values in the same pass never changes a digest.
	for _, b := range blocks {
		h := mustNew(t, append(b.opts, WithValues("/id"))...)
		for _, gl := range b.lines {
			if gl.result == "" || gl.doc == nil {
				continue
			}
			var vals [1]Value
			d, _, err := h.SumValues(gl.doc, nil, vals[:])
			// On a bytes route a value needs a JSON record: the others err.
			if errors.Is(err, ErrNoValue) || err != nil && h.Format() == FormatBytes {
				continue
			}
			if got := goldenResult(d, err); got != gl.result {
				t.Errorf("%s:%d (%s, value /id): SumValues gives %s, want %s", goldenPath, gl.n, b.hasher(), got, gl.result)
			}
		}
	}
	if filled > 0 {
		if err := os.WriteFile(goldenPath, []byte(strings.Join(raw, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("filled %d results in %s", filled, goldenPath)
	}
	if docs < 200 {
		t.Fatalf("%s holds %d documents, want at least 200", goldenPath, docs)
	}
}
