// Package config loads, validates and prints dam's configuration: defaults,
// overlaid by a YAML file, overlaid by DAM_-prefixed environment variables.
//
// Every problem is reported as an *Error naming the offending key path
// ("routes[1].ignore[0]") or environment variable; Load and Validate report
// all problems at once, joined with errors.Join, in a stable order.
package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

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
	// DecisionLog configures the decision log kept after delivery.
	DecisionLog DecisionLog `koanf:"decision_log"`
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
	// TransactionalID is the transactional id of this instance in
	// exactly-once mode: stable across its restarts, so that a restarted
	// instance fences its previous self, and distinct between live
	// instances, which would otherwise fence each other. Default ""
	// (client_id-group-hostname: stable for a host or a StatefulSet pod).
	TransactionalID string `koanf:"transactional_id"`
	// TransactionTimeout is the Kafka transaction timeout. Default 30s. It
	// must be below SessionTimeout and above the PostgreSQL lock and
	// idle-in-transaction timeouts, so that a paused zombie cannot block the
	// partition's new owner.
	TransactionTimeout time.Duration `koanf:"transaction_timeout"`
	// TLS configures TLS to the brokers. Default off.
	TLS TLS `koanf:"tls"`
	// SASL configures SASL authentication. Default none.
	SASL SASL `koanf:"sasl"`
	// Compression is the codec of produced batches (forwards and dead
	// letters), or a list of codecs in order of preference, the first the
	// broker supports being used: "none" (default, as the Java producer),
	// "gzip", "snappy", "lz4" or "zstd". Every consumer of the output
	// topics must support it: kafkajs supports only gzip without plugins.
	// The topic's compression.type, when not "producer", decides how the
	// broker stores the batches.
	Compression Codecs `koanf:"compression"`
}

// Codecs is a list of compression codecs in order of preference. The file
// and the environment may also give a single codec ("gzip").
type Codecs []string

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
	// ServerName is the name every broker's certificate is verified
	// against, instead of the host of the address dialed (for brokers
	// reached by IP address or through a proxy). Default "".
	ServerName string `koanf:"server_name"`
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
	// printed; prefer PasswordFile or DAM_KAFKA_SASL_PASSWORD. Default "".
	Password string `koanf:"password"`
	// PasswordFile names a file holding Password (a trailing newline is
	// trimmed), the way Kubernetes mounts a Secret. Load reads it into
	// Password; setting both is an error. Default "".
	PasswordFile string `koanf:"password_file"`
}

// Postgres configures the PostgreSQL store.
type Postgres struct {
	// DSN is the connection string, URL ("postgres://user:pw@host/db") or
	// key=value form. Required (or DSNFile). A secret: its password is
	// redacted when printed; prefer DSNFile or DAM_POSTGRES_DSN.
	DSN string `koanf:"dsn"`
	// DSNFile names a file holding DSN (a trailing newline is trimmed), the
	// way Kubernetes mounts a Secret. Load reads it into DSN; setting both
	// is an error. Default "".
	DSNFile string `koanf:"dsn_file"`
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

// HTTP configures the HTTP endpoint serving /metrics, /healthz, /readyz
// and /v1/status, and /v1/tap when the tap is enabled.
type HTTP struct {
	// Listen is the listen address. Default ":9090"; "" disables the
	// endpoint.
	Listen string `koanf:"listen"`
	// Tap is the live stream of decisions (dam tap). Default off.
	Tap Tap `koanf:"tap"`
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
	// BatchSize sizes the poll: dam polls up to 4 × BatchSize records at a
	// time. A decide takes every record queued for its partition, up to
	// MaxBatch, so a caught-up partition decides the few records that
	// arrived and BatchSize only marks where a backlog starts; it is the
	// lower bound of MaxBatch and MaxInFlight. Default 1000.
	BatchSize int `koanf:"batch_size"`
	// MaxBatch is the most records one decide transaction takes (a
	// partition with a backlog decides in transactions this big): big
	// batches amortize PostgreSQL's per-transaction costs when throughput
	// matters, small ones keep latency low when caught up. At least
	// BatchSize. Default 10000.
	MaxBatch int `koanf:"max_batch"`
	// MaxInFlight bounds the records polled but not yet decided, per
	// assigned partition on average: while the partitions hold this many
	// times their number, dam stops polling. At least BatchSize. Default
	// 4000.
	MaxInFlight int `koanf:"max_in_flight"`
	// MaxInFlightBytes bounds the same records by size (key, value and
	// headers) for the whole instance: dam stops polling while they take
	// this much, whatever their count. Default 67108864 (64 MiB).
	MaxInFlightBytes int `koanf:"max_in_flight_bytes"`
	// MaxDecompressedBatchBytes is the most a compressed record batch may
	// inflate to: a batch past it is bad input for each of its offsets
	// (dead letters, or a halt of its partition without a dead-letter
	// topic). At least every route's max_size plus 64 KiB. Default
	// 33554432 (32 MiB).
	MaxDecompressedBatchBytes int `koanf:"max_decompressed_batch_bytes"`
	// MaxDecompressedFetchBytes bounds what the fetched batches inflate to
	// between two polls, in all: a batch past it waits for the next poll.
	// At least MaxDecompressedBatchBytes. Default 67108864 (64 MiB).
	MaxDecompressedFetchBytes int `koanf:"max_decompressed_fetch_bytes"`
	// ShutdownGrace bounds the time to finish the batches in flight on
	// shutdown. Default 30s.
	ShutdownGrace time.Duration `koanf:"shutdown_grace"`
	// RetryMin is the first backoff delay during an outage. Default 100ms.
	RetryMin time.Duration `koanf:"retry_min"`
	// RetryMax caps the backoff delay; at least RetryMin. Default 10s.
	RetryMax time.Duration `koanf:"retry_max"`
}

// DecisionLog configures how long the decision log is kept after delivery.
type DecisionLog struct {
	// Keep is how long a decided batch stays in the decision log after its
	// offsets are committed: within it, `dam explain --offset` answers
	// from the log what was decided for an offset (forwarded, a duplicate,
	// dead-lettered, skipped by an operator) instead of inferring it from
	// the state and the input. Recovery never reads what is kept below the
	// committed offset. 0 prunes the log as soon as it is delivered. A
	// duration; "d" counts days ("7d", "1d12h"). Default 7d: "yesterday"
	// and a week of incidents, and Kafka's default retention
	// (log.retention.hours 168), past which the input records, which
	// explain reads too, are gone anyway.
	Keep time.Duration `koanf:"keep"`
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
	// Mode is the decision rule: "last-seen" (default: forward a record iff
	// its content differs from the content last forwarded for its entity),
	// "window" (forward iff its message id was not seen within Window) or
	// "version" (forward iff its version is above the highest forwarded for
	// its entity).
	Mode string `koanf:"mode"`
	// Entity is where the identity comes from in modes last-seen and
	// version: "key" (default, the record key), a JSON pointer into the
	// value ("/banana_id") or a header ("header:Entity-Id"). Not used in
	// window mode, whose identity is the message id (IDFrom).
	Entity string `koanf:"entity"`
	// IDFrom is where window mode's message id comes from: a header
	// ("header:Name") or a JSON pointer ("/meta/id"). Only in window mode;
	// default "header:Idempotency-Key" there.
	IDFrom string `koanf:"id_from" dam:"omitempty"`
	// Window is how long window mode remembers a message id: a repeat
	// within it is a duplicate, whatever its content. Required in window
	// mode, and only there.
	Window time.Duration `koanf:"window" dam:"omitempty"`
	// Sliding makes a repeat extend its id's window (to Window from the
	// repeat); the default is a fixed window from the first sighting. Only
	// in window mode.
	Sliding bool `koanf:"sliding" dam:"omitempty"`
	// CleanupInterval is how often window mode's expired ids are deleted
	// (by one instance per service at a time). Only in window mode; default
	// 1m there.
	CleanupInterval time.Duration `koanf:"cleanup_interval" dam:"omitempty"`
	// CleanupBatch is the most expired ids one cleanup statement deletes
	// (each its own short transaction). Only in window mode; default 1000
	// there.
	CleanupBatch int `koanf:"cleanup_batch" dam:"omitempty"`
	// VersionFrom is where version mode's version comes from: a header
	// ("header:Name", a decimal integer) or a JSON pointer to an integer.
	// Only in version mode; default "/version" there.
	VersionFrom string `koanf:"version_from" dam:"omitempty"`
	// RefreshAfter, in last-seen mode, forwards a record equal to the
	// content last forwarded anyway when its identity was last forwarded
	// longer ago than this (for adapters that must re-sync now and then).
	// Default 0: off. Only in last-seen mode.
	RefreshAfter time.Duration `koanf:"refresh_after" dam:"omitempty"`
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
	// MaxSize is the maximum value size in bytes. Default 1047552 (1 MiB
	// less 1 KiB): the largest value that fits in a record of Kafka's
	// default max.message.bytes (1048588) with 1 KiB left for the key,
	// headers and framing. At start it is checked against the output
	// topic's max.message.bytes.
	MaxSize int `koanf:"max_size"`

	// entity, idFrom and versionFrom are Entity, IDFrom and VersionFrom
	// parsed by Validate.
	entity, idFrom, versionFrom EntitySource
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

	CompressionNone   = "none"
	CompressionGzip   = "gzip"
	CompressionSnappy = "snappy"
	CompressionLz4    = "lz4"
	CompressionZstd   = "zstd"
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
			Compression:        Codecs{CompressionNone},
		},
		Postgres: Postgres{
			Migrate:                  true,
			MaxConns:                 8,
			StatementTimeout:         5 * time.Second,
			LockTimeout:              2 * time.Second,
			IdleInTransactionTimeout: 10 * time.Second,
		},
		HTTP: HTTP{Listen: ":9090", Tap: DefaultTap()},
		Log:  Log{Level: "info", Format: "json"},
		Pipeline: Pipeline{
			BatchSize:   1000,
			MaxBatch:    10000,
			MaxInFlight: 4000,
			// The memory bound these imply is in docs/delivery.md.
			MaxInFlightBytes:          64 << 20,
			MaxDecompressedBatchBytes: 32 << 20,
			MaxDecompressedFetchBytes: 64 << 20,
			ShutdownGrace:             30 * time.Second,
			RetryMin:                  100 * time.Millisecond,
			RetryMax:                  10 * time.Second,
		},
		Serve:       DefaultServe(),
		DecisionLog: DecisionLog{Keep: DefaultDecisionLogKeep},
	}
}

// DefaultDecisionLogKeep is the default decision_log.keep, 7 days;
// MaxDecisionLogKeep its largest value, 366 days.
const (
	DefaultDecisionLogKeep = 7 * 24 * time.Hour
	MaxDecisionLogKeep     = 366 * 24 * time.Hour
)

// DefaultMaxSize is the default routes[].max_size: 1 MiB less 1 KiB, so
// that a value of that size still fits, with its key and headers, in a
// record of Kafka's default max.message.bytes (1048588 bytes).
const DefaultMaxSize = 1<<20 - 1<<10

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
		MaxSize:        DefaultMaxSize,
	}
}

// Defaults of the mode settings, set by Validate in their mode.
const (
	DefaultIDFrom          = "header:Idempotency-Key"
	DefaultVersionFrom     = "/version"
	DefaultCleanupInterval = time.Minute
	DefaultCleanupBatch    = 1000
)

// EntitySource returns the parsed Entity. It is valid only after
// Config.Validate succeeded (Load validates).
func (r Route) EntitySource() EntitySource { return r.entity }

// IDSource returns the parsed IDFrom of a window-mode route (a header or a
// pointer). It is valid only after Config.Validate succeeded.
func (r Route) IDSource() EntitySource { return r.idFrom }

// VersionSource returns the parsed VersionFrom of a version-mode route (a
// header or a pointer). It is valid only after Config.Validate succeeded.
func (r Route) VersionSource() EntitySource { return r.versionFrom }

// Services returns the services the configuration names, sorted: every
// route's, every one a serve token allows ("*" aside), and serve.services.
func (c Config) Services() []string {
	var out []string
	for _, r := range c.Routes {
		out = append(out, r.Service)
	}
	out = append(out, c.Serve.Services...)
	for _, t := range c.Serve.Tokens {
		for _, s := range t.Services {
			if s != AnyService {
				out = append(out, s)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// CheckService returns an error wrapping ErrUnknownService, naming the
// known services, when no route and no serve token names service: a typo
// would otherwise read or change state no route decides with.
func (c Config) CheckService(service string) error {
	known := c.Services()
	if _, ok := slices.BinarySearch(known, service); ok {
		return nil
	}
	return fmt.Errorf("%w %q: the configuration knows %s", ErrUnknownService, service, strings.Join(quoteAll(known), ", "))
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	if len(out) == 0 {
		return []string{"no service"}
	}
	return out
}
