package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// route returns a second valid route.
func route(service, from, to string) Route {
	r := DefaultRoute()
	r.Service, r.From, r.To = service, from, to
	return r
}

func TestDefaultValid(t *testing.T) {
	c := valid()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := c.Routes[0].EntitySource(); got.Kind != EntityKey {
		t.Fatalf("entity source %+v", got)
	}
}

func TestDefaultIncomplete(t *testing.T) {
	c := Default()
	err := c.Validate()
	var keys []string
	for _, e := range problems(t, err) {
		keys = append(keys, e.(*Error).Key)
	}
	want := []string{"kafka.brokers", "kafka.group", "postgres.dsn", "routes"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
}

func TestValidateErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
		key    string
		msg    string
	}{
		{"no brokers", func(c *Config) { c.Kafka.Brokers = nil }, "kafka.brokers", "required"},
		{"empty broker", func(c *Config) { c.Kafka.Brokers = []string{"a:1", " "} }, "kafka.brokers[1]", "empty"},
		{"no group", func(c *Config) { c.Kafka.Group = "" }, "kafka.group", "required"},
		{"no dsn", func(c *Config) { c.Postgres.DSN = "" }, "postgres.dsn", "required"},
		{"no routes", func(c *Config) { c.Routes = nil }, "routes", "at least one route"},
		{"no service", func(c *Config) { c.Routes[0].Service = "" }, "routes[0].service", "required"},
		{"no from", func(c *Config) { c.Routes[0].From = "" }, "routes[0].from", "required"},
		{"no to", func(c *Config) { c.Routes[0].To = "" }, "routes[0].to", "required"},
		{"duplicate service", func(c *Config) { c.Routes = append(c.Routes, route("a", "in.b", "out.b")) }, "routes[1].service", `"a" is already the service of routes[0]`},
		{"duplicate from", func(c *Config) { c.Routes = append(c.Routes, route("b", "in.a", "out.b")) }, "routes[1].from", `"in.a" is already read by routes[0]`},
		{"to loops", func(c *Config) { c.Routes = append(c.Routes, route("b", "in.b", "in.a")) }, "routes[1].to", "a loop"},
		{"to loops to itself", func(c *Config) { c.Routes[0].To = "in.a" }, "routes[0].to", "a loop"},
		{"dead letter loops", func(c *Config) {
			c.Routes = append(c.Routes, route("b", "in.b", "out.b"))
			c.Routes[0].DeadLetter = "in.b"
		}, "routes[0].dead_letter", "a loop"},
		{"dead letter is to", func(c *Config) { c.Routes[0].DeadLetter = "out.a" }, "routes[0].dead_letter", "also the route's to topic"},
		{"mode bogus", func(c *Config) { c.Routes[0].Mode = "newest" }, "routes[0].mode", `invalid value "newest": want "last-seen", "window" or "version"`},
		{"window without window", func(c *Config) { c.Routes[0].Mode = "window" }, "routes[0].window", `required with mode "window"`},
		{"window negative", func(c *Config) { window(c); c.Routes[0].Window = -time.Second }, "routes[0].window", "must be positive"},
		{"window id_from key", func(c *Config) { window(c); c.Routes[0].IDFrom = "key" }, "routes[0].id_from", `invalid value "key": want "header:Name" or a JSON pointer`},
		{"window id_from wildcard", func(c *Config) { window(c); c.Routes[0].IDFrom = "/ids/*" }, "routes[0].id_from", `invalid value "/ids/*"`},
		{"window entity", func(c *Config) { window(c); c.Routes[0].Entity = "/id" }, "routes[0].entity", `not used with mode "window"`},
		{"window cleanup interval", func(c *Config) { window(c); c.Routes[0].CleanupInterval = -time.Second }, "routes[0].cleanup_interval", "must be positive"},
		{"window cleanup batch", func(c *Config) { window(c); c.Routes[0].CleanupBatch = -1 }, "routes[0].cleanup_batch", "must be positive"},
		{"window refresh_after", func(c *Config) { window(c); c.Routes[0].RefreshAfter = time.Hour }, "routes[0].refresh_after", `only with mode "last-seen", not "window"`},
		{"window version_from", func(c *Config) { window(c); c.Routes[0].VersionFrom = "/v" }, "routes[0].version_from", `only with mode "version", not "window"`},
		{"id_from in last-seen", func(c *Config) { c.Routes[0].IDFrom = "header:Id" }, "routes[0].id_from", `only with mode "window", not "last-seen"`},
		{"window in last-seen", func(c *Config) { c.Routes[0].Window = time.Hour }, "routes[0].window", `only with mode "window"`},
		{"sliding in version", func(c *Config) { c.Routes[0].Mode = "version"; c.Routes[0].Sliding = true }, "routes[0].sliding", `only with mode "window", not "version"`},
		{"cleanup in last-seen", func(c *Config) { c.Routes[0].CleanupInterval = time.Minute }, "routes[0].cleanup_interval", `only with mode "window"`},
		{"cleanup batch in last-seen", func(c *Config) { c.Routes[0].CleanupBatch = 5 }, "routes[0].cleanup_batch", `only with mode "window"`},
		{"version_from in last-seen", func(c *Config) { c.Routes[0].VersionFrom = "/v" }, "routes[0].version_from", `only with mode "version", not "last-seen"`},
		{"version_from key", func(c *Config) { c.Routes[0].Mode = "version"; c.Routes[0].VersionFrom = "key" }, "routes[0].version_from", `invalid value "key"`},
		{"version_from empty header", func(c *Config) { c.Routes[0].Mode = "version"; c.Routes[0].VersionFrom = "header:" }, "routes[0].version_from", `invalid value "header:"`},
		{"refresh_after in version", func(c *Config) { c.Routes[0].Mode = "version"; c.Routes[0].RefreshAfter = time.Hour }, "routes[0].refresh_after", `only with mode "last-seen", not "version"`},
		{"refresh_after negative", func(c *Config) { c.Routes[0].RefreshAfter = -time.Hour }, "routes[0].refresh_after", "must be positive (or 0: off)"},
		{"entity empty header", func(c *Config) { c.Routes[0].Entity = "header:" }, "routes[0].entity", "empty header name"},
		{"entity no slash", func(c *Config) { c.Routes[0].Entity = "banana_id" }, "routes[0].entity", `invalid entity "banana_id"`},
		{"entity bad escape", func(c *Config) { c.Routes[0].Entity = "/a~2" }, "routes[0].entity", "invalid entity pointer"},
		{"entity wildcard", func(c *Config) { c.Routes[0].Entity = "/items/*/id" }, "routes[0].entity", "wildcard"},
		{"format", func(c *Config) { c.Routes[0].Format = "avro" }, "routes[0].format", `invalid value "avro"`},
		{"ignore with bytes", func(c *Config) {
			c.Routes[0].Format = "bytes"
			c.Routes[0].Ignore = []string{"/a"}
		}, "routes[0].ignore", "only with format json"},
		{"ignore pointer", func(c *Config) { c.Routes[0].Ignore = []string{"/ok", "updated_at"} }, "routes[0].ignore[1]", `must start with "/"`},
		{"ignore empty pointer", func(c *Config) { c.Routes[0].Ignore = []string{""} }, "routes[0].ignore[0]", "empty pointer"},
		{"partitioning", func(c *Config) { c.Routes[0].Partitioning = "random" }, "routes[0].partitioning", `invalid value "random"`},
		{"on store failure", func(c *Config) { c.Routes[0].OnStoreFailure = "drop" }, "routes[0].on_store_failure", `invalid value "drop"`},
		{"max depth", func(c *Config) { c.Routes[0].MaxDepth = 0 }, "routes[0].max_depth", "must be positive"},
		{"max size", func(c *Config) { c.Routes[0].MaxSize = -1 }, "routes[0].max_size", "must be positive"},
		{"delivery", func(c *Config) { c.Kafka.Delivery = "at-most-once" }, "kafka.delivery", `invalid value "at-most-once"`},
		{"start", func(c *Config) { c.Kafka.Start = "middle" }, "kafka.start", `invalid value "middle"`},
		{"log level", func(c *Config) { c.Log.Level = "trace" }, "log.level", `invalid value "trace"`},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format", `invalid value "xml"`},
		{"sasl mechanism", func(c *Config) { c.Kafka.SASL.Mechanism = "GSSAPI" }, "kafka.sasl.mechanism", `invalid value "GSSAPI"`},
		{"sasl password", func(c *Config) {
			c.Kafka.SASL.Mechanism = "PLAIN"
			c.Kafka.SASL.Username = "u"
		}, "kafka.sasl.password", "required"},
		{"sasl user without mechanism", func(c *Config) { c.Kafka.SASL.Username = "u" }, "kafka.sasl.username", "without kafka.sasl.mechanism"},
		{"tls file while disabled", func(c *Config) { c.Kafka.TLS.CAFile = "/ca.pem" }, "kafka.tls.ca_file", "kafka.tls.enabled is false"},
		{"tls cert without key", func(c *Config) {
			c.Kafka.TLS.Enabled = true
			c.Kafka.TLS.CertFile = "/c.pem"
		}, "kafka.tls.key_file", "required with kafka.tls.cert_file"},
		{"tls server name while disabled", func(c *Config) { c.Kafka.TLS.ServerName = "kafka.internal" }, "kafka.tls.server_name", "kafka.tls.enabled is false"},
		{"compression codec", func(c *Config) { c.Kafka.Compression = Codecs{"zstd", "brotli"} }, "kafka.compression[1]", `invalid value "brotli": want "none", "gzip", "snappy", "lz4" or "zstd"`},
		{"compression case", func(c *Config) { c.Kafka.Compression = Codecs{"GZIP"} }, "kafka.compression[0]", `invalid value "GZIP"`},
		{"compression repeated", func(c *Config) { c.Kafka.Compression = Codecs{"gzip", "lz4", "gzip"} }, "kafka.compression[2]", `"gzip" is already kafka.compression[0]`},
		{"compression after none", func(c *Config) { c.Kafka.Compression = Codecs{"none", "gzip"} }, "kafka.compression[1]", `"gzip" is never used: "none" comes before it`},
		{"batch size", func(c *Config) { c.Pipeline.BatchSize = 0 }, "pipeline.batch_size", "must be positive"},
		{"max in flight", func(c *Config) { c.Pipeline.MaxInFlight = 999 }, "pipeline.max_in_flight", "at least pipeline.batch_size (1000)"},
		{"max batch", func(c *Config) { c.Pipeline.MaxBatch = 999 }, "pipeline.max_batch", "at least pipeline.batch_size (1000)"},
		{"retry order", func(c *Config) { c.Pipeline.RetryMin = time.Minute }, "pipeline.retry_min", "must not exceed pipeline.retry_max (10s)"},
		{"retry max", func(c *Config) { c.Pipeline.RetryMax = 0 }, "pipeline.retry_max", "must be positive"},
		{"shutdown grace", func(c *Config) { c.Pipeline.ShutdownGrace = -time.Second }, "pipeline.shutdown_grace", "must be positive"},
		{"grace above rebalance", func(c *Config) { c.Pipeline.ShutdownGrace = time.Minute }, "pipeline.shutdown_grace", "must be below kafka.rebalance_timeout"},
		{"session timeout", func(c *Config) { c.Kafka.SessionTimeout = 0 }, "kafka.session_timeout", "must be positive"},
		{"rebalance timeout", func(c *Config) { c.Kafka.RebalanceTimeout = 0 }, "kafka.rebalance_timeout", "must be positive"},
		{"statement timeout", func(c *Config) { c.Postgres.StatementTimeout = 0 }, "postgres.statement_timeout", "must be positive"},
		{"max conns", func(c *Config) { c.Postgres.MaxConns = 0 }, "postgres.max_conns", "must be positive"},
		{"transaction timeout above session", func(c *Config) { c.Kafka.TransactionTimeout = 45 * time.Second }, "kafka.transaction_timeout", "below kafka.session_timeout (45s)"},
		{"lock timeout above transaction", func(c *Config) { c.Postgres.LockTimeout = 30 * time.Second }, "postgres.lock_timeout", "below kafka.transaction_timeout (30s)"},
		{"idle timeout above transaction", func(c *Config) { c.Postgres.IdleInTransactionTimeout = time.Minute }, "postgres.idle_in_transaction_timeout", "below kafka.transaction_timeout (30s)"},
		{"http listen", func(c *Config) { c.HTTP.Listen = "9090" }, "http.listen", `invalid address "9090"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(&c)
			wantProblem(t, c.Validate(), tc.key, tc.msg)
		})
	}
}

// window makes the first route a valid window-mode route.
func window(c *Config) {
	c.Routes[0].Mode = ModeWindow
	c.Routes[0].Window = 24 * time.Hour
}

// TestValidateModeDefaults: each mode's settings get their defaults in that
// mode only, and their parsed sources.
func TestValidateModeDefaults(t *testing.T) {
	c := valid()
	window(&c)
	c.Routes = append(c.Routes, route("v", "in.v", "out.v"), route("r", "in.r", "out.r"), route("w", "in.w", "out.w"))
	c.Routes[1].Mode = ModeVersion
	c.Routes[2].RefreshAfter = time.Hour
	c.Routes[3].Mode, c.Routes[3].Window, c.Routes[3].IDFrom, c.Routes[3].Sliding = ModeWindow, time.Minute, "/meta/id", true
	c.Routes[3].CleanupInterval, c.Routes[3].CleanupBatch = 5*time.Second, 50
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	w, v, r, w2 := c.Routes[0], c.Routes[1], c.Routes[2], c.Routes[3]
	if w.IDFrom != DefaultIDFrom || w.IDSource() != (EntitySource{Kind: EntityHeader, Header: "Idempotency-Key"}) ||
		w.CleanupInterval != time.Minute || w.CleanupBatch != 1000 || w.VersionFrom != "" || w.Sliding {
		t.Errorf("window defaults: %+v", w)
	}
	if v.VersionFrom != "/version" || v.VersionSource() != (EntitySource{Kind: EntityPointer, Pointer: "/version"}) ||
		v.IDFrom != "" || v.CleanupInterval != 0 || v.CleanupBatch != 0 {
		t.Errorf("version defaults: %+v", v)
	}
	if r.RefreshAfter != time.Hour || r.IDFrom != "" || r.VersionFrom != "" || r.CleanupInterval != 0 {
		t.Errorf("last-seen: %+v", r)
	}
	if w2.IDSource() != (EntitySource{Kind: EntityPointer, Pointer: "/meta/id"}) || w2.CleanupInterval != 5*time.Second ||
		w2.CleanupBatch != 50 || !w2.Sliding {
		t.Errorf("window settings: %+v", w2)
	}
	// Validating again changes nothing (pipeline.New validates a loaded
	// configuration again).
	again := c
	again.Routes = slices.Clone(c.Routes)
	if err := again.Validate(); err != nil || !reflect.DeepEqual(again, c) {
		t.Fatalf("second Validate: %v\n%+v\n%+v", err, again.Routes, c.Routes)
	}
}

func TestValidateFillsEmptyEnums(t *testing.T) {
	c := valid()
	c.Kafka.ClientID, c.Kafka.Delivery, c.Log.Level = "", "", ""
	c.Routes[0] = Route{Service: "a", From: "in.a", To: "out.a", MaxDepth: 1, MaxSize: 1}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	r := c.Routes[0]
	if c.Kafka.ClientID != "dam" || c.Kafka.Delivery != DeliveryAtLeastOnce || c.Log.Level != "info" ||
		r.Mode != ModeLastSeen || r.Entity != "key" || r.Format != FormatJSON || r.Partitioning != PartitioningKey || r.OnStoreFailure != OnStoreFailurePause {
		t.Fatalf("defaults not filled: %+v %+v", c.Kafka, r)
	}
}

// kafka.compression is one codec or a preference list, from the file or the
// environment; none given means "none", as the Java producer.
func TestCompression(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		env  []string
		want Codecs
	}{
		{"default", minimal, nil, Codecs{"none"}},
		{"one codec", minimalWith("kafka", "kafka: {brokers: [b:1], group: g, compression: gzip}"), nil, Codecs{"gzip"}},
		{"preference list", minimalWith("kafka", "kafka: {brokers: [b:1], group: g, compression: [zstd, lz4, none]}"), nil, Codecs{"zstd", "lz4", "none"}},
		{"empty list", minimalWith("kafka", "kafka: {brokers: [b:1], group: g, compression: []}"), nil, Codecs{"none"}},
		{"environment", minimal, []string{"DAM_KAFKA_COMPRESSION=zstd,gzip"}, Codecs{"zstd", "gzip"}},
		{"environment one codec", minimal, []string{"DAM_KAFKA_COMPRESSION=snappy"}, Codecs{"snappy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(writeFile(t, tc.yaml), tc.env)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Kafka.Compression, tc.want) {
				t.Fatalf("kafka.compression = %q, want %q", c.Kafka.Compression, tc.want)
			}
		})
	}
	_, err := Load(writeFile(t, minimalWith("kafka", "kafka: {brokers: [b:1], group: g, compression: [gzip, snappyy]}")), nil)
	wantProblem(t, err, "kafka.compression[1]", `invalid value "snappyy"`)
	_, err = Load(writeFile(t, minimal), []string{"DAM_KAFKA_COMPRESSION=gzip,brotli"})
	wantProblem(t, err, "kafka.compression[1]", `invalid value "brotli"`)
	_, err = Load(writeFile(t, minimalWith("kafka", "kafka: {brokers: [b:1], group: g, compression: 3}")), nil)
	wantProblem(t, err, "kafka.compression", "want a list, got integer 3")
}

func TestValidateReportsAllInOrder(t *testing.T) {
	c := valid()
	c.Kafka.Group = ""
	c.Routes[0].Mode = "window"
	c.Routes[0].Ignore = []string{"x"}
	err := c.Validate()
	var keys []string
	for _, e := range problems(t, err) {
		keys = append(keys, e.(*Error).Key)
	}
	want := []string{"kafka.group", "routes[0].window", "routes[0].ignore[0]"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
}

func TestLoadExample(t *testing.T) {
	c, err := Load("testdata/dam.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Kafka.Brokers, []string{"kafka-1:9092", "kafka-2:9092"}) || c.Kafka.Group != "dam-customer-2" {
		t.Fatalf("kafka %+v", c.Kafka)
	}
	if len(c.Routes) != 4 {
		t.Fatalf("routes %+v", c.Routes)
	}
	if r := c.Routes[0]; r.RefreshAfter != 168*time.Hour {
		t.Fatalf("route 0 refresh_after %+v", r)
	}
	if w := c.Routes[2]; w.Mode != ModeWindow || w.Window != 24*time.Hour || w.IDSource().Header != "Idempotency-Key" || w.CleanupBatch != 1000 {
		t.Fatalf("route 2 (window) %+v", w)
	}
	if v := c.Routes[3]; v.Mode != ModeVersion || v.VersionSource().Pointer != "/version" || v.EntitySource().Pointer != "/order_id" {
		t.Fatalf("route 3 (version) %+v", v)
	}
	r0, r1 := c.Routes[0], c.Routes[1]
	if r0.DeadLetter != "delivery.customer-2.dlq" || !reflect.DeepEqual(r0.Ignore, []string{"/updated_at", "/items/*/ts"}) || r0.MaxSize != 1047552 {
		t.Fatalf("route 0 %+v", r0)
	}
	if got := r1.EntitySource(); got != (EntitySource{Kind: EntityHeader, Header: "Entity-Id"}) {
		t.Fatalf("route 1 entity %+v", got)
	}
	if r1.Format != FormatBytes || !r1.Shadow || r1.MaxDepth != 128 || r1.Mode != ModeLastSeen {
		t.Fatalf("route 1 defaults %+v", r1)
	}
}

func TestLoadMinimalGetsDefaults(t *testing.T) {
	c, err := Load(writeFile(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := valid()
	if err := want.Validate(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", c, want)
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, key, msg string
	}{
		{"unknown kafka key", minimal + "\n" + `pipeline: {batch_sise: 3}`, "pipeline.batch_sise", "unknown key"},
		{"unknown route key", `
kafka: {brokers: [b:1], group: g}
postgres: {dsn: x}
routes: [{service: a, from: in, to: out}, {service: b, fromm: in2, from: in3, to: out2}]`, "routes[1].fromm", "unknown key"},
		{"unknown top-level key", minimal + "routez: []\n", "routez", "unknown key"},
		{"dotted key is not a path", minimal + "\"kafka.group\": h\n", "kafka.group", "unknown key"},
		{"bad duration", minimal + "pipeline: {retry_max: 5 parsecs}\n", "pipeline.retry_max", `invalid duration "5 parsecs"`},
		{"number for duration", minimal + "pipeline: {retry_max: 5}\n", "pipeline.retry_max", `want a string such as "5s"`},
		{"number for string", minimal + "log: {level: 3}\n", "log.level", "want a string, got integer 3"},
		{"string for bool", minimalWith("postgres", "postgres: {dsn: x, migrate: yes please}"), "postgres.migrate", `want true or false, got string "yes please"`},
		{"string for int", minimal + "pipeline: {batch_size: lots}\n", "pipeline.batch_size", "want an integer"},
		{"fraction for int", minimal + "pipeline: {batch_size: 1.5}\n", "pipeline.batch_size", "want an integer"},
		{"int32 overflow", minimalWith("postgres", "postgres: {dsn: x, max_conns: 3000000000}"), "postgres.max_conns", "want an integer"},
		{"scalar for mapping", minimal + "http: 9090\n", "http", "want a mapping, got integer 9090"},
		{"scalar for list", minimalWith("routes", "routes: nope"), "routes", `want a list, got string "nope"`},
		{"scalar for route", minimalWith("routes", "routes: [3]"), "routes[0]", "want a mapping"},
		{"wrong type in list", minimalWith("kafka", "kafka: {brokers: [[a]], group: g}"), "kafka.brokers[0]", "want a string, got a list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeFile(t, tc.yaml), nil)
			wantProblem(t, err, tc.key, tc.msg)
		})
	}
}

func TestLoadSecretNotQuoted(t *testing.T) {
	_, err := Load(writeFile(t, minimalWith("postgres", "postgres: {dsn: 271828}")), nil)
	wantProblem(t, err, "postgres.dsn", "want a string, got integer")
	if strings.Contains(err.Error(), "271828") {
		t.Fatalf("secret in error: %v", err)
	}
}

func TestLoadAllProblemsStableOrder(t *testing.T) {
	path := writeFile(t, `
kafka: {brokerz: [a], session_timeout: 5 parsecs}
routes:
  - {service: a, fromm: x, ignore: [nope], mode: window}
`)
	env := []string{"DAM_KAFKA_BROKERZ=1"}
	_, err := Load(path, env)
	want := `DAM_KAFKA_BROKERZ: unknown environment variable
kafka.session_timeout: invalid duration "5 parsecs"
kafka.brokerz: unknown key
routes[0].fromm: unknown key
kafka.brokers: required
kafka.group: required
postgres.dsn: required
routes[0].from: required
routes[0].to: required
routes[0].window: required with mode "window": how long an id is remembered, e.g. 24h
routes[0].ignore[0]: canon: ignore pointer "nope": must start with "/"`
	problems(t, err)
	if err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
	for range 5 {
		if _, again := Load(path, env); again.Error() != err.Error() {
			t.Fatalf("unstable order:\n%v\n%v", again, err)
		}
	}
}

func TestLoadFileErrors(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "missing.yaml"), nil)
	var fe *FileError
	if !errors.As(err, &fe) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	_, err = Load(writeFile(t, "kafka:\n  brokers: [a\n"), nil)
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "line") {
		t.Fatalf("syntax error: %v", err)
	}
	_, err = Load(writeFile(t, "- a\n- b\n"), nil)
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("top-level list: %v", err)
	}
	_, err = Load(writeFile(t, "kafka: {}\nkafka: {}\n"), nil)
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "already defined") {
		t.Fatalf("duplicate key: %v", err)
	}
}

func TestLoadNoFile(t *testing.T) {
	_, err := Load("", nil)
	if len(problems(t, err)) != 4 {
		t.Fatalf("want the four required keys, got %v", err)
	}
	c, err := Load("", []string{
		"DAM_KAFKA_BROKERS=a:9092",
		"DAM_KAFKA_GROUP=g",
		"DAM_POSTGRES_DSN=postgres://x",
	})
	wantProblem(t, err, "routes", "at least one route")
	_ = c
}

func TestEnvOverlay(t *testing.T) {
	path := writeFile(t, minimal+"pipeline: {batch_size: 7}\n")
	c, err := Load(path, []string{
		"HOME=/root",
		"DAM_POSTGRES_DSN=postgres://env@db/dam",
		"DAM_KAFKA_BROKERS= b1:9092, b2:9092 ,",
		"DAM_KAFKA_SASL_MECHANISM=PLAIN",
		"DAM_KAFKA_SASL_USERNAME=u",
		"DAM_KAFKA_SASL_PASSWORD=p=w",
		"DAM_POSTGRES_STATEMENT_TIMEOUT=7s",
		"DAM_POSTGRES_MIGRATE=false",
		"DAM_POSTGRES_MAX_CONNS=3",
		"DAM_KAFKA_TLS_ENABLED=true",
		"DAM_KAFKA_TLS_INSECURE_SKIP_VERIFY=1",
		"DAM_HTTP_LISTEN=",
		"DAM_TEST_PG=whatever",
		"DAM_TEST_NOT_A_KEY=1",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Postgres.DSN != "postgres://env@db/dam" || !reflect.DeepEqual(c.Kafka.Brokers, []string{"b1:9092", "b2:9092"}) ||
		c.Kafka.SASL.Password != "p=w" || c.Postgres.StatementTimeout != 7*time.Second || c.Postgres.Migrate ||
		c.Postgres.MaxConns != 3 || !c.Kafka.TLS.Enabled || !c.Kafka.TLS.InsecureSkipVerify || c.HTTP.Listen != "" {
		t.Fatalf("env not applied: %+v", c)
	}
	if c.Pipeline.BatchSize != 7 || c.Kafka.Group != "g" {
		t.Fatalf("file lost: %+v", c)
	}
}

func TestEnvErrors(t *testing.T) {
	path := writeFile(t, minimal)
	for _, tc := range []struct{ env, key, msg string }{
		{"DAM_KAFKA_BROKERZ=a", "DAM_KAFKA_BROKERZ", "unknown environment variable"},
		{"DAM_ROUTES_0_FROM=x", "DAM_ROUTES_0_FROM", "routes cannot be set from the environment"},
		{"DAM_KAFKA=x", "DAM_KAFKA", "unknown environment variable"},
		{"DAM_kafka_group=x", "DAM_kafka_group", "unknown environment variable"},
		{"DAM_POSTGRES_MAX_CONNS=abc", "postgres.max_conns", `invalid integer "abc" (from DAM_POSTGRES_MAX_CONNS)`},
		{"DAM_POSTGRES_MAX_CONNS=0", "postgres.max_conns", "must be positive"},
		{"DAM_POSTGRES_MIGRATE=maybe", "postgres.migrate", `invalid boolean "maybe" (from DAM_POSTGRES_MIGRATE)`},
		{"DAM_POSTGRES_STATEMENT_TIMEOUT=5 parsecs", "postgres.statement_timeout", `invalid duration "5 parsecs" (from DAM_POSTGRES_STATEMENT_TIMEOUT)`},
		{"DAM_KAFKA_START=middle", "kafka.start", `invalid value "middle"`},
	} {
		t.Run(tc.env, func(t *testing.T) {
			_, err := Load(path, []string{tc.env})
			wantProblem(t, err, tc.key, tc.msg)
		})
	}
}

func TestEnvVar(t *testing.T) {
	for path, want := range map[string]string{
		"postgres.statement_timeout":     "DAM_POSTGRES_STATEMENT_TIMEOUT",
		"postgres.dsn":                   "DAM_POSTGRES_DSN",
		"postgres.dsn_file":              "DAM_POSTGRES_DSN_FILE",
		"kafka.sasl.password":            "DAM_KAFKA_SASL_PASSWORD",
		"kafka.sasl.password_file":       "DAM_KAFKA_SASL_PASSWORD_FILE",
		"kafka.brokers":                  "DAM_KAFKA_BROKERS",
		"kafka.tls.insecure_skip_verify": "DAM_KAFKA_TLS_INSECURE_SKIP_VERIFY",
		"routes":                         "",
		"kafka":                          "",
	} {
		if got := EnvVar(path); got != want {
			t.Errorf("EnvVar(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestRedactDSN(t *testing.T) {
	for in, want := range map[string]string{
		"":                                  "",
		"postgres://dam:s3cret@db:5432/dam": "postgres://dam:xxxxx@db:5432/dam",
		"postgres://dam@db/dam":             "postgres://dam@db/dam",
		"postgres://db/dam?password=s3cret&sslmode=require": "postgres://db/dam?password=xxxxx&sslmode=require",
		"postgres://dam:p%40ss@db/dam":                      "postgres://dam:xxxxx@db/dam",
		"host=db user=dam password=s3cret dbname=dam":       "host=db user=dam password=xxxxx dbname=dam",
		"host=db password = 's3 cr\\'et' dbname=dam":        "host=db password = xxxxx dbname=dam",
		"host=db PASSWORD=s3cret":                           "host=db PASSWORD=xxxxx",
		"postgres://dam:s3cret@db:bad port/dam":             "xxxxx",
		// Every key that ends in "password", sslpassword among them.
		"postgres://db/dam?sslpassword=s3cret&sslmode=verify-full": "postgres://db/dam?sslmode=verify-full&sslpassword=xxxxx",
		"postgres://db/dam?SSLPassword=s3cret":                     "postgres://db/dam?SSLPassword=xxxxx",
		"host=db sslpassword=s3cret sslkey=/k.pem":                 "host=db sslpassword=xxxxx sslkey=/k.pem",
		"host=db sslpassword='s3 cret' password=other":             "host=db sslpassword=xxxxx password=xxxxx",
		"host=db SSLPASSWORD = s3cret":                             "host=db SSLPASSWORD = xxxxx",
	} {
		if got := RedactDSN(in); got != want {
			t.Errorf("RedactDSN(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedacted(t *testing.T) {
	c := valid()
	c.Postgres.DSN = "postgres://dam:s3cret@db/dam"
	c.Kafka.SASL = SASL{Mechanism: "PLAIN", Username: "u", Password: "hunter2"}
	r := c.Redacted()
	if r.Postgres.DSN != "postgres://dam:xxxxx@db/dam" || r.Kafka.SASL.Password != "xxxxx" || r.Kafka.SASL.Username != "u" {
		t.Fatalf("not redacted: %+v", r)
	}
	if c.Kafka.SASL.Password != "hunter2" || c.Postgres.DSN != "postgres://dam:s3cret@db/dam" {
		t.Fatal("Redacted changed its receiver")
	}
	r.Routes[0].Service = "changed"
	if c.Routes[0].Service != "a" {
		t.Fatal("Redacted shares routes with its receiver")
	}
	out, err := r.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "hunter2") || strings.Contains(string(out), "s3cret") {
		t.Fatalf("secret printed:\n%s", out)
	}
	if !strings.Contains(string(out), "password: xxxxx") {
		t.Fatalf("no redacted password:\n%s", out)
	}
	c.Kafka.SASL = SASL{}
	if c.Redacted().Kafka.SASL.Password != "" {
		t.Fatal("empty password redacted to non-empty")
	}
}

func TestYAMLRoundTrip(t *testing.T) {
	c, err := Load("testdata/dam.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Load(writeFile(t, string(out)), nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !reflect.DeepEqual(c, back) {
		t.Fatalf("round trip changed the configuration:\n%s", out)
	}
	if !strings.Contains(string(out), "rebalance_timeout: 1m\n") {
		t.Fatalf("duration format:\n%s", out)
	}
}

func TestParseEntity(t *testing.T) {
	for in, want := range map[string]EntitySource{
		"key":              {Kind: EntityKey},
		"/banana_id":       {Kind: EntityPointer, Pointer: "/banana_id"},
		"/a~1b/0":          {Kind: EntityPointer, Pointer: "/a~1b/0"},
		"header:Entity-Id": {Kind: EntityHeader, Header: "Entity-Id"},
	} {
		got, err := ParseEntity(in)
		if err != nil || got != want {
			t.Errorf("ParseEntity(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if got.String() != in {
			t.Errorf("%+v.String() = %q, want %q", got, got.String(), in)
		}
	}
	for _, in := range []string{"", "Key", "banana_id", "header:", "/", "/*", "/a/*", "/a~"} {
		if in == "/" {
			continue // member "" is a valid pointer
		}
		if _, err := ParseEntity(in); err == nil {
			t.Errorf("ParseEntity(%q) succeeded", in)
		}
	}
}

// CheckService accepts the services routes and serve tokens name, and
// refuses any other naming them all: a typo in an operator's command
// must not act on a service nothing decides.
func TestCheckService(t *testing.T) {
	c := Default()
	c.Routes = []Route{{Service: "emails"}, {Service: "sms"}}
	c.Serve.Tokens = []ServeToken{{Services: []string{"push", AnyService}}}
	for _, s := range []string{"emails", "sms", "push"} {
		if err := c.CheckService(s); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	err := c.CheckService("emial")
	if !errors.Is(err, ErrUnknownService) || !strings.Contains(err.Error(), `"emails", "push", "sms"`) {
		t.Errorf("unknown service: %v", err)
	}
}

// A URL DSN with a mistyped scheme is an error naming the key and the
// scheme, not pgx's "cannot parse" with the DSN half redacted.
func TestDSNSchemeTypo(t *testing.T) {
	c := Default()
	c.Kafka.Brokers, c.Kafka.Group = []string{"localhost:9092"}, "g"
	c.Routes = []Route{DefaultRoute()}
	c.Routes[0].Service, c.Routes[0].From, c.Routes[0].To = "a", "in", "out"
	c.Postgres.DSN = "postgress://dam:secret@db/dam"
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), `postgres.dsn: unknown scheme "postgress"`) || strings.Contains(err.Error(), "secret") {
		t.Errorf("validate: %v", err)
	}
	for _, ok := range []string{"postgres://dam@db/dam", "postgresql://dam@db/dam", "host=db user=dam dbname=dam"} {
		c.Postgres.DSN = ok
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}
