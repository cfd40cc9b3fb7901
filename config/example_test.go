package config_test

import (
	"fmt"
	"log"

	"github.com/dam-dedup/dam/config"
)

func ExampleLoad() {
	cfg, err := config.Load("testdata/dam.yaml", []string{
		"DAM_POSTGRES_DSN=postgres://dam:s3cret@db.internal:5432/dam",
		"DAM_KAFKA_BROKERS=k1:9092,k2:9092,k3:9092",
		"DAM_PIPELINE_RETRY_MAX=30s",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(cfg.Kafka.Brokers, cfg.Pipeline.RetryMax)
	fmt.Println(cfg.Redacted().Postgres.DSN)
	for _, r := range cfg.Routes {
		fmt.Println(r.Service, r.Mode, r.From, "->", r.To, r.EntitySource().Kind)
	}
	// Output:
	// [k1:9092 k2:9092 k3:9092] 30s
	// postgres://dam:xxxxx@db.internal:5432/dam
	// customer-2 last-seen projections.customer-2 -> delivery.customer-2 key
	// invoices last-seen projections.invoices -> delivery.invoices header
	// payments window commands.payments -> delivery.payments key
	// orders version events.orders -> delivery.orders pointer
}
