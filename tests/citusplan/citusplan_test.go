package citusplan

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/internal/testutil/pgcitus"
)

// TestPlans captures the store's statements on a Citus cluster of two
// workers and checks how Citus runs those a decide depends on: the
// partition's statements and the per-identity ones are router statements;
// a batch's identities are given placeholders, read and locked, and
// written by router statements, per shard group; a decide writing both
// workers commits in two phases; the workers plan a decide's statements
// with its planner settings, and read and write a mode's shards by key or
// row version, never by a sequential scan.
// With -v it prints the table and every plan (docs/performance.md, On
// Citus).
func TestPlans(t *testing.T) {
	if os.Getenv("DAM_TEST_CITUS") != "1" {
		t.Skip("DAM_TEST_CITUS=1 runs it on a throwaway Citus cluster (make test-citus installs Citus)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cc, err := pgcitus.Start(ctx, t.Logf, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	// The commands the coordinator sends the workers for one decide: the
	// first of last-seen's two (its second is the same).
	var remote []string
	decides := 0
	sts, err := Capture(ctx, cc.DSN(), Options{Analyze: true, Logf: t.Logf, Remote: func(op, cmd string) {
		if op != "decide (last-seen)" {
			return
		}
		if strings.HasPrefix(cmd, "BEGIN") && len(remote) > 0 && strings.HasPrefix(remote[len(remote)-1], "COMMIT PREPARED") {
			decides++
		}
		if decides == 0 {
			remote = append(remote, abbreviate(cmd))
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	Print(&b, sts, testing.Verbose())
	fmt.Fprintf(&b, "\n-- the commands the coordinator sent the workers for one decide (last-seen, %d records): %d\n", 1000, len(remote))
	for _, c := range remote {
		if len(c) > 160 {
			c = c[:160] + "..."
		}
		fmt.Fprintln(&b, c)
	}
	t.Log("\n" + b.String())
	if len(remote) == 0 {
		t.Error("no remote command seen for a decide (citus.log_remote_commands)")
	}
	// The decide wrote both workers: its commit is two-phase, a PREPARE
	// TRANSACTION on each.
	prepared := 0
	for _, c := range remote {
		if strings.HasPrefix(c, "PREPARE TRANSACTION") {
			prepared++
		}
	}
	if prepared < 2 {
		t.Errorf("a decide writing both workers sent %d PREPARE TRANSACTION: committed in one phase on some", prepared)
	}
	// Each worker's transaction starts with the decide's planner
	// settings: a worker plans with its own, and a batch's read of a
	// shard group was a sequential scan of the shard.
	begins := 0
	for _, c := range remote {
		if !strings.HasPrefix(c, "BEGIN") {
			continue
		}
		begins++
		if !strings.Contains(c, "SET LOCAL enable_seqscan = off") {
			t.Errorf("a decide's transaction on a worker begins without its planner settings: %s", c)
		}
	}
	if begins < 2 {
		t.Errorf("a decide writing both workers began %d transactions on them, want one on each", begins)
	}
	for _, st := range sts {
		if strings.HasPrefix(st.Op, "decide") && strings.Contains(st.Plan, "Seq Scan on") {
			t.Errorf("%s: %s: a sequential scan on a worker\n%s", st.Op, st.Name, abbreviate(st.Plan))
		}
	}

	want := map[[2]string]string{
		{"decide (last-seen)", "progress lock (by writing)"}:               "router",
		{"decide (last-seen)", "read (a shard's group, no lock)"}:          "router",
		{"decide (last-seen)", "insert new (VALUES, a shard's group)"}:     "router",
		{"decide (last-seen)", "rewrite by row version (a shard's group)"}: "router",
		{"decide (window)", "read (a shard's group, no lock)"}:             "router",
		{"decide (window)", "insert new (VALUES, a shard's group)"}:        "router",
		{"decide (window)", "extend windows (a shard's group)"}:            "router",
		{"decide (version)", "read (a shard's group, no lock)"}:            "router",
		{"decide (version)", "insert new (VALUES, a shard's group)"}:       "router",
		{"decide (version)", "rewrite by row version (a shard's group)"}:   "router",
		{"decide after a lost race", "placeholders (VALUES)"}:              "router",
		{"decide after a lost race", "read and lock (a shard's group)"}:    "router",
		{"decide after a lost race", "write (a shard's group)"}:            "router",
		{"decide (last-seen)", "decision log"}:                             "router",
		{"decide (last-seen)", "advance P"}:                                "router",
		{"decide (last-seen)", "clock"}:                                    "coordinator",
		{"check", "compare-and-set"}:                                       "router",
		{"state get", "state get"}:                                         "router",
		{"recovery", "read progress"}:                                      "router",
		{"recovery", "settled progress"}:                                   "router",
		{"recovery", "read log"}:                                           "router",
	}
	for _, st := range sts {
		k := [2]string{st.Op, st.Name}
		w, ok := want[k]
		if !ok {
			continue
		}
		delete(want, k)
		if st.PlanErr != nil {
			t.Errorf("%s: %s: EXPLAIN: %v", st.Op, st.Name, st.PlanErr)
			continue
		}
		if st.Class.Kind != w {
			t.Errorf("%s: %s: %s (%d tasks), want %s\n%s", st.Op, st.Name, st.Class.Kind, st.Class.Tasks, w, abbreviate(st.Plan))
		}
	}
	for k := range want {
		t.Errorf("%s: no statement %q captured", k[0], k[1])
	}
}
