package pipeline

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/twmb/franz-go/plugin/kprom"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/config"
)

// AuthError is a broker refusing dam: its TLS handshake failed (the
// broker's certificate does not verify, or the broker rejected dam's), or
// it refused dam's SASL credentials. Retrying does not help; a person must
// fix the configuration or the credentials.
type AuthError struct {
	// Broker is the broker's address, host:port.
	Broker string
	// Mechanism is the SASL mechanism ("SCRAM-SHA-512"), or "" when the
	// TLS handshake failed.
	Mechanism string
	// Err is the client's error.
	Err error
}

func (e *AuthError) Error() string {
	if e.Mechanism == "" {
		return fmt.Sprintf("kafka: TLS handshake with %s failed: %v", e.Broker, e.Err)
	}
	return fmt.Sprintf("kafka: SASL %s authentication to %s failed: %v", e.Mechanism, e.Broker, e.Err)
}

// Unwrap returns the client's error.
func (e *AuthError) Unwrap() error { return e.Err }

// KafkaOptions returns the franz-go options that kafka.tls, kafka.sasl and
// kafka.compression ask for: every client dam makes uses them (the
// pipeline's, and the tools' such as dam explain). Errors are *config.Error
// values naming the key whose file could not be used.
func KafkaOptions(k config.Kafka) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	tc, err := tlsConfig(k.TLS)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if m := saslMechanism(k.SASL); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	codecs, err := compressionCodecs(k.Compression)
	if err != nil {
		return nil, err
	}
	// One producer sends forwards and dead letters: both use this setting.
	return append(opts, kgo.ProducerBatchCompression(codecs...)), nil
}

// tlsConfig builds the TLS client configuration from kafka.tls; nil when
// TLS is off.
func tlsConfig(c config.TLS) (*tls.Config, error) {
	if !c.Enabled {
		return nil, nil
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         c.ServerName,         // "": franz-go uses each broker's host
		InsecureSkipVerify: c.InsecureSkipVerify, //nolint:gosec // operator's explicit choice
	}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, &config.Error{Key: "kafka.tls.ca_file", Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &config.Error{Key: "kafka.tls.ca_file", Err: fmt.Errorf("%s holds no PEM certificate", c.CAFile)}
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" || c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, &config.Error{Key: "kafka.tls.cert_file", Err: fmt.Errorf("with kafka.tls.key_file: %w", err)}
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// saslMechanism builds the SASL mechanism from kafka.sasl; nil when unset.
func saslMechanism(c config.SASL) sasl.Mechanism {
	switch c.Mechanism {
	case "PLAIN":
		return plain.Auth{User: c.Username, Pass: c.Password}.AsMechanism()
	case "SCRAM-SHA-256":
		return scram.Auth{User: c.Username, Pass: c.Password}.AsSha256Mechanism()
	case "SCRAM-SHA-512":
		return scram.Auth{User: c.Username, Pass: c.Password}.AsSha512Mechanism()
	}
	return nil
}

// compressionCodecs maps kafka.compression to franz-go's codecs, in the
// same order of preference.
func compressionCodecs(names config.Codecs) ([]kgo.CompressionCodec, error) {
	if len(names) == 0 {
		return []kgo.CompressionCodec{kgo.NoCompression()}, nil
	}
	codecs := make([]kgo.CompressionCodec, len(names))
	for i, n := range names {
		switch n {
		case config.CompressionNone:
			codecs[i] = kgo.NoCompression()
		case config.CompressionGzip:
			codecs[i] = kgo.GzipCompression()
		case config.CompressionSnappy:
			codecs[i] = kgo.SnappyCompression()
		case config.CompressionLz4:
			codecs[i] = kgo.Lz4Compression()
		case config.CompressionZstd:
			codecs[i] = kgo.ZstdCompression()
		default:
			return nil, &config.Error{Key: fmt.Sprintf("kafka.compression[%d]", i), Err: fmt.Errorf("invalid value %q", n)}
		}
	}
	return codecs, nil
}

// CheckBrokers asks kafka.brokers for metadata with dam's client settings
// (TLS, SASL), as `dam run` does before it starts. It returns nil once a
// broker answers; a *config.Error when a file of kafka.tls cannot be used;
// an *AuthError when a broker refuses the TLS handshake or the
// credentials; otherwise the error of the last broker tried, prefixed
// "kafka unreachable" (the pipeline waits for a broker, not ready
// meanwhile).
func CheckBrokers(ctx context.Context, k config.Kafka) error {
	opts, err := KafkaOptions(k)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers(k.Brokers...), kgo.ClientID(k.ClientID))...)
	if err != nil {
		return fmt.Errorf("pipeline: kafka client: %w", err)
	}
	err = cl.Ping(ctx)
	cl.Close()
	if err == nil {
		return nil
	}
	if ae := diagnose(ctx, k); ae != nil {
		return ae
	}
	return fmt.Errorf("kafka unreachable: %w", err)
}

// brokerProblem turns a failed broker probe into what Ready reports and
// the log says: an *AuthError when a broker refuses dam's certificate or
// credentials (rotated under it, say), "kafka unreachable: ..."
// otherwise. The broker probe calls it.
func (p *Pipeline) brokerProblem(ctx context.Context, err error) error {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if ae := diagnose(dctx, p.cfg.Kafka); ae != nil {
		return ae
	}
	return fmt.Errorf("kafka unreachable: %w", err)
}

// reportBroker logs a change of the broker probe's outcome from was to
// err: a refused authentication at error level (a person must act; the
// client keeps retrying, so that dam resumes once the credentials are
// fixed), an unreachable cluster at warn level, the end of either at info.
func (p *Pipeline) reportBroker(was, err error) {
	var ae, wasAE *AuthError
	isAuth, wasAuth := errors.As(err, &ae), errors.As(was, &wasAE)
	switch {
	case err == nil && wasAuth:
		p.log.Info("kafka authentication succeeds again")
	case err == nil && was != nil:
		p.log.Info("kafka reachable again")
	case err == nil:
	case isAuth && (!wasAuth || wasAE.Broker != ae.Broker || wasAE.Mechanism != ae.Mechanism):
		p.log.Error("kafka refuses dam: partitions paused until the configuration or the credentials are fixed", zap.Error(err))
	case !isAuth && (was == nil || wasAuth):
		p.log.Warn("kafka unreachable: partitions paused until a broker answers", zap.Error(err))
	}
}

// diagnose tells a broker refusing dam apart from an unreachable cluster:
// it asks each seed broker alone for metadata, with a new client (so that
// its connections are new and authenticate), and returns the first
// refusal, or nil when no broker refused (they are unreachable, or answer
// again). Without TLS or SASL there is nothing to refuse.
func diagnose(ctx context.Context, k config.Kafka) *AuthError {
	if !k.TLS.Enabled && k.SASL.Mechanism == "" {
		return nil
	}
	opts, err := KafkaOptions(k)
	if err != nil {
		return nil // Run and CheckBrokers report it before any probe
	}
	for _, b := range k.Brokers {
		h := &saslReadHook{}
		cl, err := kgo.NewClient(slices.Concat(opts, []kgo.Opt{kgo.SeedBrokers(b), kgo.ClientID(k.ClientID), kgo.WithHooks(h)})...)
		if err != nil {
			continue
		}
		err = cl.Ping(ctx)
		cl.Close()
		if ae := refusal(b, k.SASL.Mechanism, err, h.failure()); ae != nil {
			return ae
		}
		if ctx.Err() != nil {
			return nil
		}
	}
	return nil
}

// refusal classifies the error of a request to broker: a TLS handshake
// that failed on either side, a SASL error code (what Kafka answers to
// bad credentials or an unknown mechanism), or the broker closing the
// connection in reply to the credentials (saslErr; what some brokers, and
// kfake, do instead). Anything else is not a refusal: nil.
func refusal(broker, mechanism string, err, saslErr error) *AuthError {
	if err == nil {
		return nil
	}
	var (
		verify *tls.CertificateVerificationError
		header tls.RecordHeaderError
		op     *net.OpError
	)
	switch {
	// The broker's certificate does not verify; the broker answered with
	// a TLS alert (crypto/tls marks alerts from the peer "remote error"),
	// such as "certificate required"; or it does not speak TLS.
	case errors.As(err, &verify), errors.As(err, &header), errors.As(err, &op) && op.Op == "remote error":
		return &AuthError{Broker: broker, Err: err}
	case mechanism == "":
		return nil
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return &AuthError{Broker: broker, Mechanism: mechanism, Err: err}
	case saslErr != nil:
		return &AuthError{Broker: broker, Mechanism: mechanism,
			Err: fmt.Errorf("the broker closed the connection in reply to the credentials (%w): wrong username or password, or no such user for this mechanism", saslErr)}
	}
	return nil
}

// saslReadHook records a broker closing the connection while the client
// waits for its answer to a SASLAuthenticate request: a refusal of the
// credentials that the client's own error (a bare EOF) does not name.
type saslReadHook struct {
	mu  sync.Mutex
	err error
}

var _ kgo.HookBrokerRead = (*saslReadHook)(nil)

// OnBrokerRead implements kgo.HookBrokerRead.
func (h *saslReadHook) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != int16(kmsg.SASLAuthenticate) || err == nil {
		return
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		h.mu.Lock()
		h.err = err
		h.mu.Unlock()
	}
}

func (h *saslReadHook) failure() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// heartbeatInterval is franz-go's default group heartbeat interval.
const heartbeatInterval = 3 * time.Second

// ownershipLease is how long a proof of owning a partition is trusted: the
// group coordinator gives a silent member's partitions away a session
// timeout after its last heartbeat, which was at most a heartbeat interval
// before the proof; half of what is left keeps a margin.
func ownershipLease(session time.Duration) time.Duration {
	return max(session-heartbeatInterval, session/2) / 2
}

// fetchMaxBytes bounds one fetch response. Kafka still returns a record
// batch larger than this on its own, so it never stalls a partition.
const fetchMaxBytes = 4 << 20

func (p *Pipeline) clientOptions() ([]kgo.Opt, error) {
	topics := slices.Sorted(maps.Keys(p.routes))
	routes := slices.Collect(maps.Values(p.routes))
	opts := []kgo.Opt{
		kgo.SeedBrokers(p.cfg.Kafka.Brokers...),
		kgo.ClientID(p.cfg.Kafka.ClientID),
		kgo.WithLogger(kzap.New(p.log.Named("kafka"), kzap.Level(kgo.LogLevelWarn))),
		kgo.WithHooks(kprom.NewMetrics("dam_kafka", kprom.Registerer(p.reg))),
		// Consumer: a group over every route's input, read_committed, no
		// auto-commit: offsets are committed only after delivery.
		kgo.ConsumerGroup(p.cfg.Kafka.Group),
		kgo.ConsumeTopics(topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		// (franz-go fetches committed offsets require-stable, always.)
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.SessionTimeout(p.cfg.Kafka.SessionTimeout),
		kgo.RebalanceTimeout(p.cfg.Kafka.RebalanceTimeout),
		// Recovery sets every assigned partition's offset; these apply
		// only when a committed offset fell below the log start (retention):
		// resume at the log start, so every record that still exists is
		// read.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// One fetch is buffered while the workers are busy, decompressed,
		// on top of the max_in_flight budget: franz-go's default (50 MiB)
		// doubled peak memory and gained nothing.
		kgo.FetchMaxBytes(fetchMaxBytes),
		// Decompression bounded per batch and per poll (decompress.go).
		kgo.WithDecompressor(p.dec),
		kgo.OnPartitionsAssigned(p.onJoined),
		kgo.AdjustFetchOffsetsFn(p.onAssigned),
		kgo.OnPartitionsRevoked(p.onRevoked),
		kgo.OnPartitionsLost(p.onLost),
		// Producer: acks=all and idempotence (franz-go's defaults, stated),
		// records partitioned by key with murmur2 or preserved, batches
		// bounded by each output topic's max.message.bytes.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(newPartitioner(routes)),
		kgo.ProducerLinger(0),
		kgo.ProducerBatchMaxBytesFn(p.limits.get),
		kgo.MaxBufferedRecords(max(p.cfg.Pipeline.MaxInFlight*2, 10000)),
	}
	// TLS, SASL and compression (kafkaopts.go).
	kopts, err := KafkaOptions(p.cfg.Kafka)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	opts = append(opts, kopts...)
	return append(opts, p.kopts...), nil
}
