//go:build !damtest

package main

import (
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/pipeline"
)

// The production build has no test hooks: the variables of testhook.go
// (DAM_TEST_PAUSE_AT, DAM_TEST_CPUPROFILE) do nothing here, and are not
// even in the binary. Build with -tags damtest for the test suite's dam.

// pauseHook returns no option: the fault-injection hook is the test
// suite's.
func pauseHook(*zap.Logger) (pipeline.Option, error) { return nil, nil }

// cpuProfile profiles nothing.
func cpuProfile() (stop func()) { return func() {} }
