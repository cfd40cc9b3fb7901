package dedup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Config tunes the connection pool that Open builds. The zero value is
// valid: every zero field takes its documented default; a negative duration
// leaves that setting to the server (or to the DSN).
type Config struct {
	// MaxConns is the pool size. Default: pgxpool's (max(4, CPUs)), or the
	// DSN's pool_max_conns.
	MaxConns int32
	// ConnectTimeout bounds establishing a connection when the DSN has no
	// connect_timeout. Default 5s.
	ConnectTimeout time.Duration
	// StatementTimeout is each session's statement_timeout. Default 5s.
	StatementTimeout time.Duration
	// LockTimeout is each session's lock_timeout: a decider waiting on a
	// zombie's row locks gives up (ErrUnavailable). Default 2s.
	LockTimeout time.Duration
	// IdleInTransactionTimeout is each session's
	// idle_in_transaction_session_timeout: the server ends a paused
	// zombie's transaction, releasing its locks. Default 10s.
	IdleInTransactionTimeout time.Duration
	// ApplicationName is reported in pg_stat_activity. Default "dam".
	ApplicationName string
}

// Default values of Config.
const (
	DefaultConnectTimeout           = 5 * time.Second
	DefaultStatementTimeout         = 5 * time.Second
	DefaultLockTimeout              = 2 * time.Second
	DefaultIdleInTransactionTimeout = 10 * time.Second
	DefaultApplicationName          = "dam"
)

// Store decides records and keeps progress over a PostgreSQL pool.
type Store struct {
	pool *pgxpool.Pool
	owns bool
	// engine caches what Distributed learned (engineUnknown until then).
	engine atomic.Int32
	// claims makes the store run the statements of Citus on one server too
	// (a test's setting): Decide locks by writing, the batched operations
	// delete without FOR UPDATE (see Distributed, citusShapes).
	claims bool
	// unrouted keeps a Citus decide from routing by shard (a test's
	// setting; see shards.go).
	unrouted bool
	// shards is the shard map a routed decide groups identities by, once
	// read (shards.go).
	shards atomic.Pointer[shardMap]
}

// Open builds a pool for dsn (URL or keyword/value form; parameters such as
// search_path and pool_max_conns keep working) whose sessions set cfg's
// timeouts. Settings given in the DSN win over cfg. It does not connect:
// an unreachable server shows up as ErrUnavailable on first use, so a
// sidecar can start (and report not-ready) while PostgreSQL is down.
// Each session holds the schema's advisory lock shared (see LockSchema),
// one statement when it connects; the first sessions also learn whether
// the tables are distributed over Citus (Distributed), before the store
// runs anything on them.
func Open(ctx context.Context, dsn string, cfg Config) (*Store, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: dsn: %w", ErrInvalid, err)
	}
	if cfg.MaxConns > 0 {
		pc.MaxConns = cfg.MaxConns
	}
	cc := pc.ConnConfig
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = orDefault(cfg.ConnectTimeout, DefaultConnectTimeout)
	}
	setParam(cc.RuntimeParams, "statement_timeout", cfg.StatementTimeout, DefaultStatementTimeout)
	setParam(cc.RuntimeParams, "lock_timeout", cfg.LockTimeout, DefaultLockTimeout)
	setParam(cc.RuntimeParams, "idle_in_transaction_session_timeout", cfg.IdleInTransactionTimeout, DefaultIdleInTransactionTimeout)
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		name := cfg.ApplicationName
		if name == "" {
			name = DefaultApplicationName
		}
		cc.RuntimeParams["application_name"] = name
	}
	s := &Store{owns: true}
	// Every session holds the schema's lock shared: `dam migrate --down`
	// refuses to drop the tables under it (LockSchema). The pool's first
	// sessions learn the engine (learnEngine).
	after := pc.AfterConnect
	pc.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if after != nil {
			if err := after(ctx, conn); err != nil {
				return err
			}
		}
		registerArrays(conn)
		if _, err := conn.Exec(ctx, sqlSchemaShared); err != nil {
			return err
		}
		return s.learnEngine(ctx, conn)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, classify("open", err)
	}
	s.pool = pool
	return s, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func setParam(params map[string]string, name string, d, def time.Duration) {
	if _, ok := params[name]; ok {
		return
	}
	d = orDefault(d, def)
	if d < 0 {
		return
	}
	params[name] = strconv.FormatInt(d.Milliseconds(), 10)
}

// NewStore uses a pool the caller built and owns: Close does not close it.
// Its connections do not learn the engine (Open's do): the store learns
// it at its first Decide, check or batched operation (Distributed), and
// until then takes a Citus worker's relayed failure for an error that
// needs a person (see Store.Transient).
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Pool returns the underlying pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close closes the pool if Open built it.
func (s *Store) Close() {
	if s.owns {
		s.pool.Close()
	}
}

// Ping checks that the store answers (for readiness).
func (s *Store) Ping(ctx context.Context) error {
	return classify("ping", s.pool.Ping(ctx))
}

// classify wraps err with the operation and, when retrying may succeed or
// the outcome is unknown, with ErrUnavailable. PostgreSQL errors are told
// apart by SQLSTATE, others by type; never by message text.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrFenced) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrNotFound) {
		return err
	}
	if retryable(err) {
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
	}
	return fmt.Errorf("dedup: %s: %w", op, err)
}

// Transient reports whether err is one that retrying may fix: a lost or
// refused connection, a timeout, a server shutting down or out of
// resources, a lock or deadlock abort. Any other error (a wrong password, a
// missing table, a broken migration) needs a person.
func Transient(err error) bool {
	return err != nil && (errors.Is(err, ErrUnavailable) || retryable(err))
}

// RecordError reports an error of the store that a record's own content
// may cause, rather than the store's state: the server refused the data
// (SQLSTATE class 22, data exception) or hit one of its limits with it
// (class 54, such as an index row too large). A decider can tell by
// deciding that record alone: if it still fails, and the same record
// decided as invalid does not, the record is bad input.
func RecordError(err error) bool {
	if err == nil || Transient(err) || errors.Is(err, ErrFenced) {
		return false
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.SQLState()[:2] {
	case "22", "54":
		return true
	}
	return false
}

func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.SQLState()
		switch code {
		case "40001", // serialization_failure
			"40P01", // deadlock_detected
			"55P03", // lock_not_available (lock_timeout)
			"57014", // query_canceled (statement_timeout)
			"57P01", // admin_shutdown
			"57P02", // crash_shutdown
			"57P03", // cannot_connect_now
			"25P03": // idle_in_transaction_session_timeout
			return true
		}
		switch code[:2] {
		case "08", // connection exception
			"53": // insufficient resources (too many connections, disk full)
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		pgconn.SafeToRetry(err) || pgconn.Timeout(err)
}
