package pipeline

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/dam-dedup/dam/config"
)

// tlsOption builds the client's TLS dialer from kafka.tls; nil when TLS is
// off. Errors name the key whose file could not be used.
func tlsOption(c config.TLS) (kgo.Opt, error) {
	if !c.Enabled {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.InsecureSkipVerify} //nolint:gosec // operator's explicit choice
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka.tls.ca_file: %s holds no PEM certificate", c.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" || c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls.cert_file/key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return kgo.DialTLSConfig(tc), nil
}

// saslOption builds the SASL mechanism from kafka.sasl; nil when unset.
func saslOption(c config.SASL) kgo.Opt {
	switch c.Mechanism {
	case "PLAIN":
		return kgo.SASL(plain.Auth{User: c.Username, Pass: c.Password}.AsMechanism())
	case "SCRAM-SHA-256":
		return kgo.SASL(scram.Auth{User: c.Username, Pass: c.Password}.AsSha256Mechanism())
	case "SCRAM-SHA-512":
		return kgo.SASL(scram.Auth{User: c.Username, Pass: c.Password}.AsSha512Mechanism())
	}
	return nil
}
