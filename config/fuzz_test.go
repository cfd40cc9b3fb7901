package config

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzLoad checks that no file crashes Load, that every problem names a
// key or is a file (read or parse) error, and that a configuration Load
// accepts prints as YAML that loads back to the same configuration.
func FuzzLoad(f *testing.F) {
	if b, err := os.ReadFile("testdata/dam.yaml"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(minimal))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "dam.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path, nil)
		if err != nil {
			problems(t, err)
			return
		}
		out, err := c.YAML()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		back, err := Load(path, nil)
		if err != nil {
			t.Fatalf("printed configuration does not load: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(c, back) {
			t.Fatalf("round trip changed the configuration:\n%s", out)
		}
	})
}

// FuzzParseEntity checks that ParseEntity never panics and that String
// gives back the accepted text.
func FuzzParseEntity(f *testing.F) {
	for _, s := range []string{"key", "/banana_id", "header:Entity-Id", "header:", "/a/*", "/~"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEntity(s)
		if err != nil {
			return
		}
		if e.String() != s {
			t.Fatalf("ParseEntity(%q).String() = %q", s, e.String())
		}
		again, err := ParseEntity(e.String())
		if err != nil || again != e {
			t.Fatalf("ParseEntity(%q) = %+v, %v; want %+v", e.String(), again, err, e)
		}
	})
}
