// Package migrations holds dam's PostgreSQL schema as numbered SQL files
// (NNN_name.up.sql / NNN_name.down.sql), embedded in the binary and applied
// with tern. Table names are unqualified: the schema is the first one on the
// connection's search_path (set it in the DSN, e.g. ?search_path=dam).
//
// Tables:
//
//   - state(service, entity, digest, updated_at, src_topic, src_partition,
//     src_offset), primary key (entity, service): the digest last forwarded
//     for each identity and the record it came from. digest is NULL only
//     transiently, as a lock placeholder inside a Decide transaction.
//     Indexed on (service, entity) for what walks one service (migration
//     007: the key identity first, for a decide's reads).
//   - progress(grp, topic, part, next_offset, epoch, delivered, topic_id),
//     primary key (grp, topic, part): each input partition's next offset to
//     decide (P), its fencing epoch, the committed offset last known to its
//     owner (for a recovery without one in Kafka) and the input topic's id
//     (to notice a topic recreated under the same name).
//   - window_ids(service, id, expires_at, forwarded_at, digest, src_topic,
//     src_partition, src_offset), primary key (id, service): window mode's
//     message ids until they expire. Indexed on (service, expires_at) for
//     the cleanup, and on (service, id).
//   - versions(service, entity, version, digest, updated_at, src_topic,
//     src_partition, src_offset), primary key (entity, service): version
//     mode's highest version forwarded per identity. Indexed on (service,
//     entity).
//   - decision_log(grp, topic, part, first_offset, end_offset, offsets,
//     decisions, entities, logged_at, causes), primary key (grp, topic,
//     part, first_offset): one row per decided batch with its forwarded and
//     invalid records (and each invalid one's cause, migration 008), used
//     by recovery to re-deliver [C, P), and kept after delivery for
//     decision_log.keep (explain answers from it); decision 6 marks an
//     operator's skip.
//   - operator_skips(grp, topic, part, skip_offset, skipped_by, reason,
//     skipped_at, was, entity), primary key (grp, topic, part,
//     skip_offset): who skipped which record, when and why (migration
//     009; dam state skip), pruned with the decision log.
//   - dam_schema_version(version): the applied migration version (tern).
//
// On a database with the citus extension (distributed PostgreSQL),
// migration 005 distributes the tables over the workers: state, versions
// and window_ids by identity, co-located; progress and decision_log by
// partition (part), co-located (operator_skips too, migration 009). On plain PostgreSQL it does nothing.
//
// Concurrent runs are safe: tern holds a PostgreSQL advisory lock while it
// migrates (on Citus, on the coordinator), so a second Up waits and then
// finds nothing to do.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed *.sql
var files embed.FS

// VersionTable is the table, on the search_path, that records the applied
// version.
const VersionTable = "dam_schema_version"

// FS returns the embedded migration files.
func FS() fs.FS { return files }

func newMigrator(ctx context.Context, conn *pgx.Conn) (*migrate.Migrator, error) {
	m, err := migrate.NewMigrator(ctx, conn, VersionTable)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	list, err := load()
	if err != nil {
		return nil, err
	}
	for _, mig := range list {
		m.AppendMigration(mig.name, mig.up, mig.down)
	}
	return m, nil
}

type migration struct{ name, up, down string }

var fileName = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.(up|down)\.sql$`)

// load pairs the NNN_name.up.sql and .down.sql files in number order. tern's
// own loader wants one file per migration, so the pairs are appended by hand.
func load() ([]migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	byNum := map[int]*migration{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		b, err := fs.ReadFile(files, e.Name())
		if err != nil {
			return nil, fmt.Errorf("migrations: %w", err)
		}
		mig := byNum[n]
		if mig == nil {
			mig = &migration{name: m[1] + "_" + m[2]}
			byNum[n] = mig
		}
		if m[3] == "up" {
			mig.up = string(b)
		} else {
			mig.down = string(b)
		}
	}
	list := make([]migration, len(byNum))
	for n, mig := range byNum {
		if n < 1 || n > len(list) || mig.up == "" || mig.down == "" {
			return nil, fmt.Errorf("migrations: %s: numbers must run 1..N with an up and a down file each", mig.name)
		}
		list[n-1] = *mig
	}
	return list, nil
}

// Up applies every migration not yet applied. When no schema of the
// connection's search_path exists (a DSN's ?search_path=dam on a new
// database), it creates the first one named there, or fails naming the
// statement to run when the role may not.
func Up(ctx context.Context, conn *pgx.Conn) error {
	if err := ensureSchema(ctx, conn); err != nil {
		return err
	}
	m, err := newMigrator(ctx, conn)
	if err != nil {
		return err
	}
	if err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// Down reverts every applied migration (to version 0): it drops dam's
// tables and all the state in them.
func Down(ctx context.Context, conn *pgx.Conn) error {
	m, err := newMigrator(ctx, conn)
	if err != nil {
		return err
	}
	if err := m.MigrateTo(ctx, 0); err != nil {
		return fmt.Errorf("migrations: down: %w", err)
	}
	return nil
}

// Version reports the applied version and the latest version this binary
// knows. It creates the version table (at version 0) if it is missing.
func Version(ctx context.Context, conn *pgx.Conn) (current, latest int32, err error) {
	m, err := newMigrator(ctx, conn)
	if err != nil {
		return 0, 0, err
	}
	current, err = m.GetCurrentVersion(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("migrations: version: %w", err)
	}
	return current, int32(len(m.Migrations)), nil
}

// Latest is the latest schema version this binary knows.
func Latest() int32 {
	list, err := load()
	if err != nil {
		panic(err) // the embedded files are checked by the tests
	}
	return int32(len(list))
}

// Applied reports the applied version, changing nothing (Version creates
// the version table): 0 when the table does not exist.
func Applied(ctx context.Context, conn *pgx.Conn) (int32, error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, VersionTable).Scan(&exists); err != nil {
		return 0, fmt.Errorf("migrations: version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int32
	if err := conn.QueryRow(ctx, `SELECT version FROM `+VersionTable).Scan(&v); err != nil {
		return 0, fmt.Errorf("migrations: version: %w", err)
	}
	return v, nil
}

// ErrNewer: the schema's version is newer than this binary knows: its
// queries may not fit the tables (and Down would lose what it does not
// know). Upgrade dam.
var ErrNewer = errors.New("migrations: schema newer than this dam")

// ErrOlder: the schema's version is older than this binary needs: apply
// the migrations (Up, `dam migrate`).
var ErrOlder = errors.New("migrations: schema older than this dam")

// VersionError is Check's error: the applied version is not the latest
// this binary knows. It matches ErrNewer or ErrOlder with errors.Is.
type VersionError struct {
	Applied, Latest int32
}

func (e *VersionError) Error() string {
	if e.Applied > e.Latest {
		return fmt.Sprintf("schema version %d is newer than this dam knows (%d): run a dam that knows it", e.Applied, e.Latest)
	}
	return fmt.Sprintf("schema version %d is older than this dam needs (%d): run dam migrate (or set postgres.migrate: true)", e.Applied, e.Latest)
}

// Is matches ErrNewer or ErrOlder.
func (e *VersionError) Is(target error) bool {
	return (target == ErrNewer && e.Applied > e.Latest) || (target == ErrOlder && e.Applied < e.Latest)
}

// Check returns a *VersionError unless the applied version is Latest. It
// changes nothing.
func Check(ctx context.Context, conn *pgx.Conn) error {
	applied, err := Applied(ctx, conn)
	if err != nil {
		return err
	}
	if latest := Latest(); applied != latest {
		return &VersionError{Applied: applied, Latest: latest}
	}
	return nil
}

// ensureSchema creates the first schema of the search_path when none of
// them exists: PostgreSQL would otherwise refuse every CREATE TABLE with
// "no schema has been selected to create in".
func ensureSchema(ctx context.Context, conn *pgx.Conn) error {
	var current *string
	var path string
	if err := conn.QueryRow(ctx, "SELECT current_schema(), current_setting('search_path')").Scan(&current, &path); err != nil {
		return fmt.Errorf("migrations: reading the search_path: %w", err)
	}
	if current != nil {
		return nil
	}
	name := firstSchema(path)
	if name == "" {
		return fmt.Errorf("migrations: the search_path (%q) names no schema to create the tables in: set one in the DSN (?search_path=dam)", path)
	}
	stmt := "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("migrations: the search_path's schema %q does not exist, and creating it failed: %w; "+
			"run, as a role that may: CREATE SCHEMA %s AUTHORIZATION <dam's role>", name, err, pgx.Identifier{name}.Sanitize())
	}
	return nil
}

// firstSchema is the first schema a search_path names, "$user" aside.
func firstSchema(path string) string {
	for _, item := range strings.Split(path, ",") {
		item = strings.TrimSpace(item)
		if len(item) >= 2 && item[0] == '"' && item[len(item)-1] == '"' {
			item = strings.ReplaceAll(item[1:len(item)-1], `""`, `"`)
		} else {
			item = strings.ToLower(item) // as PostgreSQL folds an unquoted name
		}
		if item != "" && item != "$user" {
			return item
		}
	}
	return ""
}
