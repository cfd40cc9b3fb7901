// Package tcpproxy is a test helper: a TCP proxy in front of a server
// (PostgreSQL in the outage and chaos tests) that injects the faults of a
// network and of a server going away, without touching the server:
//
//   - Cut: every connection reset, new ones refused (a server down);
//   - Reset: every connection reset, new ones accepted (a failover, a
//     proxy restart);
//   - Blackhole: nothing flows any more, nothing is closed (a partition of
//     the network, a hung server): clients wait until their own timeouts;
//   - Latency: every chunk delayed;
//   - LoseNextCommitReply: the next PostgreSQL COMMIT reaches the server,
//     its reply is lost and the connection dropped: the outcome the client
//     cannot know;
//   - HoldNextCommitReply: the next COMMIT reaches the server, its reply
//     waits until released: a client stopped in the middle of its commit.
package tcpproxy

import (
	"bytes"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type mode int

const (
	modePass mode = iota
	modeRefuse
	modeBlackhole
)

// Proxy is a TCP proxy that can inject faults between its clients and the
// server behind it.
type Proxy struct {
	ln      net.Listener
	target  string
	latency atomic.Int64 // nanoseconds added to every chunk
	// commit is the action armed by LoseNextCommitReply (nil: none).
	commit atomic.Pointer[func()]
	// hold is the action armed by HoldNextCommitReply (nil: none).
	hold atomic.Pointer[holdReply]
	// prepared is armed by LoseNextCommitPrepared.
	prepared atomic.Bool

	mu    sync.Mutex
	mode  mode
	conns map[*link]struct{}
	wg    sync.WaitGroup
}

// link is one proxied connection.
type link struct {
	client, server net.Conn // server is nil while blackholed from the start
	held           atomic.Bool
}

func (l *link) close() {
	l.client.Close()
	if l.server != nil {
		l.server.Close()
	}
}

// New starts a proxy to target (host:port) on a free loopback port, closed
// when the test ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		m := p.mode
		if m == modeRefuse {
			p.mu.Unlock()
			c.Close()
			continue
		}
		l := &link{client: c}
		l.held.Store(m == modeBlackhole)
		p.conns[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			p.pipe(l)
		}()
	}
}

func (p *Proxy) pipe(l *link) {
	defer p.forget(l)
	if l.held.Load() {
		// Accepted in a blackhole: swallow everything until the blackhole
		// ends (the connection is then reset, as a real one would be).
		_, _ = io.Copy(io.Discard, l.client)
		return
	}
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	p.mu.Lock()
	if _, ok := p.conns[l]; !ok { // reset meanwhile
		p.mu.Unlock()
		up.Close()
		return
	}
	l.server = up
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	var lost atomic.Bool // the reply of a COMMIT is being lost
	var hold atomic.Pointer[holdReply]
	var commits commitSpotter
	go func() { // client -> server
		defer wg.Done()
		p.copy(l, up, l.client, func(chunk []byte) bool {
			if bytes.Contains(chunk, []byte("COMMIT PREPARED")) && p.prepared.Swap(false) {
				go l.close()
				return false
			}
			if commits.spot(chunk) {
				if h := p.hold.Swap(nil); h != nil {
					hold.Store(h)
					_, _ = up.Write(chunk)
					go h.then()
					return false
				}
				if then := p.commit.Swap(nil); then != nil {
					lost.Store(true)
					_, _ = up.Write(chunk)
					go func() {
						time.Sleep(300 * time.Millisecond) // let the server commit
						l.close()
						(*then)()
					}()
					return false
				}
			}
			return true
		})
	}()
	go func() { // server -> client
		defer wg.Done()
		p.copy(l, l.client, up, func([]byte) bool {
			if h := hold.Swap(nil); h != nil {
				<-h.released
			}
			return !lost.Load()
		})
	}()
	wg.Wait()
}

// copy forwards src to dst chunk by chunk while the link is not held,
// after the latency, when pass allows it.
func (p *Proxy) copy(l *link, dst, src net.Conn, pass func([]byte) bool) {
	defer l.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(p.latency.Load()); d > 0 {
				time.Sleep(d)
			}
			if !l.held.Load() && pass(buf[:n]) {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// commitSpotter finds PostgreSQL COMMITs in what a client sends: as a
// simple query, as an unnamed statement (Parse with its text, as pgx sends
// with default_query_exec_mode=exec), or as a named prepared statement
// (pgx's default statement cache: the text is parsed once per connection,
// then only bound by name, which is the COMMIT to spot).
type commitSpotter struct {
	named [][]byte // names of statements prepared as COMMIT
}

var commitText = []byte("\x00COMMIT\x00")

func (c *commitSpotter) spot(chunk []byte) bool {
	if bytes.Contains(chunk, []byte("Q\x00\x00\x00\x0bCOMMIT\x00")) {
		return true
	}
	found := false
	for rest := chunk; ; {
		i := bytes.Index(rest, commitText)
		if i < 0 {
			break
		}
		// Parse: 'P', int32 length, name, 0, query, 0. The name is printable
		// and ends at i; the length before it may hold printable bytes too,
		// so the name starts where 'P' is 5 bytes before.
		j := i
		for j > 0 && rest[j-1] >= 0x21 && rest[j-1] < 0x7f {
			j--
		}
		for ; j <= i; j++ {
			if j >= 5 && rest[j-5] == 'P' {
				break
			}
		}
		switch {
		case j > i:
			found = true // not a Parse we can read: take it for a COMMIT
		case j == i:
			found = true // the unnamed statement: parsed, bound and executed at once
		default:
			c.named = append(c.named, bytes.Clone(rest[j:i]))
		}
		rest = rest[i+len(commitText)-1:]
	}
	for _, name := range c.named {
		// Bind: 'B', int32 length, portal (""), 0, statement name, 0.
		bind := append(append([]byte{0}, name...), 0)
		if bytes.Contains(chunk, bind) {
			found = true
		}
	}
	return found
}

func (p *Proxy) forget(l *link) {
	l.close()
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}

// closeAll resets every connection and sets the mode for new ones.
func (p *Proxy) closeAll(m mode) {
	p.mu.Lock()
	p.mode = m
	for l := range p.conns {
		l.close()
		delete(p.conns, l)
	}
	p.mu.Unlock()
}

// Cut resets every connection and refuses new ones until Restore.
func (p *Proxy) Cut() { p.closeAll(modeRefuse) }

// Reset resets every connection; new ones are accepted.
func (p *Proxy) Reset() { p.closeAll(modePass) }

// Restore ends a Cut or a Blackhole: new connections pass again.
// Connections held by a blackhole are reset (their data is lost).
func (p *Proxy) Restore() {
	p.mu.Lock()
	was := p.mode
	p.mode = modePass
	p.mu.Unlock()
	if was == modeBlackhole {
		p.mu.Lock()
		for l := range p.conns {
			if l.held.Load() {
				l.close()
				delete(p.conns, l)
			}
		}
		p.mu.Unlock()
	}
}

// Blackhole stops all traffic, in both directions, on every connection,
// closing nothing; new connections are accepted and held too. It lasts
// until Restore or Reset.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.mode = modeBlackhole
	for l := range p.conns {
		l.held.Store(true)
	}
	p.mu.Unlock()
}

// Latency delays every chunk, in both directions, by d (0 ends it).
func (p *Proxy) Latency(d time.Duration) { p.latency.Store(int64(d)) }

// LoseNextCommitReply arms a one-shot fault for PostgreSQL: the next COMMIT
// a client sends (as a simple query, or in a pipeline with its text, as
// pgx sends it with default_query_exec_mode=exec or on a fresh connection)
// reaches the server, but its reply never reaches the client and the
// connection is dropped 300 ms later; then runs (nil: nothing more), e.g.
// p.Cut or p.Blackhole, to make the outage last.
func (p *Proxy) LoseNextCommitReply(then func()) {
	if then == nil {
		then = func() {}
	}
	p.commit.Store(&then)
}

// LoseNextCommitPrepared arms a one-shot fault for a Citus worker: the
// next COMMIT PREPARED the coordinator sends it never arrives, and the
// connection is dropped. The coordinator has committed (its commit record
// is the decision of the two-phase commit) and its client is told so; the
// worker holds the transaction prepared until the coordinator's recovery
// of prepared transactions commits it.
func (p *Proxy) LoseNextCommitPrepared() { p.prepared.Store(true) }

// holdReply is an armed HoldNextCommitReply.
type holdReply struct {
	then     func()
	released chan struct{}
}

// HoldNextCommitReply arms a one-shot fault for PostgreSQL: the next
// COMMIT a client sends reaches the server, and then runs (in a goroutine
// of its own); the server's reply to it waits until release is called.
func (p *Proxy) HoldNextCommitReply(then func()) (release func()) {
	h := &holdReply{then: then, released: make(chan struct{})}
	if h.then == nil {
		h.then = func() {}
	}
	p.hold.Store(h)
	var once sync.Once
	return func() { once.Do(func() { close(h.released) }) }
}

// PostgresDSN returns the host:port of a PostgreSQL DSN and a function
// rewriting the DSN to another host:port.
func PostgresDSN(t testing.TB, dsn string) (string, func(string) string) {
	t.Helper()
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		hp := u.Host
		if u.Port() == "" {
			hp = net.JoinHostPort(u.Hostname(), "5432")
		}
		if u.Hostname() == "" || strings.HasPrefix(u.Hostname(), "/") {
			t.Fatalf("DSN %q: the outage test needs a TCP host", dsn)
		}
		return hp, func(addr string) string {
			v := *u
			v.Host = addr
			return v.String()
		}
	}
	host, port := "127.0.0.1", "5432"
	var rest []string
	for _, f := range strings.Fields(dsn) {
		switch {
		case strings.HasPrefix(f, "host="):
			host = strings.TrimPrefix(f, "host=")
		case strings.HasPrefix(f, "port="):
			port = strings.TrimPrefix(f, "port=")
		default:
			rest = append(rest, f)
		}
	}
	if strings.HasPrefix(host, "/") {
		t.Fatalf("DSN %q: the outage test needs a TCP host", dsn)
	}
	return net.JoinHostPort(host, port), func(addr string) string {
		h, p, _ := net.SplitHostPort(addr)
		return strings.Join(append(rest, "host="+h, "port="+p), " ")
	}
}
