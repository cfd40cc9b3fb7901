package pipeline

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/dam-dedup/dam/dedup"
)

// outcome is what happened to an input record, the label of
// dam_records_total.
type outcome uint8

// The outcomes.
const (
	outcomeForwarded outcome = iota // changed content, delivered
	outcomeDuplicate                // same content as last forwarded: dropped (or marked, in shadow mode)
	outcomeInvalid                  // bad input: dead-lettered (or halted the partition)
	outcomeRefused                  // refused by Kafka for good: dead-lettered without its value
	outcomeRebuilt                  // re-delivered from the decision log during recovery
	outcomeCaughtUp                 // decided without forwarding to catch the state up to Kafka's offset
	outcomeUndecided                // forwarded undecided while the store was down (on_store_failure: forward)
	outcomeStale                    // version mode: a version below the one forwarded: dropped (or marked)
	outcomeRefreshed                // last-seen with refresh_after: unchanged, but forwarded (re-sync)
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"forwarded", "duplicate", "invalid", "refused", "rebuilt", "caught_up", "undecided", "stale", "refreshed"}

func (o outcome) String() string { return outcomeNames[o] }

// outcomeOf is the outcome of a decided valid record. (A decision read
// back from the log after a lost reply is Forward or Duplicate: a refresh
// then counts as forwarded and a stale record as a duplicate.)
func outcomeOf(d dedup.Decision) outcome {
	switch d {
	case dedup.Forward:
		return outcomeForwarded
	case dedup.Refresh:
		return outcomeRefreshed
	case dedup.Stale:
		return outcomeStale
	}
	return outcomeDuplicate
}

// The results of a window cleanup round, the label of
// dam_window_cleanups_total.
const (
	cleanupDone    = "done"    // this instance deleted the expired ids
	cleanupSkipped = "skipped" // another instance was cleaning the service
	cleanupFailed  = "failed"  // a store error; retried at the next interval
)

// outcomes counts records per outcome.
type outcomes [numOutcomes]int

type metrics struct {
	records       *prometheus.CounterVec
	deadLetters   *prometheus.CounterVec
	decideSeconds *prometheus.HistogramVec
	batchRecords  *prometheus.HistogramVec
	storeErrors   *prometheus.CounterVec
	deliverErrors *prometheus.CounterVec
	pollToCommit  *prometheus.HistogramVec
	stateRows     *prometheus.GaugeVec
	// Window mode's cleanup.
	windowExpired  *prometheus.CounterVec
	windowCleanups *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		records: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dam_records_total",
			Help: "Input records by service and outcome (forwarded, duplicate, invalid, refused, rebuilt, caught_up, undecided, stale, refreshed).",
		}, []string{"service", "outcome"}),
		deadLetters: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dam_dead_letters_total",
			Help: "Records delivered to the dead-letter topic, by reason: invalid (bad input) or refused (refused by Kafka for good, value dropped).",
		}, []string{"service", "reason"}),
		decideSeconds: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dam_decision_seconds",
			Help:    "Duration of one batch's decide transaction in PostgreSQL.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"service"}),
		batchRecords: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dam_batch_records",
			Help:    "Records per decided batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}, []string{"service"}),
		storeErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dam_store_errors_total",
			Help: "PostgreSQL errors met while deciding or recovering (each is retried).",
		}, []string{"service"}),
		deliverErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dam_delivery_errors_total",
			Help: "Kafka produce or commit errors (each is retried).",
		}, []string{"service"}),
		pollToCommit: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dam_poll_to_commit_seconds",
			Help:    "Time from polling a batch's first record to committing its offset.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"service"}),
		stateRows: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dam_state_rows",
			Help: "Identities with stored state, per service (counted every minute; every 5 s while under 10,000).",
		}, []string{"service"}),
		windowExpired: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dam_window_expired_total",
			Help: "Expired window-mode ids deleted by this instance's cleanup.",
		}, []string{"service"}),
		windowCleanups: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dam_window_cleanups_total",
			Help: "Window cleanup rounds by result: done, skipped (another instance was cleaning the service) or failed.",
		}, []string{"service", "result"}),
	}
}

// haltedCollector computes dam_halted at scrape time from the partitions'
// own state, so that no increment or decrement can be lost.
type haltedCollector struct {
	p    *Pipeline
	desc *prometheus.Desc
}

func newHaltedCollector(p *Pipeline) prometheus.Collector {
	return &haltedCollector{p: p, desc: prometheus.NewDesc("dam_halted",
		"Partitions not making progress: paused by a PostgreSQL or Kafka outage (retrying) or halted on bad input without a dead-letter topic.",
		[]string{"service"}, nil)}
}

func (c *haltedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *haltedCollector) Collect(ch chan<- prometheus.Metric) {
	for svc, n := range c.p.haltedCounts() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), svc)
	}
}

// partitionsCollector reports, at each scrape, the partitions this
// instance owns and their lag, from the registered workers: a partition
// halted or paused stays assigned, and its lag keeps counting what waits
// behind its committed offset.
type partitionsCollector struct {
	p             *Pipeline
	assigned, lag *prometheus.Desc
}

func newPartitionsCollector(p *Pipeline) prometheus.Collector {
	return &partitionsCollector{p: p,
		assigned: prometheus.NewDesc("dam_partitions_assigned",
			"Input partitions this instance owns, halted or paused ones included.", []string{"service"}, nil),
		lag: prometheus.NewDesc("dam_consumer_lag",
			"Records between the partition's end (its high watermark) and the group's committed offset: what is not delivered yet, or waits behind a halt.",
			[]string{"service", "partition"}, nil),
	}
}

func (c *partitionsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.assigned
	ch <- c.lag
}

func (c *partitionsCollector) Collect(ch chan<- prometheus.Metric) {
	counts := make(map[string]int, len(c.p.routes))
	for _, r := range c.p.routes {
		counts[r.service] = 0
	}
	for _, w := range c.p.allWorkers() {
		counts[w.rt.service]++
		if lag, ok := w.lag(); ok {
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(lag), w.rt.service, w.label)
		}
	}
	for svc, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.assigned, prometheus.GaugeValue, float64(n), svc)
	}
}

// stateRowsEvery is the refresh interval of dam_state_rows; a service of
// fewer than stateRowsSmall rows, cheap to count, is counted every
// stateRowsSmallEvery, so that a new service's first rows show at once.
const (
	stateRowsEvery      = time.Minute
	stateRowsSmall      = 10000
	stateRowsSmallEvery = 5 * time.Second
)

// stateRowsLoop refreshes dam_state_rows, counting only this instance's
// services (every replica of every adapter's dam runs it, so it must not
// read the whole table).
func (p *Pipeline) stateRowsLoop(ctx context.Context) {
	type counted struct {
		at   time.Time
		rows int64
	}
	services := map[string]counted{}
	for _, r := range p.routes {
		services[r.service] = counted{}
	}
	t := time.NewTicker(stateRowsSmallEvery)
	defer t.Stop()
	for {
		for service, c := range services {
			if time.Since(c.at) < stateRowsEvery && (c.rows >= stateRowsSmall || time.Since(c.at) < stateRowsSmallEvery) {
				continue
			}
			if n, err := p.store.Count(ctx, service); err == nil {
				p.metrics.stateRows.WithLabelValues(service).Set(float64(n))
				services[service] = counted{at: time.Now(), rows: n}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// endsEvery is how often the partitions' end offsets are listed for the
// lag of partitions that are not fetched (halted, paused).
const endsEvery = 15 * time.Second

// endsLoop lists the owned partitions' end offsets every endsEvery, so
// that the lag of a partition nothing is fetched of (halted, paused by
// an outage) keeps growing as records arrive. It returns when ctx ends.
func (p *Pipeline) endsLoop(ctx context.Context) {
	t := time.NewTicker(endsEvery)
	defer t.Stop()
	adm := kadm.NewClient(p.client)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ws := p.allWorkers()
		topics := map[string]bool{}
		for _, w := range ws {
			topics[w.part.Topic] = true
		}
		if len(topics) == 0 {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, endsEvery)
		ends, err := adm.ListEndOffsets(lctx, slices.Collect(maps.Keys(topics))...)
		cancel()
		if err != nil {
			continue // the probes report an unreachable broker
		}
		for _, w := range ws {
			if o, ok := ends.Lookup(w.part.Topic, w.part.Partition); ok && o.Err == nil {
				w.sawEnd(o.Offset)
			}
		}
	}
}
