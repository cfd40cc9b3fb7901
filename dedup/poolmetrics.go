package dedup

import (
	"github.com/prometheus/client_golang/prometheus"
)

// PoolCollector returns a Prometheus collector of the store's connection
// pool, read from pgxpool.Pool.Stat at scrape time (nothing to keep in
// sync; a scrape costs one lock of the pool):
//
//	dam_postgres_pool_acquired_connections          gauge: connections in use
//	dam_postgres_pool_idle_connections              gauge: connections idle in the pool
//	dam_postgres_pool_total_connections             gauge: connections open (acquired, idle, being built)
//	dam_postgres_pool_max_connections               gauge: the pool's size (postgres.max_conns)
//	dam_postgres_pool_acquires_total                counter: connections acquired
//	dam_postgres_pool_empty_acquires_total          counter: acquires that had to wait for a connection
//	dam_postgres_pool_acquire_wait_seconds_total    counter: time spent waiting by those acquires
//	dam_postgres_pool_canceled_acquires_total       counter: acquires given up (context canceled)
func (s *Store) PoolCollector() prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("dam_postgres_pool_"+name, help, nil, nil)
	}
	return &poolCollector{
		s:               s,
		acquired:        d("acquired_connections", "PostgreSQL connections in use."),
		idle:            d("idle_connections", "PostgreSQL connections idle in the pool."),
		total:           d("total_connections", "PostgreSQL connections open: acquired, idle and being established."),
		max:             d("max_connections", "Size of the PostgreSQL connection pool (postgres.max_conns)."),
		acquires:        d("acquires_total", "Connections acquired from the pool."),
		emptyAcquires:   d("empty_acquires_total", "Acquires that found no idle connection and had to wait."),
		acquireWait:     d("acquire_wait_seconds_total", "Time spent waiting for a connection by acquires that found none idle."),
		canceledAcquire: d("canceled_acquires_total", "Acquires given up before a connection was free."),
	}
}

type poolCollector struct {
	s                                                     *Store
	acquired, idle, total, max                            *prometheus.Desc
	acquires, emptyAcquires, acquireWait, canceledAcquire *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.acquired, c.idle, c.total, c.max, c.acquires, c.emptyAcquires, c.acquireWait, c.canceledAcquire} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s.pool.Stat()
	gauge := func(d *prometheus.Desc, v int32) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(c.acquired, s.AcquiredConns())
	gauge(c.idle, s.IdleConns())
	gauge(c.total, s.TotalConns())
	gauge(c.max, s.MaxConns())
	counter(c.acquires, float64(s.AcquireCount()))
	counter(c.emptyAcquires, float64(s.EmptyAcquireCount()))
	counter(c.acquireWait, s.EmptyAcquireWaitTime().Seconds())
	counter(c.canceledAcquire, float64(s.CanceledAcquireCount()))
}
