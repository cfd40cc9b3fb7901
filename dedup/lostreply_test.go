package dedup_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// commitCutter is a TCP proxy to PostgreSQL that, once armed, forwards the
// client's COMMIT to the server but never delivers the server's reply, and
// then drops the connection: the "lost COMMIT reply" of DESIGN §2.
type commitCutter struct {
	l     net.Listener
	armed atomic.Bool
	wg    sync.WaitGroup
}

func newCommitCutter(t *testing.T, server string) *commitCutter {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &commitCutter{l: l}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				c.serve(client, server)
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); c.wg.Wait() })
	return c
}

func (c *commitCutter) serve(client net.Conn, addr string) {
	defer client.Close()
	server, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer server.Close()
	var cut atomic.Bool // set once the COMMIT went through: replies are dropped
	done := make(chan struct{})
	go func() { // server -> client
		defer close(done)
		defer client.Close() // the server hung up (e.g. after a cancel request): so does the proxy
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && !cut.Load() {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			// The COMMIT statement's text, not READ COMMITTED's.
			if c.armed.Load() && bytes.Contains(buf[:n], []byte("\x00COMMIT\x00")) {
				cut.Store(true)
				c.armed.Store(false)
				server.Write(buf[:n])
				time.Sleep(300 * time.Millisecond) // let the server commit
				client.Close()
				server.Close()
				<-done
				return
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	server.Close()
	<-done
}

// TestLostCommitReply: when the COMMIT reaches the server but its reply
// is lost, Decide returns ErrUnavailable (outcome unknown), never a
// decision; the store shows the batch committed, so recovery finds P at
// the batch's End and the batch in the log.
func TestLostCommitReply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cutter := newCommitCutter(t, u.Host)
	u.Host = cutter.l.Addr().String()
	q := u.Query()
	// The exec mode sends statement text with every execution, so the
	// proxy can see the COMMIT.
	q.Set("default_query_exec_mode", "exec")
	u.RawQuery = q.Encode()
	s, err := dedup.Open(ctx, u.String(), dedup.Config{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, epoch := partition(t, s, "in")
	decideAll(t, s, "svc", p, epoch, []rec{{"e", "A"}}, 1) // offset 0

	cutter.armed.Store(true)
	b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 1, End: 2,
		Records: []dedup.Record{{Offset: 1, Entity: []byte("e"), Digest: digest("B")}}}
	start := time.Now()
	out, err := s.Decide(ctx, b, nil)
	t.Logf("Decide after %v: %v", time.Since(start), err)
	if !errors.Is(err, dedup.ErrUnavailable) || len(out) != 0 {
		t.Fatalf("Decide with a lost COMMIT reply: %v, %v; want ErrUnavailable", out, err)
	}
	pr, err := s.ReadProgress(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if pr.Next != 2 {
		t.Fatalf("P = %d: the COMMIT should have gone through", pr.Next)
	}
	entries, covered, err := s.Logged(ctx, p, 1, 2)
	if err != nil || !covered || len(entries) != 1 || entries[0].Decision != dedup.Forward {
		t.Fatalf("log: %v covered %v, %v", entries, covered, err)
	}
	if st, err := s.Get(ctx, "svc", []byte("e")); err != nil || st.Digest != digest("B") {
		t.Fatalf("state: %+v, %v", st, err)
	}
}
