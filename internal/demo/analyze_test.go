package demo

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/analyze"
	"github.com/dam-dedup/dam/config"
)

// TestAnalyzeMatchesDemo produces the demo's stream (its generator, on a
// kfake broker) and analyzes the four projection topics with the demo's
// routes: per service, dam analyze forwards, drops and dead-letters what
// the demo's reference model expects, the counts dam demo checks the
// sidecar against and prints.
func TestAnalyzeMatchesDemo(t *testing.T) {
	t.Parallel()
	services := demoServices()
	var topics []string
	for _, s := range services {
		topics = append(topics, "projections."+s.name)
	}
	cluster, err := kfake.NewCluster(kfake.SeedTopics(6, topics...))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	broker := cluster.ListenAddrs()[0]
	gen, err := newDemoGenerator(broker, services, 300)
	if err != nil {
		t.Fatal(err)
	}
	defer gen.close()
	if err := gen.run(context.Background(), 8000, 0); err != nil {
		t.Fatal(err)
	}

	cfg := config.Default()
	for _, s := range services { // as Run configures the sidecar
		r := config.DefaultRoute()
		r.Service, r.From, r.To = s.name, "projections."+s.name, "delivery."+s.name
		r.DeadLetter, r.Ignore = "delivery."+s.name+".dlq", s.ignore
		if s.entity != "" {
			r.Entity = s.entity
		}
		cfg.Routes = append(cfg.Routes, r)
	}
	if err := cfg.ValidateForAnalyze(); err != nil {
		t.Fatal(err)
	}
	src := analyze.NewKafkaSource([]kgo.Opt{kgo.SeedBrokers(broker)}, topics, analyze.Start{}, cfg.Pipeline.MaxDecompressedBatchBytes)
	rep, err := analyze.Run(context.Background(), src, cfg.Routes, analyze.Options{WhatIf: -1})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Records != gen.sent.Load() {
		t.Errorf("analyzed %d records, the demo sent %d", rep.Records, gen.sent.Load())
	}
	for _, r := range rep.Routes {
		e := gen.expected[r.Service]
		t.Logf("%s: %d in, %d forwarded, %d dropped (%.1f%%), %d dead-lettered", r.Service, r.Records, r.Forwarded, r.Dropped, r.DropRate, r.DeadLetters)
		if r.Records != int64(e.in) || r.Forwarded != int64(e.forwarded) || r.Dropped != int64(e.duplicate) || r.DeadLetters != int64(e.invalid) {
			t.Errorf("%s: analyzed %d in, %d forwarded, %d dropped, %d dead-lettered; the demo expects %d/%d/%d/%d",
				r.Service, r.Records, r.Forwarded, r.Dropped, r.DeadLetters, e.in, e.forwarded, e.duplicate, e.invalid)
		}
	}
}
