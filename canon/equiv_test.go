package canon

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

type equivBlock struct {
	line   int
	kind   string // "equal" or "differ"
	ignore []string
	docs   []string
}

func readEquivalence(t *testing.T, path string) []equivBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []equivBlock
	var cur *equivBlock
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
		case line == "":
			cur = nil
		case cur == nil:
			if line != "equal" && line != "differ" {
				t.Fatalf("%s:%d: block must start with equal or differ, not %q", path, n, line)
			}
			blocks = append(blocks, equivBlock{line: n, kind: line})
			cur = &blocks[len(blocks)-1]
		case strings.HasPrefix(line, "ignore:"):
			cur.ignore = strings.Fields(strings.TrimPrefix(line, "ignore:"))
		default:
			cur.docs = append(cur.docs, strings.ReplaceAll(line, "<TAB>", "\t"))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks
}

func TestEquivalenceFile(t *testing.T) {
	blocks := readEquivalence(t, "testdata/equivalence.txt")
	firsts := map[Digest]string{}
	for _, b := range blocks {
		h := mustNew(t, WithIgnore(b.ignore...))
		seen := map[Digest]string{}
		for i, doc := range b.docs {
			d := mustSum(t, h, doc)
			switch b.kind {
			case "equal":
				if i > 0 && d != mustSum(t, h, b.docs[0]) {
					t.Errorf("line %d block: %s and %s hash differently", b.line, b.docs[0], doc)
				}
			case "differ":
				if prev, ok := seen[d]; ok {
					t.Errorf("line %d block: %s and %s hash equal", b.line, prev, doc)
				}
				seen[d] = doc
			}
		}
		if b.kind == "equal" && len(b.ignore) == 0 {
			d := mustSum(t, h, b.docs[0])
			if prev, ok := firsts[d]; ok {
				t.Errorf("line %d block: %s hashes equal to %s of another block", b.line, b.docs[0], prev)
			}
			firsts[d] = b.docs[0]
		}
	}
	if len(blocks) < 20 {
		t.Fatalf("only %d blocks read", len(blocks))
	}
}
