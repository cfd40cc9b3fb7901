// Package tcpproxy is a test helper: a TCP proxy that can cut every
// connection and refuse new ones, to simulate an outage of the server
// behind it (PostgreSQL in the outage tests) without stopping the server.
package tcpproxy

import (
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy that can cut every connection and refuse new ones:
// an outage of the server behind it, without touching the server.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cutOff bool
	conns  map[net.Conn]struct{}
}

// New starts a proxy to target (host:port) on a free loopback port, closed
// when the test ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cutOff {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		go p.pipe(c)
	}
}

func (p *Proxy) pipe(c net.Conn) {
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		p.drop(c)
		return
	}
	p.mu.Lock()
	if p.cutOff {
		p.mu.Unlock()
		up.Close()
		p.drop(c)
		return
	}
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(up, c); up.Close(); c.Close() }()
	go func() { defer wg.Done(); _, _ = io.Copy(c, up); up.Close(); c.Close() }()
	wg.Wait()
	p.drop(c)
	p.drop(up)
}

func (p *Proxy) drop(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// Cut closes every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cutOff = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

// Restore accepts connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cutOff = false
	p.mu.Unlock()
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
