package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// room bounds the request bodies held in memory at once: a request takes
// room for its body before reading it (its Content-Length, or
// serve.max_body_bytes when the length is not announced) and gives it back
// when it is answered. A request that does not fit waits for room until
// its deadline.
//
// Any waiter that fits when room is given back goes ahead, not the
// longest waiting one: a small check never queues behind a large body
// that is itself waiting for most of the room.
type room struct {
	mu    sync.Mutex
	size  int64
	used  int64
	freed chan struct{} // closed (and replaced) whenever room is given back
	gauge func(float64)
}

func newRoom(size int64, gauge func(float64)) *room {
	return &room{size: size, freed: make(chan struct{}), gauge: gauge}
}

// take waits until n bytes fit, or ctx ends (its error is returned).
func (r *room) take(ctx context.Context, n int64) error {
	for {
		r.mu.Lock()
		if r.used+n <= r.size {
			r.used += n
			r.gauge(float64(r.used))
			r.mu.Unlock()
			return nil
		}
		freed := r.freed
		r.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// give returns n bytes taken by take.
func (r *room) give(n int64) {
	r.mu.Lock()
	r.used -= n
	r.gauge(float64(r.used))
	close(r.freed)
	r.freed = make(chan struct{})
	r.mu.Unlock()
}

// connLimit is a listener that serves at most max connections at once,
// the bound of the memory they hold (buffers, a goroutine, TLS state). A
// connection beyond it is accepted but not read: it waits up to wait for
// a served one to close, and is then answered 503 with Retry-After and
// closed. While one waits, the longest-idle keep-alive connection is
// closed to make room. At most max connections wait; beyond that a new
// connection is closed at once, unanswered.
//
// Wrap it in TLS (tls.NewListener) rather than the other way round: the
// server then sees *tls.Conn, and tlsConfig (when set) lets a refusal be
// answered over TLS.
type connLimit struct {
	net.Listener
	wait      time.Duration
	tlsConfig *tls.Config
	slots     chan struct{} // one per connection served
	waiting   chan struct{} // one per connection waiting for a slot
	accepted  chan acceptResult
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
	metrics   *metrics

	mu   sync.Mutex
	idle map[*limitedConn]time.Time // served connections between requests, since when
}

type acceptResult struct {
	conn net.Conn
	err  error
}

func newConnLimit(ln net.Listener, max int, wait time.Duration, tlsConfig *tls.Config, m *metrics) *connLimit {
	l := &connLimit{Listener: ln, wait: wait, tlsConfig: tlsConfig, metrics: m,
		slots: make(chan struct{}, max), waiting: make(chan struct{}, max),
		accepted: make(chan acceptResult), done: make(chan struct{}), idle: map[*limitedConn]time.Time{}}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// Accept returns the next connection given a slot.
func (l *connLimit) Accept() (net.Conn, error) {
	select {
	case r := <-l.accepted:
		return r.conn, r.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting, closes the connections still waiting, and waits
// for the goroutines of the listener to end. Served connections are left
// to the server.
func (l *connLimit) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.done)
		err = l.Listener.Close()
		l.wg.Wait()
	})
	return err
}

func (l *connLimit) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// The server decides whether to go on (it backs off on
			// temporary errors such as too many open files).
			select {
			case l.accepted <- acceptResult{err: err}:
				continue
			case <-l.done:
				return
			}
		}
		select {
		case l.slots <- struct{}{}:
			l.hand(c)
			continue
		default:
		}
		select {
		case l.waiting <- struct{}{}:
			l.wg.Add(1)
			go l.park(c)
		default:
			l.metrics.connsRefused.Inc()
			_ = c.Close()
		}
	}
}

// hand gives c, which holds a slot, to Accept.
func (l *connLimit) hand(c net.Conn) {
	lc := &limitedConn{Conn: c, l: l}
	l.metrics.conns.Inc()
	select {
	case l.accepted <- acceptResult{conn: lc}:
	case <-l.done:
		_ = lc.Close()
	}
}

// park holds c until a slot is free or the wait is over.
func (l *connLimit) park(c net.Conn) {
	defer l.wg.Done()
	defer func() { <-l.waiting }()
	l.closeIdle()
	t := time.NewTimer(l.wait)
	defer t.Stop()
	select {
	case l.slots <- struct{}{}:
		l.hand(c)
	case <-t.C:
		l.metrics.connsRefused.Inc()
		l.refuse(c)
	case <-l.done:
		_ = c.Close()
	}
}

// refusal is the answer to a connection that found no room in time.
var refusal = func() string {
	body := `{"code":"overloaded","message":"too many connections (serve.max_connections); retry after Retry-After"}` + "\n"
	return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: " + retryAfter +
		"\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

// refuse answers c 503 and closes it, giving up after a second. It
// half-closes the connection and reads what the client sent (its request,
// unread) before closing: a socket closed with unread data is reset, and
// the client may then lose the answer before it reads it.
func (l *connLimit) refuse(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if l.tlsConfig != nil {
		c = tls.Server(c, l.tlsConfig)
	}
	if _, err := c.Write([]byte(refusal)); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// closeIdle closes the connection idle the longest, if any: a waiting
// connection has a request to make, an idle one may never make another.
func (l *connLimit) closeIdle() {
	l.mu.Lock()
	var oldest *limitedConn
	var since time.Time
	for c, t := range l.idle {
		if oldest == nil || t.Before(since) {
			oldest, since = c, t
		}
	}
	delete(l.idle, oldest)
	l.mu.Unlock()
	if oldest != nil {
		_ = oldest.Close()
	}
}

// connState is the http.Server's ConnState hook: it keeps track of the
// idle connections.
func (l *connLimit) connState(c net.Conn, state http.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if state == http.StateIdle {
		l.idle[lc] = time.Now()
	} else {
		delete(l.idle, lc)
	}
}

// limitedConn is a served connection: closing it frees its slot.
type limitedConn struct {
	net.Conn
	l    *connLimit
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.idle, c)
		c.l.mu.Unlock()
		c.l.metrics.conns.Dec()
		<-c.l.slots
	})
	return err
}
