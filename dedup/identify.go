package dedup

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
)

// entityIndex finds an entity among a batch's distinct entities, which
// are in key order: by binary search over a window of 8 bytes of each,
// taken after the prefix they all share (records keyed "entity-0…" or
// "tenant-7:…" differ only after it). A read's rows come back in heap
// order, not key order: each is found so, with no map of the batch's
// keys to build or to hash into.
type entityIndex struct {
	entities [][]byte
	prefix   []byte   // what every entity begins with
	windows  []uint64 // window(entities[i]), in increasing order
}

// window returns the 8 bytes of e after the shared prefix of length lcp,
// big-endian, zero-padded. Windows in increasing order are keys in
// bytes.Compare order, but for equal windows, which bytes.Compare decides
// (a key shorter than the window ties with the same key followed by
// zero bytes).
func window(e []byte, lcp int) uint64 {
	t := e[lcp:]
	if len(t) >= 8 {
		return binary.BigEndian.Uint64(t)
	}
	var w uint64
	for i, c := range t {
		w |= uint64(c) << (56 - 8*i)
	}
	return w
}

// find returns the index of e in the batch's entities, if it is one.
func (x *entityIndex) find(e []byte) (int, bool) {
	if len(x.entities) == 0 || !bytes.HasPrefix(e, x.prefix) {
		return 0, false
	}
	w := window(e, len(x.prefix))
	i := lowerBound(x.windows, w)
	if i == len(x.windows) || x.windows[i] != w {
		return 0, false
	}
	if i+1 == len(x.windows) || x.windows[i+1] != w {
		// The one key with this window (the usual case). Equal windows
		// and lengths are equal keys when the window holds all that
		// follows the prefix.
		c := x.entities[i]
		return i, len(c) == len(e) && (len(e) <= len(x.prefix)+8 || bytes.Equal(c, e))
	}
	// Keys that share their window (which a producer may choose): a
	// binary search of the run by bytes, so that a batch's look-ups stay
	// n log n.
	end := len(x.windows)
	if w != math.MaxUint64 {
		end = lowerBound(x.windows, w+1)
	}
	k, ok := slices.BinarySearchFunc(x.entities[i:end], e, bytes.Compare)
	return i + k, ok
}

// lowerBound returns the index of the first element of a (sorted) not
// below w. The halving step compiles to a conditional move: a row's
// entity is unrelated to the previous row's, so a branch would be
// mispredicted half of the time.
func lowerBound(a []uint64, w uint64) int {
	base, n := 0, len(a)
	for n > 1 {
		half := n / 2
		if a[base+half-1] < w {
			base += half
		}
		n -= half
	}
	if n == 1 && a[base] < w {
		base++
	}
	return base
}

// identify returns the distinct entities of the valid records in key
// order (bytes.Compare, which is bytea's order in PostgreSQL), an index
// of them, and each record's slot: the index of its entity (-1:
// invalid). Key order is the order in which every statement locks or
// writes them, so that concurrent batches wait for each other instead of
// deadlocking; sent sorted, the arrays need no sort on the server either
// (PostgreSQL's sort of an = ANY array returns at once on presorted
// input, where sorting a batch's keys was 4% of its CPU per decided
// record), and the rewrites need none in dam.
//
// The records are sorted by their entity's window (see window), ties by
// the entity's bytes: integers compared, not bytes through a map and a
// comparison function, on a batch of thousands of records.
func identify(recs []Record) (entities [][]byte, index entityIndex, slots []int32) {
	slots = make([]int32, len(recs))
	var first []byte
	lcp, valid := -1, 0
	for k := range recs {
		r := &recs[k]
		if r.Invalid {
			slots[k] = -1
			continue
		}
		valid++
		if lcp < 0 {
			first, lcp = r.Entity, len(r.Entity)
			continue
		}
		lcp = commonPrefix(first[:lcp], r.Entity)
	}
	if valid == 0 {
		return nil, entityIndex{}, slots
	}
	order := make([]keyed, 0, valid)
	for k := range recs {
		if !recs[k].Invalid {
			order = append(order, keyed{window(recs[k].Entity, lcp), int32(k)})
		}
	}
	order = sortWindows(order)
	// Equal windows: the entity's bytes decide (usually the run is one
	// entity's records). A comparison sort, whatever the run's length:
	// a producer choosing keys that share their windows gets n log n.
	for i := 0; i < len(order); {
		j := i + 1
		for j < len(order) && order[j].w == order[i].w {
			j++
		}
		if j-i > 1 {
			run := order[i:j]
			slices.SortStableFunc(run, func(a, b keyed) int {
				return bytes.Compare(recs[a.k].Entity[lcp:], recs[b.k].Entity[lcp:])
			})
		}
		i = j
	}
	// The distinct entities: each one's first record in order, and every
	// record's slot.
	firsts := make([]int32, 0, valid)
	size := 0
	for n, o := range order {
		e := recs[o.k].Entity
		if n == 0 || o.w != order[n-1].w || !bytes.Equal(e, recs[order[n-1].k].Entity) {
			firsts = append(firsts, o.k)
			size += len(e)
		}
		slots[o.k] = int32(len(firsts) - 1)
	}
	// They are copied next to each other: the read's look-ups, the arrays
	// sent and the log then read them from a few cache lines, not from
	// wherever each record's key lies.
	entities = make([][]byte, len(firsts))
	windows := make([]uint64, len(firsts))
	arena := make([]byte, 0, size)
	for i, k := range firsts {
		start := len(arena)
		arena = append(arena, recs[k].Entity...)
		entities[i] = arena[start:len(arena):len(arena)]
		windows[i] = window(entities[i], lcp)
	}
	return entities, entityIndex{entities: entities, prefix: entities[0][:lcp:lcp], windows: windows}, slots
}

// keyed is a record (its index k in the batch) and its entity's window.
type keyed struct {
	w uint64
	k int32
}

// sortWindows sorts a by window, stably: a least-significant-digit radix
// sort by byte, skipping the bytes every window shares (a batch's keys
// of equal length vary in a few of them), for batches large enough to
// pay for its counters; a comparison sort otherwise.
func sortWindows(a []keyed) []keyed {
	if len(a) < 256 {
		slices.SortStableFunc(a, func(x, y keyed) int { return cmpUint64(x.w, y.w) })
		return a
	}
	var counts [8][256]int32
	for _, x := range a {
		w := x.w
		for b := range counts {
			counts[b][byte(w>>(8*b))]++
		}
	}
	tmp := make([]keyed, len(a))
	for b := range counts {
		c := &counts[b]
		if c[byte(a[0].w>>(8*b))] == int32(len(a)) {
			continue // every window has the same byte here
		}
		var sum int32
		for i, n := range c {
			c[i], sum = sum, sum+n
		}
		for _, x := range a {
			d := byte(x.w >> (8 * b))
			tmp[c[d]] = x
			c[d]++
		}
		a, tmp = tmp, a
	}
	return a
}

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// commonPrefix returns the length of the longest common prefix of a and b.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for ; i+8 <= n; i += 8 {
		if x := binary.LittleEndian.Uint64(a[i:]) ^ binary.LittleEndian.Uint64(b[i:]); x != 0 {
			return i + bits.TrailingZeros64(x)>>3
		}
	}
	for ; i < n && a[i] == b[i]; i++ {
	}
	return i
}
