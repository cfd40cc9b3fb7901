package e2e

import (
	"testing"
	"time"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// TestRebalance has a second instance join the group mid-stream and leave
// it with SIGTERM: partitions move twice under load, each revoked owner
// delivers and commits what it decided, and nothing is lost.
func TestRebalance(t *testing.T) {
	t.Parallel()
	needBinary(t)
	b := newBroker(t, false)
	dsn := pgtest.DSN(t)
	a := newSidecar(t, "a", sidecarOpts{brokers: b.addr(), dsn: dsn})
	a.start()
	a.waitReady(30 * time.Second)

	load := startLoad(t, b.addr(), 24000, 2000, 24*time.Second)
	time.Sleep(4 * time.Second)
	c := newSidecar(t, "b", sidecarOpts{brokers: b.addr(), dsn: dsn})
	c.start()
	t.Logf("second instance started at %d records produced", load.produced.Load())
	c.waitReady(30 * time.Second)
	time.Sleep(5 * time.Second)
	a.checkAlive()
	if !c.logContains(`"partition assigned"`) {
		t.Error("the second instance never got a partition")
	}
	took, err := c.term(c.grace + 5*time.Second)
	t.Logf("second instance stopped (SIGTERM) at %d records produced: exit %v after %s", load.produced.Load(), err, took.Round(time.Millisecond))
	if err != nil {
		t.Errorf("second instance: exit %v, want status 0", err)
	}
	if took > c.grace {
		t.Errorf("second instance took %s to stop, above shutdown_grace %s", took, c.grace)
	}
	load.wait(2 * time.Minute)
	r := waitDelivered(t, b.addr(), 90*time.Second, a)
	assertReport(t, r, load, -1)
}

// TestGracefulShutdown stops the sidecar with SIGTERM under load: it must
// exit 0 within shutdown_grace having committed everything it delivered, so
// that once restarted nothing is lost and nothing is delivered twice.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	needBinary(t)
	b := newBroker(t, false)
	s := newSidecar(t, "a", sidecarOpts{brokers: b.addr(), dsn: pgtest.DSN(t), grace: 10 * time.Second})
	s.start()
	s.waitReady(30 * time.Second)

	load := startLoad(t, b.addr(), 20000, 2000, 20*time.Second)
	time.Sleep(6 * time.Second)
	took, err := s.term(s.grace + 5*time.Second)
	t.Logf("SIGTERM at %d records produced: exit %v after %s", load.produced.Load(), err, took.Round(time.Millisecond))
	if err != nil {
		t.Errorf("exit %v, want status 0", err)
	}
	if took > s.grace {
		t.Errorf("took %s to stop, above shutdown_grace %s", took, s.grace)
	}
	if !s.logContains(`"stopped"`) {
		t.Error(`no "stopped" in the log: the shutdown did not finish`)
	}
	time.Sleep(3 * time.Second)
	s.start()
	load.wait(2 * time.Minute)
	r := waitDelivered(t, b.addr(), 90*time.Second, s)
	assertReport(t, r, load, 0)
}
