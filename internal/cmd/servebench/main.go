// Command servebench is the load benchmark of `dam serve` (not a timed
// test): it runs the real binary on a fresh schema and drives POST
// /v1/check with an open-loop load generator at rising request rates.
//
// Open loop: request i of a step is due at start + i/rate whatever the
// answers before it, and its latency is measured from when it was due, so
// that a server falling behind shows as latency (no coordinated omission).
// A step is held when every request was answered 200 within the step's
// time plus a grace second and its p99 is below -p99 (the seeds' 250 ms).
// The machine is shared (PostgreSQL, the generator, other work), so a rate
// gets up to -tries attempts and is held if one of them is; every attempt
// is printed. While the last of -rates is held, the rates go on rising by
// half (up to -climb), so that the highest rate held is the service's
// capacity here, not the end of a list. The table goes to stdout; a line
// names the highest rate held.
//
// The client keeps its connections, at most -conns of them (dam serve's
// serve.max_connections): a client that opens a connection whenever none
// is idle brings, past the service's connection bound, new connections
// that are refused or close others, and on a machine shared with the
// generator their setup (connect, accept) takes the CPU the service
// needs. Clients that open a connection per request get a phase of their
// own.
//
// Then the service is driven past capacity (-overload, 2x the highest
// rate held by default) from the same client, its connections open: the
// goodput there is printed against the highest rate held (PASS when at
// least -goodput, 0.8x), with the p99 of the 503s the excess gets (PASS
// when under -shed-p99, 100 ms). A client opening a connection per
// request then offers -conn-rate times the highest rate held (past what
// that client can be served at, each request paying a connection): each
// request must be answered 200 or 503 with Retry-After, none reset or
// closed unanswered. That client holds at most twice -conns connections
// at once, past the service's bound, as a pool of workers would: unbounded
// on the same 2 CPUs as the service, its thousands of goroutines wrote
// their requests hundreds of milliseconds after their connections opened,
// and the service, holding thousands of connections silent that long,
// closed the oldest as an attacker's (their 503 came before the request,
// which Go's client reads as no answer). A client on its own machine
// writes its request as it connects.
//
// The payloads are ~500 B JSON projections over -entities identities with
// -dup-rate repeats of the entity's previous content, so that both answers
// (forward and duplicate) are exercised; the state is warmed first.
//
// -hostile runs the hostile-client run instead (hostile.go), at the size
// of the full run: 100 concurrent 10 MB bodies beside a well-behaved client,
// checks with identities the store cannot hold and checks of made-up
// services, then 60 body hogs of another tenant and 2,000 idle
// connections beside a well-behaved tenant; it fails unless dam serve's
// peak RSS stays under 300 MB, every good check is answered 200 (beside
// the hogs with a p99 under 250 ms) and /metrics does not grow.
// TestHostileClients runs it at a reduced size in make test.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/internal/pglocal"
	"github.com/dam-dedup/dam/internal/testutil/damproc"
)

const (
	envDSN     = "DAM_TEST_POSTGRES_DSN"
	defaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	token      = "servebench-token-0123456789"
	service    = "customer-2"
)

type options struct {
	rates    string
	climb    int // past -rates, rise by half until a rate is not held, up to this
	step     time.Duration
	p99      time.Duration
	entities int
	dupRate  float64
	dsn      string
	damBin   string
	maxConns int
	conns    int // the most connections the load's client keeps open (0: no bound)
	target   float64
	tries    int
	hostile  bool
	overload float64       // past capacity: this times the highest rate held (0: not run)
	connRate float64       // the client opening a connection per request: this times the highest rate held
	goodput  float64       // the goodput past capacity must be at least this times the highest rate held
	shedP99  time.Duration // the p99 the 503s past capacity must stay under
	extra    string        // more of the serve section
}

func main() {
	var o options
	flag.StringVar(&o.rates, "rates", "100,250,500,1000,1500,2000,2500,3000,4000,5000,6000,8000", "request rates to try, in order (per second)")
	flag.IntVar(&o.climb, "climb", 48000, "while the last rate was held, go on at 1.5x it, up to this rate (0: only -rates), so that the past-capacity phases start from the service's capacity")
	flag.DurationVar(&o.step, "step", 5*time.Second, "duration of each rate")
	flag.DurationVar(&o.p99, "p99", 250*time.Millisecond, "p99 a rate must stay under to be held")
	flag.IntVar(&o.entities, "entities", 20_000, "distinct identities")
	flag.Float64Var(&o.dupRate, "dup-rate", 0.30, "share of checks repeating their identity's content")
	flag.StringVar(&o.dsn, "dsn", "", "PostgreSQL DSN (default $"+envDSN+", else "+defaultDSN+", else a throwaway local cluster)")
	flag.StringVar(&o.damBin, "dam", "", "dam binary (default: build ./cmd/dam)")
	flag.IntVar(&o.maxConns, "max-conns", 0, "dam postgres.max_conns (0: dam's default)")
	flag.IntVar(&o.conns, "conns", 1024, "the most connections the client keeping its connections opens, dam serve's serve.max_connections by default (0: no bound, Go's default: past the service's bound, its new connections churn)")
	flag.Float64Var(&o.target, "target", 2000, "the rate that must be held (20x the seeds' 100 requests/s)")
	flag.IntVar(&o.tries, "tries", 2, "attempts per rate; a rate is held if one attempt is")
	flag.StringVar(&o.extra, "serve", "", "more of dam serve's serve section, as YAML lines (e.g. \"  max_checks_in_flight: 512\\n\")")
	flag.Float64Var(&o.overload, "overload", 2, "after the rising rates, offer this times the highest rate held (past capacity) from the same client, its connections open; 0: skip the past-capacity phases")
	flag.Float64Var(&o.connRate, "conn-rate", 1, "then offer this times the highest rate held from a client opening a connection per request; 0: skip")
	flag.Float64Var(&o.goodput, "goodput", 0.8, "the goodput past capacity must be at least this times the highest rate held")
	flag.DurationVar(&o.shedP99, "shed-p99", 100*time.Millisecond, "the p99 the 503s past capacity must stay under")
	flag.BoolVar(&o.hostile, "hostile", false, "instead of the load steps, the hostile-client run at full size: 100 concurrent 10 MB bodies beside good checks, bad identities and made-up services, then 60 body hogs and 2,000 idle connections beside a well-behaved tenant; fails if dam serve's peak RSS passes 300 MB, a good check is not answered 200, or their p99 beside the hogs is not under 250 ms")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "servebench: %v\n", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "servebench: "+format+"\n", args...)
}

func run(o options) error {
	var rates []int
	for _, f := range strings.Split(o.rates, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r <= 0 {
			return fmt.Errorf("-rates: %q is not a positive integer", f)
		}
		rates = append(rates, r)
	}
	ctx := context.Background()
	base, stopPG, err := postgres(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer stopPG()
	dsn, drop, err := freshSchema(ctx, base)
	if err != nil {
		return err
	}
	defer drop()
	tmp, err := os.MkdirTemp("", "servebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if o.damBin == "" {
		logf("building dam")
		if o.damBin, err = damproc.Build(damproc.BuildOptions{}); err != nil {
			return err
		}
	}
	if o.hostile {
		o.extra += hostileServeConfig
	}
	if o.extra != "" && !strings.HasSuffix(o.extra, "\n") {
		o.extra += "\n"
	}
	srv, err := startServe(o, dsn, tmp)
	if err != nil {
		return err
	}
	defer srv.stop()
	if o.hostile {
		logf("hostile clients: %+v", fullHostile)
		res, err := runHostile(srv.url, srv.proc.PID(), fullHostile)
		if err != nil {
			return err
		}
		fmt.Print(res)
		if f := res.failures(fullHostile); len(f) > 0 {
			return fmt.Errorf("hostile clients: %s", strings.Join(f, "; "))
		}
		fmt.Println("hostile clients: PASS")
		return nil
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, MaxConnsPerHost: o.conns, IdleConnTimeout: time.Minute}}
	w := newWorkload(o.entities, o.dupRate)
	logf("warming %d identities", o.entities)
	if err := warm(client, srv.url, w); err != nil {
		return err
	}

	fmt.Printf("%8s %10s %9s %9s %9s %8s %8s %6s %10s  %s\n", "rate/s", "achieved/s", "p50 ms", "p99 ms", "max ms", "errors", "503s", "dup %", "serve µs/r", "held")
	best := 0
rates:
	for k := 0; k < len(rates); k++ {
		rate := rates[k]
		for try := 1; ; try++ {
			cpu0 := cpuTime(srv.proc.PID())
			st := runStep(client, srv.url, w, rate, o.step)
			cpu := cpuTime(srv.proc.PID()) - cpu0
			held := st.errors == 0 && st.late == 0 && st.p99 < o.p99
			fmt.Printf("%8d %10.0f %9.1f %9.1f %9.1f %8d %8d %6.1f %10.0f  %s\n", rate, st.achieved, ms(st.p50), ms(st.p99), ms(st.max), st.errors+st.late,
				st.shed+st.shedNoRetry, 100*float64(st.duplicates)/float64(max(1, st.ok)), float64(cpu.Microseconds())/float64(max(1, st.ok)), yesNo(held))
			if st.firstErr != "" {
				logf("rate %d: first error: %s", rate, st.firstErr)
			}
			if err := srv.alive(); err != nil {
				return err
			}
			if held {
				best = rate
				if k == len(rates)-1 && rate*3/2 <= o.climb {
					rates = append(rates, rate*3/2) // not past capacity yet
				}
				break
			}
			if try >= o.tries {
				break rates
			}
		}
	}
	verdict := passMiss(float64(best) >= o.target)
	fmt.Printf("highest rate held with p99 < %s: %d requests/s (target >= %.0f, 20x the seeds' 100/s): %s\n", o.p99, best, o.target, verdict)
	if o.overload > 0 && best > 0 {
		return pastCapacity(o, srv, w, best, client)
	}
	return nil
}

// pastCapacity offers -overload times the highest rate held from kept,
// the client of the rising rates with the connections it opened: the
// goodput there against the highest rate held, and how fast the excess
// is told 503. Then a client that opens a connection per request offers
// -conn-rate times the highest rate held (each request pays a
// connection, so that is past what this client can be served at): every
// request must be answered 200 or 503 with Retry-After, none reset.
func pastCapacity(o options, srv *server, w *workload, best int, kept *http.Client) error {
	type phase struct {
		name   string
		client *http.Client
		rate   int
		res    stepResult
	}
	phases := []*phase{
		{name: "keep-alive", client: kept, rate: int(o.overload * float64(best))},
		{name: "conn per request", client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true, MaxConnsPerHost: 2 * o.conns}}, rate: int(o.connRate * float64(best))},
	}
	fmt.Printf("\npast capacity: %.1fx the highest rate held (%d/s) from the client above, %.1fx from one opening a connection per request, %s each\n",
		o.overload, best, o.connRate, o.step)
	fmt.Printf("%-18s %8s %10s %9s %8s %10s %8s %9s\n", "client", "rate/s", "goodput/s", "p99 ms", "503/s", "503 p99 ms", "other", "no answer")
	for _, p := range phases {
		if p.rate <= 0 {
			continue
		}
		st := runStep(p.client, srv.url, w, p.rate, o.step)
		p.res = st
		fmt.Printf("%-18s %8d %10.0f %9.1f %8.0f %10.1f %8d %9d\n", p.name, p.rate, st.achieved, ms(st.p99), float64(st.shed)/o.step.Seconds(), ms(st.shedP99),
			st.otherStatus+st.shedNoRetry, st.noAnswer)
		if st.firstNoAnswer != "" {
			logf("past capacity, %s: first request without an answer: %s", p.name, st.firstNoAnswer)
		} else if st.otherStatus+st.shedNoRetry > 0 {
			logf("past capacity, %s: first error: %s", p.name, st.firstErr)
		}
		p.client.CloseIdleConnections() // they would hold the service's connection slots
		logf("past capacity, %s: dam serve's counters so far: %s", p.name, srv.counters())
		if err := srv.alive(); err != nil {
			return err
		}
		time.Sleep(time.Second) // the connections of the step close
	}
	k := phases[0].res
	ratio := k.achieved / float64(best)
	fmt.Printf("goodput past capacity: %.0f requests/s = %.2fx the highest rate held (%d/s) (target >= %.1fx): %s\n",
		k.achieved, ratio, best, o.goodput, passMiss(ratio >= o.goodput))
	if k.shed == 0 {
		fmt.Printf("503s past capacity: none, every request served\n")
	} else {
		fmt.Printf("503s past capacity: %d, p99 %.1f ms (target < %s): %s\n", k.shed, ms(k.shedP99), o.shedP99, passMiss(k.shedP99 < o.shedP99))
	}
	for _, p := range phases {
		if p.rate <= 0 {
			continue
		}
		bad := p.res.otherStatus + p.res.shedNoRetry + p.res.noAnswer
		fmt.Printf("answered neither 200 nor 503 with Retry-After, %s: %d of %d (target 0): %s\n", p.name, bad, p.res.requests, passMiss(bad == 0))
	}
	return nil
}

func passMiss(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

// stepResult is one rate's measurements.
type stepResult struct {
	achieved       float64 // requests answered 200 a second (the goodput)
	p50, p99, max  time.Duration
	ok, duplicates int
	errors, late   int // failed requests (503s included); requests answered 200 after the step's grace
	firstErr       string
	requests       int

	// The failures by kind: 503 with Retry-After (shed), any other
	// answer, and no answer at all (a reset, a closed connection).
	shed, shedNoRetry, otherStatus, noAnswer int
	shedP99                                  time.Duration // from when the request was due
	firstNoAnswer                            string
}

// outcome is how one request ended.
type outcome int8

const (
	outOK       outcome = iota // 200
	outShed                    // 503 with Retry-After
	outShedBare                // 503 without Retry-After
	outOther                   // any other status
	outNoAnswer                // a transport error: reset, EOF, refused
)

// runStep sends rate requests per second for d, open loop, and measures
// each request's latency from when it was due.
func runStep(client *http.Client, url string, w *workload, rate int, d time.Duration) stepResult {
	n := int(float64(rate) * d.Seconds())
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = w.next()
	}
	lat := make([]time.Duration, n)
	finished := make([]time.Time, n)
	outs := make([]outcome, n)
	var dups atomic.Int64
	var firstErr, firstNoAnswer atomic.Value
	var wg sync.WaitGroup
	start := time.Now().Add(50 * time.Millisecond)
	deadline := start.Add(d + time.Second) // grace: an answer later than this misses the step
	interval := float64(time.Second) / float64(rate)
	for i := range n {
		due := start.Add(time.Duration(float64(i) * interval))
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := post(client, url, bodies[i])
			finished[i] = time.Now()
			lat[i] = finished[i].Sub(due)
			outs[i] = a.outcome
			if a.err != nil {
				firstErr.CompareAndSwap(nil, a.err.Error())
				if a.outcome == outNoAnswer {
					firstNoAnswer.CompareAndSwap(nil, a.err.Error())
				}
				return
			}
			if a.duplicate {
				dups.Add(1)
			}
		}()
	}
	wg.Wait()
	end := time.Now()
	res := stepResult{requests: n}
	var ok, shed []time.Duration
	for i, l := range lat {
		switch outs[i] {
		case outOK:
			ok = append(ok, l)
			if finished[i].After(deadline) {
				res.late++
			}
			continue
		case outShed:
			shed = append(shed, l)
		case outShedBare:
			res.shedNoRetry++
		case outOther:
			res.otherStatus++
		case outNoAnswer:
			res.noAnswer++
		}
		res.errors++
	}
	slices.Sort(ok)
	slices.Sort(shed)
	res.ok, res.duplicates = len(ok), int(dups.Load())
	res.shed = len(shed)
	if e, _ := firstErr.Load().(string); e != "" {
		res.firstErr = e
	}
	if e, _ := firstNoAnswer.Load().(string); e != "" {
		res.firstNoAnswer = e
	}
	if len(ok) > 0 {
		res.p50, res.p99, res.max = ok[len(ok)/2], ok[min(len(ok)-1, len(ok)*99/100)], ok[len(ok)-1]
	}
	if len(shed) > 0 {
		res.shedP99 = shed[min(len(shed)-1, len(shed)*99/100)]
	}
	res.achieved = float64(len(ok)) / end.Sub(start).Seconds()
	return res
}

// answer is what post saw.
type answer struct {
	outcome   outcome
	duplicate bool
	err       error // nil for 200
}

// post sends one check: its outcome, and whether it was a duplicate.
func post(client *http.Client, url string, body []byte) answer {
	req, err := http.NewRequest("POST", url+"/v1/check", bytes.NewReader(body))
	if err != nil {
		return answer{outcome: outNoAnswer, err: err}
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return answer{outcome: outNoAnswer, err: err}
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{outcome: outNoAnswer, err: err}
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		return answer{outcome: outOK, duplicate: bytes.Contains(out, []byte(`"duplicate"`))}
	case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
		return answer{outcome: outShed, err: fmt.Errorf("%d %s", resp.StatusCode, bytes.TrimSpace(out))}
	case resp.StatusCode == http.StatusServiceUnavailable:
		return answer{outcome: outShedBare, err: fmt.Errorf("%d without Retry-After %s", resp.StatusCode, bytes.TrimSpace(out))}
	}
	return answer{outcome: outOther, err: fmt.Errorf("%d %s", resp.StatusCode, bytes.TrimSpace(out))}
}

// warm checks every identity once, 64 at a time (again after a 503 with
// Retry-After: the store was at capacity).
func warm(client *http.Client, url string, w *workload) error {
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var first atomic.Value
	for e := range w.entities {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			a := post(client, url, w.body(e))
			for try := 0; a.outcome == outShed && try < 100; try++ {
				time.Sleep(10 * time.Millisecond) // told 503 at once: the store is busy
				a = post(client, url, w.body(e))
			}
			if a.err != nil {
				first.CompareAndSwap(nil, a.err)
			}
		}()
	}
	wg.Wait()
	if err, _ := first.Load().(error); err != nil {
		return fmt.Errorf("warming: %w", err)
	}
	return nil
}

// workload generates checks: each picks an identity and either repeats its
// content or changes it.
type workload struct {
	mu       sync.Mutex
	rng      *rand.Rand
	entities int
	dupRate  float64
	version  []int
	pad      string
}

func newWorkload(entities int, dupRate float64) *workload {
	return &workload{rng: rand.New(rand.NewPCG(7, 11)), entities: entities, dupRate: dupRate,
		version: make([]int, entities), pad: strings.Repeat("lorem ipsum ", 25)}
}

// next returns the body of a check of a random identity.
func (w *workload) next() []byte {
	w.mu.Lock()
	e := w.rng.IntN(w.entities)
	if w.rng.Float64() >= w.dupRate {
		w.version[e]++
	}
	w.mu.Unlock()
	return w.body(e)
}

// body is identity e's check at its current version: ~500 B of payload.
func (w *workload) body(e int) []byte {
	w.mu.Lock()
	v := w.version[e]
	w.mu.Unlock()
	b, _ := json.Marshal(map[string]any{
		"service": service,
		"entity":  fmt.Sprintf("B-%06d", e),
		"payload": map[string]any{
			"banana_id":      fmt.Sprintf("B-%06d", e),
			"ripeness_level": v,
			"origin":         map[string]any{"country": "EC", "farm": e % 97, "certified": true},
			"tags":           []string{"organic", "fair-trade", "export"},
			"notes":          w.pad,
		},
	})
	return b
}

// cpuTime returns a process's user+system CPU time from /proc (0 where
// there is no /proc).
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses: utime and
	// stime are the 14th and 15th fields of the line.
	rest := b[bytes.LastIndexByte(b, ')')+2:]
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// server is the running `dam serve`.
type server struct {
	proc *damproc.Process
	url  string
}

func startServe(o options, dsn, dir string) (*server, error) {
	addr, err := damproc.FreeAddr()
	if err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf("postgres:\n  dsn: %q\nlog:\n  level: warn\nserve:\n  listen: %s\n"+o.extra+"routes:\n  - service: %s\n    from: projections.%s\n    to: delivery.%s\n    ignore: [/notes]\n",
		dsn, addr, service, service, service)
	if o.maxConns > 0 {
		cfg = strings.Replace(cfg, "postgres:\n", fmt.Sprintf("postgres:\n  max_conns: %d\n", o.maxConns), 1)
	}
	path := filepath.Join(dir, "serve.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	// The configuration is the file's: no DAM_ variable of the caller's
	// but the test hooks.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DAM_") || strings.HasPrefix(kv, "DAM_TEST_") {
			env = append(env, kv)
		}
	}
	p, err := damproc.Start(damproc.Options{
		Args: []string{o.damBin, "serve", "--config", path}, CleanEnv: true, Env: append(env, "DAM_SERVE_TOKEN="+token),
		Stdout: os.Stderr, Stderr: os.Stderr, HTTP: addr,
	})
	if err != nil {
		return nil, err
	}
	s := &server{proc: p, url: "http://" + addr}
	if err := p.WaitReady(context.Background(), 60*time.Second); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// counters returns dam serve's counters of shedding and connections, from
// its /metrics, for the log.
func (s *server) counters() string {
	m, err := s.proc.Scrape(context.Background())
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, name := range []string{"dam_serve_shed_total", "dam_serve_overloaded_total", "dam_serve_connections_evicted_total", "dam_serve_connections_refused_total", "dam_serve_store_errors_total"} {
		if m.Has(name) {
			out = append(out, fmt.Sprintf("%s %g", name, m.Sum(name)))
		}
	}
	for _, state := range []string{"silent", "unfinished", "idle", "untrusted"} {
		if v := m.Sum("dam_serve_connections_evicted_total", "state", state); v > 0 {
			out = append(out, fmt.Sprintf("evicted %s %g", state, v))
		}
	}
	out = append(out, fmt.Sprintf("dam_serve_requests_total{endpoint=\"check\"} %g", m.Sum("dam_serve_requests_total", "endpoint", "check")))
	return strings.Join(out, "; ")
}

// alive reports an error if the server exited.
func (s *server) alive() error {
	if exited, err := s.proc.Exited(); exited {
		return fmt.Errorf("dam serve exited: %v", err)
	}
	return nil
}

// stop sends SIGTERM and waits for the exit.
func (s *server) stop() { _, _, _ = s.proc.Stop(30 * time.Second) }

// postgres returns a reachable DSN: -dsn, $DAM_TEST_POSTGRES_DSN, the local
// default, or a throwaway cluster (stopped by the returned function).
func postgres(ctx context.Context, dsn string) (string, func(), error) {
	if dsn == "" {
		dsn = os.Getenv(envDSN)
	}
	if dsn == "" {
		dsn = defaultDSN
	}
	return pglocal.ReachableOrStart(ctx, dsn, logf)
}

// freshSchema creates an empty schema (dam serve migrates it) and returns
// a DSN selecting it and a function dropping it.
func freshSchema(ctx context.Context, base string) (string, func(), error) {
	schema := fmt.Sprintf("servebench_%d", time.Now().UnixNano())
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE SCHEMA " + schema); err != nil {
		return "", nil, err
	}
	var dsn string
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		sep := "?"
		if strings.Contains(base, "?") {
			sep = "&"
		}
		dsn = base + sep + "search_path=" + schema
	} else {
		dsn = base + " search_path=" + schema
	}
	return dsn, func() {
		if err := exec("DROP SCHEMA " + schema + " CASCADE"); err != nil {
			logf("drop schema %s: %v", schema, err)
		}
	}, nil
}
