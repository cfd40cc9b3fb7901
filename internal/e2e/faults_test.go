package e2e

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// faultNet sits between the broker and its clients (kfake.ListenFn): the
// chaos tests reset every open connection (as a broker restart or a
// network failure does) or delay every reply of the broker.
type faultNet struct {
	latency atomic.Int64 // nanoseconds before each write of the broker
	mu      sync.Mutex
	conns   map[*faultConn]struct{}
}

func newFaultNet() *faultNet { return &faultNet{conns: map[*faultConn]struct{}{}} }

func (f *faultNet) listen(network, addr string) (net.Listener, error) {
	l, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	return &faultListener{Listener: l, f: f}, nil
}

// reset closes every open connection with a TCP reset and returns how
// many there were; new connections are accepted.
func (f *faultNet) reset() int {
	f.mu.Lock()
	conns := f.conns
	f.conns = map[*faultConn]struct{}{}
	f.mu.Unlock()
	for c := range conns {
		if tc, ok := c.Conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, not FIN
		}
		_ = c.Conn.Close()
	}
	return len(conns)
}

// setLatency delays every write of the broker by d (0 ends it).
func (f *faultNet) setLatency(d time.Duration) { f.latency.Store(int64(d)) }

type faultListener struct {
	net.Listener
	f *faultNet
}

func (l *faultListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	fc := &faultConn{Conn: c, f: l.f}
	l.f.mu.Lock()
	l.f.conns[fc] = struct{}{}
	l.f.mu.Unlock()
	return fc, nil
}

type faultConn struct {
	net.Conn
	f *faultNet
}

func (c *faultConn) Write(b []byte) (int, error) {
	if d := c.f.latency.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	return c.Conn.Write(b)
}

func (c *faultConn) Close() error {
	c.f.mu.Lock()
	delete(c.f.conns, c)
	c.f.mu.Unlock()
	return c.Conn.Close()
}

// signal sends sig to the running process.
func (s *sidecar) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		s.t.Fatalf("%s: not running", s.name)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("%s: %v: %v", s.name, sig, err)
	}
}

// stopped reports whether the process is stopped by a signal (SIGSTOP):
// state T in /proc/PID/stat.
func (s *sidecar) stopped() (bool, error) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return false, errors.New("not running")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return false, err
	}
	// pid (comm) state ...: comm may hold spaces, so cut at the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false, fmt.Errorf("/proc/%d/stat: %q", cmd.Process.Pid, b)
	}
	return b[i+2] == 'T', nil
}

// waitStopped waits until the process has stopped itself (the
// DAM_TEST_PAUSE_AT hook) and fails the test if it has not within limit.
func (s *sidecar) waitStopped(limit time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		st, err := s.stopped()
		if err == nil && st {
			return
		}
		s.checkAlive()
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("%s: did not stop itself at its pause step within %s", s.name, limit)
}

// exited reports whether the process has exited by itself, and how; it is
// then no longer running (start it again).
func (s *sidecar) exited() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false, nil
	}
	select {
	case <-s.done:
		s.cmd = nil
		return true, s.err
	default:
		return false, nil
	}
}

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
