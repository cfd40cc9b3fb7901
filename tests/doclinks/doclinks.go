// Package doclinks checks the links of the repository's documentation, so
// that moving a section cannot silently break one. Its test runs
// Check over the repository in `make test`.
//
// What is checked:
//
//   - in every Markdown file, every link ([text](dest), ![image](dest),
//     reference definitions, autolinks, href= of raw HTML) outside fenced
//     code blocks and code spans: a relative destination must name a file
//     or directory of the tree (not outside it), and a #fragment must name a
//     heading of the target (GitHub's slugs: lower case, spaces to '-',
//     punctuation other than '-' and '_' removed, a repeated heading gets
//     -1, -2, ...) or an explicit <a id=...> or name= anchor; a fragment
//     into a file that is not Markdown must be a line anchor (#L12,
//     #L12-L20). An http(s) link is not fetched, but it must parse with a
//     host;
//   - in code, chart and build files (.go, .yaml, .yml, .tpl, .txt, .json,
//     .sh, Makefile, Dockerfile), every reference into the documentation:
//     the root's README.md or a Markdown page under docs/, with or without
//     a #fragment, resolved from the tree's root, by the same rules.
//
// Files under a testdata directory are fixtures, not documentation, and are
// skipped.
package doclinks

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// Problem is one link that does not resolve.
type Problem struct {
	File   string // slash-separated, relative to the root
	Line   int    // 1-based
	Link   string // the destination as written
	Reason string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", p.File, p.Line, p.Link, p.Reason)
}

// Check checks the links of files (slash-separated paths relative to root,
// every file of the tree: links resolve against this list, so a file not in
// it does not exist) and returns the problems, in file and line order.
func Check(root string, files []string) ([]Problem, error) {
	c := &checker{root: root, files: map[string]bool{}, dirs: map[string]bool{".": true}, anchors: map[string]map[string]bool{}}
	for _, f := range files {
		c.files[f] = true
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			c.dirs[d] = true
		}
	}
	sorted := slices.Clone(files)
	slices.Sort(sorted)
	var problems []Problem
	for _, f := range sorted {
		if skipped(f) {
			continue
		}
		var links []link
		switch {
		case isMarkdown(f):
			src, err := c.read(f)
			if err != nil {
				return nil, err
			}
			links = markdownLinks(src)
		case isCode(f):
			src, err := c.read(f)
			if err != nil {
				return nil, err
			}
			links = codeRefs(src)
		default:
			continue
		}
		for _, l := range links {
			if reason := c.resolve(f, l); reason != "" {
				problems = append(problems, Problem{File: f, Line: l.line, Link: l.dest, Reason: reason})
			}
		}
	}
	return problems, nil
}

// skipped reports whether f is a fixture (under a testdata directory).
func skipped(f string) bool {
	return slices.Contains(strings.Split(path.Dir(f), "/"), "testdata")
}

func isMarkdown(f string) bool { return strings.EqualFold(path.Ext(f), ".md") }

func isCode(f string) bool {
	switch path.Ext(f) {
	case ".go", ".yaml", ".yml", ".tpl", ".txt", ".json", ".sh":
		return true
	}
	switch path.Base(f) {
	case "Makefile", "Dockerfile":
		return true
	}
	return false
}

type checker struct {
	root    string
	files   map[string]bool
	dirs    map[string]bool
	anchors map[string]map[string]bool // Markdown file -> its fragments
}

func (c *checker) read(f string) (string, error) {
	b, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(f)))
	if err != nil {
		return "", fmt.Errorf("doclinks: %w", err)
	}
	return string(b), nil
}

// link is a destination found in a file. fromRoot: it resolves from the
// tree's root (a reference in code) rather than from its file's directory.
type link struct {
	dest     string
	line     int
	fromRoot bool
}

// resolve returns why l, found in file f, does not resolve, or "".
func (c *checker) resolve(f string, l link) string {
	dest := l.dest
	if dest == "" {
		return "empty link"
	}
	if i := strings.IndexAny(dest, ":/?#"); i > 0 && dest[i] == ':' {
		return external(dest)
	}
	target, frag, _ := strings.Cut(dest, "#")
	target, _, _ = strings.Cut(target, "?")
	if target == "" {
		target = f // #fragment: this file
	} else {
		p, err := url.PathUnescape(target)
		if err != nil {
			return fmt.Sprintf("bad escape in path: %v", err)
		}
		switch {
		case strings.HasPrefix(p, "/"): // GitHub: from the repository's root
			p = path.Clean(strings.TrimPrefix(p, "/"))
		case l.fromRoot:
			p = path.Clean(p)
		default:
			p = path.Join(path.Dir(f), p)
		}
		if p == ".." || strings.HasPrefix(p, "../") {
			return "points outside the repository"
		}
		if p == "" {
			p = "."
		}
		target = strings.TrimSuffix(p, "/")
		if !c.files[target] && !c.dirs[target] {
			return fmt.Sprintf("%s does not exist", target)
		}
	}
	if frag == "" {
		return ""
	}
	frag, err := url.PathUnescape(frag)
	if err != nil {
		return fmt.Sprintf("bad escape in fragment: %v", err)
	}
	if !c.files[target] || !isMarkdown(target) {
		if lineAnchor.MatchString(frag) && c.files[target] {
			return ""
		}
		return fmt.Sprintf("#%s: %s is not a Markdown file, only a line anchor (#L12) can point into it", frag, target)
	}
	anchors, err := c.anchorsOf(target)
	if err != nil {
		return err.Error()
	}
	if !anchors[frag] {
		return fmt.Sprintf("#%s: no such heading or anchor in %s", frag, target)
	}
	return ""
}

var lineAnchor = regexp.MustCompile(`^L[0-9]+(-L[0-9]+)?$`)

// external checks a link with a scheme: http(s) must parse with a host.
func external(dest string) string {
	scheme, _, _ := strings.Cut(dest, ":")
	switch strings.ToLower(scheme) {
	case "http", "https":
		u, err := url.Parse(dest)
		if err != nil {
			return fmt.Sprintf("malformed URL: %v", err)
		}
		if u.Host == "" || strings.HasPrefix(u.Host, ".") || strings.HasSuffix(u.Host, ".") {
			return "malformed URL: no host"
		}
		return ""
	case "mailto":
		return ""
	}
	return fmt.Sprintf("unexpected scheme %q (only http, https and mailto)", scheme)
}

func (c *checker) anchorsOf(f string) (map[string]bool, error) {
	if a, ok := c.anchors[f]; ok {
		return a, nil
	}
	src, err := c.read(f)
	if err != nil {
		return nil, err
	}
	a := Anchors(src)
	c.anchors[f] = a
	return a, nil
}

// Anchors returns the fragments a Markdown document defines: the slugs of
// its headings (with GitHub's -1, -2 for repeats) and its explicit
// <... id=...> and <... name=...> anchors.
func Anchors(md string) map[string]bool {
	anchors := map[string]bool{}
	s := slugger{}
	for _, b := range blocks(md) {
		for _, h := range b.headings {
			anchors[s.slug(h)] = true
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(stripCode(b.text), -1) {
			anchors[m[1]] = true
		}
	}
	return anchors
}

var htmlAnchor = regexp.MustCompile(`(?i)<[a-z][^>]*?\s(?:id|name)\s*=\s*["']?([^"'\s>]+)`)

// slugger gives GitHub's heading ids: a repeated slug gets -1, -2, ...
// (github-slugger's rule, which also skips a suffixed id already taken).
type slugger map[string]int

func (s slugger) slug(heading string) string {
	base := Slug(heading)
	id := base
	for {
		if _, taken := s[id]; !taken {
			break
		}
		s[base]++
		id = fmt.Sprintf("%s-%d", base, s[base])
	}
	s[id] = 0
	return id
}

// Slug is GitHub's anchor of a heading's Markdown text: the rendered text
// (code spans' content, links' text, no emphasis or HTML tags), lower
// case, spaces to '-', every character other than a letter, a digit, '-'
// and '_' removed.
func Slug(heading string) string {
	text := headingText(heading)
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var (
	mdLink    = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag   = regexp.MustCompile(`</?[A-Za-z][^>]*>`)
	emphasis  = regexp.MustCompile(`(^|[^A-Za-z0-9])_+|_+([^A-Za-z0-9]|$)`)
	emphStars = strings.NewReplacer("*", "", "~", "")
)

// headingText renders a heading's inline Markdown as plain text.
func headingText(h string) string {
	var out strings.Builder
	for i, part := range splitCode(h) {
		if i%2 == 1 { // a code span: its content, verbatim
			out.WriteString(part)
			continue
		}
		part = mdLink.ReplaceAllString(part, "$1")
		part = htmlTag.ReplaceAllString(part, "")
		part = emphasis.ReplaceAllString(part, "$1$2")
		part = emphStars.Replace(part)
		out.WriteString(part)
	}
	return strings.TrimSpace(out.String())
}

// splitCode splits s into text and code spans, alternating (text, code,
// text, ...): a run of n backticks opens a span that the next run of
// exactly n backticks closes; without one, the backticks are text.
func splitCode(s string) []string {
	var parts []string
	var text strings.Builder
	for i := 0; i < len(s); {
		if s[i] != '`' {
			text.WriteByte(s[i])
			i++
			continue
		}
		n := run(s, i)
		end := -1
		for j := i + n; j < len(s); {
			if s[j] != '`' {
				j++
				continue
			}
			m := run(s, j)
			if m == n {
				end = j
				break
			}
			j += m
		}
		if end < 0 {
			text.WriteString(s[i : i+n])
			i += n
			continue
		}
		parts = append(parts, text.String(), codeContent(s[i+n:end]))
		text.Reset()
		i = end + n
	}
	return append(parts, text.String())
}

func run(s string, i int) int {
	n := 0
	for i+n < len(s) && s[i+n] == '`' {
		n++
	}
	return n
}

// codeContent is a code span's text: line endings become spaces, and one
// space is stripped from each end when both ends have one.
func codeContent(c string) string {
	c = strings.ReplaceAll(c, "\n", " ")
	if len(c) >= 2 && c[0] == ' ' && c[len(c)-1] == ' ' && strings.Trim(c, " ") != "" {
		c = c[1 : len(c)-1]
	}
	return c
}

// stripCode removes the code spans of s, keeping its line count (a span's
// newlines stay), so that what is left can be searched for links.
func stripCode(s string) string {
	var out strings.Builder
	for i, part := range splitCode(s) {
		if i%2 == 1 {
			out.WriteString(strings.Repeat("\n", strings.Count(part, "\n")))
			continue
		}
		out.WriteString(part)
	}
	return out.String()
}

// block is a paragraph-like run of lines outside fenced code (code spans
// may cross its lines, not its ends), with the headings it holds.
type block struct {
	text     string
	line     int // of its first line, 1-based
	headings []string
}

var (
	fence  = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})")
	atx    = regexp.MustCompile(`^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	setext = regexp.MustCompile(`^ {0,3}(?:=+|-+)[ \t]*$`)
)

// blocks splits a Markdown document into blocks: blank lines and fenced
// code blocks (which are dropped) separate them, and an ATX heading is a
// block of its own.
func blocks(md string) []block {
	lines := strings.Split(strings.ReplaceAll(md, "\r\n", "\n"), "\n")
	var out []block
	var cur []string
	start := 0
	flush := func() {
		if len(cur) > 0 {
			out = append(out, block{text: strings.Join(cur, "\n"), line: start})
		}
		cur = nil
	}
	var fenceMark string
	for i, l := range lines {
		n := i + 1
		if fenceMark != "" {
			if m := fence.FindStringSubmatch(l); m != nil && m[1][0] == fenceMark[0] && len(m[1]) >= len(fenceMark) && strings.TrimSpace(l[len(m[0]):]) == "" {
				fenceMark = ""
			}
			continue
		}
		if m := fence.FindStringSubmatch(l); m != nil {
			flush()
			fenceMark = m[1]
			continue
		}
		if strings.TrimSpace(l) == "" {
			flush()
			continue
		}
		if strings.HasPrefix(l, "    ") && len(cur) == 0 {
			continue // indented code
		}
		if m := atx.FindStringSubmatch(l); m != nil {
			flush()
			out = append(out, block{text: l, line: n, headings: []string{m[1]}})
			continue
		}
		if setext.MatchString(l) && len(cur) == 1 && !strings.Contains(cur[0], "|") {
			// "Title\n=====": the block's one line is a heading.
			out = append(out, block{text: cur[0], line: start, headings: []string{strings.TrimSpace(cur[0])}})
			cur = nil
			continue
		}
		if len(cur) == 0 {
			start = n
		}
		cur = append(cur, l)
	}
	flush()
	return out
}

var (
	// inlineLink: the destination of [text](dest "title") or ![alt](dest),
	// with balanced parentheses inside dest, or <dest>.
	inlineLink = regexp.MustCompile(`\]\(\s*(<[^>\n]*>|(?:[^()\s]|\([^()\s]*\))*)(?:\s+(?:"[^"]*"|'[^']*'|\([^)]*\)))?\s*\)`)
	refDef     = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:[ \t]*(<[^>\n]*>|\S+)`)
	autolink   = regexp.MustCompile(`<([A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>]*)>`)
	href       = regexp.MustCompile(`(?i)<[a-z][^>]*?\s(?:href|src)\s*=\s*["']([^"']*)["']`)
)

// markdownLinks returns the links of a Markdown document.
func markdownLinks(md string) []link {
	var links []link
	for _, b := range blocks(md) {
		text := stripCode(b.text)
		for _, re := range []*regexp.Regexp{inlineLink, refDef, autolink, href} {
			for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
				dest := strings.TrimSuffix(strings.TrimPrefix(text[m[2]:m[3]], "<"), ">")
				links = append(links, link{dest: dest, line: b.line + strings.Count(text[:m[2]], "\n")})
			}
		}
	}
	slices.SortStableFunc(links, func(a, b link) int { return a.line - b.line })
	return links
}

// docRef is a reference into the documentation from a file that is not
// Markdown: the root's README.md or a Markdown page under docs/, not part
// of a longer path, with an optional #fragment.
var docRef = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])((?:docs/[A-Za-z0-9_./-]*?|README)\.md(?:#[A-Za-z0-9_-]+)?)`)

// codeRefs returns the references into the documentation of a code file.
func codeRefs(src string) []link {
	var links []link
	for i, l := range strings.Split(src, "\n") {
		for _, m := range docRef.FindAllStringSubmatch(l, -1) {
			links = append(links, link{dest: m[1], line: i + 1, fromRoot: true})
		}
	}
	return links
}
