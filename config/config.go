// Package config loads, validates and prints dam's configuration: defaults,
// overlaid by a YAML file, overlaid by DAM_-prefixed environment variables.
//
// Every problem is reported as an *Error naming the offending key path
// ("routes[1].ignore[0]") or environment variable; Load and Validate report
// all problems at once, joined with errors.Join, in a stable order.
package config

import "time"

// Config is the whole configuration of one dam process.
type Config struct {
	// Kafka is the connection to the cluster holding the input and output
	// topics.
	Kafka Kafka `koanf:"kafka"`
	// Postgres is the store of decisions.
	Postgres Postgres `koanf:"postgres"`
	// HTTP is the metrics and health endpoint.
	HTTP HTTP `koanf:"http"`
	// Log configures the process log.
	Log Log `koanf:"log"`
	// Pipeline tunes batching, buffering and retries.
	Pipeline Pipeline `koanf:"pipeline"`
	// Serve configures `dam serve`, the synchronous check service.
	Serve Serve `koanf:"serve"`
	// Routes are the topic pairs dam deduplicates; at least one is required.
	// Routes are not settable from the environment. No default.
	Routes []Route `koanf:"routes"`
}

// Kafka configures the Kafka client.
type Kafka struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string `koanf:"brokers"`
	// Group is the consumer group of this dam deployment. Required.
	Group string `koanf:"group"`
	// ClientID is the Kafka client id. Default "dam".
	ClientID string `koanf:"client_id"`
	// Delivery is "at-least-once" (default) or "exactly-once" (Kafka
	// transactions; downstream consumers must read_committed).
	Delivery string `koanf:"delivery"`
	// Start is where a partition starts when neither Kafka nor PostgreSQL
	// has a position for it: "latest" (default) or "earliest".
	Start string `koanf:"start"`
	// SessionTimeout is the group session timeout. Default 45s.
	SessionTimeout time.Duration `koanf:"session_timeout"`
	// RebalanceTimeout is the group rebalance timeout. Default 60s.
	RebalanceTimeout time.Duration `koanf:"rebalance_timeout"`
	// TransactionTimeout is the Kafka transaction timeout. Default 30s. It
	// must be below SessionTimeout and above the PostgreSQL lock and
	// idle-in-transaction timeouts, so that a paused zombie cannot block the
	// partition's new owner.
	TransactionTimeout time.Duration `koanf:"transaction_timeout"`
	// TLS configures TLS to the brokers. Default off.
	TLS TLS `koanf:"tls"`
	// SASL configures SASL authentication. Default none.
	SASL SASL `koanf:"sasl"`
}

// TLS configures TLS to the Kafka brokers.
type TLS struct {
	// Enabled turns TLS on. Default false.
	Enabled bool `koanf:"enabled"`
	// CAFile is a PEM file of CAs to trust instead of the system pool.
	// Default "" (system pool).
	CAFile string `koanf:"ca_file"`
	// CertFile is the PEM client certificate; requires KeyFile. Default "".
	CertFile string `koanf:"cert_file"`
	// KeyFile is the PEM client key; requires CertFile. Default "".
	KeyFile string `koanf:"key_file"`
	// InsecureSkipVerify disables verification of the brokers'
	// certificates. For tests only. Default false.
	InsecureSkipVerify bool `koanf:"insecure_skip_verify"`
}

// SASL configures SASL authentication to the Kafka brokers.
type SASL struct {
	// Mechanism is "" (default: no SASL), "PLAIN", "SCRAM-SHA-256" or
	// "SCRAM-SHA-512".
	Mechanism string `koanf:"mechanism"`
	// Username is required with a mechanism. Default "".
	Username string `koanf:"username"`
	// Password is required with a mechanism. A secret: redacted when
	// printed; prefer DAM_KAFKA_SASL_PASSWORD. Default "".
	Password string `koanf:"password"`
}

// Postgres configures the PostgreSQL store.
type Postgres struct {
	// DSN is the connection string, URL ("postgres://user:pw@host/db") or
	// key=value form. Required. A secret: its password is redacted when
	// printed; prefer DAM_POSTGRES_DSN.
	DSN string `koanf:"dsn"`
	// Migrate applies the embedded schema migrations at start. Default true.
	Migrate bool `koanf:"migrate"`
	// MaxConns is the size of the connection pool. Default 8.
	MaxConns int32 `koanf:"max_conns"`
	// StatementTimeout is the server-side statement_timeout. Default 5s.
	StatementTimeout time.Duration `koanf:"statement_timeout"`
	// LockTimeout is the server-side lock_timeout; must be below
	// kafka.transaction_timeout. Default 2s.
	LockTimeout time.Duration `koanf:"lock_timeout"`
	// IdleInTransactionTimeout is the server-side
	// idle_in_transaction_session_timeout; must be below
	// kafka.transaction_timeout. Default 10s.
	IdleInTransactionTimeout time.Duration `koanf:"idle_in_transaction_timeout"`
}

// HTTP configures the HTTP endpoint serving /metrics, /healthz and /readyz.
type HTTP struct {
	// Listen is the listen address. Default ":9090"; "" disables the
	// endpoint.
	Listen string `koanf:"listen"`
}

// Log configures the process log.
type Log struct {
	// Level is "debug", "info" (default), "warn" or "error".
	Level string `koanf:"level"`
	// Format is "json" (default) or "console".
	Format string `koanf:"format"`
}

// Pipeline tunes the consume-decide-deliver loop.
type Pipeline struct {
	// BatchSize is the maximum number of records per decide transaction.
	// Default 1000.
	BatchSize int `koanf:"batch_size"`
	// MaxInFlight bounds the records polled but not yet decided, per
	// assigned partition on average: while the partitions hold this many
	// times their number, dam stops polling. At least BatchSize. Default
	// 4000.
	MaxInFlight int `koanf:"max_in_flight"`
	// ShutdownGrace bounds the time to finish the batches in flight on
	// shutdown. Default 30s.
	ShutdownGrace time.Duration `koanf:"shutdown_grace"`
	// RetryMin is the first backoff delay during an outage. Default 100ms.
	RetryMin time.Duration `koanf:"retry_min"`
	// RetryMax caps the backoff delay; at least RetryMin. Default 10s.
	RetryMax time.Duration `koanf:"retry_max"`
}

// Route is one deduplicated topic pair. Its defaults are DefaultRoute's.
type Route struct {
	// Service names the route: the namespace of its identities in
	// PostgreSQL. Required, unique.
	Service string `koanf:"service"`
	// From is the input (projection) topic. Required; no two routes read
	// the same topic.
	From string `koanf:"from"`
	// To is the output (delivery) topic. Required; must not be any route's
	// From.
	To string `koanf:"to"`
	// DeadLetter is the topic receiving bad input. Default "": bad input
	// halts the partition. Must not be any route's From.
	DeadLetter string `koanf:"dead_letter"`
	// Mode is the decision rule: "last-seen" (default). "window" and
	// "version" are designed but not supported yet.
	Mode string `koanf:"mode"`
	// Entity is where the identity comes from: "key" (default, the record
	// key), a JSON pointer into the value ("/banana_id") or a header
	// ("header:Entity-Id").
	Entity string `koanf:"entity"`
	// Format is how values are hashed: "json" (default, structural hash) or
	// "bytes" (raw bytes).
	Format string `koanf:"format"`
	// Ignore lists RFC 6901 JSON pointers, "*" matching any member or
	// index, left out of the hash. Only with format json. Default none.
	Ignore []string `koanf:"ignore"`
	// Shadow forwards every record, marking would-be duplicates with a
	// header instead of dropping them. Default false.
	Shadow bool `koanf:"shadow"`
	// Partitioning is how forwarded records are partitioned: "key"
	// (default, Kafka's murmur2 of the key) or "preserve" (same partition
	// number as the input).
	Partitioning string `koanf:"partitioning"`
	// OnStoreFailure is what happens while PostgreSQL is unavailable:
	// "pause" (default, nothing is decided or forwarded) or "forward"
	// (records pass through undecided: duplicates instead of a stall).
	OnStoreFailure string `koanf:"on_store_failure"`
	// MaxDepth is the maximum JSON nesting depth. Default 128.
	MaxDepth int `koanf:"max_depth"`
	// MaxSize is the maximum value size in bytes. Default 1048576 (1 MiB).
	MaxSize int `koanf:"max_size"`

	// entity is Entity parsed by Validate.
	entity EntitySource
}

// Enumerated values.
const (
	DeliveryAtLeastOnce = "at-least-once"
	DeliveryExactlyOnce = "exactly-once"

	StartLatest   = "latest"
	StartEarliest = "earliest"

	ModeLastSeen = "last-seen"
	ModeWindow   = "window"
	ModeVersion  = "version"

	FormatJSON  = "json"
	FormatBytes = "bytes"

	PartitioningKey      = "key"
	PartitioningPreserve = "preserve"

	OnStoreFailurePause   = "pause"
	OnStoreFailureForward = "forward"
)

// Default returns the default configuration: every default documented on
// the fields, no brokers, group, DSN or routes (which are required).
func Default() Config {
	return Config{
		Kafka: Kafka{
			ClientID:           "dam",
			Delivery:           DeliveryAtLeastOnce,
			Start:              StartLatest,
			SessionTimeout:     45 * time.Second,
			RebalanceTimeout:   60 * time.Second,
			TransactionTimeout: 30 * time.Second,
		},
		Postgres: Postgres{
			Migrate:                  true,
			MaxConns:                 8,
			StatementTimeout:         5 * time.Second,
			LockTimeout:              2 * time.Second,
			IdleInTransactionTimeout: 10 * time.Second,
		},
		HTTP: HTTP{Listen: ":9090"},
		Log:  Log{Level: "info", Format: "json"},
		Pipeline: Pipeline{
			BatchSize:     1000,
			MaxInFlight:   4000,
			ShutdownGrace: 30 * time.Second,
			RetryMin:      100 * time.Millisecond,
			RetryMax:      10 * time.Second,
		},
		Serve: DefaultServe(),
	}
}

// DefaultRoute returns a route with every default set and no service or
// topics. Load starts each route of the file from it.
func DefaultRoute() Route {
	return Route{
		Mode:           ModeLastSeen,
		Entity:         "key",
		Format:         FormatJSON,
		Partitioning:   PartitioningKey,
		OnStoreFailure: OnStoreFailurePause,
		MaxDepth:       128,
		MaxSize:        1 << 20,
	}
}

// EntitySource returns the parsed Entity. It is valid only after
// Config.Validate succeeded (Load validates).
func (r Route) EntitySource() EntitySource { return r.entity }
