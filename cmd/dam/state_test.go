package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

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
	if code != 0 || !strings.Contains(out, "pruned 0 ") || !strings.Contains(out, "deleted 0 expired window ids") {
		t.Fatalf("prune: %d %q %q", code, out, errOut)
	}
	if code, _, _ = runDam(t, "state", "prune", "--dsn", dsn, "--older-than", "0s"); code != 2 {
		t.Fatalf("prune --older-than 0s: %d", code)
	}
}

// TestStateEveryMode: get, stats, prune and reset on window and version
// state.
func TestStateEveryMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	s, err := dedup.Open(ctx, dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	decide := func(service string, rule dedup.Rule, now time.Time, recs ...dedup.Record) {
		t.Helper()
		p := dedup.Partition{Group: "g", Topic: "in." + service}
		pr, err := s.Acquire(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if !pr.HasNext {
			if err := s.InitProgress(ctx, p, pr.Epoch, 0); err != nil {
				t.Fatal(err)
			}
		}
		b := &dedup.Batch{Service: service, Partition: p, Epoch: pr.Epoch, Rule: rule, Now: now,
			Start: pr.Next, End: pr.Next + int64(len(recs))}
		for i, r := range recs {
			r.Offset = pr.Next + int64(i)
			b.Records = append(b.Records, r)
		}
		if _, err := s.Decide(ctx, b, nil); err != nil {
			t.Fatal(err)
		}
	}
	d := canon.Digest{byte(canon.SchemeJSON1), 0xcd}
	window := dedup.Rule{Mode: dedup.Window, Window: time.Hour}
	decide("payments", window, time.Now().Add(-3*time.Hour), dedup.Record{Entity: []byte("old-1"), Digest: d}, dedup.Record{Entity: []byte("old-2"), Digest: d})
	decide("payments", window, time.Time{}, dedup.Record{Entity: []byte("live"), Digest: d})
	decide("orders", dedup.Rule{Mode: dedup.Version}, time.Time{}, dedup.Record{Entity: []byte("o-1"), Digest: d, Version: 9})

	code, out, errOut := runDam(t, "state", "get", "--dsn", dsn, "payments", "old-1")
	if code != 0 || !strings.Contains(out, "mode          window") || !strings.Contains(out, "id            old-1") ||
		!strings.Contains(out, "(expired") || !strings.Contains(out, "source        in.payments/0@0") {
		t.Fatalf("get expired window id: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runDam(t, "state", "get", "--dsn", dsn, "payments", "live")
	if code != 0 || !strings.Contains(out, "expires_at") || strings.Contains(out, "expired") {
		t.Fatalf("get live window id: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runDam(t, "state", "get", "--dsn", dsn, "orders", "o-1")
	if code != 0 || !strings.Contains(out, "mode          version") || !strings.Contains(out, "version       9") {
		t.Fatalf("get version: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runDam(t, "state", "stats", "--dsn", dsn)
	if code != 0 || !regexp.MustCompile(`orders\s+version\s+1\s+-\s`).MatchString(out) ||
		!regexp.MustCompile(`payments\s+window\s+3\s+2\s`).MatchString(out) {
		t.Fatalf("stats: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runDam(t, "state", "prune", "--dsn", dsn, "--service", "payments", "--batch", "1")
	if code != 0 || !strings.Contains(out, "deleted 2 expired window ids") || strings.Contains(out, "pruned") {
		t.Fatalf("prune: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runDam(t, "state", "reset", "--dsn", dsn, "payments", "live", "old-1")
	if code != 0 || !strings.Contains(out, "reset 1 ") {
		t.Fatalf("reset window id: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runDam(t, "state", "reset", "--dsn", dsn, "--all", "orders")
	if code != 0 || !strings.Contains(out, "reset 1 ") {
		t.Fatalf("reset version service: %d %q %q", code, out, errOut)
	}
	if stats, err := s.Stats(ctx); err != nil || len(stats) != 0 {
		t.Fatalf("after prune and reset: %+v, %v", stats, err)
	}
}
