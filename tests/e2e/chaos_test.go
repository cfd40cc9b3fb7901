package e2e

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dam-dedup/dam/internal/pglocal"
	"github.com/dam-dedup/dam/internal/testutil/pgcitus"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// The chaos suite: each scenario injects one kind of fault, many times,
// into real dam processes under load, in both delivery modes, then reads
// everything back (read_committed) and compares it with the reference
// last-seen model of the input. `make chaos` runs the full sizes
// (DAM_TEST_CHAOS=full) and prints the table (DAM_TEST_CHAOS_TABLE=FILE); `make
// test` runs every row at a reduced size.

const (
	alo = "at-least-once"
	eos = "exactly-once"
	// chaosInFlight is pipeline.max_in_flight in the chaos rows: small,
	// so that at-least-once's documented bound on re-deliveries (the
	// records in flight at each fault) is tight enough to mean something.
	chaosInFlight = 1000
)

var chaosFull = os.Getenv("DAM_TEST_CHAOS") == "full"

// sized picks the reduced (make test) or the full (make chaos) size.
func sized[T any](reduced, full T) T {
	if chaosFull {
		return full
	}
	return reduced
}

// scenario is one row of the table per delivery mode it runs in.
type scenario struct {
	name  string
	modes []string
	// forward: the route forwards undecided while PostgreSQL is down
	// (on_store_failure: forward), so repeats are expected beyond the
	// in-flight bound.
	forward bool
	// topics are created on the broker beside the default route's.
	topics []string
	run    func(c *chaosRun)
}

// chaosRun is one scenario in one mode: its broker, its PostgreSQL and
// what it counted.
type chaosRun struct {
	t        *testing.T
	delivery string
	forward  bool
	b        *broker
	dsn      string
	load     *loadgen
	alive    []*sidecar // the sidecars the final check waits with

	// zombie may exit on a fence (exactly-once: its producer fenced when
	// its transaction ends) and is then restarted, as its orchestrator
	// would; zombieRestarted says it was.
	zombie          *sidecar
	zombieRestarted bool

	// routes is the sidecars' routes (YAML); "": the default route.
	routes string
	// checks are the routes the final check compares with their models,
	// each with its load; none: the default route and load.
	checks []chaosCheck
	// inert counts the faults that may re-deliver nothing (a clean stop,
	// a poison record): at-least-once's bound allows for the others.
	inert int
	// extraIn counts records in that no check reads (a recreated input's
	// new records).
	extraIn int
	// halts: the scenario ends with its partitions halted, by design;
	// recovery is then the time until the halt is reported.
	halts bool
	// finally are checks the scenario leaves for after the final check.
	finally []func()

	// pipeline is more of the sidecars' pipeline section (YAML lines).
	pipeline string
	// maxInFlight is the sidecars' pipeline.max_in_flight; 0: chaosInFlight.
	maxInFlight int

	mu       sync.Mutex
	adm      *kadm.Client // admin's
	faults   int
	recovery time.Duration
}

// chaosCheck is one route of the final check and its load.
type chaosCheck struct {
	rc   routeCheck
	load *loadgen
}

// restartIfFenced restarts s if it is the zombie and has exited: naming a
// fence, or the test fails.
func (c *chaosRun) restartIfFenced(s *sidecar) bool {
	if s != c.zombie {
		return false
	}
	exited, err := s.exited()
	if !exited {
		return false
	}
	if !s.currentLogContains("fenced") {
		c.t.Errorf("the zombie %s exited without naming a fence: %v", s.name, err)
	}
	c.t.Logf("the zombie %s exited on a fence (%v); restarting it", s.name, err)
	s.env = nil
	s.start()
	c.zombieRestarted = true
	return true
}

// sidecar makes a dam process of this run.
func (c *chaosRun) sidecar(name string) *sidecar {
	o := sidecarOpts{brokers: c.b.addr(), dsn: c.dsn, delivery: c.delivery, maxInFlight: cmp.Or(c.maxInFlight, chaosInFlight), routes: c.routes, pipeline: c.pipeline}
	if c.forward {
		o.routes = defaultRoutes + "    on_store_failure: forward\n"
	}
	return newSidecar(c.t, name, o)
}

// startOne starts the run's one sidecar, the one the final check waits
// with, and waits for it to be ready.
func (c *chaosRun) startOne(within time.Duration) *sidecar {
	s := c.sidecar("a")
	c.alive = []*sidecar{s}
	s.start()
	s.waitReady(within)
	return s
}

// startLoad produces n projections over d.
func (c *chaosRun) startLoad(n int, d time.Duration) {
	c.load = startLoad(c.t, c.b.addr(), n, 2000, d)
}

// fault counts one injected fault.
func (c *chaosRun) fault(what string) {
	c.mu.Lock()
	c.faults++
	n := c.faults
	c.mu.Unlock()
	produced := int64(0)
	if c.load != nil {
		produced = c.load.produced.Load()
	}
	c.t.Logf("fault %d: %s (%d records produced so far)", n, what, produced)
}

// recovered waits, from the end of a fault at since, until every sidecar
// of ss is ready and records are decided again (dam_records_total grows in
// one of them, as long as the load goes on: a sidecar may hold no
// partition), and records the longest such wait. A sidecar
// that does not recover within two minutes is stuck: the test fails.
func (c *chaosRun) recovered(since time.Time, ss ...*sidecar) {
	c.t.Helper()
	base := make([]float64, len(ss))
	for i, s := range ss {
		base[i], _ = s.metric("dam_records_total")
	}
	deadline := since.Add(2 * time.Minute)
	for {
		ok := true
		loadDone := c.load == nil || c.load.finished()
		grew := false
		for i, s := range ss {
			if c.restartIfFenced(s) {
				base[i] = 0 // a new process counts from 0
			}
			s.checkAlive()
			if s.ready() != http.StatusOK {
				ok = false
			}
			if v, err := s.metric("dam_records_total"); err == nil && v > base[i] {
				grew = true
			}
		}
		if ok && (grew || loadDone) {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no recovery within %s of the fault's end: not ready, or nothing decided since", time.Since(since).Round(time.Second))
		}
		time.Sleep(100 * time.Millisecond)
	}
	d := time.Since(since)
	c.mu.Lock()
	c.recovery = max(c.recovery, d)
	c.mu.Unlock()
}

// chaosRow is one line of the table.
type chaosRow struct {
	scenario, delivery string
	in, expected       int
	delivered, lost    int
	extra, bound       int // bound < 0: none documented
	faults             int
	recovery           time.Duration
	halts              bool // recovery is the time to report a halt
	held               int  // input records waiting behind the halt
	ran, failed        bool
}

func (r chaosRow) recovered() string {
	d := r.recovery.Round(100 * time.Millisecond).String()
	switch {
	case r.halts && r.held > 0:
		return fmt.Sprintf("halted after %s (%d records held)", d, r.held)
	case r.halts:
		return "halted after " + d
	case r.recovery == 0:
		return "n/a" // nothing to recover from (poison records)
	}
	return d
}

func (r chaosRow) beyond() string {
	if r.bound < 0 {
		return fmt.Sprintf("n/a (%d repeats, forward)", r.extra)
	}
	return fmt.Sprint(max(0, r.extra-r.bound))
}

// TestChaos runs every scenario in each of its modes, three rows at a time
// beside the other tests, and prints the table.
func TestChaos(t *testing.T) {
	t.Parallel()
	needBinary(t)
	var rows []*chaosRow
	type job struct {
		sc   scenario
		mode string
		row  *chaosRow
	}
	var jobs []job
	for _, sc := range chaosScenarios() {
		for _, m := range sc.modes {
			r := &chaosRow{scenario: sc.name, delivery: m}
			rows = append(rows, r)
			jobs = append(jobs, job{sc, m, r})
		}
	}
	sem := make(chan struct{}, 3)
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			t.Run(strings.ReplaceAll(j.sc.name, " ", "_")+"/"+j.mode, func(t *testing.T) {
				j.row.ran = true
				runScenario(t, j.sc, j.mode, j.row)
			})
		}()
	}
	wg.Wait()

	var sb strings.Builder
	fmt.Fprintf(&sb, "chaos (%s sizes, %d partitions, max_in_flight %d)\n\n", sized("reduced", "full"), partitions, chaosInFlight)
	tw := tabwriter.NewWriter(&sb, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "scenario\tdelivery\trecords in\texpected forwards\tdelivered\tlost\tduplicated beyond bound\tfaults injected\tlongest recovery\t")
	for _, r := range rows {
		if !r.ran { // not selected (go test -run 'TestChaos/ROW/MODE')
			continue
		}
		res := ""
		if r.failed {
			res = " FAILED"
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t\n", r.scenario, res, r.delivery, r.in, r.expected,
			r.delivered, r.lost, r.beyond(), r.faults, r.recovered())
	}
	tw.Flush()
	t.Log("\n" + sb.String())
	if path := os.Getenv("DAM_TEST_CHAOS_TABLE"); path != "" {
		if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// runScenario runs one row and checks the output: nothing lost, nothing
// forwarded that the model drops, per-entity order, no dead letter but
// those of poison records, and no repeat in exactly-once mode
// (read_committed) or beyond the in-flight bound in at-least-once mode.
func runScenario(t *testing.T, sc scenario, mode string, row *chaosRow) {
	c := &chaosRun{t: t, delivery: mode, forward: sc.forward, b: newBroker(t, true, sc.topics...), dsn: pgtest.DSN(t)}
	defer func() {
		if t.Failed() {
			row.failed = true
		}
	}()
	sc.run(c)
	if c.load == nil {
		t.Fatal("the scenario started no load")
	}
	checks := c.checks
	if len(checks) == 0 {
		checks = []chaosCheck{{defaultCheck, c.load}}
	}
	for _, ch := range checks {
		ch.load.wait(5 * time.Minute)
	}
	// At-least-once: each fault may deliver again what was in flight,
	// max_in_flight records per assigned partition.
	row.bound = (c.faults - c.inert) * chaosInFlight * partitions
	switch {
	case sc.forward:
		row.bound = -1
	case mode == eos:
		row.bound = 0
	}
	row.in, row.faults, row.recovery, row.halts = c.extraIn, c.faults, c.recovery, c.halts
	for _, ch := range checks {
		r := waitDeliveredRoute(t, c.b.addr(), ch.rc, 3*time.Minute, c.alive...)
		row.in += r.input
		row.expected += r.forwards
		row.delivered += r.delivered
		row.lost += r.lost + r.deadMissing
		row.extra += r.extra + r.deadExtra
		row.held += r.held
		// Every record of a hostile load is a fault of its own.
		row.faults += r.poison + r.forged
		assertReport(t, r, ch.load, row.bound)
	}
	t.Logf("%d faults, longest recovery %s", row.faults, c.recovery.Round(time.Millisecond))
	if row.faults == 0 {
		t.Error("the scenario injected no fault")
	}
	for _, f := range c.finally {
		f()
	}
}

func chaosScenarios() []scenario {
	both := []string{alo, eos}
	rows := []scenario{
		{name: "kill -9", modes: both, run: chaosKill},
		{name: "crash at each step", modes: both, run: chaosCrashAtSteps},
		{name: "zombie at each step", modes: both, run: chaosZombie},
		{name: "PostgreSQL faults", modes: both, run: chaosPostgres},
		{name: "broker faults", modes: both, run: chaosBroker},
		{name: "rebalance storm", modes: both, run: chaosStorm},
		{name: "forward, PostgreSQL flapping, kill -9", modes: []string{alo}, forward: true, run: chaosForwardFlapping},
		{name: "ambiguous EndTxn, TxnOffsetCommit", modes: []string{eos}, run: chaosAmbiguous},
		{name: "offsets moved forward", modes: both, run: chaosOffsetsForward},
		{name: "input recreated", modes: both, run: chaosRecreated},
		{name: "poison records", modes: both, topics: windowTopics, run: chaosPoison},
		{name: "decompression bombs", modes: both, run: chaosBombs},
		{name: "halt in a backlog", modes: both, run: chaosHaltBacklog},
	}
	if pgtest.Citus() { // make test-citus: every row above runs on Citus too
		rows = append(rows, scenario{name: "Citus worker restarts", modes: both, run: chaosCitusWorkers})
	}
	return rows
}

// chaosKill: SIGKILL at random moments under load, 20 times (3 reduced),
// restarting at once; each kill lands while partitions are decided and
// delivered, since the restarted process is ready first.
func chaosKill(c *chaosRun) {
	kills := sized(3, 20)
	s := c.startOne(30 * time.Second)
	c.startLoad(sized(15000, 150000), sized(30*time.Second, 200*time.Second))
	for range kills {
		time.Sleep(time.Duration(1000+rand.IntN(2000)) * time.Millisecond)
		s.checkAlive()
		s.kill()
		c.fault("kill -9")
		s.start()
		c.recovered(time.Now(), s)
	}
}

var steps = []string{"decided", "producing", "acked"}

// chaosCrashAtSteps: the process stops itself exactly at a protocol step
// (after the decide commit, with records handed to the producer, after
// the acks and before the offset commit) and is killed there, then
// restarted: DESIGN §2's crash table, row by row.
func chaosCrashAtSteps(c *chaosRun) {
	s := c.sidecar("a")
	c.alive = []*sidecar{s}
	rounds := sized(1, 3)
	c.startLoad(sized(12000, 40000), sized(30*time.Second, 100*time.Second))
	for i := range rounds * len(steps) {
		step := steps[i%len(steps)]
		if i > 0 {
			if _, err := s.term(s.grace + 5*time.Second); err != nil {
				c.t.Errorf("a: exit %v after SIGTERM", err)
			}
		}
		s.env = []string{fmt.Sprintf("DAM_TEST_PAUSE_AT=%s:%d", step, 3+rand.IntN(5))}
		s.start()
		s.waitStopped(90 * time.Second)
		s.kill()
		c.fault("kill -9 at step " + step)
		s.env = nil
		s.start()
		c.recovered(time.Now(), s)
	}
}

// chaosZombie: an owner stops itself (SIGSTOP) at a protocol step and
// stays stopped past the session timeout; another instance takes its
// partitions; then the zombie resumes (SIGCONT). It must stop on fenced
// (its epoch, its transaction), change nothing and lose nothing.
func chaosZombie(c *chaosRun) {
	a, b := c.sidecar("a"), c.sidecar("b")
	c.alive = []*sidecar{a, b}
	rounds := sized(1, 2)
	// The load lasts past the last round: a pause step is reached only
	// while records flow.
	c.startLoad(sized(20000, 60000), sized(70*time.Second, 150*time.Second))
	for i := range rounds * len(steps) {
		step := steps[i%len(steps)]
		// The zombie is a (restarted with the pause armed); b is stopped
		// so that a owns every partition when it pauses.
		if i > 0 {
			if _, err := b.term(b.grace + 5*time.Second); err != nil {
				c.t.Errorf("b: exit %v after SIGTERM", err)
			}
			if _, err := a.term(a.grace + 5*time.Second); err != nil {
				c.t.Errorf("a: exit %v after SIGTERM", err)
			}
		}
		a.env = []string{fmt.Sprintf("DAM_TEST_PAUSE_AT=%s:%d", step, 2+rand.IntN(4))}
		a.start()
		a.waitStopped(90 * time.Second)
		c.fault("SIGSTOP at step " + step)
		b.start()
		// b owns the partitions once a's session expired.
		deadline := time.Now().Add(60 * time.Second)
		for !b.currentLogContains(`"partition assigned"`) {
			if time.Now().After(deadline) {
				c.t.Fatalf("b got no partition within 60 s of a's pause")
			}
			b.checkAlive()
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(2 * time.Second)
		a.signal(syscall.SIGCONT)
		resumed := time.Now()
		// The zombie's next step fails: fenced by its epoch in PostgreSQL,
		// by the group generation (its offset commit), or its partitions
		// are lost before it tries. In exactly-once mode its producer may
		// be fenced too (the broker aborted its transaction on timeout):
		// it then exits, naming the fence, and its orchestrator restarts
		// it.
		c.zombie, c.zombieRestarted = a, false
		deadline = time.Now().Add(30 * time.Second)
		for !c.restartIfFenced(a) {
			if a.currentLogContains("fenced") || a.currentLogContains(`"partitions lost`) || a.currentLogContains(`"partitions revoked`) {
				break
			}
			if time.Now().After(deadline) {
				c.t.Errorf("the zombie (a, paused at %s) logged neither fenced nor a lost or revoked partition after it resumed", step)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.recovered(resumed, a, b)
		// In exactly-once mode the zombie's producer may be found fenced
		// only when its transaction ends, within the transaction timeout
		// (5 s here) of the resume: it then exits and is restarted.
		for until := resumed.Add(10 * time.Second); c.delivery == eos && !c.zombieRestarted && time.Now().Before(until); {
			if c.restartIfFenced(a) {
				c.recovered(time.Now(), a, b)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.zombie = nil
		a.env = nil
	}
}

// chaosPostgres: PostgreSQL behind a TCP proxy, on a private server that
// can be restarted: latency, COMMIT replies lost (the outcome unknown to
// dam), a black hole of 30 s (8 s reduced) during which dam must report
// itself not ready, and a real server restart.
func chaosPostgres(c *chaosRun) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := pglocal.Start(ctx, c.t.Logf, pglocal.Durable())
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = pg.Stop() })
	target, rewrite := tcpproxy.PostgresDSN(c.t, pg.DSN())
	proxy := tcpproxy.New(c.t, target)
	c.dsn = rewrite(proxy.Addr())
	s := c.startOne(60 * time.Second)
	c.startLoad(sized(20000, 90000), sized(45*time.Second, 180*time.Second))
	time.Sleep(3 * time.Second)

	proxy.Latency(50 * time.Millisecond)
	time.Sleep(sized(3*time.Second, 10*time.Second))
	proxy.Latency(0)
	c.fault("PostgreSQL latency 50 ms")
	c.recovered(time.Now(), s)

	for range sized(2, 5) {
		lost := make(chan struct{})
		proxy.LoseNextCommitReply(func() { close(lost) })
		select {
		case <-lost:
		case <-time.After(60 * time.Second):
			c.t.Fatal("no COMMIT went through the proxy within 60 s")
		}
		c.fault("a COMMIT's reply lost, its connection reset")
		c.recovered(time.Now(), s)
	}

	proxy.Blackhole()
	stop := make(chan struct{})
	seen := watchHalted(s, stop)
	time.Sleep(sized(8*time.Second, 30*time.Second))
	close(stop)
	got := <-seen
	proxy.Restore()
	c.fault("PostgreSQL black hole")
	if !got[0] && !got[1] {
		c.t.Error("during the black hole dam never reported dam_halted > 0 nor /readyz 503")
	}
	c.recovered(time.Now(), s)

	if err := pg.Restart(ctx, sized(2*time.Second, 5*time.Second)); err != nil {
		c.t.Fatal(err)
	}
	c.fault("PostgreSQL server restart")
	c.recovered(time.Now(), s)
}

// chaosCitusWorkers: on a Citus cluster of its own (a coordinator and two
// workers, so that the other rows' shared cluster is not disturbed), each
// worker is restarted under load, then one is down for longer: the
// partitions whose batches touch it pause and resume. A batch prepared on
// a worker when it goes down is finished by the coordinator's recovery of
// prepared transactions. The state of the route's one service must sit in
// shards on both workers.
func chaosCitusWorkers(c *chaosRun) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cc, err := pgcitus.Start(ctx, c.t.Logf, 2)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cc.Stop() })
	// Finish a two-phase commit cut by a worker's crash within a second
	// (Citus's default is a minute): the row's recovery bound is two.
	if _, err := pgExec(ctx, cc.DSN(), `ALTER SYSTEM SET citus.recover_2pc_interval = '1s'`, `SELECT pg_reload_conf()`); err != nil {
		c.t.Fatal(err)
	}
	c.dsn = cc.DSN()
	s := c.startOne(60 * time.Second)
	c.startLoad(sized(20000, 90000), sized(45*time.Second, 180*time.Second))
	time.Sleep(3 * time.Second)
	for round := range sized(1, 3) {
		for i := range cc.Workers() {
			if err := cc.Worker(i).Restart(ctx, sized(time.Second, 3*time.Second)); err != nil {
				c.t.Fatal(err)
			}
			c.fault(fmt.Sprintf("Citus worker %d restarted (round %d)", i+1, round+1))
			c.recovered(time.Now(), s)
		}
	}
	if err := cc.Worker(0).Restart(ctx, sized(8*time.Second, 20*time.Second)); err != nil {
		c.t.Fatal(err)
	}
	c.fault("Citus worker 1 down for longer")
	c.recovered(time.Now(), s)
	c.finally = append(c.finally, func() {
		// The workers whose shards hold state rows.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rows, err := pgExec(ctx, cc.DSN(), `SELECT count(DISTINCT s.nodeport) FROM citus_shards s
			JOIN run_command_on_shards('state', 'SELECT count(*) FROM %s') r ON r.shardid = s.shardid
			WHERE s.table_name = 'state'::regclass AND r.result::bigint > 0`)
		if err != nil {
			c.t.Fatal(err)
		}
		if rows != "2" {
			c.t.Errorf("the service's state sits on %s workers' shards, want 2", rows)
		}
	})
}

// pgExec runs statements on dsn, each on its own, and returns the first
// column of the last one's first row (if it has one), as text.
func pgExec(ctx context.Context, dsn string, sql ...string) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var out string
	for _, q := range sql {
		rows, err := conn.Query(ctx, q, pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			return "", fmt.Errorf("%s: %w", q, err)
		}
		if rows.Next() {
			v, err := rows.Values()
			if err != nil {
				rows.Close()
				return "", fmt.Errorf("%s: %w", q, err)
			}
			out = fmt.Sprint(v[0])
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return "", fmt.Errorf("%s: %w", q, err)
		}
	}
	return out, nil
}

// chaosBroker: the broker's connections reset, its replies delayed, and
// the broker stopped and restarted on the same port with its data.
func chaosBroker(c *chaosRun) {
	s := c.startOne(30 * time.Second)
	c.startLoad(sized(20000, 90000), sized(40*time.Second, 150*time.Second))
	time.Sleep(3 * time.Second)

	for range sized(2, 8) {
		n := c.b.faults.reset()
		c.fault(fmt.Sprintf("broker connections reset (%d)", n))
		c.recovered(time.Now(), s)
		time.Sleep(time.Duration(500+rand.IntN(1500)) * time.Millisecond)
	}

	c.b.faults.setLatency(100 * time.Millisecond)
	time.Sleep(sized(3*time.Second, 10*time.Second))
	c.b.faults.setLatency(0)
	c.fault("broker latency 100 ms")
	c.recovered(time.Now(), s)

	for range sized(1, 2) {
		t0 := time.Now()
		c.b.stop()
		stopped := time.Since(t0)
		stop := make(chan struct{})
		seen := watchHalted(s, stop)
		time.Sleep(sized(8*time.Second, 15*time.Second))
		close(stop)
		got := <-seen
		c.b.start()
		c.fault(fmt.Sprintf("broker restart (stopping it took %s)", stopped.Round(time.Millisecond)))
		// /readyz is 503 while no broker answers; dam_halted counts the
		// partitions held, which are lost once the session times out, so
		// a probe that sees the outage late may find none to count.
		if !got[1] {
			c.t.Errorf("while the broker was down /readyz never answered 503 (dam_halted > 0 seen: %v)", got[0])
		}
		c.recovered(time.Now(), s)
	}
}

// chaosStorm: under load, instances join and leave every few seconds for a
// minute (20 s reduced), some by SIGTERM, some by SIGKILL, beside one that
// stays.
func chaosStorm(c *chaosRun) {
	a := c.sidecar("a")
	others := []*sidecar{c.sidecar("b"), c.sidecar("c"), c.sidecar("d")}
	c.alive = []*sidecar{a}
	a.start()
	a.waitReady(30 * time.Second)
	d := sized(20*time.Second, 60*time.Second)
	c.startLoad(sized(15000, 60000), d+10*time.Second)
	end := time.Now().Add(d)
	running := map[*sidecar]bool{}
	for time.Now().Before(end) {
		time.Sleep(time.Duration(2000+rand.IntN(2000)) * time.Millisecond)
		s := others[rand.IntN(len(others))]
		switch {
		case !running[s]:
			s.start()
			running[s] = true
			c.fault(s.name + " joins")
		case rand.IntN(3) == 0:
			s.kill()
			running[s] = false
			c.fault(s.name + " killed")
		default:
			took, err := s.term(s.grace + 5*time.Second)
			running[s] = false
			c.fault(fmt.Sprintf("%s leaves (SIGTERM, %s)", s.name, took.Round(time.Millisecond)))
			if err != nil {
				c.t.Errorf("%s: exit %v after SIGTERM", s.name, err)
			}
		}
	}
	for s, r := range running {
		if r {
			c.alive = append(c.alive, s)
		}
	}
	c.recovered(time.Now(), c.alive...)
}

// chaosForwardFlapping: a route with on_store_failure: forward while
// PostgreSQL comes and goes every few seconds and the process is killed
// now and then: records pass undecided during the outages (repeats, as
// documented) and nothing is lost, the log having no gap to skip.
func chaosForwardFlapping(c *chaosRun) {
	target, rewrite := tcpproxy.PostgresDSN(c.t, c.dsn)
	proxy := tcpproxy.New(c.t, target)
	c.dsn = rewrite(proxy.Addr())
	s := c.startOne(30 * time.Second)
	c.startLoad(sized(15000, 60000), sized(35*time.Second, 150*time.Second))
	for i := range sized(4, 16) {
		time.Sleep(time.Duration(1500+rand.IntN(1500)) * time.Millisecond)
		proxy.Cut()
		time.Sleep(time.Duration(1000+rand.IntN(2000)) * time.Millisecond)
		if i%2 == 1 {
			s.kill()
			c.fault("kill -9 while PostgreSQL is down")
			s.start()
		}
		proxy.Restore()
		c.fault("PostgreSQL down and back")
		c.recovered(time.Now(), s)
	}
}

// chaosAmbiguous: the replies to EndTxn and then TxnOffsetCommit come
// later than the client waits for them (10 s, franz-go's request timeout
// overhead) while the broker still handles each request: dam cannot know
// whether its transaction committed, and must neither lose nor repeat.
func chaosAmbiguous(c *chaosRun) {
	s := c.startOne(30 * time.Second)
	rounds := sized(1, 3)
	c.startLoad(sized(20000, 60000), sized(60*time.Second, 180*time.Second))
	time.Sleep(3 * time.Second)
	for range rounds {
		for _, key := range []kmsg.Key{kmsg.EndTxn, kmsg.TxnOffsetCommit} {
			var fired atomic.Bool
			delayed := make(chan struct{})
			cl := c.b.cluster()
			cl.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
				if fired.Swap(true) {
					return nil, nil, false
				}
				close(delayed)
				cl.SleepControl(func() { time.Sleep(12 * time.Second) })
				return nil, nil, false
			})
			select {
			case <-delayed:
			case <-time.After(60 * time.Second):
				c.t.Fatalf("no %s request within 60 s", key.Name())
			}
			c.fault(key.Name() + " reply 12 s late")
			c.recovered(time.Now(), s)
		}
	}
	if n, err := s.metric("dam_delivery_errors_total"); err != nil || n == 0 {
		c.t.Errorf("dam_delivery_errors_total = %v (%v): the late replies failed no transaction", n, err)
	}
}

// chaosOffsetsForward: an operator moves the group's offsets forward by
// hand, while dam is stopped (an operator can only when the group is
// empty) and records keep coming: for two to four partitions, from dam's
// progress P to anywhere up to what was produced meanwhile; then dam
// starts again under load. 2 times (5 full). dam must decide the skipped
// records without forwarding them (a catch-up: its state brought up to
// date with them, so that a later repeat of a skipped value is a
// duplicate) and never commit below the moved offset, in any request.
// The checker knows the skipped ranges: nothing of them is expected,
// everything after them is, as the model decides it.
func chaosOffsetsForward(c *chaosRun) {
	floors := c.watchCommits()
	s := c.startOne(30 * time.Second)
	c.startLoad(sized(12000, 90000), sized(24*time.Second, 150*time.Second))
	skipped := map[int32][]span{}
	for range sized(2, 5) {
		time.Sleep(sized(3*time.Second, 15*time.Second) + time.Duration(rand.IntN(2000))*time.Millisecond)
		if took, err := s.term(s.grace + 5*time.Second); err != nil {
			c.t.Errorf("a: exit %v after SIGTERM (%s)", err, took.Round(time.Millisecond))
		}
		prog := c.stoppedCleanly()
		time.Sleep(time.Duration(1000+rand.IntN(1000)) * time.Millisecond) // records keep coming
		ends := c.endOffsets()
		moved := map[int32]int64{}
		caughtUp := int64(0)
		for _, p := range rand.Perm(partitions)[:2+rand.IntN(3)] {
			p := int32(p)
			if ends[p] <= prog[p] {
				continue
			}
			to := prog[p] + 1 + rand.Int64N(ends[p]-prog[p])
			moved[p] = to
			skipped[p] = append(skipped[p], span{prog[p], to})
			caughtUp += to - prog[p]
		}
		if len(moved) == 0 {
			c.t.Fatalf("nothing produced while dam was stopped (progress %v, ends %v)", prog, ends)
		}
		floors.raise(moved)
		c.moveOffsets(moved)
		c.inert++ // a clean stop: nothing to deliver again
		c.fault(fmt.Sprintf("offsets moved forward by hand while stopped, %d records skipped (partition: progress -> moved to: %s)", caughtUp, movedString(prog, moved)))
		s.start()
		c.recovered(time.Now(), s)
		// The catch-up: recovery planned it (catch_up_to), and the skipped
		// records were decided, each once, none forwarded.
		for p, to := range moved {
			re := regexp.MustCompile(fmt.Sprintf(`"partition assigned".*"partition":%d,"epoch":\d+,"progress":%d,"committed":%d,"catch_up_to":%d[,}]`, p, prog[p], to, to))
			if !s.currentLogMatches(re) {
				c.t.Errorf("partition %d: no recovery planning a catch-up from %d to %d in the log (%s)", p, prog[p], to, re)
			}
		}
		var got float64
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			got, _ = s.metric("dam_records_total", "outcome", "caught_up")
			if got >= float64(caughtUp) || time.Now().After(deadline) {
				break
			}
		}
		if time.Sleep(time.Second); got != float64(caughtUp) {
			c.t.Errorf("dam_records_total{outcome=\"caught_up\"} = %v, want the %d records skipped", got, caughtUp)
		}
	}
	rc := defaultCheck
	rc.skipped = skipped
	c.checks = []chaosCheck{{rc, c.load}}
	c.finally = append(c.finally, func() {
		checked, below := floors.result()
		c.t.Logf("%d offset commits of moved partitions seen by the broker", checked)
		if checked == 0 {
			c.t.Error("the broker saw no offset commit of a moved partition: the floor was never checked")
		}
		for _, b := range below {
			c.t.Errorf("dam committed below a moved offset: %s", b)
		}
	})
}

func movedString(prog, moved map[int32]int64) string {
	var parts []string
	for p := range int32(partitions) {
		if to, ok := moved[p]; ok {
			parts = append(parts, fmt.Sprintf("%d: %d -> %d", p, prog[p], to))
		}
	}
	return strings.Join(parts, ", ")
}

// chaosRecreated: the input topic deleted and created again while dam is
// stopped (SIGTERM under load), with new records produced to it. dam must
// halt every partition with its data-loss error naming it (/readyz 503
// saying so, dam_halted, a log line per partition), deliver nothing of the
// new topic, and have lost nothing it decided before. The check's input is
// the old topic as it was before its deletion; its records produced after
// the stop (never decided) went with it: they are a skipped range, like
// offsets moved forward. So expected is the model's forwards of what dam
// decided before the stop.
func chaosRecreated(c *chaosRun) {
	c.halts = true
	s := c.startOne(30 * time.Second)
	c.startLoad(sized(8000, 60000), sized(12*time.Second, 100*time.Second))
	time.Sleep(sized(8*time.Second, 70*time.Second) + time.Duration(rand.IntN(2000))*time.Millisecond)
	if took, err := s.term(s.grace + 5*time.Second); err != nil {
		c.t.Errorf("a: exit %v after SIGTERM (%s)", err, took.Round(time.Millisecond))
	}
	c.inert++
	c.load.wait(2 * time.Minute)
	prog := c.stoppedCleanly()
	old, err := testkafka.ReadAll(c.b.addr(), inTopic)
	if err != nil {
		c.t.Fatal(err)
	}
	ends := c.endOffsets()
	skipped := map[int32][]span{}
	undecided := int64(0)
	for p, end := range ends {
		if end > prog[p] {
			skipped[p] = []span{{prog[p], end}}
			undecided += end - prog[p]
		}
	}
	c.recreateInput()
	c.fault(fmt.Sprintf("input deleted (%d records, %d of them never decided) and created again while dam is stopped", len(old), undecided))
	fresh := startLoadTo(c.t, c.b.addr(), inTopic, sized(2000, 10000), sized(4*time.Second, 15*time.Second), projectionsOf(2000, "new"))
	c.extraIn = fresh.n
	s.start()
	restarted := time.Now()
	// Every partition halts, each saying so in the log; /readyz names one.
	var code int
	var body string
	var halted float64
	for deadline := restarted.Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		s.checkAlive()
		code, body = s.readyBody()
		halted, _ = s.halted()
		all := true
		for p := range partitions {
			all = all && s.currentLogContains(fmt.Sprintf("pipeline: input data loss: %s/%d: ", inTopic, p))
		}
		if all && code == http.StatusServiceUnavailable && halted == partitions {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("within 90 s of the restart: every partition's data loss logged: %v, /readyz %d %q, dam_halted %v; want the %d partitions halted",
				all, code, body, halted, partitions)
		}
	}
	c.recovery = time.Since(restarted)
	c.t.Logf("every partition halted %s after the restart: /readyz %d %.300q", c.recovery.Round(time.Millisecond), code, body)
	if !strings.Contains(body, "pipeline: not ready: "+inTopic+"/") || !strings.Contains(body, ": halted: input data loss") {
		c.t.Errorf("/readyz: %q, want the data loss named with the recreated topic and partition", body)
	}
	// The new records stay undelivered, and the halt holds while they come.
	fresh.wait(2 * time.Minute)
	time.Sleep(3 * time.Second)
	s.checkAlive()
	if code, body := s.readyBody(); code != http.StatusServiceUnavailable || !strings.Contains(body, "input data loss") {
		c.t.Errorf("after the new records: /readyz %d %q, want still halted on the data loss", code, body)
	}
	if h, err := s.halted(); err != nil || h != partitions {
		c.t.Errorf("after the new records: dam_halted %v (%v), want %d", h, err, partitions)
	}
	out, err := testkafka.ReadAll(c.b.addr(), outTopic)
	if err != nil {
		c.t.Fatal(err)
	}
	newDelivered := 0
	for _, r := range out {
		if bytes.HasPrefix(r.Key, []byte("new")) {
			newDelivered++
		}
	}
	if newDelivered > 0 {
		c.t.Errorf("%d records of the recreated topic delivered, want none", newDelivered)
	}
	rc := defaultCheck
	rc.input, rc.skipped = old, skipped
	c.checks = []chaosCheck{{rc, c.load}}
}

// windowTopics are the poison row's window route's.
var windowTopics = []string{"in.window", "out.window", "dlq.window"}

// poisonRoutes: the default route (entity: the key) and a window route
// (the message id: header Idempotency-Key), both with a dead-letter topic.
var poisonRoutes = defaultRoutes + `
  - service: window
    from: in.window
    to: out.window
    dead_letter: dlq.window
    mode: window
    window: 1h
`

// chaosPoison: poison records mixed into the load of two routes, as any
// producer can write them: keys of 3,000 bytes (above dam's 1 KiB identity
// limit), window message ids (Idempotency-Key) of 3,000 bytes, a duplicate
// member name of 490,000 bytes in a value under the payload limit (keyed
// by a live entity, whose state it must not touch), and forged dam-*
// headers (dam-duplicate, dam-source-offset, in any case) on good and
// poison records alike. Every poison record must be dead-lettered once,
// with a short dam-error saying why and dam's own source headers alone;
// the good records forwarded as the model says, without the forged
// headers; nothing halts.
func chaosPoison(c *chaosRun) {
	c.routes = poisonRoutes
	s := c.startOne(30 * time.Second)
	n, d := sized(8000, 60000), sized(16*time.Second, 120*time.Second)
	c.load = startLoadTo(c.t, c.b.addr(), inTopic, n, d, hostile(projections(2000), sized(400, 1000), keyPoison))
	win := startLoadTo(c.t, c.b.addr(), "in.window", n/2, d, hostile(idempotent(), sized(200, 500), idPoison))
	stop := make(chan struct{})
	seen := watchHalted(s, stop)
	c.load.wait(d + 2*time.Minute)
	win.wait(d + 2*time.Minute)
	// Everything decided (no fault here: each record once), or a halt,
	// then the halt watch ends.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		s.checkAlive()
		if got, err := s.metric("dam_records_total"); err == nil && got >= float64(n+n/2) {
			break
		}
		if h, err := s.halted(); err == nil && h > 0 {
			break
		}
		if time.Now().After(deadline) {
			got, err := s.metric("dam_records_total")
			c.t.Fatalf("dam_records_total %v (%v) 2 minutes after the load, want %d", got, err, n+n/2)
		}
	}
	for _, bad := range []string{"partition halted", "input data loss"} {
		if s.logContains(bad) {
			c.t.Errorf("the log says %q", bad)
		}
	}
	close(stop)
	// A /readyz 503 for the instance (a health probe timing out on a
	// starved machine says Kafka or PostgreSQL unreachable) is no halt.
	if got := <-seen; got[0] || got[2] {
		_, body := s.readyBody()
		c.t.Fatalf("poison records halted dam (dam_halted > 0 seen: %v, /readyz 503 for a partition seen: %v): /readyz %.300q", got[0], got[2], body)
	}
	keys := defaultCheck
	keys.poison = func(r *kgo.Record) (string, bool) {
		switch {
		case len(r.Key) > 1024:
			return "identity out of bounds", true
		case len(r.Value) > 100_000:
			return "duplicate member", true
		}
		return "", false
	}
	ids := modeCheck("window", windowModel)
	ids.poison = func(r *kgo.Record) (string, bool) {
		for _, h := range r.Headers {
			if h.Key == "Idempotency-Key" {
				return "identity out of bounds", len(h.Value) > 1024
			}
		}
		return "", false
	}
	c.checks = []chaosCheck{{keys, c.load}, {ids, win}}
}

// hostile makes gen's records hostile: every every-th one is replaced by
// a poison record (poison's i-th, made from the good one), and forged dam-*
// headers ride on 2% of the good records and on every other poison one.
func hostile(gen generator, every int, poison func(i, seq int, good *kgo.Record) *kgo.Record) generator {
	return func(rng *rand.Rand, seq int) *kgo.Record {
		r := gen(rng, seq)
		forge := rng.Float64() < 0.02
		if seq%every == every/2 {
			i := seq / every
			r, forge = poison(i, seq, r), i%2 == 1
		}
		if forge {
			r.Headers = append(r.Headers,
				kgo.RecordHeader{Key: "dam-duplicate", Value: []byte("true")},
				kgo.RecordHeader{Key: "trace", Value: fmt.Appendf(nil, "t%d", seq)},
				kgo.RecordHeader{Key: "dam-source-offset", Value: []byte("999999")})
			if seq%3 == 0 {
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: "DAM-Source-Topic", Value: []byte("forged")})
			}
		}
		return r
	}
}

// longID is an identity of 3,000 bytes, unique by seq.
func longID(prefix string, seq int) []byte {
	b := fmt.Appendf(nil, "%s%d-", prefix, seq)
	return append(b, bytes.Repeat([]byte("x"), 3000-len(b))...)
}

// keyPoison is the default route's poison: a key of 3,000 bytes, or (one
// in four) a duplicate member name of 490,000 bytes in a value of 980 kB,
// under the 1 MiB payload limit, keyed by the good record's entity.
func keyPoison(i, seq int, good *kgo.Record) *kgo.Record {
	if i%4 == 3 {
		name := strings.Repeat("n", 490_000)
		return &kgo.Record{Key: good.Key, Value: []byte(`{"` + name + `":1,"` + name + `":2}`)}
	}
	return &kgo.Record{Key: longID("k", seq), Value: good.Value}
}

// idPoison is the window route's: a message id of 3,000 bytes.
func idPoison(_, seq int, good *kgo.Record) *kgo.Record {
	return &kgo.Record{Key: fmt.Appendf(nil, "long%d", seq), Value: good.Value,
		Headers: []kgo.RecordHeader{{Key: "Idempotency-Key", Value: longID("m", seq)}}}
}

// bombMemory are the bombs row's memory settings: small, so that the
// bound they imply (docs/delivery.md#memory) is tight: 48 MiB for records
// and batches, 124 MiB for the process.
var bombMemory = memorySettings{inFlightBytes: 16 << 20, batchBytes: 4 << 20, fetchBytes: 8 << 20}

// bombParts are the partitions the bombs go to.
var bombParts = []int32{1, 4}

// chaosBombs: decompression bombs mixed into the load on two partitions,
// 3 (12 full), each a zstd batch of one record of 64 MiB (256 MiB full) of
// one byte,
// a few KB on the wire, while dam runs under the memory limit that the
// documentation derives from its settings: a cgroup (memory.max) where
// the machine allows one, and GOMEMLIMIT at 90% of it as the chart sets
// it. dam must never be killed or restarted, every partition must flow
// on past each bomb (its own past the bomb, the others past what was
// produced with it), every bomb offset must have a dead letter, and the
// peak RSS must stay under the documented limit.
func chaosBombs(c *chaosRun) {
	limit := bombMemory.limit()
	c.pipeline = bombMemory.yaml()
	cg := memoryCgroup(c.t, limit)
	s := c.sidecar("a")
	s.cgroup = cg
	s.env = []string{fmt.Sprintf("GOMEMLIMIT=%dKiB", limit*9/10>>10)}
	c.alive = []*sidecar{s}
	s.start()
	s.waitReady(30 * time.Second)
	bounded := "GOMEMLIMIT alone (no cgroup v2 memory controller here), peak RSS checked"
	if cg != "" {
		bounded = "cgroup " + cg + " and GOMEMLIMIT"
	}
	c.t.Logf("dam's memory bound: %d MiB for records and batches, a limit of %d MiB for the process (%s)", bombMemory.bound()>>20, limit>>20, bounded)

	n, d := sized(8000, 60000), sized(12*time.Second, 120*time.Second)
	bombs, size := sized(3, 12), sized(64<<20, 256<<20)
	c.startLoad(n, d)
	bm := newBomber(c.t, c.b.addr(), size)
	at := map[recAt]bool{}
	for i := range bombs {
		time.Sleep(d / time.Duration(bombs+1))
		s.checkAlive()
		b := bm.drop(c.t, bombParts[i%len(bombParts)], i)
		at[b] = true
		c.t.Logf("bomb %d: a zstd batch inflating to %d MiB at partition %d offset %d (%d records produced so far)", i+1, size>>20, b.p, b.o, c.load.produced.Load())
		c.flowsPast(c.endOffsets(), time.Minute, s)
	}
	rc := defaultCheck
	rc.bombs = at
	c.checks = []chaosCheck{{rc, c.load}}
	c.finally = append(c.finally, func() {
		s.checkAlive()
		if s.starts != 1 {
			c.t.Errorf("dam started %d times, want once", s.starts)
		}
		peak, err := s.peakRSS()
		if err != nil {
			c.t.Fatalf("peak RSS: %v", err)
		}
		c.t.Logf("peak RSS %d MiB, the documented limit %d MiB", peak>>20, limit>>20)
		if peak >= limit {
			c.t.Errorf("peak RSS %d MiB, at or above the limit of %d MiB that docs/delivery.md#memory derives from the settings (%d MiB for records and batches)", peak>>20, limit>>20, bombMemory.bound()>>20)
		}
		if cg != "" {
			if n, err := cgroupStat(cg, "memory.events", "oom_kill"); err != nil || n != 0 {
				c.t.Errorf("cgroup memory.events oom_kill %d (%v), want 0", n, err)
			}
			if p, err := cgroupStat(cg, "memory.peak", ""); err == nil {
				c.t.Logf("cgroup memory.peak %d MiB", p>>20)
			}
		}
	})
}

// flowsPast waits until every input partition is committed at or past
// ends, within limit, the sidecars staying alive.
func (c *chaosRun) flowsPast(ends map[int32]int64, limit time.Duration, alive ...*sidecar) {
	c.t.Helper()
	start := time.Now()
	for deadline := start.Add(limit); ; time.Sleep(200 * time.Millisecond) {
		for _, s := range alive {
			s.checkAlive()
		}
		comm := c.committed()
		var behind []string
		for p, end := range ends {
			if comm[p] < end {
				behind = append(behind, fmt.Sprintf("%d: committed %d < %d", p, comm[p], end))
			}
		}
		if len(behind) == 0 {
			c.t.Logf("every partition committed past %v within %s", ends, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("partitions not flowing: within %s, %s", limit, strings.Join(behind, ", "))
		}
	}
}

// haltRoutes is the default route without a dead-letter topic, its
// payloads bounded well below what the output topic accepts (haltOutMax),
// so that only a record's headers can make its forward too large.
var haltRoutes = fmt.Sprintf(`
  - service: e2e
    from: %s
    to: %s
    max_size: 131072
`, inTopic, outTopic)

// haltOutMax is the output topic's max.message.bytes in the halt row.
const haltOutMax = 262144

// haltInFlight is the halt row's pipeline.max_in_flight (its least,
// batch_size): a job may then hold more records than the whole budget
// (up to max_batch), as with the defaults on an instance of one or two
// partitions, so that a halt that kept its job's records would stop every
// partition from polling.
const haltInFlight = 500

// chaosHaltBacklog: a backlog on every partition, produced while no dam
// runs, deepest on one partition, where one record (a good value with a
// header of 300 KB) makes a forward Kafka refuses for good; the route has
// no dead-letter topic, so that partition halts there, as documented. The
// load goes on after dam starts. The halt must stop that partition alone:
// every other partition delivers its backlog and the rest of the load,
// the halted partition is committed up to the record and never past it
// (exactly-once: at most up to it, the round's records before it waiting
// with it), and nothing at or after the point it waits at is delivered.
func chaosHaltBacklog(c *chaosRun) {
	c.routes = haltRoutes
	c.maxInFlight = haltInFlight
	c.halts = true
	ctx, cancel := opCtx()
	defer cancel()
	resp, err := c.admin().AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: kadm.StringPtr(fmt.Sprint(haltOutMax))}}, outTopic)
	if err == nil {
		_, err = resp.On(outTopic, nil)
	}
	if err != nil {
		c.t.Fatalf("setting %s's max.message.bytes: %v", outTopic, err)
	}
	// The backlog: n/2 records, of which those from n/8 go to partition h
	// alone, the last of them with the large header; then n/2 more, over
	// every partition, while dam runs.
	const h = 2
	n := sized(16000, 80000)
	deep, big := span{int64(n / 8), int64(n / 2)}, n/2-1
	gen := bigHeaderAt(projectionsOn(2000, h, deep), big, 300_000)
	c.load = startLoadTo(c.t, c.b.addr(), inTopic, n, sized(8*time.Second, 40*time.Second), gen)
	for c.load.produced.Load() < int64(n/2) {
		if c.load.finished() {
			c.load.wait(0)
			c.t.Fatal("the load ended before its backlog was produced")
		}
		time.Sleep(20 * time.Millisecond)
	}
	in, err := testkafka.ReadAll(c.b.addr(), inTopic)
	if err != nil {
		c.t.Fatal(err)
	}
	at := int64(-1)
	for _, r := range in {
		for _, hd := range r.Headers {
			if hd.Key == "blob" && r.Partition == h {
				at = r.Offset
			}
		}
	}
	if at < 0 {
		c.t.Fatalf("no record with the large header in partition %d of the input", h)
	}
	backlog := c.endOffsets()
	floors := c.watchCommits()
	floors.cap(h, at)

	s := c.sidecar("a")
	c.alive = []*sidecar{s}
	s.start()
	started := time.Now()
	c.inert++ // nothing to deliver again
	c.fault(fmt.Sprintf("a record whose forward Kafka refuses for good (a header of 300 KB; %s accepts %d bytes) at partition %d offset %d, in a backlog of %v (partition: end offset)", outTopic, haltOutMax, h, at, backlog))
	// The partition halts at the record, saying which.
	why := fmt.Sprintf("%s/%d offset %d: Kafka refuses the record for good and route e2e has no dead_letter topic", inTopic, h, at)
	for deadline := started.Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		s.checkAlive()
		halted, _ := s.halted()
		code, body := s.readyBody()
		if halted == 1 && code == http.StatusServiceUnavailable && s.currentLogContains(why) {
			c.recovery = time.Since(started)
			c.t.Logf("partition %d halted %s after the start: /readyz %d %.300q", h, c.recovery.Round(time.Millisecond), code, body)
			break
		}
		if time.Now().After(deadline) {
			decided, _ := s.metric("dam_records_total")
			inFlight, _ := s.metric("dam_records_in_flight")
			c.t.Fatalf("within 90 s of the start: dam_halted %v, /readyz %d %.300q, the halt (%q) logged: %v; want partition %d halted alone (dam_records_total %v, dam_records_in_flight %v, committed %v)",
				halted, code, body, why, s.currentLogContains(why), h, decided, inFlight, c.committed())
		}
	}
	// Every other partition delivers its backlog and the rest of the load.
	c.load.wait(2 * time.Minute)
	others := map[int32]int64{}
	for p, end := range c.endOffsets() {
		if p != h {
			others[p] = end
		}
	}
	c.flowsPast(others, time.Minute, s)
	comm := c.committed()[h]
	switch {
	case comm > at:
		c.t.Errorf("the halted partition %d is committed at %d, past the record at %d it halts at", h, comm, at)
	case c.delivery == alo && comm != at:
		c.t.Errorf("the halted partition %d is committed at %d, want up to the record it halts at (%d)", h, comm, at)
	}
	c.t.Logf("partition %d halted at offset %d, committed at %d", h, at, comm)
	rc := defaultCheck
	rc.held = map[int32]int64{h: comm}
	c.checks = []chaosCheck{{rc, c.load}}
	c.finally = append(c.finally, func() {
		s.checkAlive()
		if halted, err := s.halted(); err != nil || halted != 1 {
			c.t.Errorf("after the check: dam_halted %v (%v), want 1", halted, err)
		}
		if got := c.committed()[h]; got != comm {
			c.t.Errorf("after the check: partition %d committed at %d, was %d", h, got, comm)
		}
		checked, wrong := floors.result()
		c.t.Logf("%d offset commits of the halted partition seen by the broker", checked)
		for _, w := range wrong {
			c.t.Errorf("dam committed past the halt: %s", w)
		}
	})
}

// bigHeaderAt makes gen's record seq a change of its entity (a value of
// its own, so that it is forwarded, never dropped as a repeat) with a
// header "blob" of size bytes.
func bigHeaderAt(gen generator, seq, size int) generator {
	return func(rng *rand.Rand, i int) *kgo.Record {
		r := gen(rng, i)
		if i == seq {
			r.Value = fmt.Appendf(nil, `{"e":%q,"big":%d}`, r.Key, seq)
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "blob", Value: bytes.Repeat([]byte("h"), size)})
		}
		return r
	}
}
