package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
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
	if code, _, errOut = runDam(t, "state", "reset", "--dsn", dsn, "--all", "customer-2"); code != 2 || !strings.Contains(errOut, "--yes") {
		t.Fatalf("reset --all without --yes: %d %q", code, errOut)
	}
	code, out, errOut = runDam(t, "state", "reset", "--dsn", dsn, "--all", "--yes", "customer-2")
	if code != 0 || !strings.Contains(out, "reset 3 ") {
		t.Fatalf("reset --all: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runDam(t, "state", "prune", "--dsn", dsn, "--older-than", "720h", "--yes")
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
	code, out, errOut = runDam(t, "state", "reset", "--dsn", dsn, "--all", "--yes", "--progress", "none", "orders")
	if code != 0 || !strings.Contains(out, "reset 1 ") {
		t.Fatalf("reset version service: %d %q %q", code, out, errOut)
	}
	if stats, err := s.Stats(ctx); err != nil || len(stats) != 0 {
		t.Fatalf("after prune and reset: %+v, %v", stats, err)
	}
}

// fill stores n identities "e-0".. of service through Check.
func fill(t *testing.T, s *dedup.Store, service string, n int) {
	t.Helper()
	_, err := s.Pool().Exec(context.Background(), `INSERT INTO state (service, entity, digest)
		SELECT $1, convert_to('e-' || i, 'UTF8'), '\x01'::bytea FROM generate_series(0, $2 - 1) i`, service, n)
	if err != nil {
		t.Fatal(err)
	}
}

func TestStateJSON(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	s, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := canon.Digest{byte(canon.SchemeJSON1), 0xab}
	if _, err := s.Check(context.Background(), "svc", []byte{0xff}, d); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runDam(t, "state", "get", "--dsn", dsn, "--hex", "-o", "json", "svc", "ff")
	var st struct {
		Service, Entity, Digest string
		EntityHex               string    `json:"entity_hex"`
		UpdatedAt               time.Time `json:"updated_at"`
		Source                  *struct{}
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("get -o json: %d %v %q %q", code, err, out, errOut)
	}
	if st.Service != "svc" || st.Entity != "hex:ff" || st.EntityHex != "ff" || st.Digest != d.String() || st.UpdatedAt.IsZero() || st.Source != nil {
		t.Fatalf("get -o json: %+v", st)
	}
	code, out, _ = runDam(t, "state", "stats", "--dsn", dsn, "-o", "json")
	var stats []struct {
		Service        string
		Rows           int64
		Oldest, Newest time.Time
	}
	if err := json.Unmarshal([]byte(out), &stats); code != 0 || err != nil || len(stats) != 1 || stats[0].Rows != 1 || stats[0].Oldest.IsZero() {
		t.Fatalf("stats -o json: %d %v %q", code, err, out)
	}
	if code, _, errOut := runDam(t, "state", "stats", "--dsn", dsn, "-o", "xml"); code != 2 || !strings.Contains(errOut, "want text or json") {
		t.Fatalf("-o xml: %d %q", code, errOut)
	}
}

// reset --entities-from reads one entity per line (hex with --hex),
// reports bad lines by number, and runs in batches with progress lines.
func TestStateResetEntitiesFrom(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	s, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fill(t, s, "svc", 100)
	dir := t.TempDir()
	var lines []string
	for i := 0; i < 60; i++ {
		lines = append(lines, fmt.Sprintf("e-%d", i))
	}
	list := filepath.Join(dir, "list")
	if err := os.WriteFile(list, []byte(strings.Join(lines, "\r\n")+"\n\nnot-stored\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runDam(t, "state", "reset", "--dsn", dsn, "--entities-from", list, "--batch", "25", "--progress", "lines", "svc", "e-99")
	if code != 0 || !strings.Contains(out, "reset 61 identities of service svc") {
		t.Fatalf("reset --entities-from: %d %q %q", code, out, errOut)
	}
	// Lines: the first batch, then the last (the batches are quicker than a
	// second apart).
	if errOut != "reset: 25/62 identities (40%), 25 deleted\nreset: 62/62 identities (100%), 61 deleted\n" {
		t.Fatalf("progress lines: %q", errOut)
	}
	if n, _ := s.Count(context.Background(), "svc"); n != 39 {
		t.Fatalf("%d identities left, want 39", n)
	}
	hexList := filepath.Join(dir, "hex")
	if err := os.WriteFile(hexList, []byte("652d3630\n652d3631\nxyz\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runDam(t, "state", "reset", "--dsn", dsn, "--hex", "--entities-from", hexList, "svc"); code != 2 || !strings.Contains(errOut, hexList+":3: entity \"xyz\": not hex") {
		t.Fatalf("bad hex line: %d %q", code, errOut)
	}
	if err := os.WriteFile(hexList, []byte("652d3630\n652d3631\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runDamStdin(t, "652d3630\n652d3631\n", "state", "reset", "--dsn", dsn, "--hex", "--entities-from", "-", "--progress", "none", "svc")
	if code != 0 || !strings.Contains(out, "reset 2 ") {
		t.Fatalf("reset --hex --entities-from -: %d %q", code, out)
	}
	if code, _, errOut := runDam(t, "state", "reset", "--dsn", dsn, "--entities-from", filepath.Join(dir, "missing"), "svc"); code != 2 || !strings.Contains(errOut, "no such file") {
		t.Fatalf("missing file: %d %q", code, errOut)
	}
	if code, _, errOut := runDam(t, "state", "reset", "--dsn", dsn, "--all", "--yes", "--entities-from", list, "svc"); code != 2 || !strings.Contains(errOut, "excludes") {
		t.Fatalf("--all with a list: %d %q", code, errOut)
	}
}

var barLine = regexp.MustCompile(`^\rreset \[#*\.*\] \d+/250 identities \(\d+%\), \d+ deleted$`)

// reset --all --yes walks the service in batches; on a terminal the
// progress is a bar redrawn in place.
func TestStateResetAllProgressBar(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	s, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fill(t, s, "svc", 250)
	fill(t, s, "other", 3)
	code, out, errOut := runDam(t, "state", "reset", "--dsn", dsn, "--all", "--yes", "--batch", "100", "--progress", "bar", "svc")
	if code != 0 || !strings.Contains(out, "reset 250 identities of service svc") {
		t.Fatalf("reset --all: %d %q %q", code, out, errOut)
	}
	if !strings.HasSuffix(errOut, "\n") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("bar: want redraws on one line, got %q", errOut)
	}
	draws := strings.SplitAfter(strings.TrimSuffix(errOut, "\n"), "deleted")
	if len(draws) != 4 || draws[3] != "" {
		t.Fatalf("bar: want 3 draws, got %q", errOut)
	}
	for _, d := range draws[:3] {
		if !barLine.MatchString(d) {
			t.Fatalf("bar draw %q", d)
		}
	}
	if !strings.Contains(draws[2], "[##############################] 250/250 identities (100%)") {
		t.Fatalf("last draw %q", draws[2])
	}
	if n, _ := s.Count(context.Background(), "other"); n != 3 {
		t.Fatalf("other service: %d rows", n)
	}
}

func TestStatePruneProgress(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	s, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fill(t, s, "svc", 30)
	if _, err := s.Pool().Exec(context.Background(), `UPDATE state SET updated_at = now() - interval '2 hours' WHERE entity < 'e-2'`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runDam(t, "state", "prune", "--dsn", dsn, "--service", "svc", "--older-than", "1h", "--batch", "10", "--progress", "lines")
	if code != 0 || !strings.Contains(out, "pruned 12 identities") {
		t.Fatalf("prune: %d %q %q", code, out, errOut)
	}
	if errOut != "prune: 10/30 rows walked (33%), 10 deleted\nprune: 30/30 rows walked (100%), 12 deleted\n" {
		t.Fatalf("progress lines: %q", errOut)
	}
	if code, _, errOut := runDam(t, "state", "prune", "--dsn", dsn, "--older-than", "1h", "--yes", "--progress", "fancy"); code != 2 || !strings.Contains(errOut, "want auto, bar, lines or none") {
		t.Fatalf("--progress fancy: %d %q", code, errOut)
	}
	// auto: stderr here is not a terminal, so plain lines.
	code, _, errOut = runDam(t, "state", "prune", "--dsn", dsn, "--older-than", "1h", "--yes")
	if code != 0 || !strings.HasPrefix(errOut, "prune: ") || strings.Contains(errOut, "\r") {
		t.Fatalf("auto progress off a terminal: %d %q", code, errOut)
	}
}

// An unreachable database is named and fails with status 1.
func TestStateUnreachable(t *testing.T) {
	t.Parallel()
	code, _, errOut := runDam(t, "state", "get", "--dsn", "postgres://dam:secret@127.0.0.1:1/x?connect_timeout=2", "svc", "e")
	if code != 1 || !strings.Contains(errOut, "store unavailable") || strings.Contains(errOut, "secret") {
		t.Fatalf("unreachable: %d %q", code, errOut)
	}
}

// state prune --older-than without --service forgets state of every
// service: like reset --all, it needs --yes, so that --older-than 1s
// does not wipe every service's state without a question.
func TestPruneEveryServiceNeedsYes(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	s, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fill(t, s, "a", 5)
	fill(t, s, "b", 5)
	if _, err := s.Pool().Exec(context.Background(), `UPDATE state SET updated_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	count := func(service string) int64 {
		n, err := s.Count(context.Background(), service)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	code, _, errOut := runDam(t, "state", "prune", "--dsn", dsn, "--older-than", "1s")
	if code != 2 || !strings.Contains(errOut, "--yes") || !strings.Contains(errOut, "--service") {
		t.Fatalf("prune --older-than of every service without --yes: exit %d, %q; want exit 2", code, errOut)
	}
	if a, b := count("a"), count("b"); a != 5 || b != 5 {
		t.Fatalf("a refused prune deleted state: a %d, b %d", a, b)
	}
	// Expired window ids only: changes no decision, asks nothing.
	if code, out, errOut := runDam(t, "state", "prune", "--dsn", dsn); code != 0 || !strings.Contains(out, "expired window ids") {
		t.Fatalf("prune of window ids: exit %d, %q %q", code, out, errOut)
	}
	if code, out, errOut := runDam(t, "state", "prune", "--dsn", dsn, "--older-than", "1s", "--service", "a", "--progress", "none"); code != 0 || !strings.Contains(out, "pruned 5 ") {
		t.Fatalf("prune of one service: exit %d, %q %q", code, out, errOut)
	}
	if a, b := count("a"), count("b"); a != 0 || b != 5 {
		t.Fatalf("after pruning a: a %d, b %d", a, b)
	}
	if code, out, errOut := runDam(t, "state", "prune", "--dsn", dsn, "--older-than", "1s", "--yes", "--progress", "none"); code != 0 || !strings.Contains(out, "pruned 5 ") {
		t.Fatalf("prune --yes: exit %d, %q %q", code, out, errOut)
	}
}

// Service names are printed quoted when they are not plain text, as
// entities are: a service named with terminal escapes (in a store written
// by hand, or by a dam that did not check names) is never printed raw by
// state stats or state get.
func TestStateQuotesServices(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	s, err := dedup.Open(context.Background(), dsn, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const evil = "evil\x1b]0;pwned\a\x1b[2J"
	// Written past dedup's checks, as an older dam let it be.
	if _, err := s.Pool().Exec(context.Background(), `INSERT INTO state (service, entity, digest) VALUES ($1, 'e', '\x01'::bytea || decode(repeat('ab', 32), 'hex'))`, evil); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"state", "stats", "--dsn", dsn},
		{"state", "get", "--dsn", dsn, evil, "e"},
		{"state", "reset", "--dsn", dsn, evil, "e"},
	} {
		code, out, errOut := runDam(t, args...)
		if code != 0 || strings.ContainsAny(out+errOut, "\x1b\a") || !strings.Contains(out, `"evil\x1b]0;pwned\a\x1b[2J"`) {
			t.Errorf("dam %s: exit %d, %q %q; want the service quoted", strings.Join(args[:2], " "), code, out, errOut)
		}
	}
}
