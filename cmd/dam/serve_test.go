package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/internal/testutil/damproc"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

const serveToken = "serve-test-token-0123456789"

// dam serve as a process of its own: no Kafka, no routes, the token from
// DAM_SERVE_TOKEN; it answers checks, serves its metrics, never logs the
// token, and exits 0 on SIGTERM.
func TestServeCommand(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dam.yaml")
	cfg := "postgres:\n  dsn: \"" + pgtest.DSN(t) + "\"\nserve:\n  listen: 127.0.0.1:0\n  shutdown_grace: 5s\n  services: [customer-2, a, b]\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPostgresDSN+"=") && !strings.HasPrefix(kv, "DAM_SERVE_") {
			env = append(env, kv)
		}
	}
	stderrPipe, stderrW := io.Pipe()
	proc, err := damproc.Start(damproc.Options{Args: []string{os.Args[0], "serve", "--config", path},
		CleanEnv: true, Env: append(env, envExecDam+"=1", "DAM_SERVE_TOKEN="+serveToken), Stderr: stderrW})
	if err != nil {
		t.Fatal(err)
	}
	go func() { <-proc.Done(); stderrW.Close() }()
	t.Cleanup(proc.Kill)
	// The address is in the "serve: listening" log line.
	var logs syncBuffer
	addrc := make(chan string, 1)
	logEnd := make(chan struct{})
	go func() {
		defer close(logEnd)
		sc := bufio.NewScanner(stderrPipe)
		for sc.Scan() {
			logs.Write(append(sc.Bytes(), '\n'))
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serve: listening" {
				addrc <- line.Addr
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case <-logEnd:
		t.Fatalf("dam serve exited:\n%s", logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("dam serve did not start:\n%s", logs.String())
	}
	url := "http://" + addr
	post := func(token, body string) (int, string) {
		req, _ := http.NewRequest("POST", url+"/v1/check", strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	body := `{"service":"customer-2","entity":"B-007","payload":{"banana_id":"B-007","ripeness_level":"Mostly Yellow"}}`
	if code, out := post(serveToken, body); code != 200 || !strings.Contains(out, `"decision":"forward"`) {
		t.Fatalf("first check: %d %s", code, out)
	}
	reordered := `{"service":"customer-2","entity":"B-007","payload":{"ripeness_level":"Mostly Yellow","banana_id":"B-007"}}`
	if code, out := post(serveToken, reordered); code != 200 || !strings.Contains(out, `"decision":"duplicate"`) {
		t.Fatalf("second check: %d %s", code, out)
	}
	if code, _ := post("", body); code != 401 {
		t.Fatalf("without a token: %d", code)
	}
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// customer-2 has no route and no token of its own: serve.services
	// names it, and it is counted by name.
	for _, want := range []string{`dam_serve_decisions_total{decision="duplicate",service="customer-2"} 1`, "go_goroutines", "process_resident_memory_bytes", "dam_build_info{"} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if resp, err := http.Get(url + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("readyz: %v %v", resp, err)
	}

	if _, killed, err := proc.Stop(20 * time.Second); killed || err != nil {
		<-logEnd
		t.Fatalf("dam serve after SIGTERM: exit %v, killed after 20s %v\n%s", err, killed, logs.String())
	}
	<-logEnd // all of stderr read
	if strings.Contains(logs.String(), serveToken) {
		t.Fatalf("the token is in the log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "serve: stopped") {
		t.Fatalf("no clean stop in the log:\n%s", logs.String())
	}
}

// dam serve refuses a configuration without a token, naming the key, and
// dam config redacts the tokens.
func TestServeConfig(t *testing.T) {
	unsetDSN(t)
	t.Setenv("DAM_SERVE_TOKEN", "")
	os.Unsetenv("DAM_SERVE_TOKEN")
	path := filepath.Join(t.TempDir(), "dam.yaml")
	if err := os.WriteFile(path, []byte("postgres: {dsn: \"postgres://nobody@127.0.0.1:1/x\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runDam(t, "serve", "--config", path)
	if code != 2 || !strings.Contains(errOut, "serve.tokens: required") {
		t.Fatalf("serve without a token: %d %q", code, errOut)
	}
	full := writeRunConfig(t, "postgres://nobody@127.0.0.1:1/x", "serve:\n  tokens: [{token: file-token-0123456789, services: [s]}]\n")
	t.Setenv("DAM_SERVE_TOKEN", serveToken)
	code, out, errOut := runDam(t, "config", "--config", full)
	if code != 0 || strings.Contains(out, serveToken) || strings.Contains(out, "file-token-0123456789") || strings.Count(out, "token: xxxxx") != 2 {
		t.Fatalf("config: %d %q %q", code, out, errOut)
	}
}
