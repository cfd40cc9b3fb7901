package pipeline

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Outcomes counted by dam_records_total.
const (
	outcomeForwarded = "forwarded" // changed content, delivered
	outcomeDuplicate = "duplicate" // same content as last forwarded: dropped (or marked, in shadow mode)
	outcomeInvalid   = "invalid"   // bad input: dead-lettered (or halted the partition)
	outcomeRebuilt   = "rebuilt"   // re-delivered from the decision log during recovery
	outcomeCaughtUp  = "caught_up" // decided without forwarding to catch the state up to Kafka's offset
	outcomeUndecided = "undecided" // forwarded undecided while the store was down (on_store_failure: forward)
)

type metrics struct {
	records       *prometheus.CounterVec
	deadLetters   *prometheus.CounterVec
	decideSeconds *prometheus.HistogramVec
	batchRecords  *prometheus.HistogramVec
	storeErrors   *prometheus.CounterVec
	deliverErrors *prometheus.CounterVec
	pollToCommit  *prometheus.HistogramVec
	lag           *prometheus.GaugeVec
	assigned      *prometheus.GaugeVec
	stateRows     *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		records: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dam_records_total",
			Help: "Input records by service and outcome (forwarded, duplicate, invalid, rebuilt, caught_up, undecided).",
		}, []string{"service", "outcome"}),
		deadLetters: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dam_dead_letters_total",
			Help: "Bad input records produced to the route's dead-letter topic (the delivered outcome=\"invalid\" records).",
		}, []string{"service"}),
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
		lag: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dam_consumer_lag",
			Help: "Records between the partition's high watermark and the next offset to decide.",
		}, []string{"service", "partition"}),
		assigned: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dam_partitions_assigned",
			Help: "Input partitions this instance owns.",
		}, []string{"service"}),
		stateRows: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dam_state_rows",
			Help: "Identities with stored state, per service (refreshed every minute).",
		}, []string{"service"}),
	}
}

// haltedCollector computes dam_halted at scrape time from the partitions'
// own state, so that no increment or decrement can be lost.
type haltedCollector struct {
	p    *Pipeline
	desc *prometheus.Desc
}

func newHaltedCollector(p *Pipeline) *haltedCollector {
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
