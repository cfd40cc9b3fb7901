package demo

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/explain"
	"github.com/dam-dedup/dam/pipeline"
)

// exampleService is the service of which the demo shows one entity's
// records as the sidecar decided them: its projection changes in ripeness
// and repeats with only a new updated_at, which it ignores.
const exampleService = "customer-1"

// exampleEntity is one entity of exampleService: its last forward and the
// first duplicate after it, as the reference model decided them.
type exampleEntity struct{ forwarded, dropped exampleRecord }

// exampleRecord is a record sent and, once Kafka acknowledged it, where
// it landed.
type exampleRecord struct {
	rec       *kgo.Record
	acked     bool
	partition int32
	offset    int64
}

// acked notes where Kafka put r, when r is an example's record.
func (g *demoGenerator) acked(r *kgo.Record) {
	if r.Topic != "projections."+exampleService {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.example[string(r.Key)]
	if e == nil {
		return
	}
	for _, x := range []*exampleRecord{&e.forwarded, &e.dropped} {
		if x.rec == r {
			x.acked, x.partition, x.offset = true, r.Partition, r.Offset
		}
	}
}

// showExample prints one entity of exampleService as the sidecar decided
// it: a forwarded record and the duplicate dropped after it, the route
// that decided them, and dam explain's answer for the drop, asked of the
// demo's own store and broker. It prints nothing when no entity had a
// duplicate (a very short run).
func (g *demoGenerator) showExample(ctx context.Context, out io.Writer, cfg config.Config, dsn string,
	print func(io.Writer, *explain.OffsetExplanation) error) error {
	g.mu.Lock()
	var ids []string
	for id, e := range g.example {
		if e.forwarded.acked && e.dropped.acked && e.forwarded.rec.Value != nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	var e exampleEntity
	if len(ids) > 0 {
		e = *g.example[ids[0]]
	}
	g.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	var rc config.Route
	for _, r := range cfg.Routes {
		if r.Service == exampleService {
			rc = r
		}
	}
	fmt.Fprintf(out, "\nOne banana as route %s decided it (%s -> %s, ignore %s):\n",
		rc.Service, rc.From, rc.To, strings.Join(rc.Ignore, ", "))
	for _, x := range []struct {
		what string
		r    exampleRecord
	}{{"forwarded", e.forwarded}, {"dropped", e.dropped}} {
		fmt.Fprintf(out, "  %-9s %s/%d@%d  key %s  %s\n", x.what, rc.From, x.r.partition, x.r.offset, x.r.rec.Key, x.r.rec.Value)
	}

	route, err := pipeline.CompileRoute(rc)
	if err != nil {
		return fmt.Errorf("demo: route %s: %w", rc.Service, err)
	}
	store, err := dedup.Open(ctx, dsn, dedup.Config{MaxConns: 2, ApplicationName: "dam-demo-explain"})
	if err != nil {
		return fmt.Errorf("demo: postgres: %w", err)
	}
	defer store.Close()
	kc, err := kgo.NewClient(kgo.SeedBrokers(cfg.Kafka.Brokers...))
	if err != nil {
		return fmt.Errorf("demo: kafka: %w", err)
	}
	defer kc.Close()
	res, err := explain.New(store, kc, cfg.Kafka.Group).Offset(ctx, route, e.dropped.partition, e.dropped.offset)
	if err != nil {
		return fmt.Errorf("demo: explaining %s/%d@%d: %w", rc.From, e.dropped.partition, e.dropped.offset, err)
	}
	fmt.Fprintf(out, "\nWhy was it dropped? dam explain --topic %s --partition %d --offset %d:\n", rc.From, e.dropped.partition, e.dropped.offset)
	if print == nil {
		_, err := fmt.Fprintf(out, "%s: %s\n", res.Decision, res.Reason)
		return err
	}
	return print(out, res)
}
