package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// TestBanana is the seed's scenario across two services: customer-1's
// projection includes ripeness_level, customer-2's only banana_id. When the
// ripeness changes, customer-1's adapter gets the change and customer-2's
// does not get a repeat.
func TestBanana(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "projections.customer-1", "delivery.customer-1", "projections.customer-2", "delivery.customer-2")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn,
		route("customer-1", "projections.customer-1", "delivery.customer-1"),
		route("customer-2", "projections.customer-2", "delivery.customer-2"))
	r := start(t, cfg, openStore(t, dsn))

	c1 := []string{
		`{"banana_id": "B-007", "ripeness_level": "Mostly Yellow"}`,
		`{"banana_id": "B-007", "ripeness_level": "Mostly Yellow"}`,
		`{"banana_id": "B-007", "ripeness_level": "Perfectly Yellow"}`,
	}
	c2 := []string{`{"banana_id": "B-007"}`, `{"banana_id": "B-007"}`, `{"banana_id": "B-007"}`}
	for i := range c1 {
		kc.Produce("projections.customer-1", rec("B-007", c1[i]))
		kc.Produce("projections.customer-2", rec("B-007", c2[i]))
	}
	r.waitRecords("", 6)
	if got, want := byKey(kc.ReadAll("delivery.customer-1"))["B-007"], []string{c1[0], c1[2]}; !slices.Equal(got, want) {
		t.Errorf("customer-1 got %q, want %q", got, want)
	}
	if got, want := byKey(kc.ReadAll("delivery.customer-2"))["B-007"], []string{c2[0]}; !slices.Equal(got, want) {
		t.Errorf("customer-2 got %q, want %q", got, want)
	}
	if got := r.records("customer-2", "duplicate"); got != 2 {
		t.Errorf("customer-2 duplicates counted %d, want 2", got)
	}
	r.stop()
}

// TestSequences checks last-seen per entity with exact output in order:
// A B A B A forwards all five, A A A A B forwards the first A and B.
func TestSequences(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 3, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.BatchSize = 2 // repeats straddle batches
	r := start(t, cfg, openStore(t, dsn))

	A, B := `{"v":"A"}`, `{"v":"B"}`
	var in []*kgo.Record
	for _, v := range []string{A, B, A, B, A} {
		in = append(in, rec("abab", v))
	}
	for _, v := range []string{A, A, A, A, B} {
		in = append(in, rec("aaab", v))
	}
	kc.Produce("in", in...)
	r.waitRecords("svc", 10)
	got := byKey(kc.ReadAll("out"))
	if want := []string{A, B, A, B, A}; !slices.Equal(got["abab"], want) {
		t.Errorf("A B A B A forwarded %q, want %q", got["abab"], want)
	}
	if want := []string{A, B}; !slices.Equal(got["aaab"], want) {
		t.Errorf("A A A A B forwarded %q, want %q", got["aaab"], want)
	}
	r.stop()
}

// TestStructuralEquality drops records equal as JSON trees to the last
// forwarded one (member order, whitespace, escapes) and records that differ
// only in ignored fields, and forwards real changes.
func TestStructuralEquality(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.Ignore = []string{"/updated_at", "/items/*/ts"}
	cfg := testConfig(t, kc, dsn, rt)
	r := start(t, cfg, openStore(t, dsn))

	in := []*kgo.Record{
		rec("order", `{"a":1,"b":2}`),
		rec("order", `{"b":2,"a":1}`),
		rec("ws", `{"a":[1,2],"s":"x"}`),
		rec("ws", " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"s\":\"x\" } "),
		rec("esc", `{"s":"A"}`),
		rec("esc", `{"s":"\u0041"}`),
		rec("ign", `{"id":1,"updated_at":"t1","items":[{"n":1,"ts":1},{"n":2,"ts":2}]}`),
		rec("ign", `{"id":1,"updated_at":"t2","items":[{"n":1,"ts":3},{"n":2,"ts":4}]}`),
		rec("ign", `{"updated_at":"t3","id":1,"items":[{"ts":5,"n":1},{"n":2,"ts":6}]}`),
		rec("ign", `{"id":1,"updated_at":"t4","items":[{"n":1,"ts":7},{"n":3,"ts":8}]}`), // a real change
		rec("num", `{"n":1}`),
		rec("num", `{"n":1.0}`), // numbers compare by literal: a change
	}
	kc.Produce("in", in...)
	r.waitRecords("svc", len(in))
	got := byKey(kc.ReadAll("out"))
	want := map[string][]string{
		"order": {`{"a":1,"b":2}`},
		"ws":    {`{"a":[1,2],"s":"x"}`},
		"esc":   {`{"s":"A"}`},
		"ign": {
			`{"id":1,"updated_at":"t1","items":[{"n":1,"ts":1},{"n":2,"ts":2}]}`,
			`{"id":1,"updated_at":"t4","items":[{"n":1,"ts":7},{"n":3,"ts":8}]}`,
		},
		"num": {`{"n":1}`, `{"n":1.0}`},
	}
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			t.Errorf("key %s: forwarded %q, want %q", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("forwarded keys %v, want %v", keys(got), keys(want))
	}
	r.stop()
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestManyEntities runs 300 entities x 20 records (about a third exact or
// structural repeats of the entity's previous record) over 6 partitions in
// batches of 50, and compares the output with a reference last-seen model:
// exactly the expected (key, value) records, each key's in input order.
func TestManyEntities(t *testing.T) {
	t.Parallel()
	const entities, perEntity = 300, 20
	kc := testkafka.New(t, 6, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.BatchSize = 50
	cfg.Pipeline.MaxInFlight = 200 // exercises pausing and resuming fetches
	cfg.Routes[0].Ignore = []string{"/seq"}

	rng := rand.New(rand.NewPCG(1, 2))
	want := map[string][]string{}
	last := map[string]int{} // entity -> content (v) last forwarded
	var in []*kgo.Record
	repeats := 0
	for i := range entities * perEntity {
		e := rng.IntN(entities)
		key := fmt.Sprintf("e-%03d", e)
		v, seen := last[key]
		if !seen || rng.IntN(10) >= 3 {
			v = rng.IntN(4) // small range: A B A patterns occur too
		}
		var value string
		if rng.IntN(2) == 0 {
			value = fmt.Sprintf(`{"id":%q,"v":%d,"seq":"ignored-%d"}`, key, v, i)
		} else {
			value = fmt.Sprintf(`{ "seq":"ignored-%d", "v": %d, "id": %q }`, i, v, key)
		}
		if seen && last[key] == v {
			repeats++
		} else {
			want[key] = append(want[key], value)
			last[key] = v
		}
		in = append(in, rec(key, value))
	}
	t.Logf("%d records, %d repeats", len(in), repeats)
	r := start(t, cfg, openStore(t, dsn))

	// Produce in chunks while the pipeline runs.
	for chunk := range slices.Chunk(in, 1000) {
		kc.Produce("in", chunk...)
	}
	r.waitRecords("svc", len(in))
	out := kc.ReadAll("out")
	got := byKey(out)
	if len(got) != len(want) {
		t.Errorf("%d keys forwarded, want %d", len(got), len(want))
	}
	n := 0
	for k, w := range want {
		n += len(w)
		if !slices.Equal(got[k], w) {
			t.Errorf("key %s: forwarded\n%q\nwant\n%q", k, got[k], w)
		}
	}
	if len(out) != n {
		t.Errorf("%d records forwarded, want %d", len(out), n)
	}
	if f, d := r.records("svc", "forwarded"), r.records("svc", "duplicate"); f != n || d != len(in)-n {
		t.Errorf("counted forwarded=%d duplicate=%d, want %d and %d", f, d, n, len(in)-n)
	}
	r.stop()
}

// TestDeadLetters sends every kind of bad input to the dead-letter topic
// with the error and the exact source coordinates, key and value intact,
// while the good records around them are forwarded.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out", "dlq")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	rt.MaxDepth = 8
	cfg := testConfig(t, kc, dsn, rt)
	cfg.Pipeline.BatchSize = 3
	r := start(t, cfg, openStore(t, dsn))

	deep := strings.Repeat("[", 20) + strings.Repeat("]", 20)
	bad := map[string]*kgo.Record{
		"invalid json":     {Key: []byte("bad-1"), Value: []byte(`{"a":`), Partition: 0},
		"too deep":         {Key: []byte("bad-2"), Value: []byte(deep), Partition: 1},
		"duplicate member": {Key: []byte("bad-3"), Value: []byte(`{"a":1,"a":2}`), Partition: 0, Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("kept")}}},
		"missing key":      {Key: nil, Value: []byte(`{"a":1}`), Partition: 1},
		"binary key":       {Key: []byte{0xff, 0x00, 0xfe}, Value: []byte("\xff"), Partition: 0},
	}
	good := func(p int32, key, v string) *kgo.Record {
		return &kgo.Record{Key: []byte(key), Value: []byte(v), Partition: p}
	}
	in := []*kgo.Record{
		good(0, "g1", `{"n":1}`), bad["invalid json"], good(0, "g1", `{"n":2}`), bad["duplicate member"],
		good(0, "g1", `{"n":2}`), bad["binary key"], good(0, "g2", `{"n":1}`),
		good(1, "g3", `{"n":1}`), bad["too deep"], bad["missing key"], good(1, "g3", `{"n":2}`),
	}
	produceTo(t, kc, "in", in...)
	r.waitRecords("svc", len(in))

	got := byKey(kc.ReadAll("out"))
	want := map[string][]string{"g1": {`{"n":1}`, `{"n":2}`}, "g2": {`{"n":1}`}, "g3": {`{"n":1}`, `{"n":2}`}}
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			t.Errorf("key %s: forwarded %q, want %q", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("forwarded keys %v, want %v", keys(got), keys(want))
	}

	dl := kc.ReadAll("dlq")
	if len(dl) != len(bad) {
		t.Fatalf("%d dead letters, want %d: %s", len(dl), len(bad), dump(dl))
	}
	for what, b := range bad {
		var d *kgo.Record
		for _, x := range dl {
			if string(x.Value) == string(b.Value) {
				d = x
			}
		}
		if d == nil {
			t.Errorf("%s: no dead letter with value %q", what, b.Value)
			continue
		}
		if !slices.Equal(d.Key, b.Key) || (b.Key == nil) != (d.Key == nil) {
			t.Errorf("%s: dead letter key %q, want %q", what, d.Key, b.Key)
		}
		h := headers(d)
		if h[pipeline.HeaderError] == "" {
			t.Errorf("%s: no %s header", what, pipeline.HeaderError)
		}
		t.Logf("%s: %s=%q", what, pipeline.HeaderError, h[pipeline.HeaderError])
		wantH := map[string]string{
			pipeline.HeaderSourceTopic:     "in",
			pipeline.HeaderSourcePartition: strconv.Itoa(int(b.Partition)),
			pipeline.HeaderSourceOffset:    strconv.FormatInt(b.Offset, 10),
		}
		for _, src := range b.Headers {
			wantH[src.Key] = string(src.Value)
		}
		for k, v := range wantH {
			if h[k] != v {
				t.Errorf("%s: header %s=%q, want %q", what, k, h[k], v)
			}
		}
	}
	if got := r.records("svc", "invalid"); got != len(bad) {
		t.Errorf("invalid counted %d, want %d", got, len(bad))
	}
	r.stop()
}

// TestHaltWithoutDeadLetter: a bad record at offset k of a partition, on a
// route without dead_letter, halts that partition: what precedes it is
// forwarded and committed (up to k exactly), nothing after it, Ready names
// the spot, and the other partitions keep going.
//
// With batches of 4, k=4 puts the bad record first in its batch (the halt
// comes while the previous batch is still being delivered) and k=6 in the
// middle of one (the records before it are decided in the same batch).
func TestHaltWithoutDeadLetter(t *testing.T) {
	t.Parallel()
	for _, k := range []int{4, 6} {
		t.Run(fmt.Sprintf("offset %d", k), func(t *testing.T) {
			t.Parallel()
			testHalt(t, k)
		})
	}
}

func testHalt(t *testing.T, k int) {
	kc := testkafka.New(t, 2, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.BatchSize = 4
	r := start(t, cfg, openStore(t, dsn))

	var p0 []*kgo.Record
	for i := range 12 {
		v := fmt.Sprintf(`{"i":%d}`, i)
		if i == k {
			v = `{"i":` // bad
		}
		p0 = append(p0, &kgo.Record{Key: []byte(fmt.Sprintf("p0-%d", i)), Value: []byte(v), Partition: 0})
	}
	var p1 []*kgo.Record
	for i := range 5 {
		p1 = append(p1, &kgo.Record{Key: []byte(fmt.Sprintf("p1-%d", i)), Value: []byte(`{}`), Partition: 1})
	}
	produceTo(t, kc, "in", append(p0, p1...)...)
	if p0[k].Offset != int64(k) {
		t.Fatalf("bad record at offset %d, want %d", p0[k].Offset, k)
	}

	adm := kadm.NewClient(kc.Client())
	waitCommitted := func(part int32, want int64) {
		t.Helper()
		waitFor(t, fmt.Sprintf("committed offset %d on in/%d", want, part), func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			offs, err := adm.FetchOffsets(ctx, cfg.Kafka.Group)
			if err != nil {
				return false, err.Error()
			}
			o, ok := offs.Lookup("in", part)
			if !ok {
				return false, "no commit"
			}
			return o.At == want, fmt.Sprintf("committed %d", o.At)
		})
	}
	waitCommitted(0, int64(k))
	waitCommitted(1, 5)

	var err error
	waitFor(t, "Ready to report the halt", func() (bool, string) {
		err = r.pl.Ready()
		return err != nil && strings.Contains(err.Error(), "halted"), fmt.Sprint(err)
	})
	if !errors.Is(err, pipeline.ErrNotReady) {
		t.Errorf("Ready error %v does not wrap ErrNotReady", err)
	}
	for _, s := range []string{"in/0", fmt.Sprintf("offset %d", k)} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Ready error %q does not name %q", err, s)
		}
	}

	// The other partition keeps going.
	more := &kgo.Record{Key: []byte("p1-more"), Value: []byte(`{"more":1}`), Partition: 1}
	produceTo(t, kc, "in", more)
	waitCommitted(1, 6)
	out := kc.ReadAll("out")
	got := map[string]bool{}
	for _, o := range out {
		got[string(o.Key)] = true
	}
	for i := range 12 {
		key := fmt.Sprintf("p0-%d", i)
		if got[key] != (i < k) {
			t.Errorf("%s forwarded=%v, want %v", key, got[key], i < k)
		}
	}
	for _, x := range append(p1, more) {
		if !got[string(x.Key)] {
			t.Errorf("%s (partition 1) not forwarded", x.Key)
		}
	}
	if len(out) != k+len(p1)+1 {
		t.Errorf("%d records forwarded, want %d: %s", len(out), k+len(p1)+1, dump(out))
	}
	if err := r.pl.Ready(); err == nil || !strings.Contains(err.Error(), "in/0") {
		t.Errorf("Ready after partition 1 moved on: %v, want the halt of in/0", err)
	}
	if h := r.gauge("dam_halted", "svc"); h != 1 {
		t.Errorf("dam_halted = %v, want 1", h)
	}
	waitCommitted(0, int64(k)) // still
	r.stop()
}

// TestTombstones forwards tombstones as tombstones and decides them like any
// value.
func TestTombstones(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	r := start(t, cfg, openStore(t, dsn))
	A := `{"a":1}`
	in := []*kgo.Record{
		rec("t", A), tomb("t"), tomb("t"),
		tomb("u"), rec("u", A), rec("u", A),
	}
	kc.Produce("in", in...)
	r.waitRecords("svc", len(in))
	out := kc.ReadAll("out")
	got := byKey(out)
	if want := []string{A, tombstone}; !slices.Equal(got["t"], want) {
		t.Errorf("A, tombstone, tombstone forwarded %q, want %q", got["t"], want)
	}
	if want := []string{tombstone, A}; !slices.Equal(got["u"], want) {
		t.Errorf("tombstone, A, A forwarded %q, want %q", got["u"], want)
	}
	for _, o := range out {
		if kvOf(o).Value == tombstone && o.Value != nil {
			t.Errorf("tombstone forwarded with a non-nil value %q", o.Value)
		}
	}
	r.stop()
}

// TestShadow forwards everything, marking would-be duplicates only.
func TestShadow(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.Shadow = true
	cfg := testConfig(t, kc, dsn, rt)
	r := start(t, cfg, openStore(t, dsn))
	vals := []string{`{"v":1}`, `{"v":1}`, `{"v":2}`, `{ "v" : 2 }`, `{"v":1}`}
	dup := []bool{false, true, false, true, false}
	var in []*kgo.Record
	for _, v := range vals {
		in = append(in, rec("k", v))
	}
	in[0].Headers = []kgo.RecordHeader{{Key: "x", Value: []byte("y")}}
	kc.Produce("in", in...)
	r.waitRecords("svc", len(in))
	out := kc.ReadAll("out")
	if len(out) != len(in) {
		t.Fatalf("%d forwarded in shadow mode, want all %d: %s", len(out), len(in), dump(out))
	}
	for i, o := range out {
		h := headers(o)
		_, marked := h[pipeline.HeaderDuplicate]
		if string(o.Value) != vals[i] || marked != dup[i] || (marked && h[pipeline.HeaderDuplicate] != "true") {
			t.Errorf("output %d: %s headers %v; want value %s, duplicate marker %v", i, o.Value, h, vals[i], dup[i])
		}
	}
	if h := headers(out[0]); h["x"] != "y" {
		t.Errorf("input header lost: %v", h)
	}
	if d := r.records("svc", "duplicate"); d != 2 {
		t.Errorf("duplicates counted %d, want 2", d)
	}
	r.stop()
}

// TestOutputRecord keeps key, value, headers and timestamp, and with
// partitioning: preserve the partition number.
func TestOutputRecord(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 3, "in", "out")
	dsn := pgtest.DSN(t)
	keep := route("keep", "in", "out")
	keep.Partitioning = config.PartitioningPreserve
	cfg := testConfig(t, kc, dsn, keep)
	r := start(t, cfg, openStore(t, dsn))

	ts := time.UnixMilli(1_700_000_000_123)
	var in []*kgo.Record
	for p := range int32(3) {
		for i := range 4 {
			in = append(in, &kgo.Record{
				Key:       []byte(fmt.Sprintf("k-%d", i)), // same keys on every partition: murmur2 would not keep them
				Value:     []byte(fmt.Sprintf(`{"p":%d,"i":%d}`, p, i)),
				Headers:   []kgo.RecordHeader{{Key: "trace", Value: []byte(fmt.Sprintf("%d-%d", p, i))}, {Key: "empty"}},
				Timestamp: ts.Add(time.Duration(i) * time.Second),
				Partition: p,
			})
		}
	}
	produceTo(t, kc, "in", in...)
	r.waitRecords("keep", len(in))
	out := kc.ReadAll("out")
	if len(out) != len(in) {
		t.Fatalf("%d forwarded, want %d", len(out), len(in))
	}
	for _, o := range out {
		var src *kgo.Record
		for _, x := range in {
			if string(x.Value) == string(o.Value) {
				src = x
			}
		}
		if src == nil {
			t.Errorf("unexpected output %s", o.Value)
			continue
		}
		if string(o.Key) != string(src.Key) || !o.Timestamp.Equal(src.Timestamp) || o.Partition != src.Partition {
			t.Errorf("output %s: key %q ts %v partition %d; want %q %v %d", o.Value, o.Key, o.Timestamp, o.Partition, src.Key, src.Timestamp, src.Partition)
		}
		if len(o.Headers) != 2 || o.Headers[0].Key != "trace" || string(o.Headers[0].Value) != string(src.Headers[0].Value) || o.Headers[1].Key != "empty" || len(o.Headers[1].Value) != 0 {
			t.Errorf("output %s: headers %v, want %v", o.Value, o.Headers, src.Headers)
		}
	}
	r.stop()

	t.Run("fewer output partitions refuse to start", func(t *testing.T) {
		kc := testkafka.New(t, 3, "in")
		kc.CreateTopic("narrow", 2)
		dsn := pgtest.DSN(t)
		rt := route("keep", "in", "narrow")
		rt.Partitioning = config.PartitioningPreserve
		cfg := testConfig(t, kc, dsn, rt)
		validate(t, &cfg)
		pl, err := pipeline.New(cfg, openStore(t, dsn))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = pl.Run(ctx)
		if err == nil || !strings.Contains(err.Error(), "preserve") || ctx.Err() != nil {
			t.Fatalf("Run = %v, want a preserve error at once", err)
		}
		t.Log(err)
	})
	t.Run("more output partitions are fine", func(t *testing.T) {
		kc2 := testkafka.New(t, 3, "in")
		kc2.CreateTopic("wide", 5)
		dsn := pgtest.DSN(t)
		rt := route("keep", "in", "wide")
		rt.Partitioning = config.PartitioningPreserve
		cfg := testConfig(t, kc2, dsn, rt)
		r := start(t, cfg, openStore(t, dsn))
		produceTo(t, kc2, "in", &kgo.Record{Key: []byte("k"), Value: []byte(`{}`), Partition: 2})
		out := waitOutput(t, kc2, "wide", 1)
		if out[0].Partition != 2 {
			t.Errorf("forwarded to partition %d, want 2", out[0].Partition)
		}
		r.stop()
	})
}

// TestRestart stops the pipeline cleanly, produces repeats of the last
// values and new values, and runs again with the same group and schema: the
// repeats are dropped, nothing is lost or forwarded twice.
func TestRestart(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 3, "in", "out")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Pipeline.BatchSize = 3
	store := openStore(t, dsn)

	r := start(t, cfg, store)
	var first []*kgo.Record
	for i := range 10 {
		first = append(first, rec(fmt.Sprintf("k%d", i), fmt.Sprintf(`{"v":%d}`, i)))
	}
	kc.Produce("in", first...)
	r.waitRecords("svc", 10)
	r.stop()

	adm := kadm.NewClient(kc.Client())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, "in")
	if err != nil {
		t.Fatal(err)
	}
	committed, err := adm.FetchOffsets(ctx, cfg.Kafka.Group)
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		c, _ := committed.Lookup("in", o.Partition)
		if o.Offset > 0 && c.At != o.Offset {
			t.Errorf("after a clean stop in/%d is committed at %d, want the end %d", o.Partition, c.At, o.Offset)
		}
	})

	var second []*kgo.Record
	for i := range 10 {
		second = append(second, rec(fmt.Sprintf("k%d", i), fmt.Sprintf(`{"v":%d}`, i))) // repeats
	}
	for i := 5; i < 10; i++ {
		second = append(second, rec(fmt.Sprintf("k%d", i), fmt.Sprintf(`{"v":%d}`, i+100))) // changes
	}
	kc.Produce("in", second...)
	r = start(t, cfg, store)
	r.waitRecords("svc", len(second))
	if got := r.records("svc", "forwarded"); got != 5 {
		t.Errorf("second run forwarded %d, want 5", got)
	}
	got := byKey(kc.ReadAll("out"))
	for i := range 10 {
		key := fmt.Sprintf("k%d", i)
		want := []string{fmt.Sprintf(`{"v":%d}`, i)}
		if i >= 5 {
			want = append(want, fmt.Sprintf(`{"v":%d}`, i+100))
		}
		if !slices.Equal(got[key], want) {
			t.Errorf("%s: forwarded %q, want %q", key, got[key], want)
		}
	}
	r.stop()
}

// TestEntitySources takes the identity from a JSON pointer and from a
// header instead of the key.
func TestEntitySources(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in-ptr", "out-ptr", "in-hdr", "out-hdr")
	dsn := pgtest.DSN(t)
	ptr := route("ptr", "in-ptr", "out-ptr")
	ptr.Entity = "/banana_id"
	hdr := route("hdr", "in-hdr", "out-hdr")
	hdr.Entity = "header:Entity-Id"
	cfg := testConfig(t, kc, dsn, ptr, hdr)
	r := start(t, cfg, openStore(t, dsn))

	// Keys vary (or are absent): only the pointer decides the identity.
	ptrIn := []*kgo.Record{
		{Key: []byte("x1"), Value: []byte(`{"banana_id":"B-1","ripe":1}`)},
		{Key: []byte("x2"), Value: []byte(`{"ripe":1,"banana_id":"B-1"}`)}, // same entity, same content
		{Value: []byte(`{"banana_id":"B-2","ripe":1}`)},                    // another entity
		{Value: []byte(`{"banana_id":7,"ripe":1}`)},                        // 7 is not "7"
		{Value: []byte(`{"banana_id":"7","ripe":1}`)},
		{Key: []byte("x1"), Value: []byte(`{"banana_id":"B-1","ripe":2}`)}, // change
	}
	withID := func(id, v string) *kgo.Record {
		return &kgo.Record{Key: []byte("same-key"), Value: []byte(v), Headers: []kgo.RecordHeader{{Key: "Entity-Id", Value: []byte(id)}}}
	}
	hdrIn := []*kgo.Record{
		withID("E-1", `{"ripe":1}`),
		withID("E-1", `{"ripe":1}`),
		withID("E-2", `{"ripe":1}`),
		withID("E-1", `{"ripe":2}`),
	}
	// Partitioned by key, the pointer route's records may spread across
	// partitions; one partition keeps the test's order meaningful.
	for _, x := range ptrIn {
		x.Partition = 0
	}
	for _, x := range hdrIn {
		x.Partition = 1
	}
	produceTo(t, kc, "in-ptr", ptrIn...)
	produceTo(t, kc, "in-hdr", hdrIn...)
	r.waitRecords("", len(ptrIn)+len(hdrIn))

	values := func(recs []*kgo.Record) []string {
		var vs []string
		for _, x := range recs {
			vs = append(vs, string(x.Value))
		}
		slices.Sort(vs)
		return vs
	}
	wantPtr := values(slices.Delete(slices.Clone(ptrIn), 1, 2))
	if got := values(kc.ReadAll("out-ptr")); !slices.Equal(got, wantPtr) {
		t.Errorf("pointer route forwarded %q, want %q", got, wantPtr)
	}
	if got, want := values(kc.ReadAll("out-hdr")), []string{`{"ripe":1}`, `{"ripe":1}`, `{"ripe":2}`}; !slices.Equal(got, want) {
		t.Errorf("header route forwarded %q, want %q", got, want)
	}
	r.stop()
}

// TestStateRowsGauge: dam_state_rows counts the identities of this
// instance's services only, refreshed at start (then every minute).
func TestStateRowsGauge(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in.a", "out.a", "in.b", "out.b")
	dsn := pgtest.DSN(t)
	store := openStore(t, dsn)
	both := testConfig(t, kc, dsn, route("a", "in.a", "out.a"), route("b", "in.b", "out.b"))
	r := start(t, both, store)
	for i := range 5 {
		kc.Produce("in.a", rec(fmt.Sprintf("e%d", i), `{"v":1}`), rec(fmt.Sprintf("e%d", i), `{"v":1}`))
	}
	kc.Produce("in.b", rec("x", `{"v":1}`), rec("y", `{"v":1}`))
	r.waitRecords("", 12)
	r.stop()

	onlyA := testConfig(t, kc, dsn, route("a", "in.a", "out.a"))
	r = start(t, onlyA, store)
	waitFor(t, "dam_state_rows{service=a} = 5", func() (bool, string) {
		got := r.gauge("dam_state_rows", "a")
		return got == 5, fmt.Sprintf("dam_state_rows{service=a} = %v", got)
	})
	if got := r.gauge("dam_state_rows", "b"); got != 0 {
		t.Errorf("dam_state_rows{service=b} = %v from an instance without service b", got)
	}
	r.stop()
}
