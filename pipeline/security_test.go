package pipeline_test

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testcert"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// A B A B A forwards five records, A A A A B two: the records that prove
// the pipeline decided, not merely passed records through.
var (
	secIn = []struct{ key, value string }{
		{"abab", `{"v":"A"}`}, {"abab", `{"v":"B"}`}, {"abab", `{"v":"A"}`}, {"abab", `{"v":"B"}`}, {"abab", `{"v":"A"}`},
		{"aaab", `{"v":"A"}`}, {"aaab", `{"v":"A"}`}, {"aaab", `{"v":"A"}`}, {"aaab", `{"v":"A"}`}, {"aaab", `{"v":"B"}`},
	}
	secWant = map[string][]string{
		"abab": {`{"v":"A"}`, `{"v":"B"}`, `{"v":"A"}`, `{"v":"B"}`, `{"v":"A"}`},
		"aaab": {`{"v":"A"}`, `{"v":"B"}`},
	}
)

// runDedup runs the pipeline with cfg over kc end to end: the records of
// secIn go in, and exactly secWant comes out.
func runDedup(t *testing.T, kc *testkafka.Cluster, cfg config.Config, dsn string) {
	t.Helper()
	r := start(t, cfg, openStore(t, dsn))
	var in []*kgo.Record
	for _, x := range secIn {
		in = append(in, rec(x.key, x.value))
	}
	kc.Produce("in", in...)
	r.waitRecords("svc", len(secIn))
	got := byKey(waitOutput(t, kc, "out", 7))
	for k, want := range secWant {
		if !slices.Equal(got[k], want) {
			t.Errorf("%s: got %q, want %q", k, got[k], want)
		}
	}
	if err := r.pl.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
	r.stop()
}

// The pipeline runs end to end through each SASL mechanism, as dam's own
// user (not a superuser).
func TestSASLEndToEnd(t *testing.T) {
	t.Parallel()
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			kc := saslCluster(t)
			dsn := pgtest.DSN(t)
			cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
			cfg.Kafka.SASL = config.SASL{Mechanism: mech, Username: damUser, Password: damPass}
			validate(t, &cfg)
			if err := pipeline.CheckBrokers(context.Background(), cfg.Kafka); err != nil {
				t.Fatalf("CheckBrokers: %v", err)
			}
			runDedup(t, kc, cfg, dsn)
		})
	}
}

// A wrong password, an unknown user or the wrong mechanism's user is an
// *AuthError naming the mechanism and the broker, at once (not after a
// retry loop's timeout).
func TestSASLRefused(t *testing.T) {
	t.Parallel()
	kc := saslCluster(t, kfake.User("SCRAM-SHA-512", "only512", "pw"))
	for _, tc := range []struct {
		name string
		sasl config.SASL
	}{
		{"PLAIN wrong password", config.SASL{Mechanism: "PLAIN", Username: damUser, Password: "not-the-password"}},
		{"SCRAM-SHA-256 wrong password", config.SASL{Mechanism: "SCRAM-SHA-256", Username: damUser, Password: "not-the-password"}},
		{"SCRAM-SHA-512 wrong password", config.SASL{Mechanism: "SCRAM-SHA-512", Username: damUser, Password: "not-the-password"}},
		{"unknown user", config.SASL{Mechanism: "SCRAM-SHA-512", Username: "nobody", Password: damPass}},
		{"user of another mechanism", config.SASL{Mechanism: "SCRAM-SHA-256", Username: "only512", Password: "pw"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := config.Default().Kafka
			k.Brokers = []string{kc.Addr()}
			k.SASL = tc.sasl
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			began := time.Now()
			err := pipeline.CheckBrokers(ctx, k)
			var ae *pipeline.AuthError
			if !errors.As(err, &ae) {
				t.Fatalf("CheckBrokers: %v (%T), want an *AuthError", err, err)
			}
			want := "kafka: SASL " + tc.sasl.Mechanism + " authentication to " + kc.Addr() + " failed: "
			if !strings.HasPrefix(err.Error(), want) {
				t.Errorf("error %q does not start with %q", err, want)
			}
			if strings.Contains(err.Error(), tc.sasl.Password) {
				t.Errorf("error %q shows the password", err)
			}
			if d := time.Since(began); d > 5*time.Second {
				t.Errorf("refusal reported after %s: a retry loop?", d)
			}
		})
	}
	// Kafka answers a refused login with an error code (kfake closes the
	// connection instead): a broker that answers as Kafka does.
	for _, tc := range []struct {
		name string
		key  kmsg.Key
		fail func(kmsg.Request) kmsg.Response
		want string
	}{
		{"Kafka's reply to bad credentials", kmsg.SASLAuthenticate, func(req kmsg.Request) kmsg.Response {
			resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
			resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
			msg := "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
			resp.ErrorMessage = &msg
			return resp
		}, "SASL_AUTHENTICATION_FAILED"},
		{"mechanism not enabled", kmsg.SASLHandshake, func(req kmsg.Request) kmsg.Response {
			resp := req.ResponseKind().(*kmsg.SASLHandshakeResponse)
			resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
			resp.SupportedMechanisms = []string{"PLAIN"}
			return resp
		}, "UNSUPPORTED_SASL_MECHANISM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kc := saslCluster(t)
			kc.ControlKey(int16(tc.key), func(req kmsg.Request) (kmsg.Response, error, bool) {
				kc.KeepControl()
				return tc.fail(req), nil, true
			})
			k := config.Default().Kafka
			k.Brokers = []string{kc.Addr()}
			k.SASL = config.SASL{Mechanism: "SCRAM-SHA-512", Username: damUser, Password: damPass}
			err := pipeline.CheckBrokers(context.Background(), k)
			var ae *pipeline.AuthError
			want := "kafka: SASL SCRAM-SHA-512 authentication to " + kc.Addr() + " failed: "
			if !errors.As(err, &ae) || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckBrokers: %v, want %q ... %s", err, want, tc.want)
			}
		})
	}
	// Without SASL, the broker's refusal is no AuthError (nothing of dam's
	// to blame) but it is not silent either.
	k := config.Default().Kafka
	k.Brokers = []string{kc.Addr()}
	err := pipeline.CheckBrokers(context.Background(), k)
	var ae *pipeline.AuthError
	if err == nil || errors.As(err, &ae) || !strings.Contains(err.Error(), "kafka unreachable") {
		t.Errorf("CheckBrokers without SASL: %v, want kafka unreachable", err)
	}
}

// Credentials rotated under a running dam: once the broker makes it log in
// again, the probe reports the refusal, /readyz says it in the same words
// as `dam run` at start, the error is logged once at error level, and the
// partitions count as halted. Restored credentials resume the pipeline.
func TestSASLCredentialsRotated(t *testing.T) {
	t.Parallel()
	// connections.max.reauth.ms makes franz-go authenticate its open
	// connections again every few seconds, as a real broker does.
	kc := saslCluster(t, kfake.Superuser("SCRAM-SHA-512", "rotated", "old-secret"),
		kfake.BrokerConfigs(map[string]string{"connections.max.reauth.ms": "2000"}))
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Kafka.SASL = config.SASL{Mechanism: "SCRAM-SHA-512", Username: "rotated", Password: "old-secret"}
	validate(t, &cfg)

	core, logs := observer.New(zapcore.ErrorLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
	pl, err := pipeline.New(cfg, openStore(t, dsn), pipeline.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- pl.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	kc.Produce("in", rec("k", `{"v":1}`))
	waitOutput(t, kc, "out", 1)
	waitFor(t, "ready", func() (bool, string) { err := pl.Ready(); return err == nil, errString(err) })

	setPassword := func(pw string) {
		t.Helper()
		adm := kadm.NewClient(kc.Client())
		_, err := adm.AlterUserSCRAMs(context.Background(), nil, []kadm.UpsertSCRAM{{
			User: "rotated", Mechanism: kadm.ScramSha512, Iterations: 4096, Password: pw,
		}})
		if err != nil {
			t.Fatalf("rotating the password: %v", err)
		}
	}
	setPassword("new-secret")
	want := "kafka: SASL SCRAM-SHA-512 authentication to " + kc.Addr() + " failed: "
	waitFor(t, "Ready to report the refused credentials", func() (bool, string) {
		err := pl.Ready()
		return err != nil && strings.Contains(err.Error(), want), errString(err)
	})
	if err := pl.Ready(); !errors.Is(err, pipeline.ErrNotReady) {
		t.Errorf("Ready error %v does not wrap ErrNotReady", err)
	}
	entries := logs.FilterMessageSnippet("kafka refuses dam").All()
	if len(entries) != 1 {
		t.Errorf("%d error lines about the refusal, want 1: %v", len(entries), logs.All())
	} else if got := entries[0].ContextMap()["error"]; !strings.Contains(got.(string), want) {
		t.Errorf("logged error %q does not say %q", got, want)
	}

	setPassword("old-secret")
	waitFor(t, "ready again", func() (bool, string) { err := pl.Ready(); return err == nil, errString(err) })
	kc.Produce("in", rec("k", `{"v":1}`), rec("k", `{"v":2}`))
	if got := byKey(waitOutput(t, kc, "out", 2))["k"]; !slices.Equal(got, []string{`{"v":1}`, `{"v":2}`}) {
		t.Errorf("after the rotation: %q", got)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// tlsSetup is a kfake broker requiring TLS with client certificates,
// whose certificate names only broker.dam.test (not 127.0.0.1: dam
// reaches it with kafka.tls.server_name), and the files dam needs.
type tlsSetup struct {
	kc     *testkafka.Cluster
	ca     *testcert.CA
	client testcert.Pair
}

func newTLSSetup(t *testing.T) tlsSetup {
	t.Helper()
	ca := testcert.NewCA(t, "dam-test")
	server := ca.Issue(t, "broker", "broker.dam.test")
	client := ca.Issue(t, "dam")
	stc := &tls.Config{
		Certificates: []tls.Certificate{server.TLS},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool(),
		MinVersion:   tls.VersionTLS12,
	}
	ctc := &tls.Config{RootCAs: ca.Pool(), ServerName: "broker.dam.test", Certificates: []tls.Certificate{client.TLS}, MinVersion: tls.VersionTLS12}
	kc := testkafka.NewWith(t, 2, []string{"in", "out"}, []kfake.Opt{kfake.TLS(stc)}, kgo.DialTLSConfig(ctc))
	return tlsSetup{kc: kc, ca: ca, client: client}
}

// kafkaTLS is the kafka.tls dam uses against s.
func (s tlsSetup) kafkaTLS() config.TLS {
	return config.TLS{Enabled: true, CAFile: s.ca.CertFile, CertFile: s.client.CertFile, KeyFile: s.client.KeyFile, ServerName: "broker.dam.test"}
}

// The pipeline runs end to end over TLS with a client certificate, and
// with SASL on top.
func TestTLSEndToEnd(t *testing.T) {
	t.Parallel()
	s := newTLSSetup(t)
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, s.kc, dsn, route("svc", "in", "out"))
	cfg.Kafka.TLS = s.kafkaTLS()
	validate(t, &cfg)
	if err := pipeline.CheckBrokers(context.Background(), cfg.Kafka); err != nil {
		t.Fatalf("CheckBrokers: %v", err)
	}
	runDedup(t, s.kc, cfg, dsn)
}

func TestTLSAndSASLEndToEnd(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "dam-test")
	server := ca.Issue(t, "broker", "127.0.0.1")
	stc := &tls.Config{Certificates: []tls.Certificate{server.TLS}, MinVersion: tls.VersionTLS12}
	kc := testkafka.NewWith(t, 2, []string{"in", "out"},
		[]kfake.Opt{kfake.TLS(stc), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", adminUser, adminPass), kfake.User("SCRAM-SHA-512", damUser, damPass)},
		adminAuth(), kgo.DialTLSConfig(&tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}))
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("svc", "in", "out"))
	cfg.Kafka.TLS = config.TLS{Enabled: true, CAFile: ca.CertFile} // the broker's IP is in its certificate
	cfg.Kafka.SASL = config.SASL{Mechanism: "SCRAM-SHA-512", Username: damUser, Password: damPass}
	validate(t, &cfg)
	runDedup(t, kc, cfg, dsn)
}

// Each TLS mistake is an *AuthError naming the broker and what is wrong,
// at once.
func TestTLSRefused(t *testing.T) {
	t.Parallel()
	s := newTLSSetup(t)
	other := testcert.NewCA(t, "other")
	for _, tc := range []struct {
		name   string
		mutate func(c *config.TLS)
		want   string
	}{
		{"wrong CA", func(c *config.TLS) { c.CAFile = other.CertFile }, "certificate signed by unknown authority"},
		{"wrong server name", func(c *config.TLS) { c.ServerName = "other.dam.test" }, "certificate is valid for broker.dam.test, not other.dam.test"},
		{"address not in the certificate", func(c *config.TLS) { c.ServerName = "" }, "x509: cannot validate certificate for 127.0.0.1 because it doesn't contain any IP SANs"},
		{"no client certificate", func(c *config.TLS) { c.CertFile, c.KeyFile = "", "" }, "remote error: tls: certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := config.Default().Kafka
			k.Brokers = []string{s.kc.Addr()}
			k.TLS = s.kafkaTLS()
			tc.mutate(&k.TLS)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			began := time.Now()
			err := pipeline.CheckBrokers(ctx, k)
			var ae *pipeline.AuthError
			if !errors.As(err, &ae) || ae.Mechanism != "" {
				t.Fatalf("CheckBrokers: %v (%T), want a TLS *AuthError", err, err)
			}
			prefix := "kafka: TLS handshake with " + s.kc.Addr() + " failed: "
			if !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want %q ... %q", err, prefix, tc.want)
			}
			if d := time.Since(began); d > 5*time.Second {
				t.Errorf("refusal reported after %s", d)
			}
		})
	}
}

// A file of kafka.tls that cannot be used is a configuration error naming
// its key, from CheckBrokers and from Run.
func TestTLSFiles(t *testing.T) {
	t.Parallel()
	s := newTLSSetup(t)
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(c *config.TLS)
		key    string
	}{
		{"missing CA", func(c *config.TLS) { c.CAFile = "/nonexistent/ca.pem" }, "kafka.tls.ca_file"},
		{"CA not PEM", func(c *config.TLS) { c.CAFile = notPEM }, "kafka.tls.ca_file"},
		{"key of another certificate", func(c *config.TLS) { c.KeyFile = s.ca.Issue(t, "stray").KeyFile }, "kafka.tls.cert_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := config.Default().Kafka
			k.Brokers = []string{s.kc.Addr()}
			k.TLS = s.kafkaTLS()
			tc.mutate(&k.TLS)
			err := pipeline.CheckBrokers(context.Background(), k)
			var ce *config.Error
			if !errors.As(err, &ce) || ce.Key != tc.key {
				t.Fatalf("CheckBrokers: %v, want a config error naming %s", err, tc.key)
			}
			cfg := testConfig(t, s.kc, "postgres://unused", route("svc", "in", "out"))
			cfg.Kafka.TLS = k.TLS
			validate(t, &cfg)
			pl, err := pipeline.New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := pl.Run(context.Background()); !errors.As(err, &ce) || ce.Key != tc.key {
				t.Fatalf("Run: %v, want a config error naming %s", err, tc.key)
			}
		})
	}
}
