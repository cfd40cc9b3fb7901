package dedup_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// poolValues gathers the pool collector into name -> value.
func poolValues(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		switch {
		case m.GetGauge() != nil:
			out[mf.GetName()] = m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			out[mf.GetName()] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestPoolCollector reads a real pool's statistics at scrape time: one
// connection held shows as acquired, released as idle.
func TestPoolCollector(t *testing.T) {
	pool := pgtest.Pool(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(dedup.NewStore(pool).PoolCollector())
	if got := poolValues(t, reg); len(got) != 8 {
		t.Fatalf("%d metrics, want 8: %v", len(got), got)
	}

	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	held := poolValues(t, reg)
	conn.Release()
	released := poolValues(t, reg)

	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"acquired while held", held["dam_postgres_pool_acquired_connections"], 1},
		{"idle while held", held["dam_postgres_pool_idle_connections"], 0},
		{"total while held", held["dam_postgres_pool_total_connections"], 1},
		{"acquires while held", held["dam_postgres_pool_acquires_total"], 1},
		{"acquired after release", released["dam_postgres_pool_acquired_connections"], 0},
		{"idle after release", released["dam_postgres_pool_idle_connections"], 1},
		{"max", released["dam_postgres_pool_max_connections"], float64(pool.Config().MaxConns)},
		{"canceled", released["dam_postgres_pool_canceled_acquires_total"], 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
	// The first acquire found the pool empty and waited for a connection
	// to be established.
	if released["dam_postgres_pool_empty_acquires_total"] != 1 || released["dam_postgres_pool_acquire_wait_seconds_total"] <= 0 {
		t.Errorf("empty acquires %v, waited %vs; want 1 and > 0",
			released["dam_postgres_pool_empty_acquires_total"], released["dam_postgres_pool_acquire_wait_seconds_total"])
	}
}
