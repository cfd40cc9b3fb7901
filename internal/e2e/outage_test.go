package e2e

import (
	"github.com/dam-dedup/dam/internal/tcpproxy"

	"net/http"
	"testing"
	"time"

	"github.com/dam-dedup/dam/internal/pgtest"
)

// watchHalted polls the sidecar until stop is closed and reports whether
// it was seen halted (dam_halted > 0) or not ready (/readyz 503).
func watchHalted(s *sidecar, stop <-chan struct{}) <-chan [2]bool {
	res := make(chan [2]bool, 1)
	go func() {
		var halted, notReady bool
		for {
			if h, err := s.halted(); err == nil && h > 0 {
				halted = true
			}
			if s.ready() == http.StatusServiceUnavailable {
				notReady = true
			}
			select {
			case <-stop:
				res <- [2]bool{halted, notReady}
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return res
}

// TestPostgresOutage cuts PostgreSQL (through a TCP proxy) for 20 s under
// load: the sidecar must pause (dam_halted, not ready), decide and forward
// nothing undecided, and resume by itself once PostgreSQL is back.
func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	needBinary(t)
	b := newBroker(t, false)
	dsn := pgtest.DSN(t)
	target, rewrite := tcpproxy.PostgresDSN(t, dsn)
	proxy := tcpproxy.New(t, target)
	s := newSidecar(t, "a", sidecarOpts{brokers: b.addr(), dsn: rewrite(proxy.Addr())})
	s.start()
	s.waitReady(30 * time.Second)

	load := startLoad(t, b.addr(), 24000, 2000, 30*time.Second)
	time.Sleep(5 * time.Second)
	proxy.Cut()
	t.Logf("PostgreSQL cut at %d records produced", load.produced.Load())
	stop := make(chan struct{})
	seen := watchHalted(s, stop)
	time.Sleep(20 * time.Second)
	close(stop)
	got := <-seen
	proxy.Restore()
	t.Logf("PostgreSQL restored at %d records produced; during the cut: dam_halted>0 %v, /readyz 503 %v", load.produced.Load(), got[0], got[1])
	if !got[0] && !got[1] {
		t.Error("during the PostgreSQL outage the sidecar never reported dam_halted > 0 nor /readyz 503")
	}
	s.checkAlive()
	s.waitReady(30 * time.Second)
	load.wait(2 * time.Minute)
	r := waitDelivered(t, b.addr(), 90*time.Second, s)
	// No process died: a batch whose COMMIT reply was lost is resolved from
	// the decision log, and deliveries are retried only on Kafka errors, so
	// nothing is delivered twice.
	assertReport(t, r, load, 0)
	if h, err := s.halted(); err != nil || h != 0 {
		t.Errorf("after recovery: dam_halted %v (%v), want 0", h, err)
	}
}

// TestBrokerOutage stops the Kafka broker for 20 s under load and restarts
// it on the same port with the same data: the sidecar must pause and resume
// where it stopped.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	needBinary(t)
	b := newBroker(t, true)
	s := newSidecar(t, "a", sidecarOpts{brokers: b.addr(), dsn: pgtest.DSN(t)})
	s.start()
	s.waitReady(30 * time.Second)

	// The generator blocks (its client retries) while the broker is down.
	load := startLoad(t, b.addr(), 20000, 2000, 25*time.Second)
	time.Sleep(5 * time.Second)
	b.stop()
	t.Logf("broker stopped at %d records produced", load.produced.Load())
	stop := make(chan struct{})
	seen := watchHalted(s, stop)
	time.Sleep(20 * time.Second)
	close(stop)
	got := <-seen
	b.start()
	t.Logf("broker restarted at %d records produced; during the outage: dam_halted>0 %v, /readyz 503 %v", load.produced.Load(), got[0], got[1])
	if !got[0] || !got[1] {
		t.Error("during the broker outage the sidecar did not report both dam_halted > 0 and /readyz 503")
	}
	s.checkAlive()
	load.wait(2 * time.Minute)
	r := waitDelivered(t, b.addr(), 2*time.Minute, s)
	assertReport(t, r, load, -1)
}
