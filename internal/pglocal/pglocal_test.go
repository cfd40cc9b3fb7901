package pglocal

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestStart always starts a private cluster, even when a server is already
// running, so that CI proves the fallback used by pgtest and `dam demo`.
func TestStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := Start(ctx, t.Logf, Durable())
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

	// Restart: an open connection is cut, the data survives (Durable: an
	// acknowledged commit is not lost), the port is the same.
	conn, err := pgx.Connect(ctx, c.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(ctx, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT 1`); err == nil {
		t.Error("a connection opened before Restart still works after it")
	}
	conn2, err := pgx.Connect(ctx, c.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close(context.Background())
	var v int
	if err := conn2.QueryRow(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != 42 {
		t.Fatalf("after Restart: kept = %d, %v; want 42", v, err)
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

// TestReachableOrStart: a DSN that answers is used as it is; one that does
// not gets a throwaway cluster, which the returned function stops.
func TestReachableOrStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := Start(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	dsn, stop, err := ReachableOrStart(ctx, c.DSN(), t.Logf)
	if err != nil || dsn != c.DSN() {
		t.Fatalf("a reachable server: %q, %v; want %q", dsn, err, c.DSN())
	}
	stop()
	if err := Reachable(ctx, c.DSN()); err != nil {
		t.Fatalf("the stop of a reachable server's DSN stopped it: %v", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "postgres://postgres@" + l.Addr().String() + "/postgres?sslmode=disable"
	l.Close()
	dsn, stop, err = ReachableOrStart(ctx, closed, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if dsn == closed {
		t.Fatal("an unreachable DSN was returned as it is")
	}
	if err := Reachable(ctx, dsn); err != nil {
		t.Fatalf("the throwaway cluster: %v", err)
	}
	stop()
	if err := Reachable(ctx, dsn); err == nil {
		t.Fatal("the throwaway cluster answers after its stop")
	}
}
