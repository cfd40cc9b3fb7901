package config

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/dam-dedup/dam/canon"
)

// Validate checks the whole configuration and returns every problem joined
// (each an *Error naming its key), or nil. It sets an empty enumerated
// setting (delivery, mode, entity, ...) and an empty kafka.client_id to its
// default, and parses each route's entity (see Route.EntitySource).
func (c *Config) Validate() error {
	errs := c.validate()
	if len(errs) == 0 {
		return nil
	}
	joined := make([]error, len(errs))
	for i, e := range errs {
		joined[i] = e
	}
	return errors.Join(joined...)
}

// validator collects problems in the order they are found.
type validator struct{ errs []*Error }

func (v *validator) add(key string, err error) { v.errs = append(v.errs, &Error{Key: key, Err: err}) }

func (v *validator) addf(key, format string, args ...any) {
	v.add(key, fmt.Errorf(format, args...))
}

func (v *validator) required(key string, empty bool) {
	if empty {
		v.add(key, ErrRequired)
	}
}

// oneOf checks an enumerated setting, "" meaning the default def.
func (v *validator) oneOf(key string, s *string, def string, allowed ...string) {
	if *s == "" {
		*s = def
	}
	if !slices.Contains(allowed, *s) {
		v.addf(key, "invalid value %q: want %s", *s, orList(allowed))
	}
}

func (v *validator) positive(key string, d time.Duration) {
	if d <= 0 {
		v.addf(key, "must be positive, got %s", d)
	}
}

func orList(allowed []string) string {
	q := make([]string, len(allowed))
	for i, a := range allowed {
		q[i] = fmt.Sprintf("%q", a)
	}
	if len(q) == 1 {
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

func (c *Config) validate() []*Error {
	v := &validator{}

	k := &c.Kafka
	v.required("kafka.brokers", len(k.Brokers) == 0)
	for i, b := range k.Brokers {
		if strings.TrimSpace(b) == "" {
			v.addf(fmt.Sprintf("kafka.brokers[%d]", i), "empty broker address")
		}
	}
	v.required("kafka.group", k.Group == "")
	if k.ClientID == "" {
		k.ClientID = "dam"
	}
	v.oneOf("kafka.delivery", &k.Delivery, DeliveryAtLeastOnce, DeliveryAtLeastOnce, DeliveryExactlyOnce)
	v.oneOf("kafka.start", &k.Start, StartLatest, StartLatest, StartEarliest)
	v.positive("kafka.session_timeout", k.SessionTimeout)
	v.positive("kafka.rebalance_timeout", k.RebalanceTimeout)
	v.positive("kafka.transaction_timeout", k.TransactionTimeout)
	if k.TransactionalID != "" && k.Delivery != DeliveryExactlyOnce {
		v.addf("kafka.transactional_id", "only with kafka.delivery: %s", DeliveryExactlyOnce)
	}
	if k.TransactionTimeout > 0 && k.SessionTimeout > 0 && k.TransactionTimeout >= k.SessionTimeout {
		v.addf("kafka.transaction_timeout", "%s must be below kafka.session_timeout (%s)", k.TransactionTimeout, k.SessionTimeout)
	}
	if !k.TLS.Enabled {
		for _, f := range []struct {
			key string
			set bool
		}{
			{"kafka.tls.ca_file", k.TLS.CAFile != ""},
			{"kafka.tls.cert_file", k.TLS.CertFile != ""},
			{"kafka.tls.key_file", k.TLS.KeyFile != ""},
			{"kafka.tls.server_name", k.TLS.ServerName != ""},
			{"kafka.tls.insecure_skip_verify", k.TLS.InsecureSkipVerify},
		} {
			if f.set {
				v.addf(f.key, "set but kafka.tls.enabled is false")
			}
		}
	}
	if (k.TLS.CertFile == "") != (k.TLS.KeyFile == "") {
		if k.TLS.CertFile == "" {
			v.addf("kafka.tls.cert_file", "required with kafka.tls.key_file")
		} else {
			v.addf("kafka.tls.key_file", "required with kafka.tls.cert_file")
		}
	}
	switch k.SASL.Mechanism {
	case "":
		if k.SASL.Username != "" {
			v.addf("kafka.sasl.username", "set without kafka.sasl.mechanism")
		}
		if k.SASL.PasswordFile != "" {
			v.addf("kafka.sasl.password_file", "set without kafka.sasl.mechanism")
		} else if k.SASL.Password != "" {
			v.addf("kafka.sasl.password", "set without kafka.sasl.mechanism")
		}
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		v.required("kafka.sasl.username", k.SASL.Username == "")
		v.required("kafka.sasl.password", k.SASL.Password == "")
	default:
		v.addf("kafka.sasl.mechanism", "invalid value %q: want %s", k.SASL.Mechanism, orList([]string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}))
	}

	v.compression(&k.Compression)

	p := &c.Postgres
	v.required("postgres.dsn", p.DSN == "")
	if scheme, _, ok := strings.Cut(p.DSN, "://"); ok && scheme != "postgres" && scheme != "postgresql" && !strings.ContainsAny(scheme, " =") {
		// pgx would say only "cannot parse" with the DSN half redacted.
		v.addf("postgres.dsn", "unknown scheme %q: a URL DSN starts with postgres:// or postgresql://", boundScheme(scheme))
	}
	if p.MaxConns <= 0 {
		v.addf("postgres.max_conns", "must be positive, got %d", p.MaxConns)
	}
	v.positive("postgres.statement_timeout", p.StatementTimeout)
	v.positive("postgres.lock_timeout", p.LockTimeout)
	v.positive("postgres.idle_in_transaction_timeout", p.IdleInTransactionTimeout)
	if k.TransactionTimeout > 0 {
		if p.LockTimeout > 0 && p.LockTimeout >= k.TransactionTimeout {
			v.addf("postgres.lock_timeout", "%s must be below kafka.transaction_timeout (%s)", p.LockTimeout, k.TransactionTimeout)
		}
		if p.IdleInTransactionTimeout > 0 && p.IdleInTransactionTimeout >= k.TransactionTimeout {
			v.addf("postgres.idle_in_transaction_timeout", "%s must be below kafka.transaction_timeout (%s)", p.IdleInTransactionTimeout, k.TransactionTimeout)
		}
	}

	if c.HTTP.Listen != "" {
		if _, _, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
			v.addf("http.listen", "invalid address %q: want host:port or :port", c.HTTP.Listen)
		}
	}
	v.oneOf("log.level", &c.Log.Level, "info", "debug", "info", "warn", "error")
	v.oneOf("log.format", &c.Log.Format, "json", "json", "console")

	pl := &c.Pipeline
	if pl.BatchSize <= 0 {
		v.addf("pipeline.batch_size", "must be positive, got %d", pl.BatchSize)
	}
	if pl.MaxBatch < pl.BatchSize {
		v.addf("pipeline.max_batch", "%d must be at least pipeline.batch_size (%d)", pl.MaxBatch, pl.BatchSize)
	}
	if pl.MaxInFlight < pl.BatchSize || pl.MaxInFlight <= 0 {
		v.addf("pipeline.max_in_flight", "%d must be at least pipeline.batch_size (%d)", pl.MaxInFlight, pl.BatchSize)
	}
	if pl.MaxInFlightBytes <= 0 {
		v.addf("pipeline.max_in_flight_bytes", "must be positive, got %d", pl.MaxInFlightBytes)
	}
	largest := 0
	for _, r := range c.Routes {
		largest = max(largest, r.MaxSize)
	}
	if need := largest + minBatchOverhead; pl.MaxDecompressedBatchBytes < need {
		v.addf("pipeline.max_decompressed_batch_bytes", "%d must be at least the largest routes[].max_size plus 64 KiB (%d): a batch of one record of that size must inflate",
			pl.MaxDecompressedBatchBytes, need)
	}
	if pl.MaxDecompressedFetchBytes < pl.MaxDecompressedBatchBytes {
		v.addf("pipeline.max_decompressed_fetch_bytes", "%d must be at least pipeline.max_decompressed_batch_bytes (%d)", pl.MaxDecompressedFetchBytes, pl.MaxDecompressedBatchBytes)
	}
	v.positive("pipeline.shutdown_grace", pl.ShutdownGrace)
	if pl.ShutdownGrace > 0 && k.RebalanceTimeout > 0 && pl.ShutdownGrace >= k.RebalanceTimeout {
		// A revoked partition finishes within the grace period before it is
		// released; a member that takes longer than the rebalance timeout
		// is expelled, and its partitions move while it still delivers.
		v.addf("pipeline.shutdown_grace", "%s must be below kafka.rebalance_timeout (%s)", pl.ShutdownGrace, k.RebalanceTimeout)
	}
	switch keep := c.DecisionLog.Keep; {
	case keep < 0:
		v.addf("decision_log.keep", "must not be negative, got %s", keep)
	case keep > MaxDecisionLogKeep:
		v.addf("decision_log.keep", "%s is more than %s: the log grows with it, and explain needs the input too, which Kafka keeps far less long", keep, MaxDecisionLogKeep)
	}
	v.positive("pipeline.retry_min", pl.RetryMin)
	v.positive("pipeline.retry_max", pl.RetryMax)
	if pl.RetryMin > 0 && pl.RetryMax > 0 && pl.RetryMin > pl.RetryMax {
		v.addf("pipeline.retry_min", "%s must not exceed pipeline.retry_max (%s)", pl.RetryMin, pl.RetryMax)
	}

	c.validateRoutes(v)
	c.validateServe(v)
	c.validateTap(v)
	return v.errs
}

// minBatchOverhead is the room a record batch of one record takes beyond
// its value, with a margin for its key and headers.
const minBatchOverhead = 64 << 10

func (c *Config) validateRoutes(v *validator) {
	if len(c.Routes) == 0 {
		v.addf("routes", "at least one route is required")
		return
	}
	services := make(map[string]int)
	froms := make(map[string]int)
	for i := range c.Routes {
		r := &c.Routes[i]
		key := func(name string) string { return fmt.Sprintf("routes[%d].%s", i, name) }
		v.required(key("service"), r.Service == "")
		v.required(key("from"), r.From == "")
		v.required(key("to"), r.To == "")
		if r.Service != "" {
			if j, dup := services[r.Service]; dup {
				v.addf(key("service"), "%q is already the service of routes[%d]", r.Service, j)
			} else {
				services[r.Service] = i
			}
		}
		if r.From != "" {
			if j, dup := froms[r.From]; dup {
				v.addf(key("from"), "topic %q is already read by routes[%d]", r.From, j)
			} else {
				froms[r.From] = i
			}
		}
	}
	for i := range c.Routes {
		r := &c.Routes[i]
		key := func(name string) string { return fmt.Sprintf("routes[%d].%s", i, name) }
		for _, out := range []struct{ name, topic string }{{"to", r.To}, {"dead_letter", r.DeadLetter}} {
			if out.topic == "" {
				continue
			}
			if j, loop := froms[out.topic]; loop {
				v.addf(key(out.name), "topic %q is the from topic of routes[%d]: a loop", out.topic, j)
			}
		}
		if r.DeadLetter != "" && r.DeadLetter == r.To {
			v.addf(key("dead_letter"), "topic %q is also the route's to topic", r.DeadLetter)
		}

		v.oneOf(key("mode"), &r.Mode, ModeLastSeen, ModeLastSeen, ModeWindow, ModeVersion)
		if r.Entity == "" {
			r.Entity = "key"
		}
		if e, err := ParseEntity(r.Entity); err != nil {
			v.add(key("entity"), err)
		} else {
			r.entity = e
		}
		v.modeSettings(r, key)
		v.oneOf(key("format"), &r.Format, FormatJSON, FormatJSON, FormatBytes)
		if r.Format == FormatBytes && len(r.Ignore) > 0 {
			v.addf(key("ignore"), "only with format json, not %q", r.Format)
		}
		for j, ptr := range r.Ignore {
			if err := canon.ValidatePointer(ptr); err != nil {
				v.add(fmt.Sprintf("routes[%d].ignore[%d]", i, j), err)
			}
		}
		v.oneOf(key("partitioning"), &r.Partitioning, PartitioningKey, PartitioningKey, PartitioningPreserve)
		v.oneOf(key("on_store_failure"), &r.OnStoreFailure, OnStoreFailurePause, OnStoreFailurePause, OnStoreFailureForward)
		if r.MaxDepth <= 0 {
			v.addf(key("max_depth"), "must be positive, got %d", r.MaxDepth)
		}
		if r.MaxSize <= 0 {
			v.addf(key("max_size"), "must be positive, got %d", r.MaxSize)
		}
	}
}

// modeSettings checks the settings of the route's mode, fills their
// defaults, and rejects the settings of other modes (each names the mode it
// belongs to).
func (v *validator) modeSettings(r *Route, key func(string) string) {
	only := func(name, mode string, set bool) {
		if set && r.Mode != mode {
			v.addf(key(name), "only with mode %q, not %q", mode, r.Mode)
		}
	}
	only("id_from", ModeWindow, r.IDFrom != "")
	only("window", ModeWindow, r.Window != 0)
	only("sliding", ModeWindow, r.Sliding)
	only("cleanup_interval", ModeWindow, r.CleanupInterval != 0)
	only("cleanup_batch", ModeWindow, r.CleanupBatch != 0)
	only("version_from", ModeVersion, r.VersionFrom != "")
	only("refresh_after", ModeLastSeen, r.RefreshAfter != 0)
	switch r.Mode {
	case ModeLastSeen:
		if r.RefreshAfter < 0 {
			v.addf(key("refresh_after"), "must be positive (or 0: off), got %s", r.RefreshAfter)
		}
	case ModeWindow:
		if r.IDFrom == "" {
			r.IDFrom = DefaultIDFrom
		}
		if src, err := parseFrom(r.IDFrom, "/meta/id"); err != nil {
			v.add(key("id_from"), err)
		} else {
			r.idFrom = src
		}
		if r.Entity != "key" {
			v.addf(key("entity"), "not used with mode %q: its identity is the message id (id_from)", ModeWindow)
		}
		switch {
		case r.Window == 0:
			v.addf(key("window"), "required with mode %q: how long an id is remembered, e.g. 24h", ModeWindow)
		case r.Window < 0:
			v.addf(key("window"), "must be positive, got %s", r.Window)
		}
		if r.CleanupInterval == 0 {
			r.CleanupInterval = DefaultCleanupInterval
		}
		v.positive(key("cleanup_interval"), r.CleanupInterval)
		if r.CleanupBatch == 0 {
			r.CleanupBatch = DefaultCleanupBatch
		}
		if r.CleanupBatch < 0 {
			v.addf(key("cleanup_batch"), "must be positive, got %d", r.CleanupBatch)
		}
	case ModeVersion:
		if r.VersionFrom == "" {
			r.VersionFrom = DefaultVersionFrom
		}
		if src, err := parseFrom(r.VersionFrom, DefaultVersionFrom); err != nil {
			v.add(key("version_from"), err)
		} else {
			r.versionFrom = src
		}
	}
}

// parseFrom parses id_from or version_from: a header or a JSON pointer
// without wildcards (example shows one).
func parseFrom(s, example string) (EntitySource, error) {
	src, err := ParseEntity(s)
	if err != nil || src.Kind == EntityKey {
		return EntitySource{}, fmt.Errorf(`invalid value %q: want "header:Name" or a JSON pointer such as %q`, s, example)
	}
	return src, nil
}

// codecs are the values of kafka.compression.
var codecs = []string{CompressionNone, CompressionGzip, CompressionSnappy, CompressionLz4, CompressionZstd}

// compression checks kafka.compression, an empty list meaning the default
// ("none"). Each codec is known and listed once; none follows "none",
// which every broker accepts, so that a codec after it would never be used.
func (v *validator) compression(cs *Codecs) {
	if len(*cs) == 0 {
		*cs = Codecs{CompressionNone}
	}
	seen := map[string]int{}
	for i, c := range *cs {
		key := fmt.Sprintf("kafka.compression[%d]", i)
		switch j, dup := seen[c]; {
		case !slices.Contains(codecs, c):
			v.addf(key, "invalid value %q: want %s", c, orList(codecs))
		case dup:
			v.addf(key, "%q is already kafka.compression[%d]", c, j)
		case slices.Contains((*cs)[:i], CompressionNone):
			v.addf(key, "%q is never used: \"none\" comes before it and every broker accepts uncompressed batches", c)
		}
		if _, dup := seen[c]; !dup {
			seen[c] = i
		}
	}
}

// boundScheme cuts a mistyped scheme for an error message: the DSN is a
// secret, and only its scheme is quoted.
func boundScheme(s string) string {
	if len(s) > 20 || strings.ContainsAny(s, "@:/") {
		return s[:min(len(s), 20)] + "…"
	}
	return s
}
