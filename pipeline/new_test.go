package pipeline_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/internal/pgtest"
	"github.com/dam-dedup/dam/internal/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// New validates the configuration it is given, as Load does: a Config
// built in code with entity: /banana_id deduplicates by that pointer (it
// used to be deduplicated by key, the entity never parsed), and an invalid
// one is refused with the key named.
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
