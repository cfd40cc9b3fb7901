package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dam-dedup/dam/internal/testutil/damproc"
)

// The tutorial's blocks, by their info strings: "sh tutorial" is a command
// run to completion, "sh tutorial background" one left running (a server:
// the playground, dam run) until the end, and "text tutorial output" the
// output of the command block before it: each of its lines must appear, in
// order, in what the command printed (stdout and stderr), with runs of
// spaces alike and "…" standing for any text. A background command's
// output block is awaited: the next block runs once it has appeared.
const (
	infoCommand    = "sh tutorial"
	infoBackground = "sh tutorial background"
	infoOutput     = "text tutorial output"
)

// tutorialBlock is one block of the tutorial that the test runs.
type tutorialBlock struct {
	line       int // of its opening fence, for messages
	script     string
	background bool
	want       []string // its output block's lines
}

// tutorialBlocks extracts the tutorial's blocks from markdown.
func tutorialBlocks(markdown []byte) ([]tutorialBlock, error) {
	var blocks []tutorialBlock
	var cur *tutorialBlock
	var body []string
	info, inFence, start := "", false, 0
	sc := bufio.NewScanner(bytes.NewReader(markdown))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		fence := strings.TrimSpace(line)
		switch {
		case !inFence && strings.HasPrefix(fence, "```"):
			inFence, info, start, body = true, strings.Join(strings.Fields(strings.TrimPrefix(fence, "```")), " "), n, nil
		case inFence && fence == "```":
			inFence = false
			switch info {
			case infoCommand, infoBackground:
				blocks = append(blocks, tutorialBlock{line: start, script: strings.Join(body, "\n"), background: info == infoBackground})
				cur = &blocks[len(blocks)-1]
			case infoOutput:
				if cur == nil || cur.want != nil {
					return nil, fmt.Errorf("line %d: an output block must follow a command block, one each", start)
				}
				cur.want = append([]string{}, body...)
			default:
				if strings.Contains(info, "tutorial") {
					return nil, fmt.Errorf("line %d: unknown tutorial block %q", start, info)
				}
			}
		case inFence:
			body = append(body, line)
		}
	}
	if inFence {
		return nil, fmt.Errorf("line %d: unclosed block", start)
	}
	return blocks, sc.Err()
}

var spaces = regexp.MustCompile(`\s+`)

// outputMatches reports whether every line of want appears, in order, in
// got: the first line of want that does not, or "".
func outputMatches(want []string, got string) string {
	lines := strings.Split(got, "\n")
	i := 0
	for _, w := range want {
		w = strings.TrimSpace(spaces.ReplaceAllString(w, " "))
		if w == "" {
			continue
		}
		parts := strings.Split(w, "…")
		for j := range parts {
			parts[j] = regexp.QuoteMeta(parts[j])
		}
		re := regexp.MustCompile("^" + strings.Join(parts, ".*") + "$")
		for i < len(lines) && !re.MatchString(strings.TrimSpace(spaces.ReplaceAllString(lines[i], " "))) {
			i++
		}
		if i == len(lines) {
			return w
		}
		i++
	}
	return ""
}

// TestTutorial runs docs/tutorial.md's commands in order, as a reader
// would, against dam built with -tags damtest and kcat from PATH, and checks
// the output the tutorial shows, so that the tutorial cannot drift from the
// code. The reader's machine differs in three things only: the broker's
// port is a free one (DAM_TEST_PLAYGROUND_LISTEN; 127.0.0.1:9092 in the
// expected output stands for it), HTTP listens on free ports, and the
// state goes to a database of the test's own ($DAM_POSTGRES_DSN, in the
// schema dam_playground, as the written dam.yaml selects).
func TestTutorial(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat not found: run make deps (or apt-get install kcat); the tutorial's test needs it")
	}
	md, err := os.ReadFile(filepath.Join("..", "..", "docs", "tutorial.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := tutorialBlocks(md)
	if err != nil {
		t.Fatalf("docs/tutorial.md: %v", err)
	}
	if len(blocks) < 5 {
		t.Fatalf("docs/tutorial.md: only %d tutorial blocks", len(blocks))
	}

	dam, err := damproc.Build(damproc.BuildOptions{Tags: "damtest"})
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Dir(dam)
	dsn, err := url.Parse(newDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	q := dsn.Query()
	q.Set("search_path", "dam_playground")
	dsn.RawQuery = q.Encode()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	broker := ln.Addr().String()
	ln.Close()

	dir := t.TempDir()
	env := append(os.Environ(),
		"PATH="+bin+string(os.PathListSeparator)+filepath.Dir(kcat)+string(os.PathListSeparator)+os.Getenv("PATH"),
		envPostgresDSN+"="+dsn.String(),
		envPlaygroundListen+"="+broker,
		"DAM_HTTP_LISTEN=127.0.0.1:0",
		"DAM_SERVE_LISTEN=127.0.0.1:0",
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	type server struct {
		b   tutorialBlock
		cmd *exec.Cmd
		out *syncBuffer
	}
	var servers []*server
	done := make(map[*server]error)
	var doneMu sync.Mutex
	exited := func(s *server) (error, bool) {
		doneMu.Lock()
		defer doneMu.Unlock()
		err, ok := done[s]
		return err, ok
	}
	// Servers that stopped by themselves, with their output.
	dead := func() string {
		var sb strings.Builder
		for _, s := range servers {
			if err, ok := exited(s); ok {
				fmt.Fprintf(&sb, "\nthe server of line %d (%s) exited: %v\n%s", s.b.line, s.b.script, err, s.out)
			}
		}
		return sb.String()
	}
	newCmd := func(b tutorialBlock, out *syncBuffer) *exec.Cmd {
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", b.script)
		cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd
	}
	t.Cleanup(func() {
		for _, s := range servers {
			if _, ok := exited(s); !ok {
				_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			}
		}
	})

	for _, b := range blocks {
		want := make([]string, len(b.want))
		for i, w := range b.want {
			want[i] = strings.ReplaceAll(w, "127.0.0.1:9092", broker)
		}
		out := &syncBuffer{}
		cmd := newCmd(b, out)
		if b.background {
			if err := cmd.Start(); err != nil {
				t.Fatalf("line %d: %s: %v", b.line, b.script, err)
			}
			s := &server{b: b, cmd: cmd, out: out}
			servers = append(servers, s)
			go func() {
				err := cmd.Wait()
				doneMu.Lock()
				done[s] = err
				doneMu.Unlock()
			}()
			for missing := outputMatches(want, out.String()); missing != ""; missing = outputMatches(want, out.String()) {
				if _, ok := exited(s); ok || ctx.Err() != nil {
					t.Fatalf("line %d: %s: no line %q in its output%s\n%s", b.line, b.script, missing, dead(), out)
				}
				time.Sleep(50 * time.Millisecond)
			}
			continue
		}
		// A command that waits for records (kcat -c) waits at most until
		// the test's deadline.
		timer := time.AfterFunc(time.Until(deadline(ctx)), func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
		err := cmd.Run()
		timer.Stop()
		if err != nil {
			t.Fatalf("line %d: %s: %v\n%s%s", b.line, b.script, err, out, dead())
		}
		if missing := outputMatches(want, out.String()); missing != "" {
			t.Fatalf("line %d: %s: no line %q in its output:\n%s%s", b.line, b.script, missing, out, dead())
		}
		if d := dead(); d != "" {
			t.Fatalf("after line %d:%s", b.line, d)
		}
	}

	// Ctrl-C, last started first: each server stops cleanly.
	for i := len(servers) - 1; i >= 0; i-- {
		s := servers[i]
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGINT)
		for {
			if err, ok := exited(s); ok {
				if err != nil {
					t.Errorf("line %d: %s: on Ctrl-C: %v\n%s", s.b.line, s.b.script, err, s.out)
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("line %d: %s: still running 90 s after the start\n%s", s.b.line, s.b.script, s.out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// tutorialBlocks reads the three kinds of block, and refuses an output
// block without its command and a block marked tutorial of no known kind.
func TestTutorialBlocks(t *testing.T) {
	md := "# x\n```sh\nnot run\n```\n```sh tutorial background\nserver\n```\n```text tutorial output\nready\n```\n" +
		"text\n```sh  tutorial\na\nb\n```\n"
	got, err := tutorialBlocks([]byte(md))
	if err != nil || len(got) != 2 || !got[0].background || got[0].script != "server" || len(got[0].want) != 1 ||
		got[1].background || got[1].script != "a\nb" || got[1].want != nil {
		t.Fatalf("%+v %v", got, err)
	}
	for _, bad := range []string{"```text tutorial output\nx\n```\n", "```sh tutorial\nx\n```\n```text tutorial output\n```\n```text tutorial output\n```\n",
		"```sh tutorial-bg\nx\n```\n", "```sh tutorial\nx\n"} {
		if _, err := tutorialBlocks([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if m := outputMatches([]string{"a  b…", "", "d"}, "x\na b c\nd\n"); m != "" {
		t.Errorf("missing %q", m)
	}
	if m := outputMatches([]string{"d", "a b…"}, "a b c\nd\n"); m != "a b…" {
		t.Errorf("out of order: %q", m)
	}
}
