//go:build damtest

// The test hooks of the chaos suite and the benchmarks, compiled in only
// with the damtest build tag (go build -tags damtest ./cmd/dam), which
// tests/e2e and internal/cmd/e2ebench use; the production binary has none
// (testhook_off.go).

package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"go.uber.org/zap"

	"github.com/dam-dedup/dam/pipeline"
)

// envPauseAt names the fault-injection variable of the chaos tests:
// DAM_TEST_PAUSE_AT=STEP[:N] makes dam stop itself with SIGSTOP the N-th
// time (default 1) a batch reaches STEP (decided, producing or acked), to
// become a zombie at exactly that point of the protocol until SIGCONT.
// Like every DAM_TEST_ variable it belongs to the test suite.
const envPauseAt = "DAM_TEST_PAUSE_AT"

// pauseHook returns the pipeline option that envPauseAt asks for, or nil.
func pauseHook(log *zap.Logger) (pipeline.Option, error) {
	v := os.Getenv(envPauseAt)
	if v == "" {
		return nil, nil
	}
	name, count, _ := strings.Cut(v, ":")
	n := 1
	if count != "" {
		var err error
		if n, err = strconv.Atoi(count); err != nil || n < 1 {
			return nil, fmt.Errorf("%s=%q: the count after ':' must be a positive integer", envPauseAt, v)
		}
	}
	step := pipeline.Step(name)
	switch step {
	case pipeline.StepDecided, pipeline.StepProducing, pipeline.StepAcked:
	default:
		return nil, fmt.Errorf("%s=%q: unknown step %q (decided, producing or acked)", envPauseAt, v, name)
	}
	var seen atomic.Int64
	return pipeline.WithStepHook(func(s pipeline.Step, topic string, partition int32) {
		if s != step || seen.Add(1) != int64(n) {
			return
		}
		log.Warn("test hook: stopping this process (SIGSTOP) until SIGCONT", zap.String("step", string(s)),
			zap.String("topic", topic), zap.Int32("partition", partition))
		_ = log.Sync()
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}), nil
}

// envCPUProfile names the benchmark's profiling variable: with
// DAM_TEST_CPUPROFILE=FILE, dam writes a CPU profile of its whole run to
// FILE (go run ./internal/cmd/e2ebench -profile DIR). Like every DAM_TEST_
// variable it belongs to the test suite.
const envCPUProfile = "DAM_TEST_CPUPROFILE"

// cpuProfile starts the profile envCPUProfile asks for and returns what
// stops it.
func cpuProfile() (stop func()) {
	path := os.Getenv(envCPUProfile)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "dam: %s: %v\n", envCPUProfile, err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}
