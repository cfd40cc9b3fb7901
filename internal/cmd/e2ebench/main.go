// Command e2ebench is dam's end-to-end benchmark (not a timed test). In one
// run, on the same broker and database setup, it compares:
//
//   - passthrough: consume, produce the batch, wait for the acks, commit,
//     with the pipeline's franz-go settings: the ceiling;
//   - naive: the seeds' design, per record a hash, an autocommit CAS
//     statement in PostgreSQL, a produce if forwarded and a synchronous
//     offset commit; run on a prefix of the stream (-naive-records);
//   - dam: the real binary, `dam run`, on its own fresh schema, with the
//     route's entity the record key (entity: key);
//   - dam-pointer: the same, with the entity read from the value
//     (entity: /id, which holds the same string as the key), to compare
//     a pointer entity with the key on the same data. By default both dam
//     variants run twice, in both orders (single runs are noisy on a
//     shared machine, and the order cancels a drift along the benchmark),
//     and their ratio is taken over all their runs;
//   - dam-small and dam-pointer-small: dam and dam-pointer on records of
//     ~190 B (the projection's top-level fields alone), where the pointer
//     entity's share of a record's cost is larger; compared likewise;
//   - dam-eos: dam (entity: key) with kafka.delivery: exactly-once, its
//     rate compared with dam's over all dam's runs;
//   - dam-analyze: `dam analyze` on the same backlog with the route of dam,
//     reading and deciding only (no changed paths, no what-if runs), run
//     beside each of dam's runs and its rate over all its runs compared
//     with dam's over all dam's: it decides in memory,
//     with no PostgreSQL and no writes; dam-analyze-full: with the
//     command's defaults (changed paths, and what-if runs that read the
//     backlog again), shown beside it;
//   - dam-tap: dam (entity: key) with http.tap enabled and one reader of
//     GET /v1/tap attached (as `dam tap -o json` reads it, from as soon as
//     the listener answers), its rate compared with dam's over all their
//     runs: what watching the decisions live costs the hot path. It runs
//     twice, in both orders around dam's runs, for the same reason;
//   - dam-citus: dam on a Citus cluster of its own (a coordinator and
//     -citus-workers workers on this machine), next to dam-single, dam on
//     one throwaway server with the same settings as each Citus node; the
//     two run twice, in both orders, and are compared as a ratio of their
//     medians (against its targets: 0.5x, a steady p50 under 50 ms), with
//     PostgreSQL's CPU per record summed over every node (see citus.go),
//     followed by how Citus runs each
//     statement of dam's store (tests/citusplan). Without Citus
//     installed both are skipped, saying so.
//
// Each variant gets a fresh in-process kfake cluster with the input
// pre-produced, then runs as its own process (passthrough and naive are
// this program with -child) so that peak RSS (VmHWM) is read the same way.
// Throughput is measured on the backlog, from the process start until the
// group's committed offsets reach the end offsets; latency (poll to commit,
// the dam_poll_to_commit_seconds histogram scraped from /metrics) in a
// following steady phase at -rate records/s produced live.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/internal/pglocal"
	"github.com/dam-dedup/dam/internal/testutil/damproc"
	"github.com/dam-dedup/dam/migrations"
)

const (
	envDSN     = "DAM_TEST_POSTGRES_DSN"
	defaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	partitions = 6
	group      = "e2ebench"
)

type options struct {
	records, entities, naiveRecords int
	rate                            int
	steady                          time.Duration
	dupRate                         float64
	dsn                             string
	variants                        string
	batchSize, maxInFlight          int
	maxConns                        int
	maxBatch                        int
	damBin                          string
	decideBest                      float64 // records/s of the best Decide benchmark batch, this run
	decideBestName                  string
	base                            string // git revision of the dam-base variant
	profile                         string // directory of the dam variants' CPU profiles
	baseBin                         string
	// compression is dam's kafka.compression in every dam variant (the
	// base's too when it knows the key): snappy, what the passthrough and
	// the versions before the key (franz-go's default) use, so that every
	// variant writes the same bytes.
	compression     string
	baseCompression bool // the base accepts kafka.compression
	// citusWorkers is dam-citus's number of workers; citusRecords the
	// backlog of dam-single and dam-citus (0: records).
	citusWorkers, citusRecords int
	citusCachedConns           int
}

func main() {
	var o options
	var ca childArgs
	flag.StringVar(&ca.kind, "child", "", "internal: run as the passthrough or naive child")
	flag.StringVar(&ca.brokers, "brokers", "", "internal (child): broker")
	flag.StringVar(&ca.group, "group", group, "internal (child): consumer group")
	flag.StringVar(&ca.in, "in", "", "internal (child): input topic")
	flag.StringVar(&ca.out, "out", "", "internal (child): output topic")
	flag.StringVar(&ca.http, "http", "", "internal (child): /metrics listen address")
	flag.IntVar(&o.records, "records", 1_000_000, "records in the backlog (passthrough and dam)")
	flag.IntVar(&o.entities, "entities", 100_000, "distinct entities (record keys)")
	flag.IntVar(&o.naiveRecords, "naive-records", 50_000, "records in the naive variant's backlog (a prefix of the same stream)")
	flag.IntVar(&o.rate, "rate", 1000, "records/s produced live in the steady phase")
	flag.DurationVar(&o.steady, "steady", 5*time.Second, "duration of the steady phase")
	flag.Float64Var(&o.dupRate, "dup-rate", 0.30, "share of records repeating their entity's content")
	flag.StringVar(&o.dsn, "dsn", "", "PostgreSQL DSN (default $"+envDSN+", else "+defaultDSN+", else a throwaway local cluster)")
	flag.StringVar(&o.variants, "variants", "passthrough,naive,dam-base,dam,dam-analyze,dam-tap,dam-pointer,dam-eos,dam-pointer,dam-tap,dam,dam-analyze,dam-base,dam-small,dam-pointer-small,dam-pointer-small,dam-small,dam-eos,dam-tap,dam,dam-analyze,dam-analyze-full,dam-single,dam-citus,dam-citus,dam-single",
		"variants to run, in order (dam-base: dam built at -base; dam-pointer: dam with entity: /id; dam-small, dam-pointer-small: the same on ~190 B records; the dam variants run in both orders; dam-eos: dam with kafka.delivery: exactly-once; dam-tap: dam with one tap reader attached; dam-analyze: dam analyze reading and deciding the backlog, dam-analyze-full: with its changed paths and what-if runs; dam-citus: dam on a Citus cluster, dam-single: on one server set up as its nodes)")
	flag.IntVar(&o.citusWorkers, "citus-workers", 2, "workers of dam-citus's Citus cluster")
	flag.IntVar(&o.citusRecords, "citus-records", 0, "records in the backlog of dam-single and dam-citus (0: -records)")
	flag.IntVar(&o.citusCachedConns, "citus-cached-conns", 0, "citus.max_cached_conns_per_worker of dam-citus's coordinator (0: Citus's default, 1)")
	flag.IntVar(&o.batchSize, "batch-size", 0, "dam pipeline.batch_size (0: dam's default)")
	flag.IntVar(&o.maxInFlight, "max-in-flight", 0, "dam pipeline.max_in_flight (0: dam's default)")
	flag.IntVar(&o.maxConns, "max-conns", 0, "dam postgres.max_conns (0: dam's default)")
	flag.IntVar(&o.maxBatch, "max-batch", 0, "dam pipeline.max_batch (0: dam's default)")
	flag.StringVar(&o.compression, "compression", "snappy", "dam kafka.compression in every dam variant, the base's too when it knows the key (\"\": dam's default, none)")
	flag.StringVar(&o.profile, "profile", profileDir(os.Getenv("PROFILE")), "write each dam variant's CPU profile to this directory, for go tool pprof (default: bench-profiles when $PROFILE is 1, else $PROFILE)")
	flag.Float64Var(&o.decideBest, "decide-best", 0, "records/s of the best batched Decide benchmark in the same run (make bench passes it)")
	flag.StringVar(&o.decideBestName, "decide-best-name", "", "its variant")
	flag.StringVar(&o.damBin, "dam", "", "dam binary (default: build ./cmd/dam with -tags damtest; -profile needs that tag)")
	flag.StringVar(&o.base, "base", os.Getenv("BASE"), "git revision of the dam-base variant (default $BASE, else the last commit that changed the dam figures of docs/performance.md)")
	flag.Parse()
	if o.profile != "" {
		if err := os.MkdirAll(o.profile, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "e2ebench: -profile: %v\n", err)
			os.Exit(2)
		}
	}

	if ca.kind != "" {
		ca.dsn = o.dsn
		if err := runChild(ca); err != nil {
			fmt.Fprintf(os.Stderr, "e2ebench -child %s: %v\n", ca.kind, err)
			os.Exit(1)
		}
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "e2ebench: %v\n", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "e2ebench: "+format+"\n", args...)
}

// result is one variant's measurements.
type result struct {
	variant   string
	records   int
	elapsed   time.Duration
	forwarded int64
	backlog   quantiles // poll-to-commit over the backlog phase
	steady    quantiles // poll-to-commit over the steady phase
	steadyN   int
	saturated bool // could not keep up with the steady rate: its latency is queueing
	rssKB     int64
	cpu       time.Duration // the process's user+system CPU time, both phases
	// Over the backlog phase: the WAL the server wrote (anything else
	// writing to the same server counts too) and the CPU time of this
	// variant's PostgreSQL backends.
	walBytes int64
	pgCPU    time.Duration
	// nodes: on a dedicated target (dam-single, dam-citus), each node's
	// CPU over the backlog phase; pgCPU is the sum of their backends'.
	nodes []nodeCPU
	// tap: dam-tap's reader, the decisions it read and those it lost.
	tap tapStats
}

func (r result) rate() float64 { return float64(r.records) / r.elapsed.Seconds() }

func run(o options) error {
	start := time.Now()
	ctx := context.Background()
	dsn, stopPG, err := postgres(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer stopPG()

	tmp, err := os.MkdirTemp("", "e2ebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if strings.Contains(o.variants, "dam") && o.damBin == "" {
		logf("building dam")
		if o.damBin, err = damproc.Build(damproc.BuildOptions{Tags: "damtest"}); err != nil { // damtest: DAM_TEST_CPUPROFILE
			return err
		}
	}

	if strings.Contains(o.variants, "dam-base") {
		if o.baseBin, o.base, err = buildBase(tmp, o.base); err != nil {
			return fmt.Errorf("dam-base: %w", err)
		}
		o.baseCompression = knowsCompression(tmp, o.baseBin)
	}

	variants := strings.Split(o.variants, ",")
	if slices.Contains(variants, variantCitus) {
		if err := citusUnavailable(); err != nil {
			// Only the Citus comparison needs it: the rest runs.
			fmt.Printf("%s and %s skipped: %v\n", variantCitus, variantSingle, err)
			variants = slices.DeleteFunc(variants, func(v string) bool { return v == variantCitus || v == variantSingle })
		}
	}
	shared := &pgTarget{dsn: dsn}
	dedicated := map[string]*pgTarget{} // started at their first run
	defer func() {
		for _, t := range dedicated {
			t.stop()
		}
	}()
	var results []result
	for _, v := range variants {
		n, t := o.records, shared
		if v == "naive" {
			n = min(o.naiveRecords, o.records)
		}
		if v == variantSingle || v == variantCitus {
			if o.citusRecords > 0 {
				n = min(o.citusRecords, o.records)
			}
			if t = dedicated[v]; t == nil {
				if t, err = dedicatedTarget(ctx, v, o.citusWorkers, o.citusCachedConns); err != nil {
					return fmt.Errorf("%s: %w", v, err)
				}
				dedicated[v] = t
			}
		}
		r, err := runVariant(ctx, o, v, n, t, self, tmp)
		if err != nil {
			return fmt.Errorf("%s: %w", v, err)
		}
		results = append(results, r)
	}
	printTable(os.Stdout, o, results)
	if c := dedicated[variantCitus]; c != nil {
		printCitus(os.Stdout, o, results, c)
		printPlans(ctx, os.Stdout, c.dsn)
	}
	fmt.Printf("e2ebench took %s\n", time.Since(start).Round(time.Second))
	return nil
}

// buildBase builds dam at a git revision (default: the last commit that
// changed the end-to-end dam figures of docs/performance.md, i.e. the
// version they describe) in a temporary worktree, and returns the binary
// and the revision's hash.
func buildBase(tmp, rev string) (bin, hash string, err error) {
	if rev == "" {
		if rev, err = figuresRev(); err != nil {
			return "", "", fmt.Errorf("finding the last commit that changed the dam figures (set BASE=<rev>): %w", err)
		}
	}
	out, err := exec.Command("git", "rev-parse", "--verify", rev+"^{commit}").Output()
	if err != nil {
		return "", "", fmt.Errorf("git rev-parse %s: %w", rev, err)
	}
	hash = strings.TrimSpace(string(out))
	dir := filepath.Join(tmp, "base")
	if out, err := exec.Command("git", "worktree", "add", "--detach", dir, hash).CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("git worktree add %s: %v: %s", hash, err, out)
	}
	defer func() {
		if out, err := exec.Command("git", "worktree", "remove", "--force", dir).CombinedOutput(); err != nil {
			logf("git worktree remove %s: %v: %s", dir, err, out)
		}
	}()
	logf("building dam at %s (dam-base)", hash[:12])
	// damtest: DAM_TEST_CPUPROFILE (older revisions have it untagged).
	if bin, err = damproc.Build(damproc.BuildOptions{Dir: dir, Tags: "damtest"}); err != nil {
		return "", "", fmt.Errorf("at %s: %w", hash, err)
	}
	return bin, hash, nil
}

// figuresFiles are the files that have held the end-to-end dam figures (the
// `| **dam** |` rows): docs/performance.md, and README.md in older
// revisions.
var figuresFiles = []string{"docs/performance.md", "README.md"}

// damRowPattern matches a `| **dam** |` row of a figures table.
const damRowPattern = `^\| \*\*dam\*\* \|`

// figuresRev returns the last commit that changed the dam figures. A commit
// that only moved the rows between files changed no
// figure and describes no new version, so it is passed over: the rows, in
// every figures file, must differ from its parent's.
func figuresRev() (string, error) {
	args := []string{"log", "--format=%H", "-G", damRowPattern, "--"}
	for _, f := range figuresFiles {
		args = append(args, ":(top)"+f) // from the repository's root, wherever this runs
	}
	out, err := exec.Command("git", args...).Output()
	if err != nil {
		return "", fmt.Errorf("git log: %w", err)
	}
	for _, c := range strings.Fields(string(out)) {
		if damRows(c) != damRows(c+"^") {
			return c, nil
		}
	}
	return "", fmt.Errorf("no commit changed the rows of %s", strings.Join(figuresFiles, " or "))
}

// damRows returns the `| **dam** |` rows of the figures files at rev, sorted;
// a file missing at rev (or a rev without a parent) contributes none.
func damRows(rev string) string {
	re := regexp.MustCompile(`(?m)` + damRowPattern + `.*$`)
	var rows []string
	for _, f := range figuresFiles {
		out, err := exec.Command("git", "show", rev+":"+f).Output()
		if err != nil {
			continue
		}
		rows = append(rows, re.FindAllString(string(out), -1)...)
	}
	slices.Sort(rows)
	return strings.Join(rows, "\n")
}

// postgres returns a reachable DSN: -dsn, $DAM_TEST_POSTGRES_DSN, the local
// default, or a throwaway cluster (stopped by the returned function).
func postgres(ctx context.Context, dsn string) (string, func(), error) {
	if dsn == "" {
		dsn = os.Getenv(envDSN)
	}
	if dsn == "" {
		dsn = defaultDSN
	}
	return pglocal.ReachableOrStart(ctx, dsn, logf)
}

// freshSchema creates an empty schema and returns a DSN selecting it and a
// function dropping it.
func freshSchema(ctx context.Context, t *pgTarget, variant string) (string, func(), error) {
	base := t.dsn
	schema := fmt.Sprintf("e2ebench_%s_%d", strings.ReplaceAll(variant, "-", "_"), time.Now().UnixNano())
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	// Each run starts with PostgreSQL's buffers clean, so that no run pays
	// for the previous one's dirty pages (a checkpoint inside its measured
	// window): the run right after another was seen 10-20% slower.
	checkpoint := func() error { return exec("CHECKPOINT") }
	if t.nodes != nil {
		checkpoint = func() error { return t.checkpointAll(ctx) }
	}
	if err := checkpoint(); err != nil {
		logf("checkpoint before %s: %v (runs may pay for each other's writes)", variant, err)
	}
	if err := exec("CREATE SCHEMA " + schema); err != nil {
		return "", nil, err
	}
	var dsn string
	// The application name tells this variant's PostgreSQL backends apart
	// (their CPU time is measured) from any other client of the server.
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		sep := "?"
		if strings.Contains(base, "?") {
			sep = "&"
		}
		dsn = base + sep + "search_path=" + schema + "&application_name=" + schema
	} else {
		dsn = base + " search_path=" + schema + " application_name=" + schema
	}
	// dam migrates its own schema (postgres.migrate), except on the
	// dedicated targets: distributing the tables on Citus takes seconds,
	// which are not the decide's, so both dam-single and dam-citus start
	// on a migrated schema.
	if variant == "naive" || t.nodes != nil {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return "", nil, err
		}
		err = migrations.Up(ctx, conn)
		conn.Close(ctx)
		if err != nil {
			return "", nil, err
		}
	}
	return dsn, func() {
		if err := exec("DROP SCHEMA " + schema + " CASCADE"); err != nil {
			logf("drop schema %s: %v", schema, err)
		}
	}, nil
}

func freePort() (int, error) { return damproc.FreePort() }

// produce writes n records of the workload to topic, asynchronously with
// batching, and waits for every ack.
func produce(ctx context.Context, cl *kgo.Client, topic string, w *workload, n int, perSecond int) error {
	errc := make(chan error, 1)
	cb := func(_ *kgo.Record, err error) {
		if err != nil {
			select {
			case errc <- err:
			default:
			}
		}
	}
	t0 := time.Now()
	for i := range n {
		if perSecond > 0 {
			due := t0.Add(time.Duration(float64(i) / float64(perSecond) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
		}
		k, v := w.next()
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: k, Value: v}, cb)
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// caughtUp reports whether the group's committed offsets have reached the
// end offsets of every partition of topic.
func caughtUp(ctx context.Context, adm *kadm.Client, topic string) (bool, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return false, err
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return false, err
	}
	done := true
	ends.Each(func(e kadm.ListedOffset) {
		if e.Offset == 0 {
			return
		}
		c, ok := committed.Lookup(e.Topic, e.Partition)
		if !ok || c.At < e.Offset {
			done = false
		}
	})
	return done, nil
}

func waitCaughtUp(ctx context.Context, adm *kadm.Client, topic string, alive func() error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := caughtUp(ctx, adm, topic)
		if err == nil && ok {
			return nil
		}
		if err := alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not caught up after %s (last error: %v)", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func endSum(ctx context.Context, adm *kadm.Client, topic string) (int64, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	ends.Each(func(e kadm.ListedOffset) { n += e.Offset })
	return n, nil
}

func scrape(addr string) (histogram, error) { return scrapeHist(addr, histName) }

// scrapeHist reads histogram name from dam's /metrics at addr.
func scrapeHist(addr, name string) (histogram, error) {
	m, err := damproc.Scrape(context.Background(), addr)
	if err != nil {
		return histogram{}, err
	}
	h := m.Histogram(name)
	return histogram{le: h.Bounds, cum: h.Counts}, nil
}

// vmHWM returns the process's peak resident set size in kB.
func vmHWM(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				return strconv.ParseInt(f[1], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// cpuTime returns the process's user+system CPU time so far.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * time.Second / 100, nil // USER_HZ is 100 on Linux
}

// walLSN is the server's current WAL position.
func walLSN(ctx context.Context, dsn string) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var lsn string
	err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// walDiff is the WAL written between two positions, in bytes.
func walDiff(ctx context.Context, dsn, to, from string) (int64, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int64
	err = conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, to, from).Scan(&n)
	return n, err
}

// backendsCPU sums the CPU time of the PostgreSQL backends serving
// variantDSN's application name (read from /proc: the server runs on this
// machine).
func backendsCPU(ctx context.Context, base, variantDSN string) (time.Duration, error) {
	name := ""
	for _, f := range strings.FieldsFunc(variantDSN, func(r rune) bool { return r == '&' || r == '?' || r == ' ' }) {
		if v, ok := strings.CutPrefix(f, "application_name="); ok {
			name = v
		}
	}
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, name)
	if err != nil {
		return 0, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, pid := range pids {
		if d, err := cpuTime(int(pid)); err == nil {
			total += d
		}
	}
	return total, nil
}

func runVariant(ctx context.Context, o options, variant string, n int, t *pgTarget, self, tmp string) (result, error) {
	baseDSN := t.dsn
	res := result{variant: variant, records: n, steady: quantiles{P50: math.NaN(), P99: math.NaN()}}
	in, out := "input", "output"
	if variant == "naive" {
		in, out = "input-naive", "output-naive"
	}
	port, err := freePort()
	if err != nil {
		return res, err
	}
	cluster, err := kfake.NewCluster(kfake.Ports(port), kfake.SeedTopics(partitions, in, out))
	if err != nil {
		return res, fmt.Errorf("kfake: %w", err)
	}
	defer cluster.Close()
	broker := cluster.ListenAddrs()[0]
	prod, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ProducerLinger(5*time.Millisecond),
		kgo.MaxBufferedRecords(50000), kgo.ProducerBatchMaxBytes(1<<20))
	if err != nil {
		return res, err
	}
	defer prod.Close()
	adm := kadm.NewClient(prod)

	w := newWorkload(o.entities, o.dupRate)
	w.small = strings.HasSuffix(variant, "-small")
	t0 := time.Now()
	if err := produce(ctx, prod, in, w, n, 0); err != nil {
		return res, fmt.Errorf("pre-producing: %w", err)
	}
	logf("%s: %d records pre-produced in %s", variant, n, time.Since(t0).Round(time.Millisecond))

	if variant == variantAnalyze || variant == variantAnalyzeFull {
		return runAnalyze(o, res, broker, in, variant == variantAnalyzeFull)
	}
	dsn, drop, err := freshSchema(ctx, t, variant)
	if err != nil {
		return res, err
	}
	defer drop()
	httpPort, err := freePort()
	if err != nil {
		return res, err
	}
	httpAddr := fmt.Sprintf("127.0.0.1:%d", httpPort)

	var po damproc.Options
	var childOut strings.Builder
	if isDam(variant) {
		entity, delivery := "key", "at-least-once"
		switch variant {
		case "dam-pointer", "dam-pointer-small":
			entity = "/id"
		case "dam-eos":
			delivery = "exactly-once"
		}
		cfgPath := filepath.Join(tmp, "dam.yaml")
		if err := os.WriteFile(cfgPath, []byte(damConfig(o, broker, dsn, httpAddr, in, out, entity, delivery, variant == "dam-base", variant == "dam-tap")), 0o600); err != nil {
			return res, err
		}
		bin := o.damBin
		if variant == "dam-base" {
			bin = o.baseBin
		}
		po = damproc.Options{Args: []string{bin, "run", "--config", cfgPath}, Stdout: os.Stderr}
		if o.profile != "" {
			prof := filepath.Join(o.profile, fmt.Sprintf("%s-%d.cpu.pprof", variant, time.Now().UnixNano()))
			po.Env = []string{"DAM_TEST_CPUPROFILE=" + prof}
			logf("%s: CPU profile in %s", variant, prof)
		}
	} else {
		po = damproc.Options{Args: []string{self, "-child", variant, "-brokers", broker, "-group", group,
			"-in", in, "-out", out, "-dsn", dsn, "-http", httpAddr}, Stdout: &childOut}
	}
	po.Stderr, po.HTTP = os.Stderr, httpAddr
	var lsns []string
	var meter *cpuMeter
	if t.nodes != nil {
		lsns = t.walPositions(ctx)
		meter = startCPUMeter(t.nodes)
	}
	begin := time.Now()
	proc, err := damproc.Start(po)
	if err != nil {
		if meter != nil {
			meter.stop()
		}
		return res, err
	}
	lsn0 := ""
	if t.nodes == nil {
		lsn0, _ = walLSN(ctx, baseDSN)
	}
	var tapDone chan tapStats
	if variant == "dam-tap" {
		tctx, stopTap := context.WithCancel(ctx)
		defer stopTap()
		tapDone = make(chan tapStats, 1)
		go func() { tapDone <- readTap(tctx, httpAddr) }()
	}
	alive := func() error {
		if exited, err := proc.Exited(); exited {
			return fmt.Errorf("process exited early: %v", err)
		}
		return nil
	}
	stopProc := func() { _, _, _ = proc.Stop(60 * time.Second) }
	defer stopProc()

	err = waitCaughtUp(ctx, adm, in, alive, 30*time.Minute)
	if meter != nil {
		res.nodes = meter.stop()
	}
	if err != nil {
		return res, err
	}
	res.elapsed = time.Since(begin)
	logf("%s: %d records in %s: %.0f records/s", variant, n, res.elapsed.Round(time.Millisecond), res.rate())
	if t.nodes != nil {
		res.walBytes = t.walSince(ctx, lsns)
		for _, c := range res.nodes {
			res.pgCPU += c.backends
			logf("%s: %s: backends %s, background %s, autovacuum %s", variant, c.role, c.backends.Round(time.Millisecond), c.background.Round(time.Millisecond), c.av.Round(time.Millisecond))
		}
	} else {
		if lsn1, err := walLSN(ctx, baseDSN); err == nil && lsn0 != "" {
			res.walBytes, _ = walDiff(ctx, baseDSN, lsn1, lsn0)
		}
		res.pgCPU, _ = backendsCPU(ctx, baseDSN, dsn)
	}
	// Observations are made right after a commit: let the last ones land
	// so that none of the backlog's is counted in the steady phase.
	time.Sleep(time.Second)
	h0, err := scrape(httpAddr)
	if err != nil {
		return res, fmt.Errorf("scrape: %w", err)
	}
	res.backlog = h0.quantiles()
	d0, _ := scrapeHist(httpAddr, "dam_decision_seconds")

	// Steady phase: produce live at the fixed rate, continuing the stream.
	res.steadyN = int(float64(o.rate) * o.steady.Seconds())
	if res.steadyN > 0 {
		s0 := time.Now()
		if err := produce(ctx, prod, in, w, res.steadyN, o.rate); err != nil {
			return res, fmt.Errorf("steady produce: %w", err)
		}
		if err := waitCaughtUp(ctx, adm, in, alive, 5*time.Minute); err != nil {
			return res, fmt.Errorf("steady: %w", err)
		}
		// Keeping up means finishing within a second of the last produce.
		res.saturated = time.Since(s0) > o.steady+time.Second
		time.Sleep(time.Second)
		h1, err := scrape(httpAddr)
		if err != nil {
			return res, fmt.Errorf("scrape: %w", err)
		}
		res.steady = h1.sub(h0).quantiles()
		if d1, err := scrapeHist(httpAddr, "dam_decision_seconds"); err == nil && isDam(variant) {
			q := d1.sub(d0).quantiles()
			logf("%s: steady: decide transactions (per batch) p50 %s p99 %s max bucket %s", variant, ms(q.P50), ms(q.P99), ms(d1.sub(d0).quantile(1)))
		}
	}
	if res.rssKB, err = vmHWM(proc.PID()); err != nil {
		return res, err
	}
	res.cpu, _ = cpuTime(proc.PID())
	if res.forwarded, err = endSum(ctx, adm, out); err != nil {
		return res, err
	}
	stopProc()
	if tapDone != nil {
		// The sidecar ends the stream as it stops.
		select {
		case res.tap = <-tapDone:
			logf("%s: the tap reader read %d decisions and lost %d", variant, res.tap.lines, res.tap.lost)
		case <-time.After(10 * time.Second):
			return res, fmt.Errorf("the tap reader did not end with the sidecar")
		}
	}
	if !isDam(variant) {
		var q quantiles
		if err := json.Unmarshal([]byte(strings.TrimSpace(childOut.String())), &q); err == nil {
			logf("%s: child's own quantiles over the whole run: count %.0f p50 %s p99 %s", variant, q.Count, ms(q.P50), ms(q.P99))
		}
	}
	return res, nil
}

func shortRev(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// isDam reports whether the variant runs the dam binary.
func isDam(variant string) bool { return strings.HasPrefix(variant, "dam") }

// knowsCompression reports whether the dam binary bin accepts
// kafka.compression (dam config refuses an unknown key).
func knowsCompression(tmp, bin string) bool {
	cfg := filepath.Join(tmp, "probe.yaml")
	text := "kafka:\n  brokers: [\"127.0.0.1:9092\"]\n  group: g\n  compression: [snappy]\npostgres:\n  dsn: postgres://127.0.0.1/x\nroutes:\n  - service: s\n    from: a\n    to: b\n"
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		return false
	}
	return exec.Command(bin, "config", "--config", cfg).Run() == nil
}

// damConfig is the variant's configuration; the base revision's (old) gets
// only the keys every version knows.
func damConfig(o options, broker, dsn, httpAddr, in, out, entity, delivery string, base, tap bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kafka:\n  brokers: [%q]\n  group: %s\n  start: earliest\n  delivery: %s\n", broker, group, delivery)
	if o.compression != "" && (!base || o.baseCompression) {
		fmt.Fprintf(&b, "  compression: [%s]\n", o.compression)
	}
	fmt.Fprintf(&b, "postgres:\n  dsn: %q\n  migrate: true\n", dsn)
	if o.maxConns > 0 {
		fmt.Fprintf(&b, "  max_conns: %d\n", o.maxConns)
	}
	fmt.Fprintf(&b, "http:\n  listen: %q\n", httpAddr)
	if tap {
		fmt.Fprintf(&b, "  tap:\n    enabled: true\n    token: %q\n", tapToken)
	}
	b.WriteString("log:\n  level: warn\n")
	if o.batchSize > 0 || o.maxInFlight > 0 || (o.maxBatch > 0 && !base) {
		b.WriteString("pipeline:\n")
		if o.batchSize > 0 {
			fmt.Fprintf(&b, "  batch_size: %d\n", o.batchSize)
		}
		if o.maxInFlight > 0 {
			fmt.Fprintf(&b, "  max_in_flight: %d\n", o.maxInFlight)
		}
		if o.maxBatch > 0 && !base {
			fmt.Fprintf(&b, "  max_batch: %d\n", o.maxBatch)
		}
	}
	fmt.Fprintf(&b, "routes:\n  - service: e2e\n    from: %s\n    to: %s\n    entity: %q\n", in, out, entity)
	return b.String()
}

func ms(s float64) string {
	if math.IsNaN(s) || s < 0 {
		return "n/a"
	}
	if s >= 16.384 { // the top finite bucket: the quantile lies beyond it
		return ">16.4s"
	}
	return fmt.Sprintf("%.1fms", s*1000)
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

func printTable(w io.Writer, o options, rs []result) {
	byName := map[string]result{} // a variant's first run
	total := map[string]result{}  // the sums over a variant's runs
	for _, r := range rs {
		if _, ok := byName[r.variant]; !ok {
			byName[r.variant] = r
		}
		t := total[r.variant]
		t.records += r.records
		t.elapsed += r.elapsed
		t.steadyN += r.steadyN
		t.cpu += r.cpu
		total[r.variant] = t
	}
	ratio := func(r result, base string) string {
		b, ok := byName[base]
		if !ok {
			return "-"
		}
		return fmt.Sprintf("%.2fx", r.rate()/b.rate())
	}
	fmt.Fprintf(w, "workload: %d entities, %.0f%% duplicates, ~500 B JSON, %d partitions (kfake); steady phase %d records/s for %s; dam's kafka.compression %q (base: %v)\n",
		o.entities, o.dupRate*100, partitions, o.rate, o.steady, o.compression, o.baseCompression)
	fmt.Fprintf(w, "naive runs on the first %d records (its own topic): compare records/s rates\n", min(o.naiveRecords, o.records))
	fmt.Fprintf(w, "%-12s %9s %9s %10s %9s %9s %11s %11s %11s %8s %7s %8s %9s\n",
		"variant", "records", "forwarded", "records/s", "vs naive", "vs pass", "p50 steady", "p99 steady", "p99 backlog", "RSS MB", "CPU s", "WAL B/r", "PG µs/r")
	for _, r := range rs {
		if r.saturated {
			r.variant += "*"
		}
		wal, pgc := "-", "-"
		if isDam(r.variant) && !strings.HasPrefix(r.variant, variantAnalyze) || r.variant == "naive" {
			wal = fmt.Sprintf("%.0f", float64(r.walBytes)/float64(r.records))
			pgc = fmt.Sprintf("%.1f", float64(r.pgCPU.Microseconds())/float64(r.records))
		}
		fmt.Fprintf(w, "%-12s %9d %9d %10.0f %9s %9s %11s %11s %11s %8.1f %7.1f %8s %9s\n",
			r.variant, r.records, r.forwarded, r.rate(), ratio(r, "naive"), ratio(r, "passthrough"),
			ms(r.steady.P50), ms(r.steady.P99), ms(r.backlog.P99), float64(r.rssKB)/1024, r.cpu.Seconds(), wal, pgc)
	}
	for _, r := range rs {
		if r.saturated {
			fmt.Fprintf(w, "* %s could not keep up with %d records/s: its steady latency is queueing time\n", r.variant, o.rate)
		}
	}
	if _, ok := byName["dam-eos"]; ok {
		fmt.Fprintln(w, "forwarded counts the output's offsets: in exactly-once mode each transaction's commit markers take offsets too")
	}
	d, ok := byName["dam"]
	if !ok {
		return
	}
	fmt.Fprintln(w, "targets (dam):")
	if n, ok := byName["naive"]; ok {
		x := d.rate() / n.rate()
		fmt.Fprintf(w, "  >= 15x naive          %8.2fx  %s\n", x, verdict(x >= 15))
	}
	if p, ok := byName["passthrough"]; ok {
		x := d.rate() / p.rate()
		fmt.Fprintf(w, "  >= 0.15x passthrough  %8.2fx  %s\n", x, verdict(x >= 0.15))
		// The CPU one decided record costs, dam's and its PostgreSQL
		// backends', against what the passthrough's costs (steadier than
		// a rate on a busy machine).
		per := func(r result) float64 { return float64(r.cpu.Microseconds()) / float64(r.records+r.steadyN) }
		damUS, pgUS, passUS := per(d), float64(d.pgCPU.Microseconds())/float64(d.records), per(p)
		if passUS > 0 {
			x := (damUS + pgUS) / passUS
			fmt.Fprintf(w, "  dam+PG CPU <= 4.5x pass %6.2fx  %s  (per record: dam %.1f µs + PostgreSQL %.1f µs, passthrough %.1f µs)\n",
				x, verdict(x <= 4.5), damUS, pgUS, passUS)
		}
	}
	// p99 in the steady phase holds in every at-least-once run of this
	// version (its worst run is shown), and the highest RSS.
	var worst result
	var rss int64
	for _, r := range rs {
		switch r.variant {
		case "dam", "dam-tap", "dam-pointer", "dam-small", "dam-pointer-small":
			if !math.IsNaN(r.steady.P99) && (worst.variant == "" || r.steady.P99 > worst.steady.P99) {
				worst = r
			}
		}
		if r.variant == "dam" {
			rss = max(rss, r.rssKB)
		}
	}
	if worst.variant != "" {
		fmt.Fprintf(w, "  p99 (steady) <= 20 ms %9s  %s  (the worst of every at-least-once dam run: %s)\n", ms(worst.steady.P99), verdict(worst.steady.P99 <= 0.020), worst.variant)
		if n := damonPageout(); n > 0 {
			fmt.Fprintf(w, "    this machine's kernel runs %d DAMON pageout scheme(s) (proactive reclaim): every dam and PostgreSQL stalls together\n"+
				"    each time it applies; the steady tail is then the machine's (docs/performance.md, \"The machine's memory reclaim\")\n", n)
		}
	}
	fmt.Fprintf(w, "  peak RSS < 200 MB     %7.1fMB  %s  (highest of the dam runs)\n", float64(rss)/1024, verdict(rss < 200*1024))
	if o.decideBest > 0 {
		x := total["dam"].rate() / o.decideBest
		fmt.Fprintf(w, "  dam >= 0.8x Decide     %7.2fx  %s  (the best batched Decide benchmark, %s: %.0f records/s, same run)\n",
			x, verdict(x >= 0.8), o.decideBestName, o.decideBest)
	}
	if b, ok := total["dam-base"]; ok {
		x := total["dam"].rate() / b.rate()
		// The base is the previous version: no slower than it. A ratio
		// below 1 by less than half the spread of dam's own runs (the same
		// binary, the same data) is a tie: the machine's noise, which
		// would fail two equal versions one run in two.
		var rates []float64
		for _, r := range rs {
			if r.variant == "dam" {
				rates = append(rates, r.rate())
			}
		}
		spread := (slices.Max(rates) - slices.Min(rates)) / median(rates) / 2
		how := fmt.Sprintf("%.3fx", x)
		if x < 1 && x >= 1-spread {
			how += fmt.Sprintf(", a tie: within ±%.1f%%, half the spread of dam's own %d runs", spread*100, len(rates))
		}
		fmt.Fprintf(w, "  dam >= 1.0x base       %7.2fx  %s  (%s; base: %s, same data, over all their runs)\n", x, verdict(x >= 1-spread), how, shortRev(o.base))
	}
	if _, ok := byName["dam-eos"]; ok {
		// Every exactly-once run against at-least-once over all its runs:
		// the worst is shown.
		x, p99 := math.Inf(1), 0.0
		for _, r := range rs {
			if r.variant == "dam-eos" {
				x = min(x, r.rate()/total["dam"].rate())
				p99 = max(p99, r.steady.P99)
			}
		}
		fmt.Fprintf(w, "  exactly-once >= 0.9x at-least-once %5.2fx  %s  (its worst run, vs dam over all its runs; p99 steady %s)\n", x, verdict(x >= 0.9), ms(p99))
	}
	if a, ok := total[variantAnalyze]; ok {
		// Over all its runs, each beside one of dam's: a single run
		// measured the machine's moment as much as the command.
		x := a.rate() / total["dam"].rate()
		fmt.Fprintf(w, "  analyze >= 3x dam run  %7.2fx  %s  (dam analyze reading and deciding the same backlog in memory, vs dam, same data, over all their runs)\n", x, verdict(x >= 3))
	}
	if a, ok := byName[variantAnalyzeFull]; ok {
		fmt.Fprintf(w, "  dam analyze with its changed paths and what-if runs (the defaults): %.2fx dam run\n", a.rate()/total["dam"].rate())
	}
	if t, ok := total["dam-tap"]; ok {
		x := t.rate() / total["dam"].rate()
		var read, lost int64
		for _, r := range rs {
			read, lost = read+r.tap.lines, lost+r.tap.lost
		}
		fmt.Fprintf(w, "  tap reader >= 0.95x none %5.2fx  %s  (dam-tap, one tap reader attached, vs dam, same data, over all their runs; it read %d decisions, lost %d)\n",
			x, verdict(x >= 0.95), read, lost)
	}
	for _, size := range []struct{ key, pointer, what string }{
		{"dam", "dam-pointer", "~500 B"},
		{"dam-small", "dam-pointer-small", "~190 B"},
	} {
		p, ok := total[size.pointer]
		d, dok := total[size.key]
		if !ok || !dok {
			continue
		}
		x := p.rate() / d.rate()
		fmt.Fprintf(w, "  entity /id >= 0.9x key %7.2fx  %s  (%s records: %s vs %s, same data, over all their runs)\n", x, verdict(x >= 0.9), size.what, size.pointer, size.key)
		// CPU per record is steadier than a rate on a busy machine.
		perRecord := func(r result) float64 {
			return float64(r.cpu.Microseconds()) / float64(r.records+r.steadyN)
		}
		fmt.Fprintf(w, "  dam CPU per record (%s): entity key %.1f µs, entity /id %.1f µs (%.2fx)\n",
			size.what, perRecord(d), perRecord(p), perRecord(p)/perRecord(d))
	}
}

// profileDir is where make bench PROFILE=... puts the CPU profiles: "1"
// means bench-profiles, anything else is the directory itself.
func profileDir(env string) string {
	if env == "1" {
		return "bench-profiles"
	}
	return env
}

// The variants that run `dam analyze` on the backlog instead of dam run.
const (
	variantAnalyze     = "dam-analyze"
	variantAnalyzeFull = "dam-analyze-full"
)

// runAnalyze runs `dam analyze` over the backlog of topic in, with the
// route the dam variant runs (entity: key), until it exits: reading and
// deciding only, or (full) with the command's defaults, its changed paths
// and what-if runs. Its rate is the backlog over its whole run, process
// start and every pass included. It needs no PostgreSQL and has no steady
// phase.
func runAnalyze(o options, res result, broker, in string, full bool) (result, error) {
	args := []string{"analyze", "--brokers", broker, "--topic", in, "--entity", "key", "--progress", "none", "-o", "json"}
	if !full {
		args = append(args, "--what-if", "0", "--summary-bytes", "0")
	}
	cmd := exec.Command(o.damBin, args...)
	if o.profile != "" {
		prof := filepath.Join(o.profile, fmt.Sprintf("%s-%d.cpu.pprof", res.variant, time.Now().UnixNano()))
		cmd.Env = append(os.Environ(), "DAM_TEST_CPUPROFILE="+prof)
		logf("%s: CPU profile in %s", res.variant, prof)
	}
	cmd.Stderr = os.Stderr
	var out strings.Builder
	cmd.Stdout = &out
	begin := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("dam analyze: %w", err)
	}
	// Peak RSS is its VmHWM, sampled until it exits: rusage's maxrss
	// would count this process's memory (the backlog in kfake), which the
	// child shares between its fork and its exec.
	hwm := make(chan int64)
	stop := make(chan struct{})
	go func() {
		var peak int64
		for {
			if kb, err := vmHWM(cmd.Process.Pid); err == nil {
				peak = max(peak, kb)
			}
			select {
			case <-stop:
				hwm <- peak
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	err := cmd.Wait()
	close(stop)
	res.rssKB = <-hwm
	if err != nil {
		return res, fmt.Errorf("dam analyze: %w", err)
	}
	res.elapsed = time.Since(begin)
	res.backlog = quantiles{P50: math.NaN(), P99: math.NaN()}
	var rep struct {
		Records int64 `json:"records"`
		Passes  int   `json:"passes"`
		Routes  []struct {
			Forwarded int64 `json:"forwarded"`
		} `json:"routes"`
	}
	if err := json.Unmarshal([]byte(out.String()), &rep); err != nil || len(rep.Routes) != 1 {
		return res, fmt.Errorf("dam analyze: its report: %v", err)
	}
	if rep.Records != int64(res.records) {
		return res, fmt.Errorf("dam analyze read %d records of the %d", rep.Records, res.records)
	}
	res.forwarded = rep.Routes[0].Forwarded
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	logf("%s: %d records in %s (%d passes): %.0f records/s", res.variant, res.records, res.elapsed.Round(time.Millisecond), rep.Passes, res.rate())
	return res, nil
}

// damonPageout counts the DAMON schemes running on this machine whose
// action is pageout: proactive reclaim, which unmaps and drops cold pages
// (the page cache's, the binaries' text) every aggregation interval, and
// which stalled every process of the steady phase together. 0 when DAMON
// is off, absent, or unreadable.
func damonPageout() int {
	n := 0
	kds, _ := filepath.Glob("/sys/kernel/mm/damon/admin/kdamonds/*")
	for _, kd := range kds {
		if state, err := os.ReadFile(filepath.Join(kd, "state")); err != nil || strings.TrimSpace(string(state)) != "on" {
			continue
		}
		actions, _ := filepath.Glob(filepath.Join(kd, "contexts", "*", "schemes", "*", "action"))
		for _, a := range actions {
			if b, err := os.ReadFile(a); err == nil && strings.TrimSpace(string(b)) == "pageout" {
				n++
			}
		}
	}
	return n
}
