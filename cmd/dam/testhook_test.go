//go:build damtest

package main

import (
	"testing"

	"go.uber.org/zap"
)

func TestPauseHookParsing(t *testing.T) {
	for _, tc := range []struct {
		v      string
		ok, on bool
	}{
		{"", true, false},
		{"decided", true, true},
		{"producing:3", true, true},
		{"acked:1", true, true},
		{"acked:0", false, false},
		{"acked:x", false, false},
		{"later", false, false},
	} {
		t.Setenv(envPauseAt, tc.v)
		opt, err := pauseHook(zap.NewNop())
		if (err == nil) != tc.ok || (opt != nil) != tc.on {
			t.Errorf("%s=%q: option %v, error %v; want ok %v, hook %v", envPauseAt, tc.v, opt != nil, err, tc.ok, tc.on)
		}
	}
}
