package main

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testcert"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// dam run checks the brokers before it starts: a broker refusing its
// credentials or its TLS handshake ends it at once with exit status 1 and
// a message naming the mechanism and the broker; an unusable kafka.tls
// file is a configuration error (exit 2) naming its key.
func TestRunRefusedByKafka(t *testing.T) {
	unsetDSN(t)
	sasl := testkafka.NewWith(t, 1, []string{"in", "out"}, []kfake.Opt{
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "dam", "right-secret"),
	})
	ca := testcert.NewCA(t, "dam-test")
	other := testcert.NewCA(t, "other")
	server := ca.Issue(t, "broker", "127.0.0.1")
	tlsKafka := testkafka.NewWith(t, 1, []string{"in", "out"}, []kfake.Opt{
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{server.TLS}, MinVersion: tls.VersionTLS12}),
	})
	dsn := pgtest.DSN(t)
	for _, tc := range []struct {
		name  string
		kafka string
		code  int
		want  string
	}{
		{"wrong password", fmt.Sprintf("brokers: [%s]\n  sasl: {mechanism: SCRAM-SHA-512, username: dam, password: wrong-secret}", sasl.Addr()), 1,
			"dam: kafka: SASL SCRAM-SHA-512 authentication to " + sasl.Addr() + " failed: "},
		{"wrong mechanism", fmt.Sprintf("brokers: [%s]\n  sasl: {mechanism: PLAIN, username: dam, password: right-secret}", sasl.Addr()), 1,
			"dam: kafka: SASL PLAIN authentication to " + sasl.Addr() + " failed: "},
		{"wrong CA", fmt.Sprintf("brokers: [%s]\n  tls: {enabled: true, ca_file: %s}", tlsKafka.Addr(), other.CertFile), 1,
			"dam: kafka: TLS handshake with " + tlsKafka.Addr() + " failed: "},
		{"missing CA file", fmt.Sprintf("brokers: [%s]\n  tls: {enabled: true, ca_file: /nonexistent/ca.pem}", tlsKafka.Addr()), 2,
			"dam: kafka.tls.ca_file: open /nonexistent/ca.pem: no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "dam.yaml")
			body := "kafka:\n  group: g\n  " + tc.kafka + "\npostgres:\n  dsn: \"" + dsn + "\"\nhttp:\n  listen: \"\"\n" +
				"routes:\n  - service: s\n    from: in\n    to: out\n"
			if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			code, _, errOut := runDam(t, "run", "--config", path)
			if code != tc.code || !strings.HasPrefix(errOut, tc.want) {
				t.Fatalf("dam run: exit %d, stderr %q; want exit %d and %q", code, errOut, tc.code, tc.want)
			}
			if strings.Contains(errOut, "wrong-secret") {
				t.Errorf("stderr shows the password: %q", errOut)
			}
			if d := time.Since(began); d > 10*time.Second {
				t.Errorf("dam run took %s to give up: a retry loop?", d)
			}
		})
	}
}

// Every DSN key that ends in "password" is redacted wherever dam prints
// a DSN, sslpassword among them: in dam config, in a connection error, in
// a DSN that does not parse.
func TestDSNPasswordsRedacted(t *testing.T) {
	unsetDSN(t)
	const secret = "s3cret-sslpass"
	for _, dsn := range []string{
		"postgres://dam:" + secret + "@127.0.0.1:1/dam?sslpassword=" + secret + "&sslmode=disable&connect_timeout=2",
		"host=127.0.0.1 port=1 user=dam password=" + secret + " sslpassword=" + secret + " sslmode=disable connect_timeout=2",
	} {
		path := writeRunConfig(t, dsn, "")
		for _, args := range [][]string{
			{"config", "--config", path},
			{"migrate", "--dsn", dsn},
			{"state", "stats", "--dsn", dsn},
			{"state", "stats", "--dsn", strings.Replace(dsn, "sslmode=disable", "sslmode=bogus", 1)},
			{"migrate", "--dsn", strings.Replace(dsn, "sslmode=disable", "sslmode=bogus", 1)},
		} {
			code, out, errOut := runDam(t, args...)
			if strings.Contains(out+errOut, secret) {
				t.Errorf("dam %s: exit %d prints the password:\n%s%s", strings.Join(args[:2], " "), code, out, errOut)
			}
			if args[0] == "config" && (code != 0 || strings.Count(out, "xxxxx") != 2) {
				t.Errorf("dam config: exit %d, %q %q", code, out, errOut)
			}
		}
	}
}
