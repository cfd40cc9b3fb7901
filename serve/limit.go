package serve

import (
	"container/list"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// firstByteTimeout is how long a new connection may stay silent (no
	// request, or on TLS no ClientHello) before it is closed.
	firstByteTimeout = time.Second
	// minSilent is the least number of new connections that may wait for
	// their first byte at once (at least twice serve.max_connections).
	minSilent = 1024
	// connWait is how long a connection beyond serve.max_connections
	// waits for a slot when no served connection can be closed for it,
	// before its 503.
	connWait = 250 * time.Millisecond
	// evictUntrustedAfter is how long a request without a valid token (or
	// past its token's share of the connections) is served before its
	// connection may be closed to make room.
	evictUntrustedAfter = time.Second
	// lingerTimeout bounds the polite close of a connection: its 503
	// written, what the client sent read and dropped (a socket closed with
	// unread data is reset, and the client may lose the answer).
	lingerTimeout = time.Second
	// drainTimeout bounds the polite close of a connection refused past
	// the refusals lingering at once: long enough to read the request the
	// client already sent, so that the close is not a reset.
	drainTimeout = 50 * time.Millisecond
	// maxQuickRefusals bounds the refusals being written past those that
	// linger (each for drainTimeout at most); beyond it (tens of thousands
	// of new connections a second), a connection is closed unanswered.
	maxQuickRefusals = 4096
	// silentRecheck is how long a connection closed for room as the
	// longest silent is still given for its first byte: on a busy machine
	// a client that opens a connection per request may send its request
	// a while after connecting, or its request may have arrived unread
	// while this side's goroutine waited to run.
	silentRecheck = 50 * time.Millisecond
	// pendingCheck is how long an idle connection closed for room is read
	// for a request sent as it was closed.
	pendingCheck = time.Millisecond
)

// connState is what a served connection is doing, for the choice of the
// one to close when a new connection finds every slot taken.
type connState int8

const (
	// connUnfinished: accepted, no request read yet (a TLS handshake, a
	// request line and headers on their way, or nothing). Closed first,
	// the longest unfinished first: a client that means to be served
	// sends its request at once.
	connUnfinished connState = iota
	// connIdle: a keep-alive connection between requests. Closed next,
	// the longest idle first.
	connIdle
	// connUntrusted: serving a request without a valid token, or past
	// its token's share of the connections. Closed last, once served for
	// evictUntrustedAfter.
	connUntrusted
	// connTrusted: serving a request with a valid token, within its
	// token's share of the connections, or one whose store work was
	// admitted (see hold): it may have decided, and its answer must reach
	// its client. Never closed for room.
	connTrusted
)

var connStateNames = [...]string{"unfinished", "idle", "untrusted"}

// silentConn is a new connection waiting for its first byte.
type silentConn struct {
	net.Conn
	addr netip.Addr
	elem *list.Element // in connLimit.silent; nil once out (under connLimit.mu)
}

// connLimit is a listener that serves at most max connections at once,
// the bound of the memory they hold (buffers, a goroutine, TLS state),
// and holds at most perAddr from one client address (0: no such bound).
//
// A new connection gets no slot until its first byte arrives (a request,
// or on TLS a ClientHello): until then it holds a goroutine blocked on a
// one-byte read and nothing else, for at most firstByteTimeout, and at
// most maxSilent wait so, the longest silent closed first to make room.
// Connections that send nothing thus never keep a client out.
//
// A connection with a first byte beyond max takes the slot of a served
// connection that is not serving a trusted request (see connState),
// which is closed; one that had not finished its request headers gets a
// 503 (plain HTTP) before the close. When every slot serves a trusted
// request, the new connection waits up to connWait for one to end and is
// then answered 503 with Retry-After and closed; so is a connection past
// perAddr, at once. Those refusals wait and linger in a bounded number of
// goroutines; beyond them a connection is answered 503 at once, without
// waiting for a slot, and closed once the request its client sent is
// read (drainTimeout), so that the close is not a reset. A connection
// closed for room is answered 503 too when its client may be waiting for
// an answer (a request unfinished, or sent on an idle connection as it
// was closed), and one closed as the longest silent is given
// silentRecheck more for its request, then answered 503 on plain HTTP.
// A client past capacity, one that opens a connection per request
// included, is thus served, or answered 503 fast, never reset: only past
// maxQuickRefusals answers at once is a connection closed unanswered.
//
// Wrap it in TLS (tls.NewListener) rather than the other way round: the
// server then sees *tls.Conn, and tlsConfig (when set) lets a refusal be
// answered over TLS.
type connLimit struct {
	net.Listener
	max, perAddr int
	maxSilent    int
	tokenConns   int // connections a token's requests may hold trusted
	tlsConfig    *tls.Config
	metrics      *metrics
	refusing     chan struct{} // one per refusal being written or connection waiting for a slot
	quick        chan struct{} // one per refusal being written at once, past refusing
	accepted     chan acceptResult
	done         chan struct{}
	closeOnce    sync.Once
	wg           sync.WaitGroup

	mu      sync.Mutex
	served  int
	byAddr  map[netip.Addr]int     // connections held (silent, waiting or served) by client address
	byToken map[*token]int         // trusted connections by token
	silent  list.List              // connections waiting for their first byte, oldest first
	lists   [connTrusted]list.List // the evictable served connections by state, oldest first
	changed chan struct{}          // closed (and replaced) when a slot is freed or a connection becomes evictable
}

type acceptResult struct {
	conn net.Conn
	err  error
}

func newConnLimit(ln net.Listener, maxConns, perAddr, tokens int, tlsConfig *tls.Config, m *metrics) *connLimit {
	l := &connLimit{Listener: ln, max: maxConns, perAddr: perAddr, maxSilent: max(2*maxConns, minSilent),
		tokenConns: max(1, maxConns/max(1, tokens)), tlsConfig: tlsConfig, metrics: m,
		refusing: make(chan struct{}, max(maxConns, 256)), quick: make(chan struct{}, maxQuickRefusals), accepted: make(chan acceptResult), done: make(chan struct{}),
		byAddr: map[netip.Addr]int{}, byToken: map[*token]int{}, changed: make(chan struct{})}
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
		l.mu.Lock()
		for e := l.silent.Front(); e != nil; e = e.Next() {
			_ = e.Value.(*silentConn).SetReadDeadline(aLongTimeAgo)
		}
		l.mu.Unlock()
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
		l.admit(c)
	}
}

// addrOf is c's client address (the zero Addr if not TCP).
func addrOf(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

// admit takes in a new connection: refused past perAddr, else it waits
// for its first byte (see firstByte).
func (l *connLimit) admit(c net.Conn) {
	addr := addrOf(c)
	l.mu.Lock()
	if l.perAddr > 0 && addr.IsValid() && l.byAddr[addr] >= l.perAddr {
		l.mu.Unlock()
		l.refuseSoon(c, addr, false, refusalPerAddress, 0)
		return
	}
	l.byAddr[addr]++
	var oldest *silentConn
	if l.silent.Len() >= l.maxSilent {
		oldest = l.silent.Remove(l.silent.Front()).(*silentConn)
		oldest.elem = nil
		l.metrics.connsEvicted.WithLabelValues("silent").Inc()
	}
	sc := &silentConn{Conn: c, addr: addr}
	sc.elem = l.silent.PushBack(sc)
	l.mu.Unlock()
	if oldest != nil {
		_ = oldest.SetReadDeadline(aLongTimeAgo)
	}
	_ = c.SetReadDeadline(time.Now().Add(firstByteTimeout))
	l.wg.Add(1)
	go l.firstByte(sc)
}

// firstByte waits for sc's first byte, then gives it a slot (or has it
// wait for one, or refused). A connection silent for firstByteTimeout, or
// closed for room, is closed: it sent nothing, and gets nothing.
func (l *connLimit) firstByte(sc *silentConn) {
	defer l.wg.Done()
	var b [1]byte
	n, _ := sc.Read(b[:])
	l.mu.Lock()
	closedForRoom := sc.elem == nil
	if sc.elem != nil {
		l.silent.Remove(sc.elem)
		sc.elem = nil
	}
	l.mu.Unlock()
	if n == 0 && closedForRoom && !l.closing() {
		// Closed for room as the longest silent. On a busy machine its
		// request may have arrived while this goroutine waited to run: it
		// is then not silent, and is served or refused like any other,
		// never closed unanswered (a client opening a connection per
		// request is served or told 503).
		_ = sc.SetReadDeadline(time.Now().Add(silentRecheck))
		n, _ = sc.Read(b[:])
		if n == 0 && l.tlsConfig == nil {
			// Still nothing: answered 503 all the same, and read for
			// drainTimeout, so that a client whose request is on its way
			// reads a refusal rather than a reset (a client that meant to
			// send nothing reads an answer it ignores).
			l.metrics.connsRefused.Inc()
			l.refuse(sc.Conn, refusalConnections, drainTimeout)
			l.dropAddr(sc.addr)
			return
		}
	}
	if n == 0 {
		l.dropAddr(sc.addr)
		_ = sc.Close()
		return
	}
	_ = sc.SetReadDeadline(time.Time{})
	l.mu.Lock()
	lc, victim := l.placeLocked(sc.Conn, sc.addr)
	l.mu.Unlock()
	victim.evict()
	if lc != nil {
		lc.first = b[:1]
		l.hand(lc)
		return
	}
	l.refuseSoon(&prefixConn{Conn: sc.Conn, first: b[:1]}, sc.addr, true, refusalConnections, connWait)
}

// closing reports whether Close was called.
func (l *connLimit) closing() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// dropAddr counts a connection of addr less.
func (l *connLimit) dropAddr(addr netip.Addr) {
	l.mu.Lock()
	if l.byAddr[addr]--; l.byAddr[addr] <= 0 {
		delete(l.byAddr, addr)
	}
	l.mu.Unlock()
}

// prefixConn is a connection whose first bytes were read already.
type prefixConn struct {
	net.Conn
	first []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// placeLocked gives c a slot, the free one or that of the connection it
// closes (returned, to evict once l.mu is released); nil when every slot
// serves a trusted request. l.mu is held.
func (l *connLimit) placeLocked(c net.Conn, addr netip.Addr) (lc, victim *limitedConn) {
	if l.served >= l.max {
		if victim = l.victimLocked(); victim == nil {
			return nil, nil
		}
		l.releaseLocked(victim)
		victim.evicted.Store(true)
	}
	lc = &limitedConn{Conn: c, l: l, addr: addr}
	l.served++
	l.metrics.conns.Inc()
	l.setStateLocked(lc, connUnfinished)
	return lc, victim
}

// victimLocked is the connection to close for room: the longest
// unfinished, else the longest idle, else the longest untrusted served
// for evictUntrustedAfter. l.mu is held.
func (l *connLimit) victimLocked() *limitedConn {
	for s := connUnfinished; s <= connUntrusted; s++ {
		e := l.lists[s].Front()
		if e == nil {
			continue
		}
		lc := e.Value.(*limitedConn)
		if s == connUntrusted && time.Since(lc.since) < evictUntrustedAfter {
			continue
		}
		l.metrics.connsEvicted.WithLabelValues(connStateNames[s]).Inc()
		return lc
	}
	return nil
}

// setStateLocked moves lc to state s, since now. l.mu is held.
func (l *connLimit) setStateLocked(lc *limitedConn, s connState) {
	if lc.released {
		return
	}
	l.leaveLocked(lc)
	lc.state, lc.since = s, time.Now()
	if s == connIdle {
		lc.idleRead = lc.read.Load()
	}
	if s != connTrusted {
		lc.elem = l.lists[s].PushBack(lc)
	}
	if s == connIdle || s == connUntrusted {
		l.wake()
	}
}

// leaveLocked takes lc out of its state's list, or out of its token's
// count. l.mu is held.
func (l *connLimit) leaveLocked(lc *limitedConn) {
	if lc.elem != nil {
		l.lists[lc.state].Remove(lc.elem)
		lc.elem = nil
	}
	if lc.state == connTrusted && lc.token != nil {
		l.byToken[lc.token]--
		lc.token = nil
	}
}

// releaseLocked frees lc's slot. l.mu is held.
func (l *connLimit) releaseLocked(lc *limitedConn) {
	if lc.released {
		return
	}
	l.leaveLocked(lc)
	lc.released = true
	l.served--
	l.metrics.conns.Dec()
	l.wake()
}

// wake wakes the connections waiting for a slot. l.mu is held.
func (l *connLimit) wake() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// hand gives lc, which holds a slot, to Accept.
func (l *connLimit) hand(lc *limitedConn) {
	select {
	case l.accepted <- acceptResult{conn: lc}:
	case <-l.done:
		_ = lc.Close()
	}
}

// refuseSoon answers c (of addr, counted in byAddr when counted) 503
// with refusal, after waiting up to wait for a slot, in a goroutine of
// its own. Past the bound of such goroutines (refusing), c is answered
// 503 at once, without waiting for a slot, and closed once what its
// client sent is read (drainTimeout at most): a client past capacity is
// told so, not reset. Only past maxQuickRefusals such answers at once
// is c closed unanswered.
func (l *connLimit) refuseSoon(c net.Conn, addr netip.Addr, counted bool, refusal string, wait time.Duration) {
	linger := lingerTimeout
	release := func() { <-l.refusing }
	select {
	case l.refusing <- struct{}{}:
	default:
		wait, linger, release = 0, drainTimeout, func() { <-l.quick }
		select {
		case l.quick <- struct{}{}:
		default:
			l.metrics.connsRefused.Inc()
			_ = c.Close()
			if counted {
				l.dropAddr(addr)
			}
			return
		}
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer release()
		if wait > 0 && l.wait(c, addr, wait) {
			return
		}
		l.metrics.connsRefused.Inc()
		l.refuse(c, refusal, linger)
		if counted {
			l.dropAddr(addr)
		}
	}()
}

// wait waits up to d for a slot for c (a prefixConn) and hands it over;
// it reports whether c was given one (or closed with the listener).
func (l *connLimit) wait(c net.Conn, addr netip.Addr, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	pc := c.(*prefixConn)
	for {
		l.mu.Lock()
		lc, victim := l.placeLocked(pc.Conn, addr)
		changed := l.changed
		l.mu.Unlock()
		victim.evict()
		if lc != nil {
			lc.first = pc.first
			l.hand(lc)
			return true
		}
		select {
		case <-changed:
		case <-t.C:
			return false
		case <-l.done:
			_ = c.Close()
			l.dropAddr(addr)
			return true
		}
	}
}

// CloseWrite half-closes a prefixConn (see linger).
func (c *prefixConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// The answers to a connection refused for room.
var (
	refusalConnections = refusalText("too many connections (serve.max_connections); retry after Retry-After")
	refusalPerAddress  = refusalText("too many connections from your address (serve.max_connections_per_address); retry after Retry-After")
)

func refusalText(msg string) string {
	body := `{"code":"overloaded","message":"` + msg + `"}` + "\n"
	return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: " + retryAfter +
		"\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// refuse answers c 503 and closes it, giving up after linger.
func (l *connLimit) refuse(c net.Conn, refusal string, linger time.Duration) {
	_ = c.SetDeadline(time.Now().Add(linger))
	var w net.Conn = c
	if l.tlsConfig != nil {
		w = tls.Server(c, l.tlsConfig)
	}
	if _, err := io.WriteString(w, refusal); err != nil {
		_ = c.Close()
		return
	}
	closeRead(c)
}

// closeRead half-closes c and reads what the client sent (its request,
// unread) before closing: a socket closed with unread data is reset, and
// the client may then lose the answer before it reads it. c's deadline
// is set.
func closeRead(c net.Conn) {
	defer c.Close()
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// trust marks lc, serving a request with token t, as not to be closed
// for room, within t's share of the connections; a request past that
// share stays untrusted.
func (l *connLimit) trust(lc *limitedConn, t *token) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.released || lc.state == connTrusted || l.byToken[t] >= l.tokenConns {
		return
	}
	l.setStateLocked(lc, connTrusted)
	lc.token = t
	l.byToken[t]++
}

// hold marks lc, serving a request whose store work is admitted, as not
// to be closed for room until the request ends (its answer written): its
// check may be decided (committed) at any time from now, and a client
// whose connection was closed could not know it was, and would be told
// duplicate for its own content on retrying. It is false when lc was
// closed for room already: nothing may then be decided.
func (l *connLimit) hold(lc *limitedConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.released || lc.evicted.Load() {
		return false
	}
	if lc.state == connUntrusted {
		// Counted in no token's share; idle once the request ends.
		l.setStateLocked(lc, connTrusted)
	}
	return true
}

// holdRequest holds r's connection (see connLimit.hold), when r came
// through a connLimit.
func holdRequest(r *http.Request) bool {
	if lc, ok := r.Context().Value(connKey{}).(*limitedConn); ok {
		return lc.l.hold(lc)
	}
	return true
}

// connState is the http.Server's ConnState hook: it keeps track of what
// each connection does. The server reports StateActive once a request's
// headers are read.
func (l *connLimit) connState(c net.Conn, state http.ConnState) {
	lc := limited(c)
	if lc == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case http.StateActive:
		l.setStateLocked(lc, connUntrusted)
	case http.StateIdle:
		l.setStateLocked(lc, connIdle)
	}
}

// limited is the limitedConn under c, or nil.
func limited(c net.Conn) *limitedConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, _ := c.(*limitedConn)
	return lc
}

// connKey is the request context's key of its *limitedConn (see Run's
// ConnContext).
type connKey struct{}

// trustRequest marks r's connection as serving a request with token t
// (see connLimit.trust), when r came through a connLimit.
func trustRequest(r *http.Request, t *token) {
	if lc, ok := r.Context().Value(connKey{}).(*limitedConn); ok {
		lc.l.trust(lc, t)
	}
}

// withConn is Run's ConnContext: it puts c's limitedConn in the context.
func withConn(ctx context.Context, c net.Conn) context.Context {
	if lc := limited(c); lc != nil {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

// aLongTimeAgo is a deadline that has passed: it ends any read or write.
var aLongTimeAgo = time.Unix(1, 0)

// limitedConn is a served connection: closing it frees its slot. Once
// evicted (its slot given to another), every deadline is in the past, so
// that the server gives it up and closes it.
type limitedConn struct {
	net.Conn
	l       *connLimit
	addr    netip.Addr
	first   []byte // read while it waited for a slot; read by the server goroutine only
	evicted atomic.Bool
	once    sync.Once

	read atomic.Int64 // bytes read
	// Under l.mu.
	state    connState
	since    time.Time
	elem     *list.Element
	token    *token // of a trusted request
	released bool
	idleRead int64 // read when it last became idle

	dmu sync.Mutex // orders evict with the server's deadlines
}

func (c *limitedConn) Read(p []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		c.read.Add(int64(n))
		return n, nil
	}
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (c *limitedConn) SetReadDeadline(t time.Time) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if c.evicted.Load() {
		t = aLongTimeAgo
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *limitedConn) SetWriteDeadline(t time.Time) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if c.evicted.Load() {
		t = aLongTimeAgo
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *limitedConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// evict ends what the server does with c (its slot was given to
// another): the server then closes it. A nil c is none.
func (c *limitedConn) evict() {
	if c == nil {
		return
	}
	c.dmu.Lock()
	_ = c.Conn.SetDeadline(aLongTimeAgo)
	c.dmu.Unlock()
}

// Close frees c's slot and closes it. An evicted connection whose client
// may be waiting for an answer (one that had not finished its request,
// or an idle one whose next request arrived as it was closed) is closed
// politely: answered 503 on plain HTTP, then what its client sent read,
// lingering while a refusal slot is free, else for drainTimeout. Its
// client is told 503, never reset.
func (c *limitedConn) Close() error {
	first := false
	c.once.Do(func() { first = true })
	if !first {
		return c.Conn.Close()
	}
	l := c.l
	l.mu.Lock()
	evicted, state := c.evicted.Load(), c.state
	requested := state == connIdle && c.read.Load() > c.idleRead
	l.releaseLocked(c)
	l.mu.Unlock()
	defer l.dropAddr(c.addr)
	switch {
	case !evicted:
		return c.Conn.Close()
	case state == connUnfinished:
	case state == connIdle && l.tlsConfig == nil && (requested || c.pending()):
		// A request came as the connection was closed for room: it is
		// answered, not reset.
	default:
		return c.Conn.Close()
	}
	linger := lingerTimeout
	select {
	case l.refusing <- struct{}{}:
		defer func() { <-l.refusing }()
	default:
		linger = drainTimeout
	}
	_ = c.Conn.SetDeadline(time.Now().Add(linger))
	if l.tlsConfig == nil {
		if _, err := io.WriteString(c.Conn, refusalConnections); err != nil {
			return c.Conn.Close()
		}
	}
	closeRead(c.Conn)
	return nil
}

// pending reports whether c's client sent something unread.
func (c *limitedConn) pending() bool {
	_ = c.Conn.SetReadDeadline(time.Now().Add(pendingCheck))
	var b [1]byte
	n, _ := c.Conn.Read(b[:])
	return n > 0
}
