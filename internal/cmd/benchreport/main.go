// Command benchreport runs dam's benchmarks in one run and prints their
// results against same-run baselines (`make bench`):
//
//   - canon: BenchmarkSum (canon vs the naive decode/re-marshal hash and vs a
//     plain SHA-256 of the bytes, and SumValues reading an entity in the
//     same pass vs Sum), medians over -count runs;
//   - dedup: BenchmarkDecide (batched Decide vs the per-record CAS, and each
//     mode's batched Decide next to last-seen's), medians;
//   - end to end: the internal/cmd/e2ebench program (passthrough, naive, dam
//     with entity: key, dam-pointer with entity: /id, dam-eos in
//     exactly-once mode, dam-tap with one `dam tap` reader attached
//     against dam with none, dam-citus on a Citus cluster of two workers
//     next to dam-single on one server set up as its nodes, skipped when
//     Citus is not installed), which prints its ratios;
//   - dam serve: the internal/cmd/servebench program (open-loop load at rising
//     request rates; the highest rate held with p99 under 250 ms; then
//     twice that rate, the goodput and the 503s' latency past capacity,
//     and a client opening a connection per request).
//
// The raw `go test` output is streamed to stderr; the tables go to stdout.
// A missed target is printed as MISS; the exit status is non-zero only when
// something failed to run. DAM_TEST_POSTGRES_DSN is passed through (the
// dedup benchmarks start a throwaway PostgreSQL when none is reachable).
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	quick := flag.Bool("quick", false, "development: -count 1 for every benchmark")
	skipE2E := flag.Bool("skip-e2e", false, "do not run the end-to-end benchmark")
	dedupTime := flag.String("dedup-benchtime", "1x", "-benchtime of the dedup benchmarks")
	e2eArgs := flag.String("e2e-args", "", "extra flags for internal/cmd/e2ebench (space separated)")
	skipServe := flag.Bool("skip-serve", false, "do not run the dam serve benchmark")
	serveArgs := flag.String("serve-args", "", "extra flags for internal/cmd/servebench (space separated)")
	flag.Parse()

	start := time.Now()
	canonCount, dedupCount := 5, 3
	if *quick {
		canonCount, dedupCount = 1, 1
	}
	failed := false

	canonOut, err := goBench("./canon", "-bench", ".", "-benchmem", "-count", strconv.Itoa(canonCount))
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchreport: canon benchmarks: %v\n", err)
		failed = true
	}
	dedupOut, err := goBench("./dedup", "-bench", "Decide", "-count", strconv.Itoa(dedupCount), "-benchtime", *dedupTime, "-timeout", "30m")
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchreport: dedup benchmarks: %v\n", err)
		failed = true
	}

	fmt.Printf("\n== canon (BenchmarkSum, median of %d)\n", canonCount)
	if !printCanon(os.Stdout, parse(canonOut)) {
		failed = true
	}
	fmt.Printf("\n== dedup (BenchmarkDecide, median of %d, -benchtime %s)\n", dedupCount, *dedupTime)
	if !printDedup(os.Stdout, parse(dedupOut)) {
		failed = true
	}

	if !*skipE2E {
		fmt.Printf("\n== end to end (internal/cmd/e2ebench)\n")
		args := strings.Fields(*e2eArgs)
		if best, name := bestDecide(parse(dedupOut)); best > 0 {
			// e2ebench compares dam's rate with PostgreSQL's own limit.
			args = append(args, "-decide-best", strconv.FormatFloat(best, 'f', 0, 64), "-decide-best-name", name)
		}
		if err := runProgram("e2ebench", args); err != nil {
			fmt.Fprintf(os.Stderr, "benchreport: e2ebench: %v\n", err)
			failed = true
		}
	}
	if !*skipServe {
		fmt.Printf("\n== dam serve (internal/cmd/servebench)\n")
		if err := runProgram("servebench", strings.Fields(*serveArgs)); err != nil {
			fmt.Fprintf(os.Stderr, "benchreport: servebench: %v\n", err)
			failed = true
		}
	}
	fmt.Printf("\nbench took %s\n", time.Since(start).Round(time.Second))
	if failed {
		fmt.Println("FAILED to run some benchmarks (see stderr)")
		os.Exit(1)
	}
}

// goBench runs `go test -run ^$ args pkg`, streaming its output to stderr,
// and returns the output.
func goBench(pkg string, args ...string) ([]byte, error) {
	args = append([]string{"test", "-run", "^$"}, append(args, pkg)...)
	fmt.Fprintf(os.Stderr, "$ go %s\n", strings.Join(args, " "))
	cmd := exec.Command("go", args...)
	var buf bytes.Buffer
	cmd.Stdout = io.MultiWriter(os.Stderr, &buf)
	cmd.Stderr = io.MultiWriter(os.Stderr, &buf)
	cmd.Env = os.Environ()
	err := cmd.Run()
	return buf.Bytes(), err
}

// runProgram builds and runs internal/cmd/NAME: its table goes to stdout, its
// progress to stderr.
func runProgram(name string, extra []string) error {
	dir, err := os.MkdirTemp("", "benchreport-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := dir + "/" + name
	build := exec.Command("go", "build", "-o", bin, "./internal/cmd/"+name)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	cmd := exec.Command(bin, extra...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = os.Environ()
	return cmd.Run()
}

// results maps a benchmark name (without the -GOMAXPROCS suffix) to a unit
// ("MB/s", "allocs/op", "records/s", ...) to the values of every run.
type results map[string]map[string][]float64

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

func parse(out []byte) results {
	res := results{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		f := strings.Fields(m[2])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			if res[m[1]] == nil {
				res[m[1]] = map[string][]float64{}
			}
			res[m[1]][f[i+1]] = append(res[m[1]][f[i+1]], v)
		}
	}
	return res
}

// median returns the median of name's unit and whether there was any value.
func (r results) median(name, unit string) (float64, bool) {
	vs := append([]float64(nil), r[name][unit]...)
	if len(vs) == 0 {
		return 0, false
	}
	sort.Float64s(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2], true
	}
	return (vs[n/2-1] + vs[n/2]) / 2, true
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// printCanon prints the canon table; false if a result is missing.
func printCanon(w io.Writer, r results) bool {
	complete := true
	fmt.Fprintf(w, "%-6s %12s %12s %12s %12s %13s %13s %13s\n", "size", "canon MB/s", "naive MB/s", "sha256 MB/s", "canon/naive", "canon/sha256", "canon allocs", "values/canon")
	var target struct{ naive, sha, allocs float64 }
	found2KB := false
	for _, size := range []string{"200B", "2KB", "64KB"} {
		c, ok1 := r.median("BenchmarkSum/"+size+"/canon", "MB/s")
		n, ok2 := r.median("BenchmarkSum/"+size+"/naive", "MB/s")
		s, ok3 := r.median("BenchmarkSum/"+size+"/sha256", "MB/s")
		a, ok4 := r.median("BenchmarkSum/"+size+"/canon", "allocs/op")
		if !(ok1 && ok2 && ok3 && ok4) {
			fmt.Fprintf(w, "%-6s missing results\n", size)
			complete = false
			continue
		}
		values := "-" // SumValues reading /banana_id, vs Sum
		if v, ok := r.median("BenchmarkSum/"+size+"/values", "MB/s"); ok {
			values = fmt.Sprintf("%.2fx", v/c)
		}
		fmt.Fprintf(w, "%-6s %12.1f %12.1f %12.1f %11.1fx %12.2fx %13.0f %13s\n", size, c, n, s, c/n, c/s, a, values)
		if size == "2KB" {
			found2KB = true
			target.naive, target.sha, target.allocs = c/n, c/s, a
		}
	}
	fmt.Fprintln(w, "targets (2 KB):")
	if !found2KB {
		fmt.Fprintln(w, "  no 2 KB results: MISS")
		return false
	}
	fmt.Fprintf(w, "  canon >= 12x naive      %6.1fx  %s\n", target.naive, verdict(target.naive >= 12))
	fmt.Fprintf(w, "  canon >= 0.3x sha256    %6.2fx  %s\n", target.sha, verdict(target.sha >= 0.3))
	fmt.Fprintf(w, "  canon 0 allocs/op       %6.0f   %s\n", target.allocs, verdict(target.allocs == 0))
	return complete
}

// bestDecide returns the highest median records/s of the batched Decide
// benchmarks (last-seen) and its variant.
func bestDecide(r results) (float64, string) {
	best, name := 0.0, ""
	for n := range r {
		v := strings.TrimPrefix(n, "BenchmarkDecide/")
		if !strings.HasPrefix(v, "batch=") || strings.Contains(v, "/") {
			continue
		}
		if rate, ok := r.median(n, "records/s"); ok && rate > best {
			best, name = rate, v
		}
	}
	return best, name
}

// printDedup prints the dedup table; false if a result is missing.
func printDedup(w io.Writer, r results) bool {
	base, ok := r.median("BenchmarkDecide/percas", "records/s")
	if !ok || base == 0 {
		fmt.Fprintln(w, "no BenchmarkDecide/percas result")
		return false
	}
	var names []string
	for name := range r {
		if strings.HasPrefix(name, "BenchmarkDecide/") && !strings.Contains(strings.TrimPrefix(name, "BenchmarkDecide/"), "/") {
			names = append(names, name)
		}
	}
	sort.Slice(names, func(i, j int) bool { return variantOrder(names[i]) < variantOrder(names[j]) })
	fmt.Fprintf(w, "%-12s %12s %10s\n", "variant", "records/s", "vs percas")
	batch1000 := -1.0
	for _, name := range names {
		v, ok := r.median(name, "records/s")
		if !ok {
			continue
		}
		variant := strings.TrimPrefix(name, "BenchmarkDecide/")
		fmt.Fprintf(w, "%-12s %12.0f %9.1fx\n", variant, v, v/base)
		if variant == "batch=1000" {
			batch1000 = v / base
		}
	}
	fmt.Fprintln(w, "targets:")
	if batch1000 < 0 {
		fmt.Fprintln(w, "  no batch=1000 result: MISS")
		return false
	}
	fmt.Fprintf(w, "  batch=1000 >= 12x percas %6.1fx  %s\n", batch1000, verdict(batch1000 >= 12))
	return printModes(w, r)
}

// modes are the decision rules BenchmarkDecide runs next to last-seen, as
// BenchmarkDecide/MODE/batch=1000.
var modes = []string{"refresh", "window", "version"}

// printModes prints each mode's batched decide next to last-seen's
// (batch=1000); false if a result is missing.
func printModes(w io.Writer, r results) bool {
	base, ok := r.median("BenchmarkDecide/batch=1000", "records/s")
	if !ok || base == 0 {
		fmt.Fprintln(w, "no BenchmarkDecide/batch=1000 result")
		return false
	}
	fmt.Fprintf(w, "\n%-12s %12s %14s\n", "mode", "records/s", "vs last-seen")
	fmt.Fprintf(w, "%-12s %12.0f %13.2fx\n", "last-seen", base, 1.0)
	complete := true
	for _, m := range modes {
		v, ok := r.median("BenchmarkDecide/"+m+"/batch=1000", "records/s")
		if !ok {
			fmt.Fprintf(w, "%-12s missing result\n", m)
			complete = false
			continue
		}
		fmt.Fprintf(w, "%-12s %12.0f %13.2fx\n", m, v, v/base)
	}
	return complete
}

// variantOrder sorts percas first, then batches by size.
func variantOrder(name string) int {
	v := strings.TrimPrefix(name, "BenchmarkDecide/")
	if n, err := strconv.Atoi(strings.TrimPrefix(v, "batch=")); err == nil {
		return n
	}
	return 0
}
