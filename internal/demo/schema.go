package demo

import (
	"context"
	"errors"
	"net/url"

	"github.com/jackc/pgx/v5"
)

// ownedSchema is a PostgreSQL schema that a command makes, and drops and
// makes again, but only while it is its own: the command marks the schemas
// it makes with a comment.
type ownedSchema struct {
	name string
	// mark is the comment that makes the schema the command's.
	mark string
	// notOwn is the error for a schema of that name without the mark.
	notOwn error
}

var demoSchema = ownedSchema{name: Schema, mark: schemaMark, notOwn: ErrNotTheDemos}

// remake drops the schema (if it exists) and makes it again, marked, in one
// transaction: it drops it only when it bears the mark, or yes is given;
// otherwise it returns s.notOwn.
func (s ownedSchema) remake(ctx context.Context, conn *pgx.Conn, yes bool) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		exists, own, err := s.lookUp(ctx, tx)
		switch {
		case err != nil:
			return err
		case exists && !own && !yes:
			return s.notOwn
		case exists:
			if _, err := tx.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{s.name}.Sanitize()+" CASCADE"); err != nil {
				return err
			}
		}
		return s.create(ctx, tx)
	})
}

// ensure makes the schema, marked, unless a schema of its name exists.
func (s ownedSchema) ensure(ctx context.Context, conn *pgx.Conn) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		exists, _, err := s.lookUp(ctx, tx)
		if err != nil || exists {
			return err
		}
		return s.create(ctx, tx)
	})
}

// lookUp reports whether the schema exists, and whether it bears the mark.
func (s ownedSchema) lookUp(ctx context.Context, tx pgx.Tx) (exists, own bool, err error) {
	var mark *string
	err = tx.QueryRow(ctx, `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1`, s.name).Scan(&mark)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	return true, mark != nil && *mark == s.mark, nil
}

func (s ownedSchema) create(ctx context.Context, tx pgx.Tx) error {
	// No parameters in utility statements: the name is quoted, the mark a
	// literal.
	id := pgx.Identifier{s.name}.Sanitize()
	_, err := tx.Exec(ctx, "CREATE SCHEMA "+id+"; COMMENT ON SCHEMA "+id+" IS "+quoteLiteral(s.mark))
	return err
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings).
func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

// withSearchPath returns dsn with its search_path set to schema.
func withSearchPath(dsn, schema string) string {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return dsn + " search_path=" + schema
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
