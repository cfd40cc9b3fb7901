// Package e2e runs the real dam binary (`dam run`) as subprocesses against
// an in-process Kafka broker (kfake, real wire protocol on loopback TCP) and
// a real PostgreSQL, and checks the delivery protocol's promise end to end:
// whatever kills, outages and rebalances happen, no forwarded record is
// lost, nothing the model drops is forwarded, and per-entity order holds.
//
// chaos_test.go is the chaos suite (`make chaos` at full size, `make test`
// at a reduced one): each fault of DESIGN §2, many times, in both delivery
// modes, in one table.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/internal/testutil/damproc"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

const (
	inTopic    = "projections"
	outTopic   = "delivery"
	deadTopic  = "delivery.dlq"
	partitions = 6
)

var (
	damBin   string // the built binary
	buildErr error
)

func TestMain(m *testing.M) {
	damBin, buildErr = damproc.Build(damproc.BuildOptions{Tags: testTags})
	pgtest.Main(m)
}

// testTags are the build tags of the suite's dam binary: damtest compiles
// in the test hooks (DAM_TEST_PAUSE_AT) that the chaos rows use.
const testTags = "damtest"

func needBinary(t *testing.T) {
	t.Helper()
	if buildErr != nil {
		t.Fatalf("building dam: %v", buildErr)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	port, err := damproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// broker is a kfake cluster on a fixed port, restartable with its data when
// started with a data directory.
type broker struct {
	t       *testing.T
	port    int
	dataDir string
	topics  []string
	// faults sits between the broker and its clients (see faultNet).
	faults *faultNet
	opts   []kfake.Opt // more options of kfake.NewCluster
	mu     sync.Mutex
	c      *kfake.Cluster
}

// newBroker starts a broker holding the default route's topics and the
// extra ones.
func newBroker(t *testing.T, persistent bool, extra ...string) *broker {
	t.Helper()
	return newBrokerOpts(t, persistent, nil, extra...)
}

// newBrokerOpts is newBroker with more kfake options.
func newBrokerOpts(t *testing.T, persistent bool, opts []kfake.Opt, extra ...string) *broker {
	t.Helper()
	b := &broker{t: t, topics: append([]string{inTopic, outTopic, deadTopic}, extra...),
		faults: newFaultNet(), opts: opts}
	if persistent {
		b.dataDir = filepath.Join(t.TempDir(), "kfake")
	}
	for attempt := 1; ; attempt++ {
		b.port = freePort(t)
		// kfake's classic groups, refereed as Kafka's coordinator would
		// (referee_test.go): a rebalance storm livelocks without.
		if !refereeOff {
			b.faults.ref = newGroupReferee(b)
		}
		err := b.startOnce()
		if err == nil {
			break
		}
		if b.faults.ref != nil {
			b.faults.ref.close()
			b.faults.ref = nil
		}
		// freePort's port was free when it looked, but the kernel hands the
		// same ephemeral range to outgoing connections: no client knows
		// this broker's address yet, so take another port.
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 5 {
			t.Fatalf("kfake on port %d: %v", b.port, err)
		}
	}
	t.Cleanup(func() {
		if b.faults.ref != nil {
			b.faults.ref.close()
		}
		b.stop()
	})
	return b
}

func (b *broker) addr() string { return fmt.Sprintf("127.0.0.1:%d", b.port) }

// start restarts the broker on its port.
func (b *broker) start() {
	b.t.Helper()
	var err error
	for i := 0; i < 50; i++ { // the port may take a moment to be free again
		if err = b.startOnce(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.t.Fatalf("kfake on port %d: %v", b.port, err)
}

// startOnce starts the broker on its port, once.
func (b *broker) startOnce() error {
	opts := []kfake.Opt{kfake.Ports(b.port), kfake.SeedTopics(partitions, b.topics...), kfake.ListenFn(b.faults.listen)}
	opts = append(opts, b.opts...)
	if b.dataDir != "" {
		opts = append(opts, kfake.DataDir(b.dataDir), kfake.SyncWrites())
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.c = c
	b.mu.Unlock()
	return nil
}

// cluster returns the running kfake cluster (for its control hooks).
func (b *broker) cluster() *kfake.Cluster {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c == nil {
		b.t.Fatal("the broker is stopped")
	}
	return b.c
}

func (b *broker) stop() {
	b.mu.Lock()
	c := b.c
	b.c = nil
	b.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// sidecar is one `dam run` process (restartable).
type sidecar struct {
	t        *testing.T
	name     string
	cfgPath  string
	httpAddr string
	logDir   string
	grace    time.Duration
	// maxInFlight is the configuration's pipeline.max_in_flight.
	maxInFlight int
	// env is added to the environment of the next start (DAM_TEST_PAUSE_AT).
	env []string
	// cgroup, when set, is the directory of a cgroup v2 that the process
	// starts in (memoryCgroup).
	cgroup string

	mu     sync.Mutex
	proc   *damproc.Process // nil when not running
	starts int
	logs   []string
}

type sidecarOpts struct {
	brokers string
	dsn     string
	grace   time.Duration
	// routes is the YAML of the configuration's routes list; "" is one
	// last-seen route over inTopic, outTopic and deadTopic (service e2e).
	routes string
	// delivery is kafka.delivery; "" is at-least-once.
	delivery string
	// maxInFlight is pipeline.max_in_flight; 0 is 5000.
	maxInFlight int
	// pipeline is more of the configuration's pipeline section (YAML
	// lines, each indented by two spaces).
	pipeline string
}

var defaultRoutes = fmt.Sprintf(`
  - service: e2e
    from: %s
    to: %s
    dead_letter: %s
`, inTopic, outTopic, deadTopic)

func newSidecar(t *testing.T, name string, o sidecarOpts) *sidecar {
	t.Helper()
	needBinary(t)
	dir := t.TempDir()
	if o.grace == 0 {
		o.grace = 15 * time.Second
	}
	if o.routes == "" {
		o.routes = defaultRoutes
	}
	if o.delivery == "" {
		o.delivery = "at-least-once"
	}
	if o.maxInFlight == 0 {
		o.maxInFlight = 5000
	}
	s := &sidecar{t: t, name: name, logDir: dir, grace: o.grace, maxInFlight: o.maxInFlight,
		httpAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		cfgPath:  filepath.Join(dir, "dam.yaml")}
	cfg := fmt.Sprintf(`kafka:
  brokers: [%q]
  group: dam-e2e
  client_id: dam-%s
  start: earliest
  session_timeout: 6s
  rebalance_timeout: 20s
  transaction_timeout: 5s
  delivery: %s
postgres:
  dsn: %q
  migrate: true
  max_conns: 8
  statement_timeout: 4s
  lock_timeout: 2s
  idle_in_transaction_timeout: 4s
http:
  listen: %q
log:
  level: info
  format: json
pipeline:
  batch_size: 500
  max_in_flight: %d
  shutdown_grace: %s
  retry_min: 50ms
  retry_max: 1s
%sroutes:%s`, o.brokers, name, o.delivery, o.dsn, s.httpAddr, o.maxInFlight, o.grace, o.pipeline, o.routes)
	if err := os.WriteFile(s.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.mu.Lock()
		running := s.proc != nil
		s.mu.Unlock()
		if running {
			s.kill()
		}
		if t.Failed() {
			s.dumpLogs()
		}
	})
	return s
}

func (s *sidecar) start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.t.Fatalf("%s: already running", s.name)
	}
	s.starts++
	o := damproc.Options{
		Args: []string{damBin, "run", "--config", s.cfgPath},
		Env:  s.env,
		Log:  filepath.Join(s.logDir, fmt.Sprintf("%s-%d.log", s.name, s.starts)),
		HTTP: s.httpAddr,
	}
	if s.cgroup != "" {
		cg, err := os.Open(s.cgroup)
		if err != nil {
			s.t.Fatalf("%s: %v", s.name, err)
		}
		defer cg.Close() // the child is in it once started
		o.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	}
	p, err := damproc.Start(o)
	if err != nil {
		s.t.Fatalf("%s: %v", s.name, err)
	}
	s.logs = append(s.logs, o.Log)
	s.proc = p
}

// running returns the running process, or nil.
func (s *sidecar) running() *damproc.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// kill sends SIGKILL and waits for the process to be gone.
func (s *sidecar) kill() {
	p := s.running()
	if p == nil {
		return
	}
	p.Kill()
	s.mu.Lock()
	s.proc = nil
	s.mu.Unlock()
}

// term sends SIGTERM and returns how long the process took to exit and
// the exit error (nil: status 0); it fails the test if it is not gone within
// limit (and kills it).
func (s *sidecar) term(limit time.Duration) (time.Duration, error) {
	s.t.Helper()
	p := s.running()
	if p == nil {
		s.t.Fatalf("%s: not running", s.name)
	}
	took, killed, err := p.Stop(limit)
	if killed {
		s.t.Errorf("%s: still running %s after SIGTERM; killed it", s.name, limit)
	}
	s.mu.Lock()
	s.proc = nil
	s.mu.Unlock()
	return took, err
}

// checkAlive fails the test if the process exited on its own.
func (s *sidecar) checkAlive() {
	s.t.Helper()
	if exited, err := s.exited(); exited {
		s.t.Errorf("%s exited by itself: %v", s.name, err)
	}
}

// dumpLogs logs the last 60 lines of each of the sidecar's logs, or all of
// them with DAM_TEST_FULL_LOGS set.
func (s *sidecar) dumpLogs() {
	for _, p := range s.logs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 60 && os.Getenv("DAM_TEST_FULL_LOGS") == "" {
			lines = lines[len(lines)-60:]
		}
		s.t.Logf("--- tail of %s ---\n%s", filepath.Base(p), strings.Join(lines, "\n"))
	}
}

// logContains reports whether any log of the sidecar has a line containing
// sub.
func (s *sidecar) logContains(sub string) bool {
	s.mu.Lock()
	logs := append([]string(nil), s.logs...)
	s.mu.Unlock()
	for _, p := range logs {
		if data, err := os.ReadFile(p); err == nil && bytes.Contains(data, []byte(sub)) {
			return true
		}
	}
	return false
}

// currentLogMatches reports whether the log of the current (or last)
// process matches re.
func (s *sidecar) currentLogMatches(re *regexp.Regexp) bool {
	s.mu.Lock()
	var p string
	if len(s.logs) > 0 {
		p = s.logs[len(s.logs)-1]
	}
	s.mu.Unlock()
	data, err := os.ReadFile(p)
	return err == nil && re.Match(data)
}

// currentLogContains reports whether the log of the current (or last)
// process has a line containing sub.
func (s *sidecar) currentLogContains(sub string) bool {
	s.mu.Lock()
	var p string
	if len(s.logs) > 0 {
		p = s.logs[len(s.logs)-1]
	}
	s.mu.Unlock()
	data, err := os.ReadFile(p)
	return err == nil && bytes.Contains(data, []byte(sub))
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// halted returns the sum of dam_halted over services from /metrics.
func (s *sidecar) halted() (float64, error) { return s.metric("dam_halted") }

// metric returns the sum of the series of name whose labels include all
// of labels (name, value pairs), from the sidecar's /metrics.
func (s *sidecar) metric(name string, labels ...string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m, err := damproc.Scrape(ctx, s.httpAddr)
	if err != nil {
		return 0, err
	}
	return m.Sum(name, labels...), nil
}

// ready returns /readyz's status code (0 when unreachable).
func (s *sidecar) ready() int {
	p := s.running()
	if p == nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return p.Ready(ctx)
}

// waitReady waits for /readyz to answer 200.
func (s *sidecar) waitReady(limit time.Duration) {
	s.t.Helper()
	p := s.running()
	if p == nil {
		s.t.Fatalf("%s: not running", s.name)
	}
	if err := p.WaitReady(context.Background(), limit); err != nil {
		s.checkAlive()
		s.t.Fatalf("%s: %v", s.name, err)
	}
}

// loadgen produces n records to a topic at a steady rate, each made by its
// generator.
type loadgen struct {
	t        *testing.T
	brokers  string
	topic    string
	n        int
	gen      generator
	rate     int // records per second
	produced atomic.Int64
	done     chan struct{}
	err      error
}

// generator makes the record with sequence number seq; records are
// partitioned by key.
type generator func(rng *rand.Rand, seq int) *kgo.Record

// startLoad produces n projections of entities entities to inTopic over
// d (see projections).
func startLoad(t *testing.T, brokers string, n, entities int, d time.Duration) *loadgen {
	return startLoadTo(t, brokers, inTopic, n, d, projections(entities))
}

// startLoadTo produces n records made by gen to topic over d.
func startLoadTo(t *testing.T, brokers, topic string, n int, d time.Duration, gen generator) *loadgen {
	t.Helper()
	g := &loadgen{t: t, brokers: brokers, topic: topic, n: n, gen: gen, rate: int(float64(n) / d.Seconds()), done: make(chan struct{})}
	go func() {
		defer close(g.done)
		g.err = g.run()
	}()
	t.Cleanup(func() { <-g.done })
	return g
}

// projections is last-seen's stream: records keyed by entity whose value
// repeats the entity's previous value 30% of the time.
func projections(entities int) generator { return projectionsOf(entities, "k") }

// projectionsOf is projections with keys named prefix + entity number.
func projectionsOf(entities int, prefix string) generator {
	return projectionsPick(entities, prefix, func(rng *rand.Rand, _ int) int { return rng.IntN(entities) })
}

// projectionsOn is projections whose records seq in [only.from, only.to)
// are all of entities on partition p (as the load's producer partitions
// their keys), making p's backlog deeper than the others'.
func projectionsOn(entities int, p int32, only span) generator {
	part := kgo.StickyKeyPartitioner(nil).ForTopic(inTopic)
	var on []int
	for e := range entities {
		if part.Partition(&kgo.Record{Key: fmt.Appendf(nil, "k%d", e)}, partitions) == int(p) {
			on = append(on, e)
		}
	}
	return projectionsPick(entities, "k", func(rng *rand.Rand, seq int) int {
		if int64(seq) >= only.from && int64(seq) < only.to {
			return on[rng.IntN(len(on))]
		}
		return rng.IntN(entities)
	})
}

// projectionsPick is projectionsOf whose record seq is of entity pick's.
func projectionsPick(entities int, prefix string, pick func(rng *rand.Rand, seq int) int) generator {
	last := make([][]byte, entities)
	version := make([]int, entities)
	pad := strings.Repeat("x", 150)
	return func(rng *rand.Rand, seq int) *kgo.Record {
		e := pick(rng, seq)
		if last[e] == nil || rng.Float64() >= 0.3 {
			version[e]++
			last[e] = fmt.Appendf(nil, `{"e":"%s%d","v":%d,"seq":%d,"pad":%q}`, prefix, e, version[e], seq, pad)
		}
		return &kgo.Record{Key: fmt.Appendf(nil, "%s%d", prefix, e), Value: last[e]}
	}
}

func (g *loadgen) run() error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(g.brokers), kgo.DefaultProduceTopic(g.topic),
		kgo.ProducerLinger(5*time.Millisecond), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		return err
	}
	defer cl.Close()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	const chunk = 100
	tick := time.Duration(float64(time.Second) * chunk / float64(g.rate))
	next := time.Now()
	for sent := 0; sent < g.n; {
		batch := make([]*kgo.Record, 0, chunk)
		for ; len(batch) < chunk && sent < g.n; sent++ {
			batch = append(batch, g.gen(rng, sent))
		}
		// Blocks (the client retries) while the broker is down: the input
		// is never dropped, only delayed.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := cl.ProduceSync(ctx, batch...).FirstErr()
		cancel()
		if err != nil {
			return fmt.Errorf("load: produce: %w", err)
		}
		g.produced.Add(int64(len(batch)))
		next = next.Add(tick)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		} else {
			next = time.Now()
		}
	}
	return nil
}

// finished reports whether the generator is done.
func (g *loadgen) finished() bool {
	select {
	case <-g.done:
		return true
	default:
		return false
	}
}

func (g *loadgen) wait(limit time.Duration) {
	g.t.Helper()
	select {
	case <-g.done:
	case <-time.After(limit):
		g.t.Fatalf("load generator not done after %s (%d of %d produced)", limit, g.produced.Load(), g.n)
	}
	if g.err != nil {
		g.t.Fatal(g.err)
	}
}

// report is the checker's result.
type report struct {
	topic           string // the input's
	input, forwards int
	delivered       int // records in the output topic, repeats included
	lost, extra     int
	falseForwards   int
	orderErrors     int
	// skipped: the model's forwards in ranges the operator skipped (not
	// expected); skippedDelivered: of them, delivered all the same;
	// skippedRepeats: later records repeating them, which only a state
	// brought up to date by the catch-up drops.
	skipped, skippedDelivered, skippedRepeats int
	// headerErrors: forwards whose headers are not their input's less
	// the dam-* ones.
	headerErrors int
	// dead letters: dead, in the dead-letter topic; poison, bad input
	// records (each must have one); forged, input records carrying dam-*
	// headers; deadMissing, poison records not dead-lettered (yet);
	// deadWrong, dead letters of good records or not as documented
	// (source headers, dam-error, key, value); deadExtra, a poison
	// record's dead letter again.
	dead, poison, forged              int
	deadMissing, deadWrong, deadExtra int
	// bombs: of the poison records, the offsets of batches that inflate
	// past dam's bound (unread, so not among the input's records).
	bombs int
	// held: input records behind a halt (left out of the model);
	// heldDelivered: of them, delivered all the same.
	held, heldDelivered int
	firstProblems       []string
}

func (r report) String() string {
	s := fmt.Sprintf("%s: checked %d input, %d model forwards: lost %d, extra %d, false forwards %d, order errors %d, dead letters %d",
		r.topic, r.input, r.forwards, r.lost, r.extra, r.falseForwards, r.orderErrors, r.dead)
	if r.skipped > 0 || r.skippedDelivered > 0 {
		s += fmt.Sprintf("; %d model forwards skipped by the operator, %d of them delivered, %d repeated after the skip", r.skipped, r.skippedDelivered, r.skippedRepeats)
	}
	if r.poison > 0 || r.forged > 0 {
		s += fmt.Sprintf("; %d poison records: %d not dead-lettered, %d dead letters repeated; %d records with forged dam-* headers", r.poison, r.deadMissing, r.deadExtra, r.forged)
	}
	if r.bombs > 0 {
		s += fmt.Sprintf("; %d of the poison records in batches past the decompression bound", r.bombs)
	}
	if r.held > 0 || r.heldDelivered > 0 {
		s += fmt.Sprintf("; %d records held behind a halt, %d of them delivered", r.held, r.heldDelivered)
	}
	if r.deadWrong > 0 || r.headerErrors > 0 {
		s += fmt.Sprintf("; %d dead letters wrong, %d forwards with wrong headers", r.deadWrong, r.headerErrors)
	}
	return s
}

func sortRecs(rs []*kgo.Record) {
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].Partition != rs[j].Partition {
			return rs[i].Partition < rs[j].Partition
		}
		return rs[i].Offset < rs[j].Offset
	})
}

// model returns what a route forwards of its input (in partition and
// offset order): per key, the forwarded records in order. Records of one
// key share a partition, so the model holds whatever the interleaving of
// partitions. A key's forwarded values are distinct in every load here
// (each change carries a new sequence number), which the checker relies
// on: it matches the output by value.
type model func(in []*kgo.Record) map[string][]*kgo.Record

// lastSeenModel forwards a record iff its value differs from its key's
// previous one.
func lastSeenModel(in []*kgo.Record) map[string][]*kgo.Record {
	prev := map[string]string{}
	m := map[string][]*kgo.Record{}
	for _, rec := range in {
		k, v := string(rec.Key), string(rec.Value)
		if p, ok := prev[k]; ok && p == v {
			continue
		}
		prev[k] = v
		m[k] = append(m[k], rec)
	}
	return m
}

// recAt is where a record is: partition and offset.
type recAt struct {
	p int32
	o int64
}

// span is a range of offsets [from, to).
type span struct{ from, to int64 }

// routeCheck names a route's topics and model for the checker, and what
// the scenario did to its input.
type routeCheck struct {
	in, out, dead string
	model         model
	// input, when non-nil, is the input to check instead of what the
	// topic holds (read before the topic was deleted and recreated).
	input []*kgo.Record
	// skipped holds, per input partition, the ranges the operator made
	// dam skip (the group's offsets moved forward past them, or records
	// lost with a deleted topic): the model decides their records (dam
	// brings its state up to date with them) but expects none of them
	// delivered.
	skipped map[int32][]span
	// poison says whether an input record is bad input, and what its
	// dead letter's dam-error must say; bad input is never decided (the
	// model leaves it out) and has exactly one dead letter. nil: there is
	// none, and no dead letter may appear.
	poison func(*kgo.Record) (cause string, bad bool)
	// bombs are the offsets of the input's record batches that inflate
	// past pipeline.max_decompressed_batch_bytes (a batch of one record
	// each). The checker reads the input around them (readAround), and
	// each must have one dead letter without key, value or input headers,
	// with dam-value-dropped: unknown and a dam-error saying why.
	bombs map[recAt]bool
	// held is, per input partition, the offset from which its records
	// wait behind a halt (the committed offset of a halted partition):
	// dam has not decided them, so the model leaves them out, and none of
	// them may be delivered.
	held map[int32]int64
}

// bombCause is what a bomb's dead letter's dam-error says.
const bombCause = "inflates past pipeline.max_decompressed_batch_bytes"

// valueDropped is the header of a dead letter without its record's value
// (pipeline.HeaderValueDropped).
const valueDropped = "dam-value-dropped"

func (rc routeCheck) isHeld(r *kgo.Record) bool {
	from, ok := rc.held[r.Partition]
	return ok && r.Offset >= from
}

// defaultCheck is the default route's (sidecarOpts.routes "").
var defaultCheck = routeCheck{in: inTopic, out: outTopic, dead: deadTopic, model: lastSeenModel}

func (rc routeCheck) isSkipped(r *kgo.Record) bool {
	for _, s := range rc.skipped[r.Partition] {
		if r.Offset >= s.from && r.Offset < s.to {
			return true
		}
	}
	return false
}

// maxErrorHeader bounds a dead letter's dam-error (docs/delivery.md: 512
// bytes, and the mark of the cut).
const maxErrorHeader = 600

// userHeaders are hs less those named dam-* (in any case), as "key=value"
// strings in order.
func userHeaders(hs []kgo.RecordHeader) []string {
	var out []string
	for _, h := range hs {
		if !isDamHeader(h.Key) {
			out = append(out, h.Key+"="+string(h.Value))
		}
	}
	return out
}

func isDamHeader(key string) bool {
	return len(key) >= 4 && strings.EqualFold(key[:4], "dam-")
}

// check compares the route's output topic with its model of the input,
// and its dead-letter topic with the input's poison records.
func (rc routeCheck) check(brokers string) (report, error) {
	in := rc.input
	var unread map[recAt]bool
	if in == nil {
		var err error
		if rc.bombs != nil {
			in, unread, err = readAround(brokers, rc.in, checkerInflateMax)
		} else {
			in, err = testkafka.ReadAll(brokers, rc.in)
		}
		if err != nil {
			return report{}, fmt.Errorf("reading %s: %w", rc.in, err)
		}
	}
	for a := range unread {
		if !rc.bombs[a] {
			return report{}, fmt.Errorf("%s: the batch at partition %d offset %d inflates past %d bytes, and it is no bomb of the scenario's", rc.in, a.p, a.o, checkerInflateMax)
		}
	}
	if rc.bombs != nil && len(unread) != len(rc.bombs) {
		return report{}, fmt.Errorf("%s: %d batches inflate past %d bytes, the scenario produced %d bombs", rc.in, len(unread), checkerInflateMax, len(rc.bombs))
	}
	out, err := testkafka.ReadAll(brokers, rc.out)
	if err != nil {
		return report{}, fmt.Errorf("reading %s: %w", rc.out, err)
	}
	dead, err := testkafka.ReadAll(brokers, rc.dead)
	if err != nil {
		return report{}, fmt.Errorf("reading %s: %w", rc.dead, err)
	}
	in = slices.Clone(in)
	sortRecs(in)
	sortRecs(out)
	r := report{topic: rc.in, input: len(in) + len(unread), delivered: len(out), dead: len(dead), bombs: len(unread)}
	problem := func(f string, a ...any) {
		if len(r.firstProblems) < 10 {
			r.firstProblems = append(r.firstProblems, fmt.Sprintf(f, a...))
		}
	}
	// Bad input is never decided: the model runs on the good records.
	byOffset := make(map[recAt]*kgo.Record, len(in))
	poisonCause := map[recAt]string{}
	for a := range unread {
		poisonCause[a] = bombCause
	}
	held := map[string]map[string]bool{}
	good := in[:0:0]
	for _, rec := range in {
		byOffset[recAt{rec.Partition, rec.Offset}] = rec
		if len(userHeaders(rec.Headers)) < len(rec.Headers) {
			r.forged++
		}
		if rc.poison != nil {
			if cause, bad := rc.poison(rec); bad {
				poisonCause[recAt{rec.Partition, rec.Offset}] = cause
				continue
			}
		}
		if rc.isHeld(rec) {
			k := string(rec.Key)
			if held[k] == nil {
				held[k] = map[string]bool{}
			}
			held[k][string(rec.Value)] = true
			r.held++
			continue
		}
		good = append(good, rec)
	}
	r.poison = len(poisonCause)
	// The model: per key, the values forwarded, in order, less those the
	// operator skipped.
	model := map[string][]string{}
	modelRec := map[string]map[string]*kgo.Record{}
	skipped := map[string]map[string]bool{}
	for k, recs := range rc.model(good) {
		modelRec[k] = map[string]*kgo.Record{}
		for _, rec := range recs {
			v := string(rec.Value)
			if rc.isSkipped(rec) {
				if skipped[k] == nil {
					skipped[k] = map[string]bool{}
				}
				skipped[k][v] = true
				r.skipped++
				continue
			}
			modelRec[k][v] = rec
			model[k] = append(model[k], v)
			r.forwards++
		}
	}
	for _, rec := range good {
		if skipped[string(rec.Key)][string(rec.Value)] && !rc.isSkipped(rec) {
			r.skippedRepeats++
		}
	}
	// The output: per entity, first occurrences in output order.
	seen := map[string]map[string]bool{}
	firsts := map[string][]string{}
	for _, rec := range out {
		k, v := string(rec.Key), string(rec.Value)
		src := modelRec[k][v]
		if src == nil {
			switch {
			case held[k][v]:
				r.heldDelivered++
				problem("delivered a record held behind a halt: entity %.40s value %.60s (partition %d offset %d)", k, v, rec.Partition, rec.Offset)
			case skipped[k][v]:
				r.skippedDelivered++
				problem("delivered a value the model forwards only in a range the operator skipped (that record, or a later repeat the caught-up state drops): entity %.40s value %.60s (partition %d offset %d)", k, v, rec.Partition, rec.Offset)
			default:
				r.falseForwards++
				problem("false forward: entity %.40s value %.60s (partition %d offset %d)", k, v, rec.Partition, rec.Offset)
			}
			continue
		}
		if got, want := userHeaders(rec.Headers), userHeaders(src.Headers); len(got) != len(rec.Headers) || !slices.Equal(got, want) {
			r.headerErrors++
			problem("forward of entity %.40s (input partition %d offset %d) has headers %q, want the input's less dam-*: %q", k, src.Partition, src.Offset, headerList(rec.Headers), want)
		}
		if seen[k] == nil {
			seen[k] = map[string]bool{}
		}
		if seen[k][v] {
			r.extra++
			continue
		}
		seen[k][v] = true
		firsts[k] = append(firsts[k], v)
	}
	for k, vs := range model {
		for _, v := range vs {
			if !seen[k][v] {
				r.lost++
				problem("lost: entity %.40s value %.60s", k, v)
			}
		}
		// Order: the delivered first occurrences are the model's forwards
		// in model order (a subsequence of it while some are missing).
		i := 0
		for _, v := range firsts[k] {
			for i < len(vs) && vs[i] != v {
				i++
			}
			if i == len(vs) {
				r.orderErrors++
				problem("order: entity %.40s: %.60s delivered out of model order", k, v)
				break
			}
			i++
		}
	}
	// The dead letters: one per poison record, with dam's headers alone
	// naming its source and a short error saying why.
	lettered := map[recAt]bool{}
	for _, d := range dead {
		src, cause, err := rc.deadLetterSource(d, byOffset)
		if err == nil {
			if want, bad := poisonCause[recAt{src.Partition, src.Offset}]; !bad {
				err = errors.New("a good record dead-lettered")
			} else if !strings.Contains(cause, want) {
				err = fmt.Errorf("dam-error %.200q does not say %q", cause, want)
			}
		}
		if err != nil {
			r.deadWrong++
			problem("dead letter at partition %d offset %d (key %.40q): %v", d.Partition, d.Offset, d.Key, err)
			continue
		}
		if a := (recAt{src.Partition, src.Offset}); lettered[a] {
			r.deadExtra++
		} else {
			lettered[a] = true
		}
	}
	for a := range poisonCause {
		if !lettered[a] {
			r.deadMissing++
			problem("poison record at partition %d offset %d not dead-lettered", a.p, a.o)
		}
	}
	return r, nil
}

// deadLetterSource returns the input record a dead letter names and its
// dam-error, or why the dead letter is not as documented: exactly one
// dam-error (at most maxErrorHeader bytes), dam-source-topic,
// -partition and -offset each, naming an input record whose key, value and
// headers (less dam-*) it carries, and no other dam-* header. A bomb's
// dead letter (rc.bombs) carries nothing of its record, which dam never
// read, and dam-value-dropped: unknown besides.
func (rc routeCheck) deadLetterSource(d *kgo.Record, in map[recAt]*kgo.Record) (*kgo.Record, string, error) {
	dam := map[string][]string{}
	for _, h := range d.Headers {
		if isDamHeader(h.Key) {
			dam[h.Key] = append(dam[h.Key], string(h.Value))
		}
	}
	want := []string{"dam-error", "dam-source-topic", "dam-source-partition", "dam-source-offset"}
	for _, k := range want {
		if len(dam[k]) != 1 {
			return nil, "", fmt.Errorf("%d %s headers, want 1 (headers %q)", len(dam[k]), k, headerList(d.Headers))
		}
	}
	p, err1 := strconv.ParseInt(dam["dam-source-partition"][0], 10, 32)
	o, err2 := strconv.ParseInt(dam["dam-source-offset"][0], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return nil, "", err
	}
	bomb := rc.bombs[recAt{int32(p), o}]
	if bomb {
		want = append(want, valueDropped)
		if v := dam[valueDropped]; len(v) != 1 || v[0] != "unknown" {
			return nil, "", fmt.Errorf("a bomb's dead letter with %s %q, want \"unknown\" once", valueDropped, v)
		}
	}
	if len(dam) != len(want) {
		return nil, "", fmt.Errorf("dam-* headers %q, want %q alone", headerList(d.Headers), want)
	}
	cause := dam["dam-error"][0]
	if len(cause) > maxErrorHeader {
		return nil, "", fmt.Errorf("dam-error of %d bytes, above %d: %.100q", len(cause), maxErrorHeader, cause)
	}
	if dam["dam-source-topic"][0] != rc.in {
		return nil, "", fmt.Errorf("dam-source-topic %q, want %q", dam["dam-source-topic"][0], rc.in)
	}
	if bomb {
		if len(d.Key) > 0 || len(d.Value) > 0 || len(d.Headers) != len(want) {
			return nil, "", fmt.Errorf("a bomb's dead letter with a key (%d bytes), a value (%d bytes) or headers %q: dam never read its record", len(d.Key), len(d.Value), headerList(d.Headers))
		}
		return &kgo.Record{Topic: rc.in, Partition: int32(p), Offset: o}, cause, nil
	}
	src := in[recAt{int32(p), o}]
	switch {
	case src == nil:
		return nil, "", fmt.Errorf("no input record at partition %d offset %d", p, o)
	case !bytes.Equal(src.Key, d.Key) || !bytes.Equal(src.Value, d.Value):
		return nil, "", fmt.Errorf("key or value (%d bytes) not those of input partition %d offset %d", len(d.Value), p, o)
	case !slices.Equal(userHeaders(d.Headers), userHeaders(src.Headers)):
		return nil, "", fmt.Errorf("headers %q, want the input's less dam-* (%q)", userHeaders(d.Headers), userHeaders(src.Headers))
	}
	return src, cause, nil
}

// headerList shows headers as "key=value" (values cut at 40 bytes).
func headerList(hs []kgo.RecordHeader) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		v := string(h.Value)
		if len(v) > 40 {
			v = v[:40] + "…"
		}
		out[i] = h.Key + "=" + v
	}
	return out
}

// waitDelivered polls the checker of the default route until nothing is
// lost (or limit), then returns the last report.
func waitDelivered(t *testing.T, brokers string, limit time.Duration, alive ...*sidecar) report {
	t.Helper()
	return waitDeliveredRoute(t, brokers, defaultCheck, limit, alive...)
}

// waitDeliveredRoute is waitDelivered for the route rc: it waits until
// nothing is lost and every poison record is dead-lettered.
func waitDeliveredRoute(t *testing.T, brokers string, rc routeCheck, limit time.Duration, alive ...*sidecar) report {
	t.Helper()
	deadline := time.Now().Add(limit)
	var r report
	var err error
	for {
		r, err = rc.check(brokers)
		if err == nil && r.lost == 0 && r.deadMissing == 0 {
			return r
		}
		for _, s := range alive {
			s.checkAlive()
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		t.Fatalf("checker: %v", err)
	}
	return r
}

// assertReport fails on any loss, false forward, order error, forward with
// the wrong headers, record delivered from a skipped range, or dead letter
// not of a poison record (or not as documented) or missing, or when the
// input does not hold the load's records; maxExtra bounds the
// repeats of forwards and of dead letters alike (< 0: any number).
func assertReport(t *testing.T, r report, load *loadgen, maxExtra int) {
	t.Helper()
	t.Log(r)
	for _, p := range r.firstProblems {
		t.Log(p)
	}
	if r.input-r.bombs != load.n {
		t.Errorf("the input topic holds %d records besides %d bombs, the load produced %d", r.input-r.bombs, r.bombs, load.n)
	}
	if r.forwards == 0 {
		t.Fatal("checker: the model forwards nothing: the load did not reach the broker")
	}
	if r.lost != 0 || r.falseForwards != 0 || r.orderErrors != 0 || r.skippedDelivered != 0 || r.headerErrors != 0 ||
		r.deadWrong != 0 || r.deadMissing != 0 || r.heldDelivered != 0 {
		t.Errorf("delivery broken: %s", r)
	}
	if maxExtra >= 0 && r.extra > maxExtra {
		t.Errorf("extra deliveries: %d, want at most %d", r.extra, maxExtra)
	}
	if maxExtra >= 0 && r.deadExtra > maxExtra {
		t.Errorf("dead letters repeated: %d, want at most %d", r.deadExtra, maxExtra)
	}
}

// modeCheck is the check of route service (in.service → out.service,
// dead letters to dlq.service) against model m.
func modeCheck(service string, m model) routeCheck {
	return routeCheck{in: "in." + service, out: "out." + service, dead: "dlq." + service, model: m}
}

// idempotent is window mode's stream: commands keyed by their message id
// (header Idempotency-Key, so that retries share a partition), 30% of them
// retries of a recent id, with a changed value (a retry counter): a retry
// is a duplicate whatever its content.
func idempotent() generator {
	var recent []string
	return func(rng *rand.Rand, seq int) *kgo.Record {
		id := fmt.Sprintf("m%d", seq)
		if len(recent) > 0 && rng.Float64() < 0.3 {
			id = recent[rng.IntN(len(recent))]
		} else if recent = append(recent, id); len(recent) > 500 {
			recent = recent[1:]
		}
		return &kgo.Record{Key: []byte(id), Value: fmt.Appendf(nil, `{"id":%q,"seq":%d}`, id, seq),
			Headers: []kgo.RecordHeader{{Key: "Idempotency-Key", Value: []byte(id)}}}
	}
}

// windowModel forwards the first record of each id (the key): the window
// (1h) outlasts the test.
func windowModel(in []*kgo.Record) map[string][]*kgo.Record {
	m := map[string][]*kgo.Record{}
	for _, rec := range in {
		if k := string(rec.Key); m[k] == nil {
			m[k] = []*kgo.Record{rec}
		}
	}
	return m
}
