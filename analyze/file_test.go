package analyze_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/analyze"
	"github.com/dam-dedup/dam/config"
)

// readAll reads a source once and returns its records.
func readAll(t *testing.T, src analyze.Source) []*kgo.Record {
	t.Helper()
	var recs []*kgo.Record
	if err := src.Read(context.Background(), nil, func(run []*kgo.Record) (int, error) {
		recs = append(recs, run...)
		return len(run), nil
	}); err != nil {
		t.Fatal(err)
	}
	return recs
}

// TestFileSourceForms reads both line forms: kcat's -J envelope (its key,
// payload, null payload as a tombstone, timestamp and both header forms)
// and a value with or without a tab-separated key.
func TestFileSourceForms(t *testing.T) {
	t.Parallel()
	path := writeFile(t,
		`{"topic":"t","partition":2,"offset":17,"tstype":"create","ts":1700000000123,"broker":1,"headers":["h","1","g",null],"key":"k1","payload":"{\"a\":1}"}`,
		`{"topic":"t","partition":2,"offset":18,"key":null,"payload":null,"headers":[{"key":"h","value":"2"}]}`,
		"k2\t{\"a\":\t2}",
		`{"payload":"not an envelope: no topic"}`,
		"",
		`[1,2]`,
	)
	recs := readAll(t, analyze.NewFileSource(path, "route-topic", 1<<20))
	if len(recs) != 5 {
		t.Fatalf("read %d records, want 5 (the blank line skipped)", len(recs))
	}
	r := recs[0]
	if r.Topic != "t" || r.Partition != 2 || r.Offset != 17 || string(r.Key) != "k1" || string(r.Value) != `{"a":1}` ||
		r.Timestamp.UnixMilli() != 1700000000123 || len(r.Headers) != 2 || string(r.Headers[0].Value) != "1" || r.Headers[1].Value != nil {
		t.Errorf("envelope: %+v", r)
	}
	if r := recs[1]; r.Key != nil || r.Value != nil || len(r.Headers) != 1 || string(r.Headers[0].Value) != "2" {
		t.Errorf("tombstone envelope: key %q value %q headers %v", r.Key, r.Value, r.Headers)
	}
	if r := recs[2]; r.Topic != "route-topic" || string(r.Key) != "k2" || string(r.Value) != "{\"a\":\t2}" {
		t.Errorf("keyed line: %q %q %q", r.Topic, r.Key, r.Value)
	}
	if r := recs[3]; r.Key != nil || string(r.Value) != `{"payload":"not an envelope: no topic"}` {
		t.Errorf("a value with a payload member: %q %q", r.Key, r.Value)
	}
	if got := analyze.NewFileSource(path, "x", 1<<20).Where(recs[0]); !strings.Contains(got, ":1 (partition 2, offset 17)") {
		t.Errorf("Where = %q", got)
	}
	all := readAll(t, analyze.NewFileSource(path, "only", 1<<20).AllToTopic())
	if all[0].Topic != "only" {
		t.Errorf("AllToTopic: an envelope's record has topic %q", all[0].Topic)
	}
	plain := readAll(t, analyze.NewFileSource(path, "x", 1<<20).WithoutKeys())
	if r := plain[2]; r.Key != nil || string(r.Value) != "k2\t{\"a\":\t2}" {
		t.Errorf("WithoutKeys: %q %q", r.Key, r.Value)
	}
}

// TestFileSourceLineLimit: a line past the limit ends the reading with an
// error naming its line, never an unbounded buffer.
func TestFileSourceLineLimit(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `{"a":1}`, `{"a":"`+strings.Repeat("x", 200<<10)+`"}`)
	err := analyze.NewFileSource(path, "t", 100<<10).Read(context.Background(), nil, func(run []*kgo.Record) (int, error) { return len(run), nil })
	if err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("err = %v, want line 2 too long", err)
	}
}

// TestFileSourceRereadsTheSameLines: after a first Read stopped early, a
// later Read passes the same records, no more.
func TestFileSourceRereadsTheSameLines(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "a\t1", "b\t2", "c\t3", "d\t4")
	src := analyze.NewFileSource(path, "t", 1<<20)
	if err := src.Read(context.Background(), nil, func(run []*kgo.Record) (int, error) {
		return 2, analyze.ErrStop // takes the first two
	}); err != nil {
		t.Fatal(err)
	}
	if again := readAll(t, src); len(again) != 2 || string(again[1].Key) != "b" {
		t.Fatalf("the second read passed %d records, want the first 2", len(again))
	}
}

// TestFileStopsBeforeWhatItDoesNotRead: an analysis that stops (at
// --max-records or at the identity limit) before a line it cannot read
// (too long, a malformed envelope) ends without error, as it would had
// the file ended there: the lines past the stop are never read, and the
// what-if runs read the records the first pass took.
func TestFileStopsBeforeWhatItDoesNotRead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		bad  string
		o    analyze.Options
	}{
		{"max records, a long line", `{"a":"` + strings.Repeat("x", 2<<10) + `"}`, analyze.Options{MaxRecords: 4}},
		{"max records, a bad envelope", `{"topic":"t","partition":0,"offset":9,"payload":7}`, analyze.Options{MaxRecords: 4}},
		{"identity limit, a long line", `{"a":"` + strings.Repeat("x", 2<<10) + `"}`, analyze.Options{MaxIdentities: 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			lines := []string{`k1	{"a":1,"b":1}`, `k1	{"a":1,"b":2}`, `k2	{"a":1,"b":1}`, `k1	{"a":1,"b":2}`, `k3	{"a":1}`, `k1	{"a":1}`, c.bad}
			rep, err := analyze.Run(context.Background(), analyze.NewFileSource(writeFile(t, lines...), "t", 1<<10), []config.Route{routeOf(t, nil)}, c.o)
			if err != nil {
				t.Fatalf("an analysis stopped before line 7 fails on it: %v", err)
			}
			if rep.Records != 4 || rep.Stopped == "" {
				t.Fatalf("records %d, stopped %q: want 4 and a stop", rep.Records, rep.Stopped)
			}
			for _, p := range rep.Routes[0].Churn.Paths {
				if p.WhatIf == nil || p.WhatIf.Error != "" || p.WhatIf.Dropped > rep.Records {
					t.Errorf("%s: what-if %+v", p.Path, p.WhatIf)
				}
			}
		})
	}
}

// TestStandardInputStopsWithoutWaitingForMore: from standard input (a
// pipe whose writer is still there, as `kcat -C` without -e is), an
// analysis that reaches --max-records ends, without waiting for lines
// past it that may never come.
func TestStandardInputStopsWithoutWaitingForMore(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = io.WriteString(pw, "k1\t{\"a\":1}\nk1\t{\"a\":1}\nk2\t{\"a\":2}\n") }()
	done := make(chan error, 1)
	var rep *analyze.Report
	go func() {
		var err error
		rep, err = analyze.Run(context.Background(), analyze.NewReaderSource(pr, "t", 1<<20), []config.Route{routeOf(t, nil)}, analyze.Options{MaxRecords: 2})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		if rep.Records != 2 || rep.Routes[0].Dropped != 1 {
			t.Fatalf("records %d, dropped %d: want 2 and 1", rep.Records, rep.Routes[0].Dropped)
		}
	case <-time.After(10 * time.Second):
		pw.CloseWithError(errors.New("the analysis waited for input past --max-records"))
		<-done
		t.Fatal("the analysis waited for input past --max-records")
	}
}
