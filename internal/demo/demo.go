// Package demo is dam demo: the real sidecar over four services'
// projection topics on franz-go's in-process Kafka broker (kfake) and a
// PostgreSQL schema of its own, fed a stream of bananas, its decisions
// checked against a reference model. cmd/dam gives it the sidecar to run.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/explain"
	"github.com/dam-dedup/dam/internal/pglocal"
)

// demoService is one adapter of the demo: its projection of the banana
// entity and its route settings.
type demoService struct {
	name    string
	project func(b *banana) map[string]any
	ignore  []string
	entity  string
	badRate float64 // share of its records sent as bad input
}

// banana is the merged entity of the seed write-up.
type banana struct {
	ID        string
	Name      string
	Ripeness  string
	Price     string
	Origin    string
	UpdatedAt time.Time
	Deleted   bool
}

var ripeness = []string{"Green", "Mostly Green", "Mostly Yellow", "Perfectly Yellow", "Spotted"}

func demoServices() []demoService {
	return []demoService{
		{ // The seed's Adapter 1: sees ripeness; the timestamp is ignored.
			name: "customer-1",
			project: func(b *banana) map[string]any {
				return map[string]any{"banana_id": b.ID, "ripeness_level": b.Ripeness, "updated_at": b.UpdatedAt.Format(time.RFC3339Nano)}
			},
			ignore: []string{"/updated_at"},
		},
		{ // The seed's Adapter 2: sees only the id and the name.
			name: "customer-2",
			project: func(b *banana) map[string]any {
				return map[string]any{"banana_id": b.ID, "name": b.Name}
			},
		},
		{ // Pricing: nested price, trace metadata ignored, some bad input.
			name: "customer-3",
			project: func(b *banana) map[string]any {
				return map[string]any{
					"banana_id": b.ID,
					"price":     map[string]any{"amount": json.Number(b.Price), "currency": "EUR"},
					"meta":      map[string]any{"trace_id": fmt.Sprintf("%016x", rand.Uint64()), "at": b.UpdatedAt.Unix()},
				}
			},
			ignore:  []string{"/meta/trace_id", "/meta/at"},
			badRate: 0.003,
		},
		{ // Everything but the timestamp; identity taken from the payload.
			name: "customer-4",
			project: func(b *banana) map[string]any {
				return map[string]any{"banana_id": b.ID, "name": b.Name, "ripeness_level": b.Ripeness,
					"price": json.Number(b.Price), "origin": b.Origin, "updated_at": b.UpdatedAt.Format(time.RFC3339Nano)}
			},
			ignore: []string{"/updated_at"},
			entity: "/banana_id",
		},
	}
}

// Options are dam demo's settings.
type Options struct {
	// Records is how many input records to send, then summarise and
	// return (0: until ctx ends).
	Records int
	// Entities is how many distinct bananas change.
	Entities int
	// Port is the kfake broker's port on 127.0.0.1 (0: any free port).
	Port int
	// Rate is entity events per second (0: as fast as possible with
	// Records, 500 without).
	Rate int
	// DSN is the PostgreSQL server to use ("": the local one, else a
	// throwaway cluster started here).
	DSN string
	// Delivery is the sidecar's kafka.delivery.
	Delivery string
	// Yes drops a schema named Schema that the demo did not make (and
	// everything in it); without it, Run refuses with ErrNotTheDemos.
	Yes bool
	// PrintExplanation prints dam explain's answer for an offset, as
	// dam explain does.
	PrintExplanation func(io.Writer, *explain.OffsetExplanation) error
}

// Schema is the schema the demo makes, drops and makes again at each run.
const Schema = "dam_demo"

// schemaMark is the comment the demo puts on its schema: a schema named
// Schema without it is not the demo's.
const schemaMark = "made by dam demo, which drops it and makes it again at each run"

// ErrNotTheDemos: the server holds a schema named Schema that the demo did
// not make, and Options.Yes was not given.
var ErrNotTheDemos = errors.New("demo: schema " + Schema + " exists and was not made by dam demo")

// Sidecar runs the sidecar on cfg until ctx ends: dam run's, which cmd/dam
// gives. It registers its metrics on reg, calls started with its HTTP
// address once it runs, and adds kafka to its Kafka client's options.
type Sidecar func(ctx context.Context, cfg config.Config, reg *prometheus.Registry, started func(httpAddr string), kafka ...kgo.Opt) error

// Run runs the demo, printing a live line and a per-service summary to
// out; it fails when the sidecar's decisions differ from the reference
// model.
func Run(ctx context.Context, out io.Writer, o Options, sidecar Sidecar) error {
	services := demoServices()
	var topics []string
	for _, s := range services {
		topics = append(topics, "projections."+s.name, "delivery."+s.name, "delivery."+s.name+".dlq")
	}
	cluster, err := kfake.NewCluster(kfake.Ports(o.Port), kfake.SeedTopics(6, topics...))
	if err != nil {
		return fmt.Errorf("demo: starting kfake: %w", err)
	}
	defer cluster.Close()
	broker := cluster.ListenAddrs()[0]
	fmt.Fprintf(out, "kafka (kfake) listening on %s: e.g. kcat -b %s -C -t delivery.customer-2 -e -X isolation.level=read_committed\n", broker, broker)

	dsn, cleanup, err := demoPostgres(ctx, out, o.DSN, o.Yes)
	if err != nil {
		return err
	}
	defer cleanup()

	cfg := config.Default()
	cfg.Kafka.Brokers = []string{broker}
	cfg.Kafka.Group = "dam-demo"
	cfg.Kafka.Start = config.StartEarliest
	cfg.Kafka.Delivery = o.Delivery
	cfg.Postgres.DSN = dsn
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Log.Level = "error" // the live line counts dead letters; keep it readable
	cfg.Log.Format = "console"
	for _, s := range services {
		r := config.DefaultRoute()
		r.Service, r.From, r.To = s.name, "projections."+s.name, "delivery."+s.name
		r.DeadLetter, r.Ignore = "delivery."+s.name+".dlq", s.ignore
		if s.entity != "" {
			r.Entity = s.entity
		}
		cfg.Routes = append(cfg.Routes, r)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("demo: built an invalid configuration: %w", err)
	}
	reg := prometheus.NewRegistry()
	sideCtx, stopSide := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSide()
	ready := make(chan string, 1)
	sideErr := make(chan error, 1)
	go func() {
		// Short fetch waits keep the live line moving.
		sideErr <- sidecar(sideCtx, cfg, reg, func(addr string) { ready <- addr }, kgo.FetchMaxWait(50*time.Millisecond))
	}()
	select {
	case addr := <-ready:
		fmt.Fprintf(out, "sidecar metrics on http://%s/metrics\n", addr)
	case err := <-sideErr:
		return fmt.Errorf("demo: sidecar: %w", err)
	}

	gen, err := newDemoGenerator(broker, services, o.Entities)
	if err != nil {
		return err
	}
	defer gen.close()
	genCtx, stopGen := context.WithCancel(ctx)
	defer stopGen()
	genDone := make(chan error, 1)
	rate := o.Rate
	if rate == 0 && o.Records == 0 {
		rate = 500
	}
	go func() { genDone <- gen.run(genCtx, o.Records, rate) }()

	// Live line until every sent record is decided. Ctrl-C stops producing;
	// what was sent is still decided (for at most drainTimeout) before the
	// summary.
	const drainTimeout = 30 * time.Second
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	var lastDecided float64
	lastAt := start
	genFinished := false
	interrupt := ctx.Done()
	var drainBy <-chan time.Time
	for {
		select {
		case <-interrupt:
			interrupt = nil
			stopGen()
			drainBy = time.After(drainTimeout)
		case err := <-genDone:
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("demo: producing: %w", err)
			}
			genFinished = true
			genDone = nil
		case err := <-sideErr:
			return fmt.Errorf("demo: sidecar stopped: %w", err)
		case <-drainBy:
			return fmt.Errorf("demo: %d records sent were not all decided within %s", gen.sent.Load(), drainTimeout)
		case <-tick.C:
		}
		c := readCounts(reg)
		decided := c.total("forwarded") + c.total("duplicate") + c.total("invalid")
		now := time.Now()
		rps := (decided - lastDecided) / now.Sub(lastAt).Seconds()
		lastDecided, lastAt = decided, now
		fmt.Fprintf(out, "\rin %-8d forwarded %-8.0f dropped %-8.0f dead-lettered %-6.0f %8.0f records/s   ",
			gen.sent.Load(), c.total("forwarded"), c.total("duplicate"), c.total("invalid"), rps)
		if genFinished && decided >= float64(gen.sent.Load()) {
			break
		}
	}
	fmt.Fprintln(out)
	stopSide()
	if err := <-sideErr; err != nil {
		return fmt.Errorf("demo: sidecar: %w", err)
	}
	if err := gen.summary(out, readCounts(reg), time.Since(start)); err != nil {
		return err
	}
	// The Ctrl-C that ended the run must not cut the example short.
	xctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return gen.showExample(xctx, out, cfg, dsn, o.PrintExplanation)
}

// demoPostgres returns a DSN for a fresh demo schema: on the given server,
// else the local one, else a throwaway cluster started here. yes: drop a
// schema of the demo's name that the demo did not make.
func demoPostgres(ctx context.Context, out io.Writer, dsn string, yes bool) (string, func(), error) {
	explicit := dsn != ""
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	cleanup := func() {}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := pglocal.Reachable(rctx, dsn)
	cancel()
	if err != nil {
		if explicit {
			return "", nil, fmt.Errorf("demo: PostgreSQL at %s: %w", config.RedactDSN(dsn), err)
		}
		fmt.Fprintf(out, "no PostgreSQL at %s (%v): starting a throwaway cluster\n", config.RedactDSN(dsn), err)
		cl, err := pglocal.Start(ctx, func(string, ...any) {})
		if err != nil {
			return "", nil, fmt.Errorf("demo: no PostgreSQL reachable and none could be started: %w (set DAM_POSTGRES_DSN)", err)
		}
		dsn, cleanup = cl.DSN(), func() { _ = cl.Stop() }
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("demo: %w", err)
	}
	defer conn.Close(ctx)
	if err := demoSchema.remake(ctx, conn, yes); errors.Is(err, ErrNotTheDemos) {
		cleanup()
		return "", nil, fmt.Errorf("%w (on %s): refusing to drop it and everything in it", err, config.RedactDSN(dsn))
	} else if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("demo: making schema %s: %w", Schema, err)
	}
	fmt.Fprintf(out, "postgres: %s (schema %s)\n", config.RedactDSN(dsn), Schema)
	return withSearchPath(dsn, Schema), cleanup, nil
}

// demoGenerator produces the projection stream and keeps the reference
// model: what an exact last-seen dedup must forward, per service.
type demoGenerator struct {
	cl       *kgo.Client
	services []demoService
	bananas  []*banana
	rng      *rand.Rand
	sent     atomic.Int64

	mu       sync.Mutex
	last     map[string]map[string]string // service -> entity -> canonical projection
	expected map[string]*demoExpect
	// example holds, per entity of exampleService, its last forward and
	// the first duplicate after it (the reference model's decisions).
	example map[string]*exampleEntity
}

type demoExpect struct{ in, forwarded, duplicate, invalid int }

func newDemoGenerator(broker string, services []demoService, n int) (*demoGenerator, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return nil, err
	}
	g := &demoGenerator{
		cl: cl, services: services, rng: rand.New(rand.NewPCG(7, 11)),
		last: map[string]map[string]string{}, expected: map[string]*demoExpect{},
		example: map[string]*exampleEntity{},
	}
	origins := []string{"Ecuador", "Costa Rica", "Colombia", "Philippines"}
	for i := range n {
		g.bananas = append(g.bananas, &banana{
			ID: fmt.Sprintf("B-%04d", i), Name: "Mr. Banana " + fmt.Sprint(i), Ripeness: ripeness[0],
			Price: "1.20", Origin: origins[i%len(origins)], UpdatedAt: time.Now(),
		})
	}
	for _, s := range services {
		g.last[s.name] = map[string]string{}
		g.expected[s.name] = &demoExpect{}
	}
	return g, nil
}

func (g *demoGenerator) close() { g.cl.Close() }

// run sends events until limit input records are sent (0: until ctx ends).
func (g *demoGenerator) run(ctx context.Context, limit, rate int) error {
	var interval time.Duration
	if rate > 0 {
		interval = time.Second / time.Duration(rate)
	}
	var errMu sync.Mutex
	var firstErr error
	for ctx.Err() == nil && (limit == 0 || int(g.sent.Load()) < limit) {
		for _, r := range g.event(limit) {
			g.sent.Add(1)
			// Not ctx: a record counted in the reference model must reach
			// Kafka even when Ctrl-C stops the generator.
			g.cl.Produce(context.WithoutCancel(ctx), r, func(r *kgo.Record, err error) {
				if err != nil {
					errMu.Lock()
					firstErr = err
					errMu.Unlock()
					return
				}
				g.acked(r)
			})
		}
		if interval > 0 {
			time.Sleep(interval)
		}
	}
	if err := g.cl.Flush(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	errMu.Lock()
	defer errMu.Unlock()
	return firstErr
}

// event changes one banana and returns every service's projection of it.
func (g *demoGenerator) event(limit int) []*kgo.Record {
	b := g.bananas[g.rng.IntN(len(g.bananas))]
	b.UpdatedAt = b.UpdatedAt.Add(time.Duration(1+g.rng.IntN(1000)) * time.Millisecond)
	switch p := g.rng.Float64(); {
	case b.Deleted:
		b.Deleted = false // comes back after a tombstone
	case p < 0.30:
		b.Ripeness = ripeness[g.rng.IntN(len(ripeness))]
	case p < 0.36:
		b.Name = fmt.Sprintf("Mr. Banana %d", g.rng.IntN(100000))
	case p < 0.48:
		b.Price = fmt.Sprintf("%d.%02d", 1+g.rng.IntN(2), g.rng.IntN(100))
	case p < 0.52:
		b.Origin = []string{"Ecuador", "Costa Rica", "Colombia", "Philippines"}[g.rng.IntN(4)]
	case p < 0.525:
		b.Deleted = true
	default:
		// Only the timestamp changed: a duplicate for every service.
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var recs []*kgo.Record
	for _, s := range g.services {
		if limit > 0 && int(g.sent.Load())+len(recs) >= limit {
			break
		}
		if b.Deleted && s.entity != "" {
			continue // a tombstone has no payload to take the identity from
		}
		exp := g.expected[s.name]
		exp.in++
		r := &kgo.Record{Topic: "projections." + s.name, Key: []byte(b.ID)}
		if s.badRate > 0 && g.rng.Float64() < s.badRate {
			r.Value = []byte(`{"banana_id": "` + b.ID + `", "price": {"amount": 1.20,`) // truncated: bad input
			exp.invalid++
			recs = append(recs, r)
			continue
		}
		canonical := "\x00tombstone"
		if !b.Deleted {
			proj := s.project(b)
			r.Value = shuffledJSON(g.rng, proj)
			canonical = canonicalWithout(proj, s.ignore)
		}
		if g.last[s.name][b.ID] == canonical && g.last[s.name][b.ID] != "" {
			exp.duplicate++
			if e := g.example[b.ID]; s.name == exampleService && e != nil && e.dropped.rec == nil {
				e.dropped.rec = r
			}
		} else {
			exp.forwarded++
			g.last[s.name][b.ID] = canonical
			if s.name == exampleService {
				g.example[b.ID] = &exampleEntity{forwarded: exampleRecord{rec: r}}
			}
		}
		recs = append(recs, r)
	}
	return recs
}

// shuffledJSON writes v with its members in random order and random
// spacing: different bytes, the same tree.
func shuffledJSON(rng *rand.Rand, v any) []byte {
	var sb strings.Builder
	var write func(v any)
	write = func(v any) {
		switch t := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(t))
			for k := range t {
				keys = append(keys, k)
			}
			rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
			sb.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					sb.WriteByte(',')
				}
				if rng.IntN(3) == 0 {
					sb.WriteString(" ")
				}
				kb, _ := json.Marshal(k)
				sb.Write(kb)
				sb.WriteByte(':')
				write(t[k])
			}
			sb.WriteByte('}')
		default:
			b, _ := json.Marshal(t)
			sb.Write(b)
		}
	}
	write(v)
	return []byte(sb.String())
}

// canonicalWithout is the reference model's equality: encoding/json with
// sorted keys, ignored members removed (the demo's pointers name members).
func canonicalWithout(v map[string]any, ignore []string) string {
	cp := map[string]any{}
	for k, val := range v {
		if m, ok := val.(map[string]any); ok {
			inner := map[string]any{}
			for ik, iv := range m {
				inner[ik] = iv
			}
			val = inner
		}
		cp[k] = val
	}
	for _, p := range ignore {
		parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
		if len(parts) == 1 {
			delete(cp, parts[0])
		} else if m, ok := cp[parts[0]].(map[string]any); ok {
			delete(m, parts[1])
		}
	}
	b, _ := json.Marshal(cp)
	return string(b)
}

// summary prints per-service counts, compares them with the reference
// model and fails when they differ.
func (g *demoGenerator) summary(out io.Writer, c demoCounts, took time.Duration) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	fmt.Fprintf(out, "\n%-12s %8s %10s %10s %14s %10s  %s\n", "service", "in", "forwarded", "dropped", "dead-lettered", "dropped %", "reference model")
	ok := true
	names := make([]string, 0, len(g.expected))
	for n := range g.expected {
		names = append(names, n)
	}
	sort.Strings(names)
	var in, dropped float64
	for _, n := range names {
		e := g.expected[n]
		f, d, i := c[n]["forwarded"], c[n]["duplicate"], c[n]["invalid"]
		match := int(f) == e.forwarded && int(d) == e.duplicate && int(i) == e.invalid
		verdict := "matches"
		if !match {
			ok = false
			verdict = fmt.Sprintf("MISMATCH: expected %d/%d/%d", e.forwarded, e.duplicate, e.invalid)
		}
		pct := 0.0
		if e.in > 0 {
			pct = 100 * d / float64(e.in)
		}
		in += float64(e.in)
		dropped += d
		fmt.Fprintf(out, "%-12s %8d %10.0f %10.0f %14.0f %9.1f%%  %s\n", n, e.in, f, d, i, pct, verdict)
	}
	fmt.Fprintf(out, "\n%.0f records in %s: %.0f duplicates kept away from the adapters.\n", in, took.Round(time.Millisecond), dropped)
	if !ok {
		return fmt.Errorf("demo: the sidecar's decisions differ from the reference model")
	}
	return nil
}

// demoCounts is dam_records_total by service and outcome.
type demoCounts map[string]map[string]float64

func (c demoCounts) total(outcome string) float64 {
	var t float64
	for _, m := range c {
		t += m[outcome]
	}
	return t
}

func readCounts(reg *prometheus.Registry) demoCounts {
	c := demoCounts{}
	mfs, err := reg.Gather()
	if err != nil {
		return c
	}
	for _, mf := range mfs {
		if mf.GetName() != "dam_records_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var svc, outcome string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "service":
					svc = l.GetValue()
				case "outcome":
					outcome = l.GetValue()
				}
			}
			if c[svc] == nil {
				c[svc] = map[string]float64{}
			}
			c[svc][outcome] += m.GetCounter().GetValue()
		}
	}
	return c
}
