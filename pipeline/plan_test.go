package pipeline

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of the data-driven tests (testdata/plan) with what they produce")

// TestPlanRecovery drives planRecovery, through planWith, from the files
// of testdata/plan: each stanza states what recovery knows of partition
// in/0 of group g, and the output is the facts the plan read on the way
// and the plan. `go test ./pipeline -run TestPlanRecovery -rewrite`
// regenerates the output.
//
// A stanza's command is plan (at assignment: the input is checked against
// the progress) or replan (a partition planned again while it stays ours:
// it is not), with arguments:
//
//	P=<n>            the progress P; absent: never set
//	C=<n>            Kafka's committed offset; absent: none
//	delivered=<n>    the committed offset dam last knew; absent: -1
//	bound=<X>        the topic id bound to P (a letter: 16 bytes of it); absent: none
//	id=<X>           the input topic's id now; absent: unknown
//	end=<n>          the partition's end now; absent: unknown
//	bind=<X>         the id binding answers (another owner bound it first); absent: bound's, else id's
//	first=<n>        the partition's first offset
//	lso=<n>          its last stable offset
//	start=<s>        kafka.start: latest (absent) or earliest
//	log=[a,b),...    the decision log's batches; absent: none
func TestPlanRecovery(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "plan", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no files in testdata/plan (%v)", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			runDataDriven(t, file, runPlanStanza)
		})
	}
}

// runPlanStanza plans one stanza's partition and returns its output.
func runPlanStanza(t *testing.T, s stanza) string {
	args, err := parseArgs(s.args)
	if err != nil {
		t.Fatalf("%s: %v", s.pos, err)
	}
	in := planInput{
		part:     dedup.Partition{Group: "g", Topic: "in", Partition: 0},
		progress: dedup.Progress{Epoch: 2, Delivered: -1},
		start:    config.StartLatest,
	}
	var out []string
	fact := func(key string) int64 {
		v, ok := args.ints[key]
		if !ok {
			t.Fatalf("%s: the plan needs %s=, which the stanza does not give", s.pos, key)
		}
		return v
	}
	if v, ok := args.ints["P"]; ok {
		in.progress.Next, in.progress.HasNext = v, true
	}
	if v, ok := args.ints["C"]; ok {
		in.committed, in.hasCommitted = v, true
	}
	if v, ok := args.ints["delivered"]; ok {
		in.progress.Delivered = v
	}
	in.progress.TopicID = args.ids["bound"]
	if v, ok := args.words["start"]; ok {
		in.start = v
	}
	switch s.cmd {
	case "plan":
		in.input = &inputFacts{id: args.ids["id"]}
		in.input.end, in.input.hasEnd = args.ints["end"]
	case "replan":
	default:
		t.Fatalf("%s: unknown command %q", s.pos, s.cmd)
	}
	pl, err := planWith(in, func(n need, from int64, in *planInput) error {
		switch n {
		case needBind:
			bound := in.progress.TopicID // coalesce(topic_id, id), as dedup.Store.BindTopic
			if bound == ([16]byte{}) {
				bound = in.input.id
			}
			if v, ok := args.ids["bind"]; ok {
				bound = v
			}
			in.bound = &bound
			out = append(out, "bind topic: "+idLetter(bound))
		case needFirst:
			v := fact("first")
			in.first = &v
			out = append(out, fmt.Sprint("read first offset: ", v))
		case needLastStable:
			v := fact("lso")
			in.lastStable = &v
			out = append(out, fmt.Sprint("read last stable offset: ", v))
		case needLogStart:
			in.logStart = &logStartFact{}
			if len(args.log) > 0 {
				in.logStart.first, in.logStart.ok = args.log[0][0], true
				out = append(out, fmt.Sprint("read log start: ", in.logStart.first))
			} else {
				out = append(out, "read log start: none")
			}
		case needLog:
			covered := logCovers(args.log, from, in.progress.Next)
			in.log = &logCover{from: from, covered: covered}
			what := "covered"
			if !covered {
				what = "not covered"
			}
			out = append(out, fmt.Sprintf("read log [%d,%d): %s", from, in.progress.Next, what))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: %v", s.pos, err)
	}
	return strings.Join(append(out, describePlan(pl, in.progress.Next)...), "\n")
}

// describePlan is a plan in the stanzas' words (p: P).
func describePlan(pl recoveryPlan, p int64) []string {
	if pl.halt != nil {
		return []string{"halt: " + pl.halt.Error()}
	}
	var out []string
	switch {
	case pl.init && pl.firstJoin:
		out = append(out, fmt.Sprintf("init progress at %d (first join: first offset %d)", pl.startAt, pl.first))
	case pl.init:
		out = append(out, fmt.Sprintf("init progress at %d", pl.startAt))
	}
	if pl.replay {
		out = append(out, fmt.Sprintf("replay %d..%d", pl.replayFrom, p))
	}
	if pl.catchUpTo != 0 {
		out = append(out, fmt.Sprintf("catch up %d..%d", p, pl.catchUpTo))
	}
	return append(out, fmt.Sprintf("start at %d", pl.startAt))
}

// logCovers reports whether batches cover [from, to) without a gap, as
// dedup.Store.Logged does (an empty range is covered).
func logCovers(batches [][2]int64, from, to int64) bool {
	reached := from
	for _, b := range batches {
		if b[1] > from && b[0] < to && b[0] <= reached && b[1] > reached {
			reached = b[1]
		}
	}
	return reached >= to
}

type stanzaArgs struct {
	ints  map[string]int64
	ids   map[string][16]byte
	words map[string]string
	log   [][2]int64 // in order of their first offset
}

func parseArgs(fields []string) (stanzaArgs, error) {
	a := stanzaArgs{ints: map[string]int64{}, ids: map[string][16]byte{}, words: map[string]string{}}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return a, fmt.Errorf("argument %q: want key=value", f)
		}
		switch k {
		case "P", "C", "delivered", "end", "first", "lso":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return a, fmt.Errorf("argument %q: %w", f, err)
			}
			a.ints[k] = n
		case "bound", "id", "bind":
			if len(v) != 1 || v[0] < 'A' || v[0] > 'Z' {
				return a, fmt.Errorf("argument %q: a topic id is one capital letter", f)
			}
			var id [16]byte
			for i := range id {
				id[i] = v[0]
			}
			a.ids[k] = id
		case "start":
			if v != config.StartLatest && v != config.StartEarliest {
				return a, fmt.Errorf("argument %q: latest or earliest", f)
			}
			a.words[k] = v
		case "log":
			for b := range strings.SplitSeq(v, ",[") {
				var first, end int64
				if _, err := fmt.Sscanf("["+strings.TrimPrefix(b, "["), "[%d,%d)", &first, &end); err != nil || first >= end {
					return a, fmt.Errorf("argument %q: want log=[first,end),... (%v)", f, err)
				}
				a.log = append(a.log, [2]int64{first, end})
			}
			slices.SortFunc(a.log, func(x, y [2]int64) int { return int(x[0] - y[0]) })
		default:
			return a, fmt.Errorf("unknown argument %q", f)
		}
	}
	return a, nil
}

func idLetter(id [16]byte) string {
	if id == ([16]byte{}) {
		return "none"
	}
	return string(id[0])
}

// TestPlanWithStopsOnAFactNotRead ends planning with an error when a fact
// the plan needs is still missing after it was read, instead of asking for
// it forever.
func TestPlanWithStopsOnAFactNotRead(t *testing.T) {
	in := planInput{part: dedup.Partition{Group: "g", Topic: "in"}, progress: dedup.Progress{Next: 5, HasNext: true}}
	reads := 0
	_, err := planWith(in, func(n need, _ int64, _ *planInput) error {
		reads++
		return nil
	})
	if err == nil || reads != 1 || !strings.Contains(err.Error(), "log start was needed again") {
		t.Fatalf("planWith: %v after %d reads; want an error after one read of the log start", err, reads)
	}
}

// The data-driven files (after pebble's and cockroachdb/datadriven's
// format): stanzas separated by blank lines, each a command line with
// space-separated arguments, a line "----", and the expected output up to
// the next blank line. Lines starting with # before a command are
// comments, kept by -rewrite.

type stanza struct {
	pos      string   // file:line of the command
	comments []string // the # lines before the command
	cmd      string
	args     []string
	want     string
}

// runDataDriven runs every stanza of file through run and compares its
// output with the expected one, or with -rewrite writes the file anew with
// the outputs.
func runDataDriven(t *testing.T, file string, run func(*testing.T, stanza) string) {
	t.Helper()
	stanzas, err := readStanzas(file)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i, s := range stanzas {
		got := run(t, s)
		if *rewrite {
			if i > 0 {
				b.WriteString("\n")
			}
			for _, c := range s.comments {
				b.WriteString(c + "\n")
			}
			fmt.Fprintf(&b, "%s\n----\n%s\n", strings.Join(append([]string{s.cmd}, s.args...), " "), got)
			continue
		}
		if got != s.want {
			t.Errorf("%s: %s %s\ngot:\n%s\nwant:\n%s", s.pos, s.cmd, strings.Join(s.args, " "), got, s.want)
		}
	}
	if *rewrite {
		if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func readStanzas(file string) ([]stanza, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var out []stanza
	var cur *stanza
	inOutput := false
	var want []string
	for i, l := range lines {
		pos := fmt.Sprintf("%s:%d", file, i+1)
		switch {
		case inOutput && l == "":
			cur.want, inOutput, want = strings.Join(want, "\n"), false, nil
			out, cur = append(out, *cur), nil
		case inOutput:
			want = append(want, l)
		case l == "" && cur != nil && cur.cmd != "":
			return nil, fmt.Errorf("%s: a blank line before the stanza's ----", pos)
		case l == "" && cur != nil:
			cur.comments = append(cur.comments, "") // a blank line among comments
		case l == "":
		case strings.HasPrefix(l, "#"):
			if cur == nil {
				cur = &stanza{}
			}
			if cur.cmd != "" {
				return nil, fmt.Errorf("%s: a comment between a command and its ----", pos)
			}
			cur.comments = append(cur.comments, l)
		case l == "----":
			if cur == nil || cur.cmd == "" {
				return nil, fmt.Errorf("%s: ---- without a command", pos)
			}
			inOutput = true
		default:
			if cur == nil {
				cur = &stanza{}
			}
			if cur.cmd != "" {
				return nil, fmt.Errorf("%s: a second command before ----", pos)
			}
			f := strings.Fields(l)
			cur.pos, cur.cmd, cur.args = pos, f[0], f[1:]
		}
	}
	switch {
	case inOutput:
		cur.want = strings.Join(want, "\n")
		out = append(out, *cur)
	case cur != nil:
		return nil, fmt.Errorf("%s: a stanza without ----", file)
	}
	return out, nil
}
