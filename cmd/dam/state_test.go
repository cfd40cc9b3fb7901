package main

import (
	"context"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/pgtest"
)

func TestStateGetResetRoundTrip(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	s, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := canon.Digest{byte(canon.SchemeJSON1), 0xab}
	for _, e := range [][]byte{[]byte("banana-1"), {0xff, 0x00}, []byte("banana-2")} {
		if _, err := s.Check(context.Background(), "customer-2", e, d); err != nil {
			t.Fatal(err)
		}
	}

	code, out, errOut := runDam(t, "state", "get", "--dsn", dsn, "customer-2", "banana-1")
	if code != 0 || !strings.Contains(out, d.String()) || !strings.Contains(out, "banana-1") {
		t.Fatalf("get: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runDam(t, "state", "get", "--dsn", dsn, "--hex", "customer-2", "ff00")
	if code != 0 || !strings.Contains(out, "hex:ff00") {
		t.Fatalf("get --hex: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runDam(t, "state", "stats", "--dsn", dsn)
	if code != 0 || !strings.Contains(out, "customer-2") || !strings.Contains(out, " 3 ") {
		t.Fatalf("stats: %d %q %q", code, out, errOut)
	}
	if code, _, errOut = runDam(t, "state", "reset", "--dsn", dsn, "customer-2"); code != 2 || !strings.Contains(errOut, "--all") {
		t.Fatalf("reset without entities or --all: %d %q", code, errOut)
	}
	code, out, errOut = runDam(t, "state", "reset", "--dsn", dsn, "--hex", "customer-2", "ff00")
	if code != 0 || !strings.Contains(out, "reset 1 ") {
		t.Fatalf("reset: %d %q %q", code, out, errOut)
	}
	if code, _, errOut = runDam(t, "state", "get", "--dsn", dsn, "--hex", "customer-2", "ff00"); code != 1 || !strings.Contains(errOut, "not found") {
		t.Fatalf("get after reset: %d %q", code, errOut)
	}
	if dec, _ := s.Check(context.Background(), "customer-2", []byte{0xff, 0x00}, d); dec != dedup.Forward {
		t.Fatalf("after reset: %v, want forward", dec)
	}
	code, out, errOut = runDam(t, "state", "reset", "--dsn", dsn, "--all", "customer-2")
	if code != 0 || !strings.Contains(out, "reset 3 ") {
		t.Fatalf("reset --all: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runDam(t, "state", "prune", "--dsn", dsn, "--older-than", "720h")
	if code != 0 || !strings.Contains(out, "pruned 0 ") {
		t.Fatalf("prune: %d %q %q", code, out, errOut)
	}
	if code, _, _ = runDam(t, "state", "prune", "--dsn", dsn); code != 2 {
		t.Fatalf("prune without --older-than: %d", code)
	}
}
