package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// tapTestToken is the tap token of the tests' sidecars.
const tapTestToken = "tap-0123456789abcdef-ZYXW"

// startTapSidecar runs a sidecar of route s (in -> out, no dead-letter
// topic) with the tap enabled, and returns its HTTP address once it is
// ready. It stops with the test.
func startTapSidecar(t *testing.T, kc *testkafka.Cluster) string {
	t.Helper()
	cfg := sidecarConfig(t, kc, pgtest.DSN(t), func(c *config.Config) {
		c.HTTP.Tap = config.Tap{Enabled: true, Token: tapTestToken, MaxReaders: 2}
	})
	addr, _ := startSidecar(t, cfg)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if code, _ := readyz(t, addr); code == http.StatusOK {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatal("the sidecar is not ready")
		}
	}
}

// lockedLines collects a command's output lines as they come.
type lockedLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *lockedLines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// runTapCmd runs dam tap with args until the test ends, collecting its
// output lines.
func runTapCmd(t *testing.T, args ...string) *lockedLines {
	t.Helper()
	pr, pw := io.Pipe()
	out := &lockedLines{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		root := newRootCmd(strings.NewReader(""), pw, io.Discard)
		root.SetArgs(append([]string{"tap"}, args...))
		if err := root.ExecuteContext(ctx); err != nil {
			t.Errorf("dam tap: %v", err)
		}
		pw.Close()
	}()
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			out.mu.Lock()
			out.lines = append(out.lines, sc.Text())
			out.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return out
}

// waitLines waits until ok accepts the lines.
func waitLines(t *testing.T, l *lockedLines, what string, ok func([]string) bool) []string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if lines := l.all(); ok(lines) {
			return lines
		}
	}
	t.Fatalf("%s: dam tap printed %q", what, l.all())
	return nil
}

// dam tap, on a running sidecar, shows every drop with the offset of the
// content it duplicates, whether that content was forwarded in the same
// decided batch or an earlier one, and nothing but drops when asked for
// drops; -o json gives the same as NDJSON. The stream outlives the
// server's read and write timeouts while idle.
func TestTapShowsEveryDropWithItsSource(t *testing.T) {
	saved := sidecarHTTP
	sidecarHTTP.read, sidecarHTTP.write = time.Second, time.Second
	t.Cleanup(func() { sidecarHTTP = saved })
	kc := testkafka.New(t, 1, "in", "out")
	addr := startTapSidecar(t, kc)

	drops := runTapCmd(t, "--addr", addr, "--token", tapTestToken, "--decision", "drop")
	all := runTapCmd(t, "--addr", addr, "--token", tapTestToken, "-o", "json")
	// Attached once a warm-up drop shows.
	for i := 0; ; i++ {
		kc.Produce("in", &kgo.Record{Key: []byte("warm"), Value: []byte(`{"w":1}`)})
		time.Sleep(100 * time.Millisecond)
		if len(drops.all()) > 0 && len(all.all()) > 1 {
			break
		}
		if i > 200 {
			t.Fatalf("no warm-up drop tapped: %q %q", drops.all(), all.all())
		}
	}
	time.Sleep(2500 * time.Millisecond) // idle past the server's timeouts
	start := len(drops.all())
	startAll := len(all.all())

	// Offsets of the next records: the warm-ups so far, then these.
	var base int64
	for _, l := range all.all() {
		var tl pipeline.TapLine
		if err := json.Unmarshal([]byte(l), &tl); err == nil && tl.Offset >= base {
			base = tl.Offset + 1
		}
	}
	waves := [][][2]string{
		{{"k1", `{"a":1}`}, {"k1", `{"a":1}`}, {"k2", `{"x":1}`}},
		{{"k1", `{"a":1}`}, {"k2", `{"x":1}`}, {"k1", `{"a":2}`}, {"k1", `{"a":2}`}},
		{{"k1", `{"a":1}`}, {"k1", `{"a":1}`}, {"k2", `{"x":1}`}},
	}
	type drop struct {
		offset, of int64
		key        string
	}
	var want []drop
	last := map[string]struct {
		value  string
		offset int64
	}{}
	off := base
	for _, wave := range waves {
		for _, kv := range wave {
			kc.Produce("in", &kgo.Record{Key: []byte(kv[0]), Value: []byte(kv[1])})
			if l, ok := last[kv[0]]; ok && l.value == kv[1] {
				want = append(want, drop{off, l.offset, kv[0]})
			} else {
				last[kv[0]] = struct {
					value  string
					offset int64
				}{kv[1], off}
			}
			off++
		}
		time.Sleep(300 * time.Millisecond)
	}
	lines := waitLines(t, drops, "every drop", func(l []string) bool { return len(l)-start >= len(want) })[start:]
	if len(lines) != len(want) {
		t.Fatalf("tapped drops %q, want %d", lines, len(want))
	}
	for i, w := range want {
		line := fmt.Sprintf("s in/0@%d %s drop: duplicate of the content forwarded from offset %d", w.offset, w.key, w.of)
		if lines[i] != line {
			t.Errorf("drop %d: %q, want %q", i, lines[i], line)
		}
	}

	jl := waitLines(t, all, "every decision as JSON", func(l []string) bool { return len(l)-startAll >= int(off-base) })[startAll:]
	var jdrops int
	for _, l := range jl {
		var tl pipeline.TapLine
		if err := json.Unmarshal([]byte(l), &tl); err != nil {
			t.Fatalf("-o json line %q: %v", l, err)
		}
		if tl.Decision == pipeline.TapDrop {
			w := want[jdrops]
			if tl.Offset != w.offset || tl.DuplicateOf == nil || tl.DuplicateOf.Offset != w.of || tl.DuplicateOf.Topic != "in" || tl.Entity != w.key {
				t.Errorf("json drop %d: %s, want offset %d duplicate_of %d", jdrops, l, w.offset, w.of)
			}
			jdrops++
		} else if tl.Decision != pipeline.TapForward {
			t.Errorf("json line %s: want a forward or a drop", l)
		}
	}
	if jdrops != len(want) {
		t.Errorf("-o json showed %d drops, want %d", jdrops, len(want))
	}
}

// The tap answers only a bearer token of http.tap: no token and a wrong
// one get 401, a filter it cannot read 400, and one reader beyond
// max_readers 503.
func TestTapNeedsItsToken(t *testing.T) {
	kc := testkafka.New(t, 1, "in", "out")
	addr := startTapSidecar(t, kc)
	get := func(token, query string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/tap?"+query, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		token, query string
		want         int
	}{
		{"", "", http.StatusUnauthorized},
		{"tap-0123456789abcdef-ZYXV", "", http.StatusUnauthorized},
		{tapTestToken, "decision=maybe", http.StatusBadRequest},
		{tapTestToken, "sample=2", http.StatusBadRequest},
	} {
		if got := get(tc.token, tc.query); got != tc.want {
			t.Errorf("token %q query %q: %d, want %d", tc.token, tc.query, got, tc.want)
		}
	}
	// Two readers hold their streams open: each is attached once its 200
	// has arrived, so the third is refused whatever the timing.
	for i := 0; i < 2; i++ {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/tap", nil)
		req.Header.Set("Authorization", "Bearer "+tapTestToken)
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("reader %d of max_readers 2: %d, want 200", i+1, resp.StatusCode)
		}
	}
	if got := get(tapTestToken, ""); got != http.StatusServiceUnavailable {
		t.Errorf("a third reader of max_readers 2: %d, want 503", got)
	}
	if code, _, errOut := runDam(t, "tap", "--addr", addr, "--token", "tap-0123456789abcdef-ZYXV"); code != 1 || !regexp.MustCompile(`401.*refuses the token`).MatchString(errOut) {
		t.Errorf("dam tap with a wrong token: exit %d, %q", code, errOut)
	}
}

// What dam tap prints of a decision is safe on a terminal: a reason or an
// entity that quotes hostile input has its controls escaped.
func TestTapTextEscapes(t *testing.T) {
	got := tapText(pipeline.TapLine{Service: "s", Topic: "in", Offset: 3, Entity: "a b", Decision: "dead-letter", Reason: "bad input: \x1b[2J\u202e"})
	if want := "s in/0@3 \"a b\" dead-letter: bad input: \\u001b[2J\\u202e\n"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}
