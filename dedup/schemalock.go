package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// schemaLockKey is the advisory lock of dam's schema (the first on the
// search_path): every session of a Store holds it shared from its
// connection on, and an operation that no dam session may see (dropping
// the schema's tables) takes it exclusively. One key space, one key per
// schema: sessions of other schemas in the same database do not count.
const schemaLockKey = `hashtext('dam.schema'), hashtext(current_schema())`

// sqlSchemaShared is run by every new session of Open's pool. It waits
// for an exclusive holder (a `dam migrate --down` in progress) up to the
// session's lock_timeout, and fails the connection after that: a
// transient error, retried like an outage.
const sqlSchemaShared = `SELECT pg_advisory_lock_shared(` + schemaLockKey + `)`

// ErrSchemaInUse: dam sessions are connected to the schema (LockSchema).
var ErrSchemaInUse = errors.New("dedup: dam sessions are connected to the schema")

// LockSchema takes the schema's lock exclusively on conn, without
// waiting, for an operation that no dam session may see, such as
// dropping the tables. While conn holds it, no Store can open a session
// on the schema. It returns an error wrapping ErrSchemaInUse, naming the
// sessions (process id, application name, client address), when a
// Store's session is connected; the lock ends with conn, or with
// UnlockSchema.
func LockSchema(ctx context.Context, conn *pgx.Conn) error {
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT coalesce(pg_try_advisory_lock(`+schemaLockKey+`), true)`).Scan(&ok); err != nil {
		return classify("lock schema", err)
	}
	if ok {
		return nil
	}
	rows, err := conn.Query(ctx, `SELECT a.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), 'local')
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid::int = hashtext('dam.schema') AND l.objid::int = hashtext(current_schema()) AND l.objsubid = 2
		ORDER BY a.pid`)
	if err != nil {
		return classify("lock schema", err)
	}
	var sessions []string
	for rows.Next() {
		var pid int32
		var app, addr string
		if err := rows.Scan(&pid, &app, &addr); err != nil {
			return classify("lock schema", err)
		}
		sessions = append(sessions, fmt.Sprintf("pid %d %q from %s", pid, app, addr))
	}
	if err := rows.Err(); err != nil {
		return classify("lock schema", err)
	}
	noun := "sessions"
	if len(sessions) == 1 {
		noun = "session"
	}
	return fmt.Errorf("%w: %d dam %s (%s)", ErrSchemaInUse, len(sessions), noun, strings.Join(sessions, ", "))
}

// UnlockSchema releases LockSchema's lock.
func UnlockSchema(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(`+schemaLockKey+`)`)
	return classify("unlock schema", err)
}
