package pglocal

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/internal/testutil/testcert"
)

// WithTLS: the server accepts TCP connections over TLS only, and a client
// verifying it with the right root certificate connects encrypted.
func TestStartWithTLS(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "pg-test")
	server := ca.Issue(t, "postgres", "127.0.0.1", "localhost")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := Start(ctx, t.Logf, WithTLS(server.CertFile, server.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	}()
	if err := Reachable(ctx, c.DSN()); err != nil {
		t.Fatalf("DSN() %s: %v", c.DSN(), err)
	}
	verified := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=verify-full&sslrootcert=%s", c.Port(), ca.CertFile)
	conn, err := pgx.Connect(ctx, verified)
	if err != nil {
		t.Fatalf("verify-full: %v", err)
	}
	defer conn.Close(ctx)
	var ssl bool
	if err := conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		t.Fatalf("pg_stat_ssl.ssl = %v, %v; want true", ssl, err)
	}
	plain := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port())
	if err := Reachable(ctx, plain); err == nil || !strings.Contains(err.Error(), "no encryption") {
		t.Fatalf("sslmode=disable: %v, want refused (no pg_hba.conf entry ... no encryption)", err)
	}
}
