package serve

import "time"

// SetIdleTimeout shortens the keep-alive idle timeout of s's HTTP server
// (two minutes), for tests.
func SetIdleTimeout(s *Server, d time.Duration) { s.timeouts.idle = d }

// HTTPTimeouts returns the timeouts of s's HTTP server.
func HTTPTimeouts(s *Server) (header, read, write, idle time.Duration) {
	t := s.timeouts
	return t.header, t.read, t.write, t.idle
}

// StatusClientGone is the status recorded for a request whose client went
// away.
const StatusClientGone = statusClientGone

// ReadyProbes is the number of store pings /readyz has sent.
func ReadyProbes(s *Server) int64 { return s.ready.probes.Load() }
