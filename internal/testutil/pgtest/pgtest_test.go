package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestDSNSelectsFreshMigratedSchema(t *testing.T) {
	t.Parallel()
	a, b := DSN(t), DSN(t)
	if a == b {
		t.Fatal("two tests got the same schema")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM state").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("fresh schema has %d state rows", n)
	}
}

func TestWithSearchPath(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u@h/db?sslmode=disable": "postgres://u@h/db?search_path=s&sslmode=disable",
		"host=h user=u":                     "host=h user=u search_path=s",
	} {
		if got := WithSearchPath(in, "s"); got != want {
			t.Errorf("WithSearchPath(%q) = %q, want %q", in, got, want)
		}
	}
}
