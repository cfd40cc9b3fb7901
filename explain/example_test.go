package explain_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/explain"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/pipeline"
)

// Offset says what the sidecar decided for an input record, and why.
func ExampleExplainer_Offset() {
	ctx := context.Background()
	x := newExample()
	defer x.close()
	x.decide(`{"banana_id":"B-007","ripeness":"yellow","updated_at":1}`, `{"updated_at":2,"banana_id":"B-007","ripeness":"yellow"}`)

	ex := explain.New(x.store, x.kafka, "dam-customer-2")
	for _, offset := range []int64{0, 1} {
		res, err := ex.Offset(ctx, x.route, 0, offset)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("offset %d: %s: %s\n", offset, res.Decision, res.Reason)
	}
	// Output:
	// offset 0: forward: forwarded: no earlier record of this entity in offsets [0, 0): a new identity; it set the stored digest, still current
	// offset 1: duplicate: duplicate of the content forwarded from offset 0 at 2030-01-02T03:04:05Z; decided at 2030-01-02T03:04:05Z (the decision log holds its batch [0, 2))
}

// Payload says whether a payload would be forwarded now, and what differs
// from the content last forwarded.
func ExampleExplainer_Payload() {
	ctx := context.Background()
	x := newExample()
	defer x.close()
	x.decide(`{"banana_id":"B-007","ripeness":"yellow","updated_at":1}`)

	ex := explain.New(x.store, x.kafka, "dam-customer-2")
	res, err := ex.Payload(ctx, explain.Query{Route: x.route, Service: "customer-2", Entity: []byte("B-007"),
		Value: []byte(`{"banana_id":"B-007","ripeness":"spotted","updated_at":3}`), HasValue: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s (%s): %s\n", res.Decision, res.Cause, res.Reason)
	fmt.Println("difference:", res.Difference)
	// Output:
	// forward (changed): its digest differs from the stored digest
	// difference: /ripeness: "yellow" -> "spotted"
}

// example is a route of a sidecar's configuration, a Kafka cluster (kfake)
// holding its input topic and a store, as the examples need them.
type example struct {
	cluster *kfake.Cluster
	kafka   *kgo.Client
	store   *dedup.Store
	route   *pipeline.Route
}

func newExample() *example {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "projections.customer-2"))
	if err != nil {
		log.Fatal(err)
	}
	kafka, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	dsn, err := pgtest.Schema()
	if err != nil {
		log.Fatal(err)
	}
	store, err := dedup.Open(ctx, dsn, dedup.Config{})
	if err != nil {
		log.Fatal(err)
	}
	// The route as the sidecar compiles it from its configuration.
	cfg := config.Default()
	cfg.Kafka.Brokers, cfg.Kafka.Group, cfg.Postgres.DSN = cluster.ListenAddrs(), "dam-customer-2", dsn
	rc := config.DefaultRoute()
	rc.Service, rc.From, rc.To, rc.Ignore = "customer-2", "projections.customer-2", "delivery.customer-2", []string{"/updated_at"}
	cfg.Routes = []config.Route{rc}
	if err := cfg.Validate(); err != nil {
		log.Fatal(err)
	}
	route, err := pipeline.CompileRoute(cfg.Routes[0])
	if err != nil {
		log.Fatal(err)
	}
	return &example{cluster: cluster, kafka: kafka, store: store, route: route}
}

func (x *example) close() {
	x.store.Close()
	x.kafka.Close()
	x.cluster.Close()
}

// decide produces values (key B-007) to the input and decides them in one
// batch at 2030-01-02T03:04:05Z, as the sidecar does.
func (x *example) decide(values ...string) {
	ctx := context.Background()
	p := dedup.Partition{Group: "dam-customer-2", Topic: "projections.customer-2"}
	pr, err := x.store.Acquire(ctx, p)
	if err != nil {
		log.Fatal(err)
	}
	if err := x.store.InitProgress(ctx, p, pr.Epoch, 0); err != nil {
		log.Fatal(err)
	}
	b := &dedup.Batch{Service: "customer-2", Rule: x.route.Rule(), Now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC),
		Partition: p, Epoch: pr.Epoch, End: int64(len(values))}
	for _, v := range values {
		rec := &kgo.Record{Topic: p.Topic, Key: []byte("B-007"), Value: []byte(v)}
		if err := x.kafka.ProduceSync(ctx, rec).FirstErr(); err != nil {
			log.Fatal(err)
		}
		id, version, digest, err := x.route.Identify(rec)
		b.Records = append(b.Records, dedup.Record{Offset: rec.Offset, Entity: id, Version: version, Digest: digest, Invalid: err != nil})
	}
	if _, err := x.store.Decide(ctx, b, nil); err != nil {
		log.Fatal(err)
	}
}
