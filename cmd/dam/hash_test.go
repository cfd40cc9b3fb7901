package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/canon"
)

func runHash(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(append([]string{"hash"}, args...), strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func digestOf(t *testing.T, value string, opts ...canon.Option) string {
	t.Helper()
	h, err := canon.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	d, err := h.Sum([]byte(value))
	if err != nil {
		t.Fatal(err)
	}
	return d.String() + "\n"
}

func TestHashCmd(t *testing.T) {
	file := filepath.Join(t.TempDir(), "v.json")
	if err := os.WriteFile(file, []byte(`{"a":1,"b":"x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	banana := `{"banana_id":"B-007","ripeness_level":"Perfectly Yellow"}`
	tests := []struct {
		name       string
		args       []string
		stdin      string
		code       int
		stdout     string
		stderrHas  string
		stderrNone bool
	}{
		{name: "stdin", stdin: banana, stdout: digestOf(t, banana), stderrNone: true},
		{name: "member order", stdin: `{"ripeness_level":"Perfectly Yellow","banana_id":"B-007"}` + "\n", stdout: digestOf(t, banana)},
		{name: "dash is stdin", args: []string{"-"}, stdin: banana, stdout: digestOf(t, banana)},
		{name: "file", args: []string{file}, stdout: digestOf(t, `{"b":"x","a":1}`)},
		{name: "ignore", args: []string{"--ignore", "/ts", "--ignore", "/items/*/ts"},
			stdin: `{"ts":1,"items":[{"ts":2,"v":1}]}`, stdout: digestOf(t, `{"items":[{"v":1}]}`)},
		{name: "bytes format", args: []string{"--format", "bytes"}, stdin: "\x00\xff",
			stdout: digestOf(t, "\x00\xff", canon.WithFormat(canon.FormatBytes))},
		{name: "empty bytes", args: []string{"--format", "bytes"}, stdin: "",
			stdout: digestOf(t, "", canon.WithFormat(canon.FormatBytes))},
		{name: "lines", args: []string{"--lines"}, stdin: "{\"a\":1}\n\n  \n[1]\r\n\"x\"",
			stdout: digestOf(t, `{"a":1}`) + digestOf(t, `[1]`) + digestOf(t, `"x"`)},
		{name: "explain", args: []string{"--explain", "--ignore", "/ts"}, stdin: `{"b":[1],"ts":0,"a":"\u00e9"}`,
			stdout: "{\n  \"a\": \"é\",\n  \"b\": [\n    1\n  ]\n}\n"},
		{name: "explain lines", args: []string{"--explain", "--lines"}, stdin: "1\n{}\n", stdout: "1\n{}\n"},
		{name: "invalid", stdin: `{"a":1,"a":2}`, code: 1,
			stderrHas: "dam: invalid JSON at byte 7: duplicate member: \"a\"\n"},
		{name: "empty input", stdin: "", code: 1, stderrHas: "dam: invalid JSON at byte 0: syntax error"},
		{name: "trailing data", stdin: "{} {}", code: 1, stderrHas: "dam: invalid JSON at byte 3: data after the top-level value"},
		{name: "invalid line", args: []string{"--lines"}, stdin: "1\n\n[1,]\n2\n", code: 1,
			stdout: digestOf(t, "1"), stderrHas: "dam: invalid JSON at line 3, byte 3: syntax error"},
		{name: "too large", stdin: `"` + strings.Repeat("a", canon.DefaultMaxSize) + `"`, code: 1,
			stderrHas: "dam: invalid JSON at byte 1048576: value too large"},
		{name: "line too long", args: []string{"--lines"}, stdin: "1\n" + strings.Repeat("1", canon.DefaultMaxSize+2) + "\n", code: 1,
			stdout: digestOf(t, "1"), stderrHas: "dam: invalid JSON at line 2, byte 1048576: value too large"},
		{name: "bad pointer", args: []string{"--ignore", "/a~2"}, code: 2,
			stderrHas: `ignore pointer "/a~2": invalid escape "~2" at byte 2`},
		{name: "empty pointer", args: []string{"--ignore", ""}, code: 2, stderrHas: "ignore pointer"},
		{name: "unknown format", args: []string{"--format", "xml"}, code: 2, stderrHas: `unknown format "xml"`},
		{name: "extra args", args: []string{"a", "b"}, code: 2, stderrHas: "dam: "},
		{name: "unknown flag", args: []string{"--nope"}, code: 2, stderrHas: "unknown flag"},
		{name: "missing file", args: []string{filepath.Join(t.TempDir(), "nope")}, code: 1, stderrHas: "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runHash(t, tt.stdin, tt.args...)
			if code != tt.code {
				t.Errorf("exit status %d, want %d (stderr %q)", code, tt.code, stderr)
			}
			if tt.stdout != "" || tt.code == 0 {
				if stdout != tt.stdout {
					t.Errorf("stdout %q, want %q", stdout, tt.stdout)
				}
			}
			if tt.stderrHas != "" && !strings.Contains(stderr, tt.stderrHas) {
				t.Errorf("stderr %q, want it to contain %q", stderr, tt.stderrHas)
			}
			if tt.stderrNone && stderr != "" {
				t.Errorf("stderr %q, want none", stderr)
			}
			if strings.Contains(stderr, "goroutine ") || strings.Count(stderr, "\n") > 1 {
				t.Errorf("stderr is not one line: %q", stderr)
			}
		})
	}
}
