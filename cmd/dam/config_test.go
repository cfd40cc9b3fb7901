package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testConfig = `
kafka:
  brokers: [localhost:9092]
  group: g
  sasl: {mechanism: PLAIN, username: u, password: hunter2}
postgres: {dsn: "postgres://dam:s3cret@localhost/dam"}
routes:
  - {service: a, from: in.a, to: out.a, ignore: [/updated_at]}
`

func runConfig(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"config"}, args...), strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestConfigPrintsRedacted(t *testing.T) {
	code, out, errOut := runConfig(t, "--config", writeConfig(t, testConfig))
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		"dsn: postgres://dam:xxxxx@localhost/dam\n",
		"password: xxxxx\n",
		"ignore: [/updated_at]\n",
		"session_timeout: 45s\n",
		"max_size: 1047552\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "hunter2") || strings.Contains(out, "s3cret") {
		t.Fatalf("secret printed:\n%s", out)
	}
}

func TestConfigEnvironment(t *testing.T) {
	t.Setenv("DAM_POSTGRES_DSN", "host=db password=fromenv")
	t.Setenv("DAM_PIPELINE_BATCH_SIZE", "42")
	code, out, errOut := runConfig(t, "--config", writeConfig(t, testConfig))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "dsn: host=db password=xxxxx\n") || !strings.Contains(out, "batch_size: 42\n") {
		t.Fatalf("environment not applied:\n%s", out)
	}
}

func TestConfigErrors(t *testing.T) {
	path := writeConfig(t, strings.Replace(testConfig, "ignore: [/updated_at]", "fromm: x, ignore: [updated_at]", 1))
	code, out, errOut := runConfig(t, "--config", path)
	if code != 2 || out != "" {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	want := "dam: " + path + ": routes[0].fromm: unknown key\n" +
		"dam: " + path + `: routes[0].ignore[0]: canon: ignore pointer "updated_at": must start with "/"` + "\n"
	if errOut != want {
		t.Fatalf("stderr\n%s\nwant\n%s", errOut, want)
	}
}

func TestConfigUnknownEnvironment(t *testing.T) {
	t.Setenv("DAM_KAFKA_BROKERZ", "x")
	code, _, errOut := runConfig(t, "--config", writeConfig(t, testConfig))
	if code != 2 || !strings.Contains(errOut, ": DAM_KAFKA_BROKERZ: unknown environment variable") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

func TestConfigMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	code, _, errOut := runConfig(t, "--config", path)
	if code != 2 || errOut != "dam: "+path+": no such file or directory\n" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

func TestConfigDefaultPath(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dam.yaml"), []byte(testConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	if code, _, errOut := runConfig(t); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

func TestConfigUsage(t *testing.T) {
	if code, _, _ := runConfig(t, "extra"); code != 2 {
		t.Fatalf("extra argument: exit %d", code)
	}
	if code, _, _ := runConfig(t, "--bogus"); code != 2 {
		t.Fatalf("unknown flag: exit %d", code)
	}
}

func TestLoadConfigIsUsageError(t *testing.T) {
	_, err := loadConfig(writeConfig(t, "kafka: 3\n"))
	var ue usageError
	if !errors.As(err, &ue) {
		t.Fatalf("%T %v is not a usageError", err, err)
	}
	cfg, err := loadConfig(writeConfig(t, testConfig))
	if err != nil || cfg.Kafka.SASL.Password != "hunter2" {
		t.Fatalf("loadConfig: %+v, %v", cfg.Kafka.SASL, err)
	}
}

// A configuration for dam serve alone (no kafka, no routes) is printed
// with --serve, which checks it as dam serve does; without --serve the
// errors say that --serve exists.
func TestConfigServeOnly(t *testing.T) {
	unsetDSN(t)
	t.Setenv("DAM_SERVE_TOKEN", "")
	os.Unsetenv("DAM_SERVE_TOKEN")
	path := writeConfig(t, "postgres: {dsn: \"postgres://dam:s3cret@db/dam\"}\nserve:\n  token: serve-only-token-5f3a9c1e7b2d\n  services: [a]\n")
	code, out, errOut := runConfig(t, "--serve", "--config", path)
	if code != 0 || !strings.Contains(out, "listen: :8080\n") || strings.Contains(out, "serve-only-token") || strings.Contains(out, "s3cret") {
		t.Fatalf("config --serve: exit %d, stderr %q\n%s", code, errOut, out)
	}
	code, _, errOut = runConfig(t, "--config", path)
	if code != 2 || !strings.Contains(errOut, "kafka.brokers: required") || !strings.Contains(errOut, "dam config --serve") {
		t.Fatalf("config without --serve: exit %d, %q; want exit 2 naming kafka.brokers and --serve", code, errOut)
	}
	// --serve still checks what dam serve needs: a token.
	path = writeConfig(t, "postgres: {dsn: \"postgres://dam@db/dam\"}\n")
	if code, _, errOut := runConfig(t, "--serve", "--config", path); code != 2 || !strings.Contains(errOut, "serve.tokens: required") {
		t.Fatalf("config --serve without a token: exit %d, %q", code, errOut)
	}
}

// dam run refuses a bad configuration before connecting to anything: exit
// status 2 and the key named.
func TestRunConfigErrors(t *testing.T) {
	unsetDSN(t)
	for _, tc := range []struct{ extra, want string }{
		{"    ignore: [updated_at]\n", "routes[0].ignore[0]"},
		{"    mode: sometimes\n", "routes[0].mode"},
		{"    entity: \"header:\"\n", "routes[0].entity"},
		{"    fromm: typo\n", "routes[0].fromm: unknown key"},
	} {
		path := writeRunConfig(t, "postgres://nobody@127.0.0.1:1/x", tc.extra)
		code, _, errOut := runDam(t, "run", "--config", path)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: got %d %q, want exit 2 naming %s", tc.extra, code, errOut, tc.want)
		}
	}
}
