package main

import (
	"regexp"
	"strings"
	"testing"
)

// The demo shows behaviour, not only counts: one entity's forwarded record
// and the duplicate dropped after it, the route that decided them, and
// dam explain's answer for the drop, which names the forwarded offset. On
// a database of the test's own: the demo's schema has a fixed name.
func TestDemoShowsADrop(t *testing.T) {
	dsn := newDatabase(t)
	code, out, errOut := runDam(t, "demo", "--records", "2000", "--entities", "100", "--dsn", dsn)
	if code != 0 {
		t.Fatalf("demo: exit %d\n%s\n%s", code, out, errOut)
	}
	m := regexp.MustCompile(`One banana as route customer-1 decided it \(projections\.customer-1 -> delivery\.customer-1, ignore /updated_at\):
  forwarded projections\.customer-1/(\d+)@(\d+)  key (B-\d+)  \{.*\}
  dropped   projections\.customer-1/(\d+)@(\d+)  key (B-\d+)  \{.*\}

Why was it dropped\? dam explain --topic projections\.customer-1 --partition (\d+) --offset (\d+):
`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no forwarded and dropped record of one banana in the demo's output:\n%s", out)
	}
	fp, fo, fk, dp, do, dk, ep, eo := m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8]
	if fp != dp || fk != dk || ep != dp || eo != do {
		t.Fatalf("the example's records are not one entity's in one partition, or explain asks of another:\n%s", out)
	}
	for _, want := range []string{"decision  duplicate", "duplicate of the content forwarded from offset " + fo + " at ", "entity    " + fk} {
		if !strings.Contains(out, want) {
			t.Errorf("dam explain's answer has no %q:\n%s", want, out)
		}
	}
}
