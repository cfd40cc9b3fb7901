package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// secretFile writes content to a file of its own and returns its path.
func secretFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const (
	fileDSN      = "postgres://dam:s3cret@db:5432/dam"
	filePassword = "hunter2"
)

// noPostgres is minimal without its postgres line.
var noPostgres = minimalWith("postgres", "")

func TestSecretFiles(t *testing.T) {
	for _, tc := range []struct {
		name, content, want string
	}{
		{"as is", fileDSN, fileDSN},
		{"one trailing newline trimmed", fileDSN + "\n", fileDSN},
		{"CRLF trimmed", fileDSN + "\r\n", fileDSN},
		{"only one newline trimmed", fileDSN + "\n\n", fileDSN + "\n"},
		{"inner spaces kept", "host=db password='a b'\n", "host=db password='a b'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := secretFile(t, tc.content)
			c, err := Load(writeFile(t, noPostgres+"postgres: {dsn_file: "+path+"}\n"), nil)
			if err != nil {
				t.Fatal(err)
			}
			if c.Postgres.DSN != tc.want || c.Postgres.DSNFile != path {
				t.Fatalf("dsn %q from %q, want %q", c.Postgres.DSN, c.Postgres.DSNFile, tc.want)
			}
		})
	}
}

func TestSecretFilesFromEnv(t *testing.T) {
	dsn, pw := secretFile(t, fileDSN+"\n"), secretFile(t, filePassword+"\n")
	c, err := Load(writeFile(t, noPostgres), []string{
		"DAM_POSTGRES_DSN_FILE=" + dsn,
		"DAM_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
		"DAM_KAFKA_SASL_USERNAME=dam",
		"DAM_KAFKA_SASL_PASSWORD_FILE=" + pw,
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Postgres.DSN != fileDSN || c.Kafka.SASL.Password != filePassword {
		t.Fatalf("secrets not read: dsn %q, password %q", c.Postgres.DSN, c.Kafka.SASL.Password)
	}
}

func TestSecretFileErrors(t *testing.T) {
	dsn, pw, empty := secretFile(t, fileDSN), secretFile(t, filePassword), secretFile(t, "\n")
	missing := filepath.Join(t.TempDir(), "missing")
	sasl := func(extra string) string {
		return minimal + "kafka: {brokers: [localhost:9092], group: g, sasl: {mechanism: PLAIN, username: u" + extra + "}}\n"
	}
	for _, tc := range []struct {
		name, yaml string
		env        []string
		key, msg   string
	}{
		{"dsn and dsn_file", minimalWith("postgres", "postgres: {dsn: x, dsn_file: "+dsn+"}"), nil,
			"postgres.dsn_file", "set together with postgres.dsn"},
		{"dsn from env and dsn_file", minimalWith("postgres", "postgres: {dsn_file: "+dsn+"}"), []string{"DAM_POSTGRES_DSN=x"},
			"postgres.dsn_file", "set together with postgres.dsn"},
		{"dsn and dsn_file from env", minimal, []string{"DAM_POSTGRES_DSN_FILE=" + dsn},
			"postgres.dsn_file", "set together with postgres.dsn"},
		{"missing dsn_file", noPostgres + "postgres: {dsn_file: " + missing + "}\n", nil,
			"postgres.dsn_file", "open " + missing + ": no such file or directory"},
		{"dsn_file is a directory", noPostgres + "postgres: {dsn_file: " + filepath.Dir(missing) + "}\n", nil,
			"postgres.dsn_file", "is a directory"},
		{"empty dsn_file", noPostgres + "postgres: {dsn_file: " + empty + "}\n", nil,
			"postgres.dsn_file", "is empty"},
		{"password and password_file", strings.Replace(sasl(", password: p, password_file: "+pw), "kafka: {brokers: [localhost:9092], group: g}\n", "", 1), nil,
			"kafka.sasl.password_file", "set together with kafka.sasl.password"},
		{"missing password_file", strings.Replace(sasl(", password_file: "+missing), "kafka: {brokers: [localhost:9092], group: g}\n", "", 1), nil,
			"kafka.sasl.password_file", "no such file or directory"},
		{"password_file without mechanism", minimal, []string{"DAM_KAFKA_SASL_PASSWORD_FILE=" + pw},
			"kafka.sasl.password_file", "set without kafka.sasl.mechanism"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeFile(t, tc.yaml), tc.env)
			wantProblem(t, err, tc.key, tc.msg)
			for _, secret := range []string{fileDSN, filePassword} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("secret in error: %v", err)
				}
			}
		})
	}
}

// TestSecretFilesPrinted: the printed configuration names the files, not
// their content, and loads back to the same configuration.
func TestSecretFilesPrinted(t *testing.T) {
	dsn, pw := secretFile(t, fileDSN+"\n"), secretFile(t, filePassword+"\n")
	c, err := Load(writeFile(t, noPostgres+"postgres: {dsn_file: "+dsn+"}\n"), []string{
		"DAM_KAFKA_SASL_MECHANISM=PLAIN",
		"DAM_KAFKA_SASL_USERNAME=dam",
		"DAM_KAFKA_SASL_PASSWORD_FILE=" + pw,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []Config{c, c.Redacted()} {
		out, err := cfg.YAML()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "s3cret") || strings.Contains(string(out), filePassword) {
			t.Fatalf("secret printed:\n%s", out)
		}
		for _, want := range []string{"dsn_file: " + dsn + "\n", "password_file: " + pw + "\n", `dsn: ""`} {
			if !strings.Contains(string(out), want) {
				t.Fatalf("no %q in:\n%s", want, out)
			}
		}
		back, err := Load(writeFile(t, string(out)), nil)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if !reflect.DeepEqual(back, c) {
			t.Fatalf("round trip changed the configuration:\n%s", out)
		}
	}
}
