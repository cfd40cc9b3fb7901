package explain_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/explain"
)

// transcript collects the wording of one test's explanations (what dam
// explain prints: decision, reason, rule, evidence, difference, ...), in
// the order the test asks, and compares it at the end with
// testdata/<test>.golden (explain.CheckGolden; go test ./explain -rewrite
// rewrites it).
type transcript struct {
	b strings.Builder
}

func newTranscript(t *testing.T) *transcript {
	t.Helper()
	g := &transcript{}
	t.Cleanup(func() {
		if !t.Failed() {
			explain.CheckGolden(t, strings.ReplaceAll(t.Name(), "/", "-"), g.b.String())
		}
	})
	return g
}

func (g *transcript) entry(label string) {
	if g.b.Len() > 0 {
		g.b.WriteString("\n")
	}
	g.b.WriteString("== " + label + "\n")
}

func (g *transcript) field(name, value string) {
	fmt.Fprintf(&g.b, "%s: %s\n", name, value)
}

// offset records an offset explanation.
func (g *transcript) offset(label string, res *explain.OffsetExplanation) {
	g.entry(label)
	g.field("decision", res.Decision)
	g.field("reason", res.Reason)
	g.field("rule", res.Rule)
	if res.Difference != nil {
		g.field("difference", diffText(res))
	}
	g.b.WriteString("evidence:\n")
	for _, l := range res.Evidence {
		g.b.WriteString("- " + l + "\n")
	}
}

// payload records a payload explanation.
func (g *transcript) payload(label string, res *explain.PayloadExplanation) {
	g.entry(label)
	decision := res.Decision
	if decision == "" {
		decision = "(none: no payload)"
	}
	g.field("decision", decision)
	if res.Cause != "" {
		g.field("cause", res.Cause)
	}
	g.field("reason", res.Reason)
	g.field("rule", res.Rule)
	g.field("hashing", res.Hashing)
	g.field("stored", res.Stored.String())
	if res.ModeChange != "" {
		g.field("mode change", res.ModeChange)
	}
	if res.StoredContent != "" {
		g.field("stored content", res.StoredContent)
	}
	if res.Difference != nil {
		g.field("difference", res.Difference.String())
	}
}

// err records an error's message.
func (g *transcript) err(label string, err error) {
	g.entry(label)
	g.field("error", fmt.Sprint(err))
}
