package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// oneBatch is a valid batch; against a dead store it must not be decided.
func oneBatch() *dedup.Batch {
	return &dedup.Batch{Service: "svc", Partition: dedup.Partition{Group: "g", Topic: "t"}, Epoch: 1, Start: 0, End: 1,
		Records: []dedup.Record{{Offset: 0, Entity: []byte("e"), Digest: digest("A")}}}
}

func expectUnavailable(t *testing.T, dsn string, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	s, err := dedup.Open(ctx, dsn, dedup.Config{ConnectTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatalf("Open must not need the server: %v", err)
	}
	defer s.Close()
	start := time.Now()
	out, err := s.Decide(ctx, oneBatch(), make([]dedup.Decision, 0, 1))
	if !errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("Decide: %v, want ErrUnavailable", err)
	}
	if len(out) != 0 {
		t.Fatalf("Decide returned decisions with an error: %v", out)
	}
	if d := time.Since(start); d > within {
		t.Fatalf("Decide took %v, want < %v", d, within)
	}
	if _, err := s.Acquire(ctx, oneBatch().Partition); !errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("Acquire: %v, want ErrUnavailable", err)
	}
	if _, err := s.Check(ctx, "svc", []byte("e"), digest("A")); !errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("Check: %v, want ErrUnavailable", err)
	}
	t.Logf("error: %v", err)
}

func TestOutageRefused(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	expectUnavailable(t, "postgres://postgres@"+addr+"/postgres?sslmode=disable", 2*time.Second)
}

// TestOutageHang: a server that accepts connections and never answers
// (a paused or partitioned host) must not hang Decide past the connect
// timeout.
func TestOutageHang(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	expectUnavailable(t, "postgres://postgres@"+l.Addr().String()+"/postgres?sslmode=disable", 2*time.Second)
}

// TestDecideContextDeadline: the caller's deadline also ends a Decide with
// ErrUnavailable, not a decision.
func TestDecideContextDeadline(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	p, epoch := partition(t, s, "in")
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	b := oneBatch()
	b.Partition, b.Epoch = p, epoch
	if out, err := s.Decide(ctx, b, nil); !errors.Is(err, dedup.ErrUnavailable) || len(out) != 0 {
		t.Fatalf("Decide: %v, %v", out, err)
	}
}

// TestLockTimeoutIsUnavailable: a decider blocked by a zombie's row lock
// gives up after lock_timeout with ErrUnavailable and changes nothing. On
// Citus the wait happens on a worker, which does not get the session's
// lock_timeout: statement_timeout (here 1s) bounds it instead.
func TestLockTimeoutIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	s, err := dedup.Open(ctx, dsn, dedup.Config{LockTimeout: 200 * time.Millisecond, StatementTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, epoch := partition(t, s, "in")
	if _, err := s.Check(ctx, "svc", []byte("e"), digest("A")); err != nil {
		t.Fatal(err)
	}
	zombie, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer zombie.Rollback(ctx)
	if _, err := zombie.Exec(ctx, `SELECT 1 FROM state WHERE entity = 'e' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	b := oneBatch()
	b.Partition, b.Epoch = p, epoch
	b.Records[0].Digest = digest("B")
	start := time.Now()
	out, err := s.Decide(ctx, b, nil)
	if !errors.Is(err, dedup.ErrUnavailable) || len(out) != 0 {
		t.Fatalf("Decide: %v, %v; want ErrUnavailable", out, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
	zombie.Rollback(ctx)
	if pr, err := s.Acquire(ctx, p); err != nil || pr.Next != 0 {
		t.Fatalf("progress moved: %+v, %v", pr, err)
	}
	if st, err := s.Get(ctx, "svc", []byte("e")); err != nil || st.Digest != digest("A") {
		t.Fatalf("state changed: %+v, %v", st, err)
	}
}

// TestTerminatedConnection: a server-side kill of the store's sessions
// (admin shutdown, failover) surfaces as ErrUnavailable or is survived,
// never as another kind of error.
func TestTerminatedConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	app := fmt.Sprintf("dam-terminated-%d", time.Now().UnixNano()) // kill only this test's sessions
	s, err := dedup.Open(ctx, pgtest.DSN(t), dedup.Config{ApplicationName: app})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, epoch := partition(t, s, "in")
	next := int64(0)
	for i := range 5 {
		if _, err := s.Pool().Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND application_name = $1`, app); err != nil {
			t.Fatal(err)
		}
		b := oneBatch()
		b.Partition, b.Epoch, b.Start, b.End = p, epoch, next, next+1
		b.Records[0].Offset = next
		b.Records[0].Digest = digest(fmt.Sprint(i))
		if _, err := s.Decide(ctx, b, nil); err != nil && !errors.Is(err, dedup.ErrUnavailable) {
			t.Fatalf("Decide: %v", err)
		} else if err == nil {
			next++
		}
	}
}
