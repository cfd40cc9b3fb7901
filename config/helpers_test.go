package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// valid returns a minimal valid configuration.
func valid() Config {
	c := Default()
	c.Kafka.Brokers = []string{"localhost:9092"}
	c.Kafka.Group = "g"
	c.Postgres.DSN = "postgres://dam@localhost/dam"
	r := DefaultRoute()
	r.Service, r.From, r.To = "a", "in.a", "out.a"
	c.Routes = []Route{r}
	return c
}

// problems returns the joined errors of err, each required to be an *Error
// or a *FileError.
func problems(t testing.TB, err error) []error {
	t.Helper()
	if err == nil {
		return nil
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	for _, e := range errs {
		var ce *Error
		var fe *FileError
		switch {
		case errors.As(e, &ce):
			if ce.Key == "" {
				t.Errorf("error without a key: %v", e)
			}
		case errors.As(e, &fe):
		default:
			t.Errorf("error %T is neither *Error nor *FileError: %v", e, e)
		}
	}
	return errs
}

// wantProblem asserts that err contains exactly one problem whose text
// starts with "key: " and contains msg.
func wantProblem(t *testing.T, err error, key, msg string) {
	t.Helper()
	errs := problems(t, err)
	if len(errs) != 1 {
		t.Fatalf("want one problem %s: ...%s..., got %d: %v", key, msg, len(errs), err)
	}
	var ce *Error
	if !errors.As(errs[0], &ce) || ce.Key != key {
		t.Fatalf("want key %q, got %v", key, errs[0])
	}
	if got := errs[0].Error(); !strings.HasPrefix(got, key+": ") || !strings.Contains(got, msg) {
		t.Fatalf("want %q containing %q, got %q", key+": ...", msg, got)
	}
}

// writeFile writes text to dam.yaml in a fresh directory and returns its
// path.
func writeFile(t testing.TB, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dam.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// minimal is the smallest valid configuration file.
const minimal = `
kafka: {brokers: [localhost:9092], group: g}
postgres: {dsn: "postgres://dam@localhost/dam"}
routes:
  - {service: a, from: in.a, to: out.a}
`

// minimalWith returns minimal with its top-level line for section replaced
// by line (or line added).
func minimalWith(section, line string) string {
	var out []string
	replaced := false
	for _, l := range strings.Split(minimal, "\n") {
		switch {
		case strings.HasPrefix(l, section+":"):
			out = append(out, line)
			replaced = true
		case replaced && strings.HasPrefix(l, "  ") && section == "routes":
		default:
			out = append(out, l)
		}
	}
	if !replaced {
		out = append(out, line)
	}
	return strings.Join(out, "\n") + "\n"
}

// longToken is a valid token (MinTokenLength bytes or more).
const longToken = "0123456789abcdef-token"
