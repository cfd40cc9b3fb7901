package pglocal

import (
	"context"
	"net"
	"testing"
	"time"
)

// TestStart always starts a private cluster, even when a server is already
// running, so that CI proves the fallback used by pgtest and `dam demo`.
func TestStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := Start(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	}()
	if err := Reachable(ctx, c.DSN()); err != nil {
		t.Fatal(err)
	}
}

// TestReachableFailsFast: a port that refuses connections is reported at
// once, not after a long timeout.
func TestReachableFailsFast(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	if err := Reachable(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable"); err == nil {
		t.Fatal("Reachable succeeded against a closed port")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Reachable took %v", d)
	}
}
