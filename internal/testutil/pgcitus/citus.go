// Package pgcitus starts a throwaway Citus cluster for tests and benches: a
// coordinator and workers, each a pglocal cluster on 127.0.0.1.
package pgcitus

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/internal/pglocal"
)

// ErrNoCitus: the Citus extension is not installed in the PostgreSQL whose
// binaries pglocal uses.
var ErrNoCitus = errors.New("pgcitus: the Citus extension is not installed; " +
	"`make test-citus` installs it (scripts/install-citus.sh), or run ../shared/citus/build.sh")

// ShardCount is the citus.shard_count of a Start coordinator:
// each distributed table gets this many shards. Citus's default, 32, makes
// creating (and dropping) a schema of distributed tables per test slow; 4
// still spreads every table over two workers.
const ShardCount = 4

// Cluster is a running throwaway Citus cluster: a coordinator and its
// workers, each a Cluster of its own. Stop it to remove it.
type Cluster struct {
	coord   *pglocal.Cluster
	workers []*pglocal.Cluster
}

// Installed reports whether the Citus extension (citus.so and
// citus.control) is installed in the PostgreSQL whose binaries Start uses;
// if not, the error wraps ErrNoCitus and names the paths it looked at.
func Installed() error {
	bin, err := pglocal.BinDir()
	if err != nil {
		return err
	}
	return installed(bin)
}

func installed(bin string) error {
	// The server loads the library: look beside the real postgres binary
	// (bin may hold symlinks, as /usr/local/bin to Debian's). pg_config
	// knows the layout; without it, assume Debian's
	// (/usr/lib/postgresql/N/{bin,lib}, /usr/share/postgresql/N).
	if real, err := filepath.EvalSymlinks(filepath.Join(bin, "postgres")); err == nil {
		bin = filepath.Dir(real)
	}
	libdir, sharedir := filepath.Join(filepath.Dir(bin), "lib"), ""
	if out, err := exec.Command(filepath.Join(bin, "pg_config"), "--pkglibdir", "--sharedir").Output(); err == nil {
		if f := strings.Fields(string(out)); len(f) == 2 {
			libdir, sharedir = f[0], f[1]
		}
	}
	so := filepath.Join(libdir, "citus.so")
	if _, err := os.Stat(so); err != nil {
		return fmt.Errorf("%w (no %s for the PostgreSQL in %s)", ErrNoCitus, so, bin)
	}
	if sharedir != "" {
		control := filepath.Join(sharedir, "extension", "citus.control")
		if _, err := os.Stat(control); err != nil {
			return fmt.Errorf("%w (%s exists but %s does not)", ErrNoCitus, so, control)
		}
	}
	return nil
}

// Start starts a Citus cluster from the installed binaries: a
// coordinator and workers worker nodes (at least 1), each a cluster as
// Start makes it, on its own port of 127.0.0.1, with
// shared_preload_libraries = 'citus', max_prepared_transactions = 200 (for
// two-phase commits), durable commits (see Durable: tests kill workers)
// and the citus extension created in the postgres database. The workers
// are added to the coordinator (citus_add_node), whose citus.shard_count
// is ShardCount. opts apply to every node. It fails with an error
// wrapping ErrNoCitus when Citus is not installed.
//
// Clients connect to the coordinator (DSN); Worker gives the workers'
// clusters, to Restart, Kill or Revive one: each keeps its port, so the
// coordinator finds it again.
func Start(ctx context.Context, logf func(string, ...any), workers int, opts ...pglocal.Option) (*Cluster, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if workers < 1 {
		return nil, fmt.Errorf("pgcitus: Start: %d workers, want at least 1", workers)
	}
	bin, err := pglocal.BinDir()
	if err != nil {
		return nil, err
	}
	if err := installed(bin); err != nil {
		return nil, err
	}
	node := append([]pglocal.Option{pglocal.Durable(), pglocal.WithConf(
		"shared_preload_libraries = 'citus'",
		"max_prepared_transactions = 200",
	)}, opts...)
	coordOpts := append(append([]pglocal.Option(nil), node...), pglocal.WithConf(
		fmt.Sprintf("citus.shard_count = %d", ShardCount),
	))

	// The nodes start in parallel: initdb and the first start dominate.
	cc := &Cluster{workers: make([]*pglocal.Cluster, workers)}
	errs := make([]error, workers+1)
	var wg sync.WaitGroup
	for i := 0; i <= workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c *pglocal.Cluster
			if i == 0 {
				c, errs[i] = pglocal.Start(ctx, logf, coordOpts...)
				cc.coord = c
			} else {
				c, errs[i] = pglocal.Start(ctx, logf, node...)
				cc.workers[i-1] = c
			}
			if errs[i] == nil {
				errs[i] = execAll(ctx, c.DSN(), "CREATE EXTENSION citus")
			}
		}()
	}
	wg.Wait()
	err = errors.Join(errs...)
	if err == nil {
		sql := []string{fmt.Sprintf("SELECT citus_set_coordinator_host('127.0.0.1', %d)", cc.coord.Port())}
		for _, w := range cc.workers {
			sql = append(sql, fmt.Sprintf("SELECT citus_add_node('127.0.0.1', %d)", w.Port()))
		}
		err = execAll(ctx, cc.coord.DSN(), sql...)
	}
	if err != nil {
		cc.Stop()
		return nil, fmt.Errorf("pgcitus: Start: %w", err)
	}
	logf("pgcitus: started Citus: coordinator on 127.0.0.1:%d, %d workers", cc.coord.Port(), workers)
	return cc, nil
}

// DSN returns a connection string for the coordinator's postgres database
// (see pglocal.Cluster.DSN).
func (cc *Cluster) DSN() string { return cc.coord.DSN() }

// Coordinator returns the coordinator's cluster.
func (cc *Cluster) Coordinator() *pglocal.Cluster { return cc.coord }

// Workers returns the workers' clusters, in the order they were added.
func (cc *Cluster) Workers() []*pglocal.Cluster {
	return append([]*pglocal.Cluster(nil), cc.workers...)
}

// Worker returns worker i's cluster (0-based).
func (cc *Cluster) Worker(i int) *pglocal.Cluster { return cc.workers[i] }

// Stop stops every node (see pglocal.Cluster.Stop) and removes them.
func (cc *Cluster) Stop() error {
	var errs []error
	for _, c := range append([]*pglocal.Cluster{cc.coord}, cc.workers...) {
		if c != nil {
			errs = append(errs, c.Stop())
		}
	}
	return errors.Join(errs...)
}

// execAll runs each statement on one connection to dsn.
func execAll(ctx context.Context, dsn string, sql ...string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("pgcitus: %w", err)
	}
	defer conn.Close(context.Background())
	for _, s := range sql {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgcitus: %s: %w", s, err)
		}
	}
	return nil
}
