package dedup_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pglocal"
	"github.com/dam-dedup/dam/internal/testutil/testcert"
	"github.com/dam-dedup/dam/migrations"
)

// The store works over TLS verified through the DSN alone
// (sslmode=verify-full, sslrootcert), against a PostgreSQL that accepts
// TCP connections only over TLS; a wrong root certificate fails, saying
// why.
func TestStoreOverVerifiedTLS(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "pg-test")
	other := testcert.NewCA(t, "other")
	server := ca.Issue(t, "postgres", "127.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := pglocal.Start(ctx, t.Logf, pglocal.WithTLS(server.CertFile, server.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	dsn := func(root string) string {
		return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=verify-full&sslrootcert=%s", c.Port(), root)
	}

	conn, err := pgx.Connect(ctx, dsn(ca.CertFile))
	if err != nil {
		t.Fatalf("connect with verify-full: %v", err)
	}
	if err := migrations.Up(ctx, conn); err != nil {
		t.Fatalf("migrate over TLS: %v", err)
	}
	conn.Close(ctx)

	s, err := dedup.Open(ctx, dsn(ca.CertFile), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, epoch := partition(t, s, "tls")
	got := decideAll(t, s, "svc", p, epoch, []rec{{"e", "A"}, {"e", "A"}, {"e", "B"}}, 3)
	if want := []dedup.Decision{dedup.Forward, dedup.Duplicate, dedup.Forward}; !slices.Equal(got, want) {
		t.Fatalf("decisions over TLS %v, want %v", got, want)
	}
	var ssl bool
	if err := s.Pool().QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		t.Fatalf("pg_stat_ssl.ssl = %v, %v; want true", ssl, err)
	}

	bad, err := dedup.Open(ctx, dsn(other.CertFile), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	err = bad.Ping(ctx)
	if err == nil || !strings.Contains(err.Error(), "x509: certificate signed by unknown authority") {
		t.Fatalf("wrong root certificate: %v, want x509: certificate signed by unknown authority", err)
	}
	t.Logf("wrong root certificate: %v", err)
}
