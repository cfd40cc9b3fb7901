package main

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/damproc"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// playground is dam playground running as a process of its own.
type playground struct {
	t    *testing.T
	proc *damproc.Process
	out  *syncBuffer
	addr string
}

// startPlayground starts dam playground with args on addr ("": a free
// port), in dir, with $DAM_POSTGRES_DSN set to dsn (unless ""), and waits
// until it prints its next commands.
func startPlayground(t *testing.T, addr, dir, dsn string, args ...string) *playground {
	t.Helper()
	if addr == "" {
		addr = freeAddr(t)
	}
	p := &playground{t: t, addr: addr, out: &syncBuffer{}}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPostgresDSN+"=") {
			env = append(env, kv)
		}
	}
	env = append(env, envExecDam+"=1")
	if dsn != "" {
		env = append(env, envPostgresDSN+"="+dsn)
	}
	proc, err := damproc.Start(damproc.Options{Args: append([]string{os.Args[0], "playground", "--dir", dir, "--listen", p.addr}, args...),
		CleanEnv: true, Env: env, Stdout: p.out, Stderr: p.out})
	if err != nil {
		t.Fatal(err)
	}
	p.proc = proc
	t.Cleanup(proc.Kill)
	deadline := time.After(30 * time.Second)
	for !strings.Contains(p.out.String(), "\nNext,") {
		select {
		case <-p.proc.Done():
			t.Fatalf("dam playground exited: %v\n%s", p.proc.Wait(), p.out)
		case <-deadline:
			t.Fatalf("dam playground did not start:\n%s", p.out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return p
}

// stop sends SIGTERM and requires exit status 0.
func (p *playground) stop() {
	p.t.Helper()
	if _, killed, err := p.proc.Stop(30 * time.Second); killed || err != nil {
		p.t.Fatalf("dam playground on SIGTERM: exit %v, killed after 30s %v\n%s", err, killed, p.out)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := damproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// playgroundDSN returns a database of the test's own, in the schema
// dam_playground.
func playgroundDSN(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(newDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", "dam_playground")
	u.RawQuery = q.Encode()
	return u.String()
}

// The playground writes a dam.yaml that dam run and dam serve accept, for
// its broker, which holds the route's topics and makes any other on first
// use; it keeps the broker's records across restarts, and never rewrites
// the dam.yaml it wrote.
func TestPlaygroundConfigAndTopics(t *testing.T) {
	dir, dsn := t.TempDir(), playgroundDSN(t)
	p := startPlayground(t, "", dir, dsn)
	path := filepath.Join(dir, "dam.yaml")
	for _, want := range []string{"broker data " + filepath.Join(dir, "kafka") + " (new)", "written now",
		"schema dam_playground, made afresh", "dam migrate -c " + path, "dam run -c " + path,
		"kcat -F " + filepath.Join(dir, "kcat.conf") + " -P -t projections.emails -K:",
		"dam explain -c " + path + " --topic projections.emails --partition 0 --offset 1"} {
		if !strings.Contains(p.out.String(), want) {
			t.Errorf("the playground's output has no %q:\n%s", want, p.out)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("dam.yaml: %v %v (it holds a DSN and a token: 0600)", fi, err)
	}
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatalf("dam run's configuration: %v", err)
	}
	if _, err := config.LoadServe(path, nil); err != nil {
		t.Fatalf("dam serve's configuration: %v", err)
	}
	if len(cfg.Kafka.Brokers) != 1 || cfg.Kafka.Brokers[0] != p.addr || cfg.Kafka.Start != config.StartEarliest ||
		len(cfg.Routes) != 1 || !strings.Contains(cfg.Postgres.DSN, "search_path=dam_playground") {
		t.Fatalf("dam.yaml: %+v", cfg)
	}
	if conf, err := os.ReadFile(filepath.Join(dir, "kcat.conf")); err != nil || !strings.Contains(string(conf), "\nbootstrap.servers="+p.addr+"\n") {
		t.Fatalf("kcat.conf: %q %v", conf, err)
	}

	// The route's topics exist; another is made on first use.
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, topic := range []string{"projections.emails", "delivery.emails", "delivery.emails.dlq", "made.on.first.use"} {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatalf("producing to %s: %v", topic, err)
		}
	}
	cl.Close()
	p.stop()

	// Restarted: the records are still there, dam.yaml is not rewritten,
	// and the schema is kept.
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p = startPlayground(t, p.addr, dir, dsn)
	for _, want := range []string{"(kept from the last run)", "config " + path + " (read)", "schema dam_playground, kept"} {
		if !strings.Contains(strings.Join(strings.Fields(p.out.String()), " "), want) {
			t.Errorf("the restarted playground's output has no %q:\n%s", want, p.out)
		}
	}
	if after, err := os.ReadFile(path); err != nil || string(after) != string(before) {
		t.Fatalf("dam.yaml was rewritten: %v", err)
	}
	cl, err = kgo.NewClient(kgo.SeedBrokers(p.addr), kgo.ConsumeTopics("made.on.first.use"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if fs := cl.PollFetches(ctx); fs.Err() != nil || fs.NumRecords() != 1 {
		t.Fatalf("the record made on first use, after a restart: %v, %d records", fs.Err(), fs.NumRecords())
	}
	p.stop()
}

// A new broker (a new directory) drops and makes again the schema that the
// playground made for another one, whose state would contradict the new
// records; a schema of that name that it did not make is refused unless
// --yes.
func TestPlaygroundNewBrokerRemakesItsSchema(t *testing.T) {
	dsn := playgroundDSN(t)
	p := startPlayground(t, "", t.TempDir(), dsn)
	p.stop()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	tableThere := func() bool {
		var n int
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'dam_playground' AND tablename = 'old'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	exec(`CREATE TABLE dam_playground.old (x int)`)
	p = startPlayground(t, "", t.TempDir(), dsn)
	p.stop()
	if tableThere() {
		t.Fatal("a new broker kept the state of the playground's schema")
	}

	// A schema that is not the playground's.
	exec(`DROP SCHEMA dam_playground CASCADE; CREATE SCHEMA dam_playground; CREATE TABLE dam_playground.old (x int)`)
	code, out, errOut := runDam(t, "playground", "--dir", t.TempDir(), "--listen", freeAddr(t), "--dsn", dsn)
	if code != 2 || !strings.Contains(errOut, "schema dam_playground") || !strings.Contains(errOut, "--yes drops it") || !tableThere() {
		t.Fatalf("a new broker on a schema not the playground's: exit %d, the table is there: %v\n%s\n%s", code, tableThere(), out, errOut)
	}
	p = startPlayground(t, "", t.TempDir(), dsn, "--yes")
	p.stop()
	if tableThere() {
		t.Fatal("--yes kept the schema")
	}
}

// The playground refuses what it cannot serve, before it writes anything:
// an address its clients cannot be told to connect to, a dam.yaml it did
// not write, and a PostgreSQL server that does not answer (saying how to
// start one).
func TestPlaygroundRefuses(t *testing.T) {
	unsetDSN(t)
	for _, listen := range []string{"0.0.0.0:9092", ":9092", "[::]:9092", "127.0.0.1"} {
		if code, _, errOut := runDam(t, "playground", "--dir", t.TempDir(), "--listen", listen); code != 2 || !strings.Contains(errOut, "--listen") {
			t.Errorf("--listen %s: exit %d, %q", listen, code, errOut)
		}
	}
	dir := t.TempDir()
	mine := "kafka:\n  brokers: [kafka:9092]\n"
	if err := os.WriteFile(filepath.Join(dir, "dam.yaml"), []byte(mine), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runDam(t, "playground", "--dir", dir, "--listen", freeAddr(t))
	if b, _ := os.ReadFile(filepath.Join(dir, "dam.yaml")); code != 2 || !strings.Contains(errOut, "not written by dam playground") ||
		!strings.Contains(errOut, "--config") || string(b) != mine {
		t.Errorf("a dam.yaml of the user's: exit %d, %q; dam.yaml now %q", code, errOut, b)
	}
	dir = t.TempDir()
	code, _, errOut = runDam(t, "playground", "--dir", dir, "--listen", freeAddr(t), "--dsn", "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2")
	if code != 1 || !strings.Contains(errOut, "no PostgreSQL server answers at postgres://postgres@127.0.0.1:1/postgres") ||
		!strings.Contains(errOut, "docker run") || !strings.Contains(errOut, "--dsn") {
		t.Errorf("no PostgreSQL: exit %d, %q", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "dam.yaml")); err == nil {
		t.Error("dam.yaml written for a PostgreSQL that does not answer")
	}
}

// With --config the playground serves another configuration's topics and
// writes no dam.yaml; a configuration that names other brokers gets a
// warning, and its schema is left alone.
func TestPlaygroundOtherConfig(t *testing.T) {
	dir := t.TempDir()
	path := writeRunConfig(t, pgtest.DSN(t), "")
	p := startPlayground(t, "", dir, "", "--config", path)
	out := strings.Join(strings.Fields(p.out.String()), " ")
	for _, want := range []string{"topics in, out (", "config " + path + " (read)", "untouched: the configuration's kafka.brokers does not name " + p.addr,
		"warning: " + path + "'s kafka.brokers [127.0.0.1:1] does not name this broker"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, p.out)
		}
	}
	p.stop()
	if _, err := os.Stat(filepath.Join(dir, "dam.yaml")); err == nil {
		t.Error("dam.yaml written with --config")
	}
}
