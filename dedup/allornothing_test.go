package dedup_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pgtest"
	"github.com/dam-dedup/dam/internal/tcpproxy"
)

// TestCheckAllOrNothing: a caller decides with Check inside its own
// transaction, writes its business row, and loses the connection before
// the COMMIT: neither the decision nor the business row took effect, so
// the retry decides Forward again (no loss) and writes its row once.
// The connection is lost both ways: cut on the network (a proxy) and
// killed by the server (pg_terminate_backend).
func TestCheckAllOrNothing(t *testing.T) {
	t.Parallel()
	for _, kill := range []struct {
		name string
		do   func(t *testing.T, proxy *tcpproxy.Proxy, admin *pgx.Conn, pid uint32)
	}{
		{"network cut", func(_ *testing.T, proxy *tcpproxy.Proxy, _ *pgx.Conn, _ uint32) { proxy.Cut() }},
		{"backend terminated", func(t *testing.T, _ *tcpproxy.Proxy, admin *pgx.Conn, pid uint32) {
			var ok bool
			// Citus adds pg_terminate_backend(bigint), of its global
			// process ids: the cast picks PostgreSQL's.
			if err := admin.QueryRow(context.Background(), `SELECT pg_terminate_backend($1::int)`, int32(pid)).Scan(&ok); err != nil || !ok {
				t.Fatalf("pg_terminate_backend: %v %v", ok, err)
			}
		}},
	} {
		t.Run(kill.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := pgtest.DSN(t)
			admin, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(ctx)
			if _, err := admin.Exec(ctx, `CREATE TABLE orders (entity text PRIMARY KEY, amount int NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			target, rewrite := tcpproxy.PostgresDSN(t, dsn)
			proxy := tcpproxy.New(t, target)
			conn, err := pgx.Connect(ctx, rewrite(proxy.Addr()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)

			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			d, err := dedup.Check(ctx, tx, "billing", []byte("B-007"), digest("ripe"))
			if err != nil || d != dedup.Forward {
				t.Fatalf("Check: %v, %v", d, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('B-007', 42)`); err != nil {
				t.Fatal(err)
			}
			var pid uint32
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			kill.do(t, proxy, admin, pid)
			if err := tx.Commit(ctx); err == nil {
				t.Fatal("COMMIT on a lost connection succeeded")
			}

			var orders int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil || orders != 0 {
				t.Fatalf("business rows after the lost commit: %d, %v", orders, err)
			}
			var states int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM state`).Scan(&states); err != nil || states != 0 {
				t.Fatalf("state rows after the lost commit: %d, %v", states, err)
			}

			// The retry (the application's restart from the beginning of
			// its flow) gets Forward again and commits both.
			err = pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
				d, err := dedup.Check(ctx, tx, "billing", []byte("B-007"), digest("ripe"))
				if err != nil {
					return err
				}
				if d != dedup.Forward {
					return errors.New("retry: " + d.String() + ", want forward")
				}
				_, err = tx.Exec(ctx, `INSERT INTO orders VALUES ('B-007', 42)`)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if d, err := dedup.Check(ctx, admin, "billing", []byte("B-007"), digest("ripe")); err != nil || d != dedup.Duplicate {
				t.Fatalf("after the committed retry: %v, %v", d, err)
			}
		})
	}
}
