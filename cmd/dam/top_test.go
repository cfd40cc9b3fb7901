package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// dam top, run in a terminal (tmux) as a person runs it, against a
// running sidecar: the screen shows the service with its drop rate, and
// a halted partition as halted, with its reason (the record's offset and
// why), refreshed as it happens.
func TestTopShowsAHaltedPartitionInATerminal(t *testing.T) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("tmux not found: make deps installs it (scripts/install-tmux.sh)")
		}
		t.Skip("tmux not found (make deps, or apt-get install tmux): dam top's terminal test needs it")
	}
	kc := testkafka.New(t, 1, "in", "out")
	addr := startTapSidecar(t, kc)
	kc.Produce("in", &kgo.Record{Key: []byte("k"), Value: []byte(`{"a":1}`)}, &kgo.Record{Key: []byte("k"), Value: []byte(`{"a":1}`)})

	socket := fmt.Sprintf("dam-top-test-%d", os.Getpid())
	tm := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(tmux, append([]string{"-L", socket}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	tm("-f", "/dev/null", "new-session", "-d", "-s", "top", "-x", "260", "-y", "30",
		"env", envExecDam+"=1", envTapToken+"="+tapTestToken, os.Args[0], "top", "--addr", addr)
	t.Cleanup(func() { _ = exec.Command(tmux, "-L", socket, "kill-server").Run() })
	screen := func(what string, ok func(string) bool) string {
		t.Helper()
		var s string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if s = tm("capture-pane", "-p", "-t", "top"); ok(s) {
				return s
			}
		}
		t.Fatalf("%s: the screen shows\n%s", what, s)
		return ""
	}
	header := regexp.MustCompile(`SERVICE / PARTITION\s+IN/s\s+FWD/s\s+DROP/s\s+DL/s\s+DROP%\s+DECIDE\s+LAG\s+STATE`)
	running := regexp.MustCompile(`(?m)^s\s+\d+\s+\d+\s+\d+\s+\d+\s+50\.0%\s+[\d.]+ms\s*$`)
	part := regexp.MustCompile(`(?m)^  in/0\s+0\s+running\s*$`)
	screen("a running partition", func(s string) bool {
		return header.MatchString(s) && running.MatchString(s) && part.MatchString(s) && strings.Contains(s, addr+"  ready")
	})

	kc.Produce("in", &kgo.Record{Key: []byte("k"), Value: []byte(`not json`)})
	halted := regexp.MustCompile(`(?m)^  in/0\s+\d+\s+halted: .*in/0 offset 2: .*route s has no dead_letter topic`)
	s := screen("a halted partition", func(s string) bool {
		return halted.MatchString(s) && strings.Contains(s, "1 halted or paused") && strings.Contains(s, "not ready: in/0: halted")
	})
	t.Logf("the screen:\n%s", s)
}

// Without a terminal, or with -o json, dam top prints one snapshot; the
// reason of a halt needs a tap token, and without one the partition says
// what stops it in fixed words.
func TestTopSnapshot(t *testing.T) {
	kc := testkafka.New(t, 1, "in", "out")
	addr := startTapSidecar(t, kc)
	kc.Produce("in", &kgo.Record{Key: []byte("k"), Value: []byte(`not json`)})
	var v topView
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		code, out, errOut := runDam(t, "top", "--addr", addr, "--token", tapTestToken, "--interval", "100ms", "-o", "json")
		if code != 0 {
			t.Fatalf("dam top -o json: exit %d %s", code, errOut)
		}
		v = topView{}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("dam top -o json: %v\n%s", err, out)
		}
		if len(v.Services) == 1 && len(v.Services[0].Partitions) == 1 && v.Services[0].Partitions[0].State == "halted" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dam top -o json never shows the halt: %s", out)
		}
	}
	p := v.Services[0].Partitions[0]
	if !strings.Contains(p.Why, "in/0 offset 0") || v.Span <= 0 || v.Sidecars[0].Ready {
		t.Errorf("snapshot %+v, partition %+v", v, p)
	}
	t.Setenv(envTapToken, "")
	code, out, _ := runDam(t, "top", "--addr", addr, "--interval", "100ms")
	if code != 0 || !regexp.MustCompile(`(?m)^  in/0\s+\d+\s+halted: halted$`).MatchString(out) || strings.Contains(out, "offset") {
		t.Errorf("dam top without a token: exit %d\n%s", code, out)
	}
}
