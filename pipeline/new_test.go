package pipeline_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// New validates the configuration it is given, as Load does: a Config
// built in code with entity: /banana_id deduplicates by that pointer (not
// by key, the entity never parsed), and an invalid one is refused with the
// key named.
func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.Entity = "/banana_id"
	cfg := testConfig(t, kc, dsn, rt) // not validated: New must do it
	reg := prometheus.NewRegistry()
	pl, err := pipeline.New(cfg, openStore(t, dsn), pipeline.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, pl, reg)
	one(t, kc, "in",
		&kgo.Record{Key: []byte("x"), Value: []byte(`{"banana_id":"B-1","v":1}`)},
		&kgo.Record{Key: []byte("y"), Value: []byte(`{"banana_id":"B-1","v":1}`)}) // another key, same entity and content
	r.waitRecords("svc", 2)
	if out := kc.ReadAll("out"); len(out) != 1 {
		t.Errorf("forwarded %s; want one record: the second is a duplicate of entity B-1", dump(out))
	}
	r.stop()

	bad := cfg
	bad.Routes = slices.Clone(cfg.Routes)
	bad.Routes[0].Ignore = []string{"no-slash"}
	if _, err := pipeline.New(bad, openStore(t, dsn)); !errors.Is(err, pipeline.ErrConfig) || !contains(err.Error(), "routes[0].ignore[0]") {
		t.Errorf("New with a bad ignore pointer: %v, want ErrConfig naming routes[0].ignore[0]", err)
	}
	txnid := cfg
	txnid.Kafka.TransactionalID = "x"
	if _, err := pipeline.New(txnid, openStore(t, dsn)); !errors.Is(err, pipeline.ErrConfig) || !contains(err.Error(), "kafka.transactional_id") {
		t.Errorf("New with a transactional id in at-least-once mode: %v, want ErrConfig naming kafka.transactional_id", err)
	}
}

// A pointer entity on a format: bytes route comes from canon's own pass:
// two entities that differ only in invalid UTF-8 or a lone surrogate are
// never merged (encoding/json turned both into U+FFFD: one identity, and
// the second record was dropped as its duplicate); such values are not
// JSON, so they have no entity and are dead-lettered. Valid entities that
// differ stay apart.
func TestPointerEntityOnBytesRoute(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out", "dlq")
	dsn := pgtest.DSN(t)
	rt := route("svc", "in", "out")
	rt.Entity, rt.Format, rt.DeadLetter = "/id", "bytes", "dlq"
	r := start(t, testConfig(t, kc, dsn, rt), openStore(t, dsn))
	one(t, kc, "in",
		&kgo.Record{Key: []byte("a"), Value: []byte("{\"id\":\"x\xff\",\"v\":1}")},   // invalid UTF-8
		&kgo.Record{Key: []byte("b"), Value: []byte("{\"id\":\"x\xfe\",\"v\":1}")},   // another one
		&kgo.Record{Key: []byte("c"), Value: []byte(`{"id":"x\ud800","v":1}`)},       // a lone surrogate
		&kgo.Record{Key: []byte("d"), Value: []byte(`{"id":"\u00e9","v":1}`)},        // é, escaped
		&kgo.Record{Key: []byte("e"), Value: []byte("{\"id\":\"\u00e9\",\"v\":1}")},  // é, raw: the same entity, other bytes
		&kgo.Record{Key: []byte("f"), Value: []byte("{\"id\":\"e\u0301\",\"v\":1}")}) // e + combining accent: another entity
	r.waitRecords("svc", 6)
	got := byKey(kc.ReadAll("out"))
	if len(got) != 3 || got["d"] == nil || got["e"] == nil || got["f"] == nil {
		t.Errorf("forwarded %v; want d, e (same entity, other bytes: a change on a bytes route) and f", got)
	}
	dl := kc.ReadAll("dlq")
	if len(dl) != 3 {
		t.Fatalf("dead letters %s, want the three records whose entity is not valid text", dump(dl))
	}
	for _, d := range dl {
		if h := headers(d)[pipeline.HeaderError]; !contains(h, "invalid") {
			t.Errorf("dead letter %s: error %q", d.Key, h)
		}
	}
	r.stop()
}
