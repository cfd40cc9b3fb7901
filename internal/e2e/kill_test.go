package e2e

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dam-dedup/dam/internal/pgtest"
)

// TestKill9 kills the sidecar with SIGKILL at random moments under load and
// restarts it each time: recovery must replay what was decided but not
// delivered, so nothing is lost; the only extras are re-deliveries of the
// batches in flight at a kill.
func TestKill9(t *testing.T) {
	t.Parallel()
	needBinary(t)
	b := newBroker(t, false)
	s := newSidecar(t, "a", sidecarOpts{brokers: b.addr(), dsn: pgtest.DSN(t)})
	s.start()
	s.waitReady(30 * time.Second)

	load := startLoad(t, b.addr(), 30000, 2000, 40*time.Second)
	// A restarted member waits for the killed one's session to expire
	// before it owns partitions, so each kill waits for readiness first:
	// the kill then lands while partitions are being decided and
	// delivered, not while the process is still joining.
	kills := 0
	for kills < 5 {
		s.waitReady(30 * time.Second)
		time.Sleep(time.Duration(1000+rand.IntN(2000)) * time.Millisecond)
		s.checkAlive()
		s.kill()
		kills++
		t.Logf("kill %d: %d records produced so far", kills, load.produced.Load())
		s.start()
	}
	t.Logf("killed the sidecar %d times", kills)
	load.wait(2 * time.Minute)
	r := waitDelivered(t, b.addr(), 90*time.Second, s)
	assertReport(t, r, load, -1)
}
