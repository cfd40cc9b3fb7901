// Package damproc runs the built dam binary as a process, for the suites
// and benchmarks that test it from outside: it builds ./cmd/dam once per
// process and build options, starts it with its output in a log file (or
// writers), waits until its /readyz answers 200, scrapes its /metrics and
// stops it, with SIGTERM and a grace period, or with SIGKILL.
//
// It is a test library: dam itself never imports it.
package damproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BuildOptions say how to build dam.
type BuildOptions struct {
	// Dir is the root of the source tree to build (a worktree of another
	// revision); "" is this module's.
	Dir string
	// Tags are the build tags, comma separated ("damtest" compiles in the
	// test hooks); "" builds the production binary.
	Tags string
	// LDFlags are the linker flags (-X main.version=...).
	LDFlags string
}

var (
	buildsMu sync.Mutex
	builds   = map[BuildOptions]*build{}
)

type build struct {
	once sync.Once
	bin  string
	err  error
}

// Build builds ./cmd/dam as o says, once per process and o: callers with
// the same options, concurrent or not, share the binary. It lives in a
// directory of the system's temporary directory named after this
// process (damproc-PID-*), which outlives it (a test binary may end in
// os.Exit); each Build removes those of processes that have exited.
func Build(o BuildOptions) (string, error) {
	buildsMu.Lock()
	b := builds[o]
	if b == nil {
		b = &build{}
		builds[o] = b
	}
	buildsMu.Unlock()
	b.once.Do(func() { b.bin, b.err = buildDam(o) })
	return b.bin, b.err
}

func buildDam(o BuildOptions) (string, error) {
	removeStale()
	src := o.Dir
	if src == "" {
		root, err := ModuleRoot()
		if err != nil {
			return "", err
		}
		src = root
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("damproc-%d-", os.Getpid()))
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "dam")
	args := []string{"build", "-o", bin}
	if o.Tags != "" {
		args = append(args, "-tags", o.Tags)
	}
	if o.LDFlags != "" {
		args = append(args, "-ldflags", o.LDFlags)
	}
	cmd := exec.Command("go", append(args, "./cmd/dam")...)
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("damproc: go %s in %s: %v\n%s", strings.Join(cmd.Args[1:], " "), src, err, out)
	}
	return bin, nil
}

// removeStale removes the build directories of processes that have
// exited: a running suite's binary is never removed under it.
func removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "damproc-*-*"))
	for _, d := range dirs {
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(d), "damproc-%d-", &pid); err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

// ModuleRoot returns the directory of the go.mod of the module that the
// current directory is in.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("damproc: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("damproc: go env GOMOD: not inside a module")
	}
	return filepath.Dir(gomod), nil
}

// FreeAddr returns a 127.0.0.1:port address that was free a moment ago:
// for a listener of a process about to start.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// FreePort is FreeAddr's port.
func FreePort() (int, error) {
	addr, err := FreeAddr()
	if err != nil {
		return 0, err
	}
	_, port, _ := net.SplitHostPort(addr)
	var p int
	_, err = fmt.Sscan(port, &p)
	return p, err
}

// Options say how to start a process.
type Options struct {
	// Args is the command line, the program first: dam's binary (Build)
	// and its arguments, or any other program.
	Args []string
	// Env is added to this process's environment; with CleanEnv, it is
	// the whole environment.
	Env      []string
	CleanEnv bool
	// Dir is the working directory; "" is this process's.
	Dir string
	// Log is a file that takes the process's standard output and error;
	// "" sends them to Stdout and Stderr (nil: discarded).
	Log            string
	Stdout, Stderr io.Writer
	// HTTP is the address of the process's HTTP listener (dam's
	// http.listen or serve.listen), for Ready, WaitReady and Scrape.
	HTTP string
	// SysProcAttr is passed on (a cgroup to start in).
	SysProcAttr *syscall.SysProcAttr
}

// Process is a started process.
type Process struct {
	opts Options
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the exit error, once done is closed
}

// Start starts a process. Stop or Kill it; Done is closed when it has
// exited.
func Start(o Options) (*Process, error) {
	if len(o.Args) == 0 {
		return nil, errors.New("damproc: Start: no program")
	}
	cmd := exec.Command(o.Args[0], o.Args[1:]...)
	cmd.Dir = o.Dir
	switch {
	case o.CleanEnv:
		cmd.Env = append([]string{}, o.Env...)
	case len(o.Env) > 0:
		cmd.Env = append(os.Environ(), o.Env...)
	}
	cmd.SysProcAttr = o.SysProcAttr
	var logFile *os.File
	if o.Log != "" {
		f, err := os.Create(o.Log)
		if err != nil {
			return nil, err
		}
		logFile = f
		cmd.Stdout, cmd.Stderr = f, f
	} else {
		cmd.Stdout, cmd.Stderr = o.Stdout, o.Stderr
	}
	if err := cmd.Start(); err != nil {
		if logFile != nil {
			logFile.Close()
		}
		return nil, fmt.Errorf("damproc: start %s: %w", filepath.Base(o.Args[0]), err)
	}
	p := &Process{opts: o, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		if logFile != nil {
			logFile.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// PID is the process's id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Log is the path of the process's log file ("" without one).
func (p *Process) Log() string { return p.opts.Log }

// HTTP is the address of the process's HTTP listener.
func (p *Process) HTTP() string { return p.opts.HTTP }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and then its exit error
// (nil: status 0).
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Wait waits for the process to exit and returns its exit error.
func (p *Process) Wait() error {
	<-p.done
	return p.err
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits up to grace for the exit, then sends
// SIGKILL. It returns how long the process took to exit, whether it had
// to be killed, and its exit error (nil: status 0).
func (p *Process) Stop(grace time.Duration) (took time.Duration, killed bool, err error) {
	start := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		killed = true
		p.Kill()
	}
	return time.Since(start), killed, p.err
}

var client = &http.Client{Timeout: 5 * time.Second}

// Ready returns the status of the process's /readyz (0 when it does not
// answer).
func (p *Process) Ready(ctx context.Context) int {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+p.opts.HTTP+"/readyz", nil)
	if err != nil {
		return 0
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// WaitReady polls /readyz every 100 ms until it answers 200. It fails
// when the process exits first, or after limit.
func (p *Process) WaitReady(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := 0
	for {
		if last = p.Ready(ctx); last == http.StatusOK {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("damproc: %s exited before it was ready: %v", filepath.Base(p.opts.Args[0]), p.err)
		case <-ctx.Done():
			return fmt.Errorf("damproc: %s not ready within %s (/readyz: %d)", filepath.Base(p.opts.Args[0]), limit, last)
		case <-tick.C:
		}
	}
}

// Scrape reads the process's /metrics.
func (p *Process) Scrape(ctx context.Context) (Metrics, error) {
	return Scrape(ctx, p.opts.HTTP)
}

// Tail returns the last n lines of the process's log file.
func (p *Process) Tail(n int) string {
	data, err := os.ReadFile(p.opts.Log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if n > 0 && len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
