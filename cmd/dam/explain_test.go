package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pgtest"
	"github.com/dam-dedup/dam/internal/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// explainEnv is a kfake cluster with the input topic "in" (one partition),
// a schema and a configuration file whose route "svc" reads "in", for
// group "g".
type explainEnv struct {
	t     *testing.T
	kc    *testkafka.Cluster
	dsn   string
	path  string
	store *dedup.Store
	route *pipeline.Route // svc's, compiled as the sidecar runs it
	p     dedup.Partition
	epoch int64
	next  int64 // P
}

// newExplainEnv: route "svc" ignores /ts and has no dead-letter topic.
func newExplainEnv(t *testing.T) *explainEnv {
	return newModeEnv(t, "    ignore: [/ts]\n")
}

// newModeEnv: route "svc" has the settings routeYAML (lines indented for a
// route's keys); more holds further routes ("  - service: ..." items).
// Not parallel: DAM_POSTGRES_DSN is unset for the test (it would override
// the file's DSN), and tests stop explainClock.
func newModeEnv(t *testing.T, routeYAML string, more ...string) *explainEnv {
	t.Helper()
	unsetDSN(t)
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	path := filepath.Join(t.TempDir(), "dam.yaml")
	body := fmt.Sprintf("kafka:\n  brokers: [%s]\n  group: g\npostgres:\n  dsn: %q\nroutes:\n  - service: svc\n    from: in\n    to: out\n%s%s",
		kc.Addr(), dsn, routeYAML, strings.Join(more, ""))
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	route, err := pipeline.CompileRoute(cfg.Routes[0])
	if err != nil {
		t.Fatal(err)
	}
	store, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	e := &explainEnv{t: t, kc: kc, dsn: dsn, path: path, store: store, route: route, p: dedup.Partition{Group: "g", Topic: "in", Partition: 0}}
	pr, err := store.Acquire(context.Background(), e.p)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.InitProgress(context.Background(), e.p, pr.Epoch, 0); err != nil {
		t.Fatal(err)
	}
	e.epoch = pr.Epoch
	return e
}

// produce writes records (key, value) to "in".
func (e *explainEnv) produce(kv ...string) {
	e.t.Helper()
	var recs []*kgo.Record
	for i := 0; i < len(kv); i += 2 {
		recs = append(recs, &kgo.Record{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
	}
	e.kc.Produce("in", recs...)
}

// decide decides the next n records of "in" on the database's clock.
func (e *explainEnv) decide(n int) []dedup.Decision {
	e.t.Helper()
	return e.decideAt(time.Time{}, n)
}

// decideAt decides the next n records of "in" as the sidecar does (the
// route's Identify and rule, one batch, logged) at now (zero: the
// database's clock), and returns the decisions.
func (e *explainEnv) decideAt(now time.Time, n int) []dedup.Decision {
	e.t.Helper()
	ctx := context.Background()
	recs := e.kc.ReadAll("in")
	b := &dedup.Batch{Service: "svc", Rule: e.route.Rule(), Now: now, Partition: e.p, Epoch: e.epoch, Start: e.next, End: e.next + int64(n)}
	for _, r := range recs[e.next : e.next+int64(n)] {
		id, v, d, err := e.route.Identify(r)
		b.Records = append(b.Records, dedup.Record{Offset: r.Offset, Entity: id, Version: v, Digest: d, Invalid: err != nil})
	}
	out, err := e.store.Decide(ctx, b, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if !now.IsZero() {
		// The sidecar logs a batch at its decide transaction's start, a
		// moment before it reads its decision time: a batch decided at a
		// given time is logged at that time.
		if _, err := e.store.Pool().Exec(ctx, `UPDATE decision_log SET logged_at = $1 WHERE grp = $2 AND topic = $3 AND part = $4 AND first_offset = $5`,
			now, e.p.Group, e.p.Topic, e.p.Partition, b.Start); err != nil {
			e.t.Fatal(err)
		}
	}
	e.next = b.End
	return out
}

// at stops dam explain's clock (the database's) at now for the rest of the
// test, to decide exactly at a boundary.
func (e *explainEnv) at(now time.Time) {
	prev := explainClock
	explainClock = func(context.Context) (time.Time, error) { return now, nil }
	e.t.Cleanup(func() { explainClock = prev })
}

// explain runs dam explain with the environment's configuration.
func (e *explainEnv) explain(args ...string) (int, string, string) {
	e.t.Helper()
	return runDam(e.t, append([]string{"explain", "--config", e.path}, args...)...)
}

func (e *explainEnv) explainOffset(offset int64, extra ...string) (int, string, string) {
	e.t.Helper()
	return e.explain(append([]string{"--topic", "in", "--partition", "0", "--offset", fmt.Sprint(offset)}, extra...)...)
}

// mustContain checks that out holds every want, runs of spaces counting as
// one (the text output is aligned in columns).
func mustContain(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	squeeze := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	for _, w := range wants {
		if !strings.Contains(squeeze(out), squeeze(w)) {
			t.Errorf("%s lacks %q:\n%s", what, w, out)
		}
	}
}

// explain --offset answers from the decision log while it covers the
// offset, from the state once it is pruned, and says which.
func TestExplainOffset(t *testing.T) {
	e := newExplainEnv(t)
	e.produce(
		"B-007", `{"id":"B-007","ripe":"mostly yellow","ts":1}`, // 0 forward
		"B-007", `{"ts":2,"ripe":"mostly yellow","id":"B-007"}`, // 1 duplicate of 0
		"B-008", `{"id":"B-008","ripe":"green"}`, // 2 forward
		"B-007", `{"id":"B-007","ripe":"perfectly yellow","ts":3}`, // 3 forward: changed
		"B-009", `{"id":"B-009",`, // 4 invalid
		"B-007", `{"id":"B-007","ripe":"perfectly yellow","ts":4}`, // 5 duplicate of 3
		"B-007", `{"id":"B-007","ripe":"brown"}`, // 6 not decided
	)
	if got := fmt.Sprint(e.decide(6)); got != "[forward duplicate forward forward invalid duplicate]" {
		t.Fatalf("decisions %s", got)
	}

	code, out, errOut := e.explainOffset(1)
	if code != 0 {
		t.Fatalf("explain 1: %d %s", code, errOut)
	}
	mustContain(t, "explain 1 (logged)", out, "decision    duplicate", "duplicate of the content forwarded from offset 0 at ",
		"decision log: offset 1 is in the batch [0, 6)", "entity      B-007")

	code, out, _ = e.explainOffset(3)
	mustContain(t, "explain 3 (logged)", out, "decision    forward", `/ripe: "mostly yellow" -> "perfectly yellow" (offset 1 -> 3)`,
		"its content differs from the previous record of this entity (offset 1)")
	if code != 0 {
		t.Fatal(code)
	}
	_, out, _ = e.explainOffset(4)
	mustContain(t, "explain 4", out, "decision    invalid", "bad input (invalid JSON at byte 14", "no dead_letter topic: it halted the partition")
	_, out, _ = e.explainOffset(5)
	mustContain(t, "explain 5", out, "duplicate of the content forwarded from offset 3 at", "state: 01")
	_, out, _ = e.explainOffset(6)
	mustContain(t, "explain 6", out, "decision    undecided", "offsets below the partition's progress 6 are decided", "it would be forwarded")

	// Delivered: the log is pruned below the committed offset. The state
	// still answers for offset 5 (it holds offset 3's content) and says the
	// log no longer covers it; offset 1 is answered from Kafka.
	if _, err := e.store.PruneLog(context.Background(), e.p, 6); err != nil {
		t.Fatal(err)
	}
	_, out, _ = e.explainOffset(5)
	mustContain(t, "explain 5 (pruned)", out, "decision    duplicate", "duplicate of the content forwarded from offset 3 at",
		"decision log: no longer covers offset 5")
	_, out, _ = e.explainOffset(1)
	mustContain(t, "explain 1 (pruned)", out, "decision    unknown", "the stored digest was since set from offset 3", "no longer covers offset 1")

	code, out, _ = e.explainOffset(3, "-o", "json")
	var res struct {
		Decision   string
		Previous   *struct{ Offset int64 }
		Difference *struct{ Path, Old, New string }
		Evidence   []string
	}
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil {
		t.Fatalf("-o json: %d %v\n%s", code, err, out)
	}
	if res.Decision != "forward" || res.Previous.Offset != 1 || res.Difference.Path != "/ripe" || res.Difference.New != `"perfectly yellow"` || len(res.Evidence) < 3 {
		t.Fatalf("-o json: %+v", res)
	}

	// Retention removed the first records: offset 1 can no longer be read
	// and the log no longer covers it.
	adm := kadm.NewClient(e.kc.Client())
	to := kadm.Offsets{}
	to.AddOffset("in", 0, 2, -1)
	if _, err := adm.DeleteRecords(context.Background(), to); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = e.explainOffset(1)
	if code != 1 || !strings.Contains(errOut, "below the log start offset 2") || !strings.Contains(errOut, "nothing left to explain it from") {
		t.Fatalf("explain of a deleted record: %d %s", code, errOut)
	}
}

// A duplicate whose source is neither in the state nor in the log is found
// by reading the input before it.
func TestExplainDuplicateFromKafka(t *testing.T) {
	e := newExplainEnv(t)
	e.produce("k", `{"v":1}`, "other", `{"v":1}`, "k", `{"v":1}`, "k", `{"v":1}`, "k", `{"v":2}`)
	e.decide(5)
	if _, err := e.store.PruneLog(context.Background(), e.p, 5); err != nil {
		t.Fatal(err)
	}
	// The state of k now holds offset 4's content; offset 3 repeated offset
	// 0's, which only the input still shows.
	code, out, errOut := e.explainOffset(3)
	if code != 0 {
		t.Fatal(errOut)
	}
	mustContain(t, "explain 3", out, "decision    unknown", "the stored digest was since set from offset 4",
		"the input before it suggests a duplicate of the content forwarded from offset 0 (unless")
	// Offset 4 changed k: the input before it shows from what.
	_, out, _ = e.explainOffset(4)
	mustContain(t, "explain 4", out, "decision    forward", "/v: 1 -> 2 (offset 3 -> 4)", "it set the stored digest, still current")
	// With a window too short to see offset 0, the run start is a bound.
	_, out, _ = e.explainOffset(3, "--lookback", "1")
	mustContain(t, "explain 3 --lookback 1", out, "forwarded from offset 2 or earlier")
}

// runDamStdin is runDam with stdin.
func runDamStdin(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr strings.Builder
	code := run(args, strings.NewReader(stdin), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// explain SERVICE ENTITY PAYLOAD: would it be forwarded now, and what
// differs from the stored content, read back from Kafka.
func TestExplainPayload(t *testing.T) {
	e := newExplainEnv(t)
	e.produce("B-007", `{"id":"B-007","ripe":"mostly yellow","tags":["a","b"],"ts":1}`)
	e.decide(1)
	payload := filepath.Join(t.TempDir(), "p.json")
	write := func(s string) {
		if err := os.WriteFile(payload, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"ts":9,"tags":["a","b"],"ripe":"mostly yellow","id":"B-007"}`)
	code, out, errOut := e.explain("svc", "B-007", payload)
	if code != 0 {
		t.Fatal(errOut)
	}
	mustContain(t, "duplicate payload", out, "decision    duplicate", "set ", "from in/0@0", "ignore /ts")

	write(`{"id":"B-007","ripe":"mostly yellow","tags":["a","c"]}`)
	_, out, _ = e.explain("svc", "B-007", payload)
	mustContain(t, "changed payload", out, "decision    forward", `difference  /tags/1: "b" -> "c" (stored -> payload)`)

	// From stdin, as JSON.
	code, out, _ = runDamStdin(t, `{"id":"B-007","ripe":"mostly yellow","tags":["a","b"],"new":true}`,
		"explain", "--config", e.path, "-o", "json", "svc", "B-007", "-")
	var res struct {
		Decision   string
		Difference struct{ Path, Old, New string }
		Stored     struct{ Source struct{ Offset int64 } }
	}
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil || res.Decision != "forward" || res.Difference.Path != "/new" || res.Difference.Old != "(absent)" {
		t.Fatalf("-o json: %d %v %s", code, err, out)
	}

	// No state: forward. A bad payload: invalid, with the byte.
	_, out, _ = e.explain("svc", "B-999", payload)
	mustContain(t, "new identity", out, "stored      none", "decision    forward: no stored state")
	write(`{"id":1,"id":2}`)
	_, out, _ = e.explain("svc", "B-007", payload)
	mustContain(t, "bad payload", out, "decision    invalid", "invalid JSON at byte 8")

	// Stored content no longer readable: set by a check, or deleted by
	// retention.
	if _, err := e.store.Check(context.Background(), "svc", []byte("checked"), canon.Tombstone); err != nil {
		t.Fatal(err)
	}
	write(`{"v":1}`)
	_, out, _ = e.explain("svc", "checked", payload)
	mustContain(t, "set by a check", out, "decision    forward", "stored content no longer readable: it was set by a check")
	adm := kadm.NewClient(e.kc.Client())
	to := kadm.Offsets{}
	to.AddOffset("in", 0, 1, -1)
	if _, err := adm.DeleteRecords(context.Background(), to); err != nil {
		t.Fatal(err)
	}
	_, out, _ = e.explain("svc", "B-007", payload)
	mustContain(t, "deleted source", out, "decision    forward", "stored content no longer readable: in/0@0: not readable: below the log start offset 1")

	// Without a payload: the stored state.
	code, out, _ = e.explain("svc", "B-007")
	mustContain(t, "no payload", out, "stored      01", "no payload given")
	if code != 0 {
		t.Fatal(code)
	}
}

func TestExplainErrors(t *testing.T) {
	e := newExplainEnv(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"nosuch", "e"}, 2, `unknown service "nosuch"`},
		{[]string{"--hex", "svc", "zz"}, 2, `entity "zz": not hex`},
		{[]string{"svc"}, 2, "give SERVICE ENTITY"},
		{[]string{"--topic", "in", "--offset", "1"}, 2, "go together"},
		{[]string{"--topic", "in", "--partition", "0", "--offset", "1", "svc", "e"}, 2, "not both"},
		{[]string{"--topic", "nope", "--partition", "0", "--offset", "1"}, 2, `no route of the configuration reads topic "nope"`},
		{[]string{"-o", "yaml", "svc", "e"}, 2, "want text or json"},
		{[]string{"svc", "e", "/no/such/file"}, 1, "no such file"},
	} {
		code, _, errOut := e.explain(tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: %d %q, want %d ...%s...", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	// An unreachable database is named, and fails (1).
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte(fmt.Sprintf("kafka: {brokers: [%s], group: g}\npostgres: {dsn: \"postgres://nobody:secret@127.0.0.1:1/x?connect_timeout=2\"}\nroutes: [{service: svc, from: in, to: out}]\n", e.kc.Addr())), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runDam(t, "explain", "--config", bad, "svc", "e")
	if code != 1 || !strings.Contains(errOut, "postgres postgres://nobody:xxxxx@127.0.0.1:1/x") || strings.Contains(errOut, "secret") {
		t.Fatalf("unreachable database: %d %q", code, errOut)
	}
}
