// Package pglocal starts a throwaway PostgreSQL cluster from the locally
// installed server binaries: for tests when no server is configured, and for
// `dam demo`. It has no testing imports.
package pglocal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoBinaries: initdb and pg_ctl were found neither on PATH nor under
// /usr/lib/postgresql/*/bin.
var ErrNoBinaries = errors.New("pglocal: PostgreSQL server binaries (initdb, pg_ctl) not found; install PostgreSQL")

// Cluster is a running throwaway cluster. Stop it to remove it.
type Cluster struct {
	dir  string
	bin  string
	port int
	cred *syscall.Credential
	logf func(string, ...any)
	tls  *tlsFiles
	// durable: synchronous_commit on (see Durable).
	durable bool
	// conf: lines appended to postgresql.conf after initdb (withConf).
	conf []string
	// down: stopped by Kill, not yet started again.
	down bool
}

// tlsFiles are the server's certificate and key, PEM.
type tlsFiles struct{ cert, key string }

// Option configures Start.
type Option func(*Cluster)

// WithTLS makes the server speak TLS with the certificate and key in the
// given PEM files (copied into the cluster's directory), and accept TCP
// connections only over TLS (pg_hba.conf: hostssl only): a client with
// sslmode=disable is refused, and sslmode=verify-full checks the
// certificate against the client's root certificate and 127.0.0.1.
func WithTLS(certFile, keyFile string) Option {
	return func(c *Cluster) { c.tls = &tlsFiles{cert: certFile, key: keyFile} }
}

// Durable makes every commit reach the operating system before it is
// acknowledged (synchronous_commit=on; fsync stays off): a server crash
// (Restart) then loses no acknowledged commit, as with a real server,
// though an operating system crash could.
func Durable() Option {
	return func(c *Cluster) { c.durable = true }
}

// WithConf appends lines to postgresql.conf after initdb, such as
// shared_preload_libraries for an extension.
func WithConf(lines ...string) Option {
	return func(c *Cluster) { c.conf = append(c.conf, lines...) }
}

// Start initialises a cluster in a new temporary directory and starts it on
// a free TCP port of 127.0.0.1 (plus a unix socket in the directory), with
// trust authentication for user postgres and durability off (fsync=off,
// synchronous_commit=off) for speed; opts add TLS or durable commits.
// When running as root the server runs as the postgres user (or nobody),
// since PostgreSQL refuses to run as root. logf receives progress lines; it
// may be nil.
func Start(ctx context.Context, logf func(string, ...any), opts ...Option) (*Cluster, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	reapOnce.Do(func() { reapOrphans(logf) })
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("pglocal: %w", err)
	}
	if err := writeOwner(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := &Cluster{dir: dir, bin: bin, logf: logf}
	for _, o := range opts {
		o(c)
	}
	if os.Geteuid() == 0 {
		c.cred, err = unprivileged()
		if err == nil {
			err = os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid))
		}
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pglocal: running as root: %w", err)
		}
	}
	if err := c.run(ctx, "initdb", "-D", c.data(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if c.tls != nil {
		if err := c.setupTLS(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if len(c.conf) > 0 {
		conf := "\n# pglocal\n" + strings.Join(c.conf, "\n") + "\n"
		if err := appendFile(filepath.Join(c.data(), "postgresql.conf"), conf); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	// The port is free when probed but may be taken before the server binds
	// it: retry with another.
	for attempt := 0; ; attempt++ {
		c.port, err = freePort()
		if err == nil {
			err = c.startServer(ctx)
		}
		if err == nil {
			break
		}
		if attempt == 2 || ctx.Err() != nil {
			logf("pglocal: server log:\n%s", c.serverLog())
			os.RemoveAll(dir)
			return nil, err
		}
	}
	logf("pglocal: started PostgreSQL (%s) on 127.0.0.1:%d in %s", bin, c.port, dir)
	return c, nil
}

// startServer starts the server on c.port and waits for it to accept
// connections.
func (c *Cluster) startServer(ctx context.Context) error {
	sync := "off"
	if c.durable {
		sync = "on"
	}
	return c.run(ctx, "pg_ctl", "start", "-D", c.data(), "-w", "-t", "60",
		"-l", filepath.Join(c.dir, "server.log"), "-o", strings.Join([]string{
			"-p", strconv.Itoa(c.port), "-k", c.dir, "-c", "listen_addresses=127.0.0.1",
			"-c", "fsync=off", "-c", "synchronous_commit=" + sync, "-c", "full_page_writes=off",
			"-c", "max_connections=200",
		}, " "))
}

// Restart stops the server the way a crash does (immediate shutdown: every
// connection is cut, no checkpoint), keeps it down for down, and starts it
// again on the same port with the same data, which it recovers from its
// WAL: a server restart or failover as a client sees it, for fault tests.
// It is Kill, a wait, then Revive.
func (c *Cluster) Restart(ctx context.Context, down time.Duration) error {
	if err := c.Kill(ctx); err != nil {
		return err
	}
	select {
	case <-time.After(down):
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.Revive(ctx)
}

// Kill stops the server the way a crash does (immediate shutdown: every
// connection is cut, no checkpoint) and leaves it down, its data kept,
// until Revive: an outage of a length the caller chooses. Stop still
// removes a killed cluster.
func (c *Cluster) Kill(ctx context.Context) error {
	if err := c.run(ctx, "pg_ctl", "stop", "-D", c.data(), "-m", "immediate", "-w"); err != nil {
		return err
	}
	c.down = true
	return nil
}

// Revive starts a server stopped by Kill again on the same port with the
// same data, which it recovers from its WAL.
func (c *Cluster) Revive(ctx context.Context) error {
	if err := c.startServer(ctx); err != nil {
		c.logf("pglocal: server log:\n%s", c.serverLog())
		return err
	}
	c.down = false
	return nil
}

// DSN returns a connection string for the cluster's postgres database:
// sslmode=disable, or sslmode=require when started WithTLS (which encrypts
// but verifies nothing; add sslmode=verify-full and sslrootcert to a DSN
// built from Port to verify the server).
func (c *Cluster) DSN() string {
	mode := "disable"
	if c.tls != nil {
		mode = "require"
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=%s", c.port, mode)
}

// Port is the server's TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// setupTLS copies the certificate and key where the server (perhaps
// another user) can read them, the key private to it as PostgreSQL
// requires, turns ssl on and allows TCP connections over TLS only.
func (c *Cluster) setupTLS() error {
	cert, key := filepath.Join(c.dir, "server.crt"), filepath.Join(c.dir, "server.key")
	for _, f := range []struct {
		from, to string
		mode     os.FileMode
	}{{c.tls.cert, cert, 0o644}, {c.tls.key, key, 0o600}} {
		b, err := os.ReadFile(f.from)
		if err != nil {
			return fmt.Errorf("pglocal: tls: %w", err)
		}
		if err := os.WriteFile(f.to, b, f.mode); err != nil {
			return fmt.Errorf("pglocal: tls: %w", err)
		}
		if c.cred != nil {
			if err := os.Chown(f.to, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return fmt.Errorf("pglocal: tls: %w", err)
			}
		}
	}
	conf := fmt.Sprintf("\n# pglocal.WithTLS\nssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\n", cert, key)
	if err := appendFile(filepath.Join(c.data(), "postgresql.conf"), conf); err != nil {
		return err
	}
	// Overwriting keeps the file's owner (the server's user).
	hba := "# pglocal.WithTLS: TCP only over TLS\nlocal all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n"
	if err := os.WriteFile(filepath.Join(c.data(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return fmt.Errorf("pglocal: tls: %w", err)
	}
	return nil
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return fmt.Errorf("pglocal: %w", err)
	}
	return f.Close()
}

// Stop stops the server immediately (no checkpoint: the data is thrown
// away), unless Kill left it down, and removes its directory.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // Stop has no caller context
	defer cancel()
	var err error
	if !c.down {
		err = c.run(ctx, "pg_ctl", "stop", "-D", c.data(), "-m", "immediate", "-w")
	}
	if rerr := os.RemoveAll(c.dir); err == nil && rerr != nil {
		err = fmt.Errorf("pglocal: %w", rerr)
	}
	return err
}

// Reachable reports whether a PostgreSQL server answers at dsn: it connects
// and pings, within ctx.
func Reachable(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	defer conn.Close(ctx)
	if err := conn.Ping(ctx); err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	return nil
}

// ReachableOrStart returns dsn when a server answers there within 3
// seconds, else the DSN of a throwaway cluster it starts (saying so through
// logf), with the function that stops it (a no-op for dsn's server): what
// the benchmarks use when no server is configured.
func ReachableOrStart(ctx context.Context, dsn string, logf func(string, ...any)) (string, func(), error) {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := Reachable(cctx, dsn)
	cancel()
	if err == nil {
		return dsn, func() {}, nil
	}
	logf("%s unreachable (%v): starting a throwaway PostgreSQL", dsn, err)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, err := Start(sctx, logf)
	if err != nil {
		return "", nil, err
	}
	return c.DSN(), func() {
		if err := c.Stop(); err != nil {
			logf("%v", err)
		}
	}, nil
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) serverLog() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
	return string(b)
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	if c.cred != nil {
		// The server's own libpq connections (Citus's to other nodes)
		// look for client certificates under $HOME/.postgresql, and fail
		// when they may not even look, as in root's /root: give the
		// server's user a HOME it can read.
		cmd.Env = append(cmd.Env, "HOME="+c.dir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pglocal: %s %s: %w: %s", name, args[0], err, strings.TrimSpace(out.String()))
	}
	return nil
}

// unprivileged returns the credentials of the postgres user, else nobody.
func unprivileged() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("no postgres or nobody user to run the server as")
}

// BinDir returns the directory holding the initdb and pg_ctl that Start
// uses: PATH first, then the highest version under /usr/lib/postgresql.
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return pgVersion(matches[i]) > pgVersion(matches[j]) })
	for _, m := range matches {
		dir := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	return "", ErrNoBinaries
}

// pgVersion extracts N from /usr/lib/postgresql/N/bin/initdb for ordering.
func pgVersion(path string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(filepath.Dir(path))), 64)
	return v
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pglocal: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
