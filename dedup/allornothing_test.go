package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
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

// TestDecideCommitsEveryWorkerOrNone: on Citus, a decide whose identities
// lie on a worker other than its partition's progress row commits on both
// or on neither: a commit refused on the progress row's worker (a deferred
// trigger failing it there) leaves the identity's state as it was, so the
// batch decided again forwards its record again. Routed by shard and
// unrouted (the shape a stale shard map falls back to) alike.
func TestDecideCommitsEveryWorkerOrNone(t *testing.T) {
	for _, shape := range []struct {
		name string
		set  func(*dedup.Store)
	}{{"routed", func(*dedup.Store) {}}, {"unrouted", dedup.SetUnrouted}} {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := newStore(t)
			if !distributed(t, s) {
				t.Skip("the workers of Citus (DAM_TEST_CITUS=1)")
			}
			shape.set(s)
			p, epoch := partition(t, s, "twophase")
			// An identity on the other worker than p's progress row.
			var entity []byte
			if err := s.Pool().QueryRow(ctx, `SELECT e FROM generate_series(0, 99) AS g(i), convert_to('e-' || g.i, 'UTF8') AS e
				WHERE (SELECT groupid FROM pg_dist_placement WHERE shardid = get_shard_id_for_distribution_column('state', e))
					<> (SELECT groupid FROM pg_dist_placement WHERE shardid = get_shard_id_for_distribution_column('progress', $1::int))
				ORDER BY g.i LIMIT 1`, p.Partition).Scan(&entity); err != nil {
				t.Fatal(err)
			}
			batch := func(start int64, content string) *dedup.Batch {
				return &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: start, End: start + 1,
					Records: []dedup.Record{{Offset: start, Entity: entity, Digest: digest(content)}}}
			}
			if got, err := s.Decide(ctx, batch(0, "1"), nil); err != nil || got[0] != dedup.Forward {
				t.Fatalf("first batch: %v, %v", got, err)
			}

			// Every commit that advances P to 2 fails on the progress row's
			// worker, at its end (PREPARE TRANSACTION, or COMMIT).
			var schema string
			if err := s.Pool().QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
				t.Fatal(err)
			}
			onCluster := func(sql string, args ...any) {
				t.Helper()
				rows, err := s.Pool().Query(ctx, sql, args...)
				if err != nil {
					t.Fatal(err)
				}
				defer rows.Close()
				for rows.Next() {
					var ok bool
					var result string
					if err := rows.Scan(&ok, &result); err != nil {
						t.Fatal(err)
					}
					if !ok {
						t.Fatalf("%s: %s", sql, result)
					}
				}
				if err := rows.Err(); err != nil {
					t.Fatal(err)
				}
			}
			// Created on the coordinator, Citus creates it on the workers.
			if _, err := s.Pool().Exec(ctx, `CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql AS
				$$BEGIN IF NEW.next_offset = 2 THEN RAISE EXCEPTION 'commit refused'; END IF; RETURN NULL; END$$`); err != nil {
				t.Fatal(err)
			}
			onCluster(`SELECT success, result FROM run_command_on_placements('progress', $1)`, fmt.Sprintf(`CREATE CONSTRAINT TRIGGER refuse_commit
				AFTER UPDATE ON %%s DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION %s.refuse_commit()`, schema))
			_, err := s.Decide(ctx, batch(1, "2"), nil)
			onCluster(`SELECT success, result FROM run_command_on_placements('progress', 'DROP TRIGGER refuse_commit ON %s')`)
			pr, perr := s.SettledProgress(ctx, p)
			if perr != nil {
				t.Fatal(perr)
			}
			st, gerr := s.Get(ctx, "svc", entity)
			if gerr != nil {
				t.Fatal(gerr)
			}
			t.Logf("decide refused on the progress row's worker: %v; P %d, state %x", err, pr.Next, st.Digest[:4])
			if (pr.Next == 2) != (st.Digest == digest("2")) {
				t.Fatalf("P %d but the state of %s, on another worker, is %s's: committed on one worker only",
					pr.Next, entity, map[bool]string{true: "the batch", false: "before the batch"}[st.Digest == digest("2")])
			}
			if pr.Next == 1 {
				if got, err := s.Decide(ctx, batch(1, "2"), nil); err != nil || got[0] != dedup.Forward {
					t.Fatalf("the batch decided again: %v, %v (want forward)", got, err)
				}
			}
		})
	}
}
