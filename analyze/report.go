package analyze

import (
	"encoding/hex"
	"strconv"
	"unicode/utf8"
)

// Report is what an analysis found: one RouteReport per route that read
// records, and how the reading went.
type Report struct {
	// Records is how many records were read (and decided, if a route
	// reads their topic).
	Records int64 `json:"records"`
	// Unrouted counts records of a topic no route reads.
	Unrouted int64 `json:"unrouted,omitempty"`
	// Clock is where the rules' clock came from: "record" (each record's
	// timestamp) or "start" (the analysis's start, for every record).
	Clock string `json:"clock"`
	// Stopped says why the reading stopped before the end of the input,
	// if it did (the identity limit, or --max-records).
	Stopped string `json:"stopped,omitempty"`
	// Passes is how many times the input was read: once to decide, and
	// again for the what-if runs.
	Passes int           `json:"passes"`
	Routes []RouteReport `json:"routes"`
	// Notes are what the reader should know about the figures (limits
	// met, what-if runs left out).
	Notes []string `json:"notes,omitempty"`
}

// RouteReport is one route's decisions.
type RouteReport struct {
	Service string `json:"service"`
	Topic   string `json:"topic"`
	// Rule is the route's mode and settings, as dam explain words them.
	Mode       string `json:"mode"`
	Records    int64  `json:"records"`
	Forwarded  int64  `json:"forwarded"` // refreshed included
	Refreshed  int64  `json:"refreshed,omitempty"`
	Dropped    int64  `json:"dropped"` // duplicates and stale
	Duplicates int64  `json:"duplicates"`
	Stale      int64  `json:"stale,omitempty"`
	// DropRate is Dropped over Records, in percent.
	DropRate    float64 `json:"drop_rate"`
	DeadLetters int64   `json:"dead_letters"`
	// Halts: the route has no dead_letter topic, so the first bad record
	// would halt its partition instead of going to a dead letter.
	Halts      bool     `json:"halts,omitempty"`
	BadRecords []Reason `json:"dead_letter_reasons,omitempty"`
	// Identities is how many distinct identities the route's records had.
	Identities int64 `json:"identities"`
	// Shadow: the route forwards every record, marking the would-be drops.
	Shadow      bool          `json:"shadow,omitempty"`
	TopEntities []EntityDrops `json:"top_entities,omitempty"`
	Churn       *Churn        `json:"churn,omitempty"`
}

// Reason is one cause of dead letters: the error it wraps innermost, how
// many records it sent to the dead-letter topic, and the first of them.
type Reason struct {
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
	// Example is the first such record's error in full (cut to 200
	// bytes) and where it was: topic/partition@offset, or the file's line.
	Example string `json:"example"`
	At      string `json:"at"`
}

// EntityDrops is an identity and the records of it the route would drop.
type EntityDrops struct {
	// Entity is the identity as text, or "hex:..." when it is not
	// printable UTF-8.
	Entity string `json:"entity"`
	Drops  int64  `json:"drops"`
}

// Churn is which paths changed in the records the route would forward.
type Churn struct {
	// Compared counts forwards compared with their identity's previous
	// forward; First the forwards of an identity's first record;
	// NotCompared those whose previous summary was not kept (the memory
	// budget, or more than 4096 leaves); Unchanged the compared ones that
	// changed at no path (forwarded for their version or window, not
	// their content).
	Compared    int64 `json:"compared"`
	First       int64 `json:"first"`
	NotCompared int64 `json:"not_compared,omitempty"`
	Unchanged   int64 `json:"unchanged,omitempty"`
	// OtherPaths counts changes at paths past the 10000 distinct paths
	// counted.
	OtherPaths int64        `json:"other_paths,omitempty"`
	Paths      []PathChange `json:"paths"`
}

// PathChange is a path pattern (array indices as "*", "" for the whole
// value) and how many compared forwards changed there.
type PathChange struct {
	Path    string  `json:"path"`
	Changed int64   `json:"changed"`
	Share   float64 `json:"share"` // of the compared forwards, in percent
	WhatIf  *WhatIf `json:"what_if,omitempty"`
}

// WhatIf is the route's decisions with Path ignored too: the same records
// decided again by the route compiled with the path added to its ignore
// list.
type WhatIf struct {
	Dropped  int64   `json:"dropped"`
	DropRate float64 `json:"drop_rate"`
	// Error says why the route could not be compiled with the path
	// ignored (too many ignore pointers); the figures are then zero.
	Error string `json:"error,omitempty"`
}

func rate(n, of int64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// maxExample bounds an example error in a report: errors quote input.
const maxExample = 200

// showIdentity renders an identity for a report: printable UTF-8 as is
// (cut to 120 bytes), anything else as hex.
func showIdentity(b []byte) string {
	printable := utf8.Valid(b)
	for _, r := range string(b) {
		if !strconv.IsPrint(r) {
			printable = false
			break
		}
	}
	if printable {
		return cut(string(b), 120)
	}
	return "hex:" + cut(hex.EncodeToString(b), 120)
}

// cut shortens s to at most n bytes on a character boundary, marking the
// cut with "…".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
