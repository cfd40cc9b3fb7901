package analyze

import (
	"hash/maphash"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/dam-dedup/dam/canon"
)

// Churn: for each record a route would forward, which JSON paths changed
// since its identity's previous forwarded record (the content the rule
// compared it with). A record is summarised structurally, as the route
// hashes it: its leaves (scalars, empty objects and arrays) in the
// canonical form (canon.Hasher.AppendCanonical: ignored values left out),
// each as a digest of its path and a digest of its value. Two summaries
// differ at the paths whose leaves differ or exist on one side only.
// Paths are reported as patterns, array indices as "*" (/items/*/price),
// so that they read as ignore pointers.

// leaf is one leaf of a summary: digests of its path and its value, and
// its path's pattern (an index into the route's patterns, or noPattern).
type leaf struct {
	path, value uint64
	pattern     int32
}

// noPattern stands for a pattern beyond maxPatterns.
const noPattern = -1

// Limits of the churn's memory besides Options.SummaryBytes.
const (
	// maxLeaves is the most leaves a record may have to be summarised:
	// a larger record's forward is counted as not compared.
	maxLeaves = 4096
	// maxPatterns is the most distinct path patterns counted per route;
	// further ones are counted together as other paths.
	maxPatterns = 10000
	// summaryOverhead is what a summary takes besides its leaves: its key,
	// its slice header and the map's share.
	summaryOverhead = 64
	// wholeValue is the pattern of a value that is not an object or an
	// array, or a tombstone: the whole value.
	wholeValue = ""
)

// churn is one route's churn: the summaries of its identities' last
// forwarded records and the counts of changed path patterns.
type churn struct {
	hasher   *canon.Hasher
	seed     maphash.Seed
	budget   *int64 // the bytes summaries may still take, shared by the routes
	sums     map[idKey][]leaf
	patterns map[string]int32
	names    []string
	counts   []int64
	stamp    []int64 // the record that last counted each pattern
	seq      int64   // records summarised
	others   int64   // changes at patterns beyond maxPatterns
	refused  int64   // summaries not kept for lack of room in the budget

	// compared: forwards compared with their identity's previous forward;
	// unchanged: among them, those whose summary showed no change (a
	// window or version mode forward of equal content); first: forwards of
	// an identity's first record; notCompared: forwards whose previous
	// summary was not kept (over the budget or too many leaves).
	compared, unchanged, first, notCompared int64

	buf  []byte // canonical text
	walk walker
	next []leaf
}

func newChurn(h *canon.Hasher, budget *int64, seed maphash.Seed) *churn {
	return &churn{hasher: h, seed: seed, budget: budget, sums: map[idKey][]leaf{}, patterns: map[string]int32{}}
}

// forwarded takes a record the rule forwarded, of identity k and value
// value; first says the identity had no state before it.
func (c *churn) forwarded(k idKey, value []byte, first bool) {
	c.seq++
	prev, had := c.sums[k]
	leaves, ok := c.summarise(value)
	switch {
	case first:
		c.first++
	case !had:
		c.notCompared++
	default:
		c.compared++
		if !c.diff(prev, leaves) {
			c.unchanged++
		}
	}
	c.keep(k, prev, had, leaves, ok)
}

// keep stores leaves as k's summary, within the budget; without room (or
// without a summary, !ok) k has none, and its next forward is not
// compared.
func (c *churn) keep(k idKey, prev []leaf, had bool, leaves []leaf, ok bool) {
	if had {
		*c.budget += int64(len(prev))*24 + summaryOverhead
	}
	need := int64(len(leaves))*24 + summaryOverhead
	if !ok || need > *c.budget {
		if ok {
			c.refused++
		}
		if had {
			delete(c.sums, k)
		}
		return
	}
	*c.budget -= need
	if had && cap(prev) >= len(leaves) {
		c.sums[k] = append(prev[:0], leaves...)
		return
	}
	c.sums[k] = slices.Clone(leaves)
}

// summarise returns value's leaves sorted by path digest (valid until the
// next call), or false when the route cannot summarise it (too many
// leaves; the value was valid for Identify, so its canonical form exists).
func (c *churn) summarise(value []byte) ([]leaf, bool) {
	c.next = c.next[:0]
	if value == nil {
		c.next = append(c.next, c.leafOf([]byte(wholeValue), []byte(wholeValue), []byte("\x00tombstone")))
		return c.next, true
	}
	var err error
	c.buf, err = c.hasher.AppendCanonical(c.buf[:0], value)
	if err != nil {
		return nil, false
	}
	ok := c.walk.walk(c.buf, func(path, pattern, v []byte) bool {
		if len(c.next) == maxLeaves {
			return false
		}
		c.next = append(c.next, c.leafOf(path, pattern, v))
		return true
	})
	if !ok {
		return nil, false
	}
	slices.SortFunc(c.next, func(a, b leaf) int {
		switch {
		case a.path < b.path:
			return -1
		case a.path > b.path:
			return 1
		}
		return 0
	})
	return c.next, true
}

func (c *churn) leafOf(path, pattern, value []byte) leaf {
	return leaf{path: maphash.Bytes(c.seed, path), value: maphash.Bytes(c.seed, value), pattern: c.pattern(pattern)}
}

// pattern returns the index of a path pattern, adding it while there is
// room.
func (c *churn) pattern(p []byte) int32 {
	if i, ok := c.patterns[string(p)]; ok {
		return i
	}
	if len(c.names) == maxPatterns {
		return noPattern
	}
	i := int32(len(c.names))
	c.patterns[string(p)] = i
	c.names = append(c.names, string(p))
	c.counts = append(c.counts, 0)
	c.stamp = append(c.stamp, 0)
	return i
}

// diff counts the patterns of the paths where a and b (sorted by path)
// differ, each once for the record, and reports whether any did.
func (c *churn) diff(a, b []leaf) bool {
	changed := false
	count := func(p int32) {
		changed = true
		if p == noPattern {
			c.others++
			return
		}
		if c.stamp[p] != c.seq {
			c.stamp[p] = c.seq
			c.counts[p]++
		}
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || i < len(a) && a[i].path < b[j].path:
			count(a[i].pattern)
			i++
		case i == len(a) || b[j].path < a[i].path:
			count(b[j].pattern)
			j++
		default:
			if a[i].value != b[j].value {
				count(b[j].pattern)
			}
			i++
			j++
		}
	}
	return changed
}

// walker walks the canonical text of a value (valid JSON, as
// canon.Hasher.AppendCanonical writes it) and yields its leaves with
// their RFC 6901 paths and path patterns (indices as "*").
type walker struct {
	path, pattern []byte
	stack         []frame
	name          []byte
}

// frame is an open object or array: where its path and pattern end, and
// the index of its current element.
type frame struct {
	object             bool
	pathLen, patternAt int
	index              int
}

// walk calls leaf for every leaf of text in order; it stops and returns
// false when leaf does.
func (w *walker) walk(text []byte, leaf func(path, pattern, value []byte) bool) bool {
	w.path, w.pattern, w.stack = w.path[:0], w.pattern[:0], w.stack[:0]
	i := skipSpace(text, 0)
	for i < len(text) {
		// A value starts at i.
		switch c := text[i]; c {
		case '{', '[':
			j := skipSpace(text, i+1)
			if j < len(text) && (text[j] == '}' || text[j] == ']') {
				if !leaf(w.path, w.pattern, text[i:j+1]) {
					return false
				}
				i = j + 1
				break
			}
			w.stack = append(w.stack, frame{object: c == '{', pathLen: len(w.path), patternAt: len(w.pattern)})
			i = w.member(text, j)
			continue
		default:
			end := scalarEnd(text, i)
			if !leaf(w.path, w.pattern, text[i:end]) {
				return false
			}
			i = end
		}
		// After a value: a comma, or the ends of containers.
		for {
			i = skipSpace(text, i)
			if len(w.stack) == 0 || i >= len(text) {
				return true
			}
			f := &w.stack[len(w.stack)-1]
			w.path, w.pattern = w.path[:f.pathLen], w.pattern[:f.patternAt]
			if text[i] == ',' {
				f.index++
				i = w.member(text, skipSpace(text, i+1))
				break
			}
			w.stack = w.stack[:len(w.stack)-1] // '}' or ']'
			i++
		}
	}
	return true
}

// member appends the path token of the current frame's next element: at
// i, a member's name and colon, or an array's element; it returns where
// the element's value starts.
func (w *walker) member(text []byte, i int) int {
	f := &w.stack[len(w.stack)-1]
	if !f.object {
		w.path = strconv.AppendInt(append(w.path, '/'), int64(f.index), 10)
		w.pattern = append(w.pattern, "/*"...)
		return skipSpace(text, i)
	}
	end := scalarEnd(text, i)
	w.name = decodeString(w.name[:0], text[i:end])
	w.path = appendToken(append(w.path, '/'), w.name)
	w.pattern = appendToken(append(w.pattern, '/'), w.name)
	i = skipSpace(text, end)
	return skipSpace(text, i+1) // past ':'
}

// appendToken appends name escaped as an RFC 6901 reference token.
func appendToken(dst, name []byte) []byte {
	for _, c := range name {
		switch c {
		case '~':
			dst = append(dst, '~', '0')
		case '/':
			dst = append(dst, '~', '1')
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

func skipSpace(text []byte, i int) int {
	for i < len(text) && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r') {
		i++
	}
	return i
}

// scalarEnd returns the end of the string, number or literal at text[i].
func scalarEnd(text []byte, i int) int {
	if text[i] == '"' {
		for j := i + 1; j < len(text); j++ {
			switch text[j] {
			case '\\':
				j++
			case '"':
				return j + 1
			}
		}
		return len(text)
	}
	j := i
	for j < len(text) {
		switch text[j] {
		case ',', '}', ']', ' ', '\n', '\t', '\r':
			return j
		}
		j++
	}
	return j
}

// decodeString appends the decoded value of a JSON string literal (its
// quotes included) to dst.
func decodeString(dst, lit []byte) []byte {
	if len(lit) < 2 {
		return dst
	}
	s := lit[1 : len(lit)-1]
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			dst = append(dst, c)
			continue
		}
		i++
		switch s[i] {
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'u':
			r, n := hex4(s[i+1:])
			i += n
			if utf16.IsSurrogate(r) && i+2 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
				if r2, n2 := hex4(s[i+3:]); n2 == 4 {
					r = utf16.DecodeRune(r, r2)
					i += 2 + n2
				}
			}
			dst = utf8.AppendRune(dst, r)
		default: // '"', '\\', '/'
			dst = append(dst, s[i])
		}
	}
	return dst
}

// hex4 reads four hex digits; n is how many bytes it took (4, or 0).
func hex4(b []byte) (rune, int) {
	if len(b) < 4 {
		return utf8.RuneError, 0
	}
	n, err := strconv.ParseUint(string(b[:4]), 16, 32)
	if err != nil {
		return utf8.RuneError, 0
	}
	return rune(n), 4
}
