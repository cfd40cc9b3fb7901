package serve_test

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testcert"
	"github.com/dam-dedup/dam/serve"
)

// install copies a certificate and its key to certFile and keyFile the
// way a Secret's files change: each written aside, then renamed over.
func install(t *testing.T, p testcert.Pair, certFile, keyFile string) {
	t.Helper()
	for _, f := range []struct{ from, to string }{{p.CertFile, certFile}, {p.KeyFile, keyFile}} {
		b, err := os.ReadFile(f.from)
		if err != nil {
			t.Fatal(err)
		}
		tmp := f.to + ".tmp"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f.to); err != nil {
			t.Fatal(err)
		}
	}
}

// served returns the common name of the certificate the server presents
// on a new connection.
func served(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	resp, err := client.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil {
		t.Fatalf("healthz over TLS: %d %v", resp.StatusCode, resp.TLS)
	}
	return resp.TLS.PeerCertificates[0].Subject.CommonName
}

// serve.tls serves the API over HTTPS with the certificate in its files,
// and serves a new certificate once the files change (cert-manager
// rotates them in place) without a restart; a pair that does not load
// leaves the previous certificate in use.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "dam-serve-test")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	install(t, ca.Issue(t, "first", "127.0.0.1"), certFile, keyFile)
	h := newServer(t, func(c *config.Config) {
		c.Serve.TLS = config.ServeTLS{CertFile: certFile, KeyFile: keyFile}
		c.Serve.MaxConnections = 1
		c.Serve.RequestTimeout = time.Second
	})
	addr := h.run()
	url := "https://" + addr
	// A new connection per request: each sees the certificate of its time.
	h.client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}}
	h.url = url
	if cn := served(t, h.client, url); cn != "first" {
		t.Fatalf("certificate %q, want first", cn)
	}
	if got := h.check("a", "e", "1"); got != "forward" {
		t.Fatal(got)
	}
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP answered 200 on the TLS port")
		}
	}

	install(t, ca.Issue(t, "second", "127.0.0.1"), certFile, keyFile)
	deadline := time.Now().Add(5 * time.Second)
	for served(t, h.client, url) != "second" {
		if time.Now().After(deadline) {
			t.Fatal("the rotated certificate is not served 5s after its files changed")
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Half a rotation: a new certificate beside the old key. The pair
	// does not load; the previous one stays.
	third := ca.Issue(t, "third", "127.0.0.1")
	b, err := os.ReadFile(third.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if cn := served(t, h.client, url); cn != "second" {
		t.Fatalf("certificate %q after a half-written rotation, want second (the previous one)", cn)
	}
	install(t, third, certFile, keyFile)
	deadline = time.Now().Add(5 * time.Second)
	for served(t, h.client, url) != "third" {
		if time.Now().After(deadline) {
			t.Fatal("the completed rotation is not served")
		}
		time.Sleep(200 * time.Millisecond)
	}

	// A connection beyond serve.max_connections is refused over TLS too:
	// a request with a valid token whose body comes slowly holds the one
	// slot (until its slowness ends it, after a second). While a
	// connection of the requests above still holds the slot (its close
	// reaches the server a little later, more so on a loaded machine),
	// the slow request itself may be refused: try again until it is in.
	var resp *http.Response
	deadline = time.Now().Add(10 * time.Second)
	for {
		hog, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatal(err)
		}
		defer hog.Close()
		if _, err := io.WriteString(hog, "POST /v1/check HTTP/1.1\r\nHost: dam\r\nAuthorization: Bearer "+tokenAll+"\r\nContent-Length: 100\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		resp, err = h.client.Get(url + "/healthz")
		if err == nil && resp.StatusCode == 503 {
			break
		}
		if err == nil {
			resp.Body.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("beyond serve.max_connections over TLS: %v %v", resp, err)
		}
		hog.Close()
		time.Sleep(200 * time.Millisecond)
	}
	resp.Body.Close()
	if resp.Header.Get("Retry-After") == "" {
		t.Fatalf("beyond serve.max_connections over TLS: %d without Retry-After", resp.StatusCode)
	}
}

// TLS 1.2 offers AEAD suites only: a client offering only CBC suites
// with SHA-1 (ECDHE-ECDSA-AES128-SHA and the like) fails its handshake;
// one offering GCM succeeds.
func TestTLSSuites(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "dam-serve-test")
	p := ca.Issue(t, "serve", "127.0.0.1")
	h := newServer(t, func(c *config.Config) { c.Serve.TLS = config.ServeTLS{CertFile: p.CertFile, KeyFile: p.KeyFile} })
	addr := h.run()
	dial := func(suites ...uint16) error {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12, CipherSuites: suites})
		if err == nil {
			c.Close()
		}
		return err
	}
	for _, suite := range []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA,
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256, tls.TLS_ECDHE_ECDSA_WITH_RC4_128_SHA} {
		if err := dial(suite); err == nil {
			t.Errorf("TLS 1.2 with %s: negotiated; want a handshake failure", tls.CipherSuiteName(suite))
		}
	}
	for _, suite := range []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256} {
		if err := dial(suite); err != nil {
			t.Errorf("TLS 1.2 with %s: %v", tls.CipherSuiteName(suite), err)
		}
	}
}

// The HTTP server's error log is rate-limited: plaintext connections to
// the TLS port (each a handshake error) write a few lines, not one each;
// every error is counted in dam_serve_http_errors_total.
func TestHTTPErrorLogRate(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "dam-serve-test")
	p := ca.Issue(t, "serve", "127.0.0.1")
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewRegistry()
	dsn := pgtest.DSN(t)
	cfg := testConfig(dsn)
	cfg.Serve.TLS = config.ServeTLS{CertFile: p.CertFile, KeyFile: p.KeyFile}
	srv, err := serve.New(cfg, nil, serve.WithLogger(zap.New(core)), serve.WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, srv: srv, client: http.DefaultClient}
	addr := h.run()
	const n = 200
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: dam\r\n\r\n")
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mf, _ := reg.Gather()
		counted := 0.0
		for _, f := range mf {
			if f.GetName() == "dam_serve_http_errors_total" {
				counted = f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		if counted >= n || logs.FilterLoggerName("http").Len() >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("dam_serve_http_errors_total %v after %d plaintext connections", counted, n)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	lines := logs.FilterLoggerName("http").Len()
	if lines == 0 || lines > 11 {
		t.Errorf("%d log lines for %d plaintext connections to the TLS port; want a few (at most 11)", lines, n)
	}
}

// A certificate that cannot be used stops New, naming the key.
func TestTLSConfigErrors(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "dam-serve-test")
	p := ca.Issue(t, "x", "127.0.0.1")
	other := ca.Issue(t, "y", "127.0.0.1")
	for _, tc := range []struct {
		name, cert, key, want string
	}{
		{"missing cert", "/nonexistent/tls.crt", p.KeyFile, "serve.tls.cert_file: stat /nonexistent/tls.crt"},
		{"missing key", p.CertFile, "/nonexistent/tls.key", "serve.tls.key_file: stat /nonexistent/tls.key"},
		{"key of another certificate", p.CertFile, other.KeyFile, "serve.tls: "},
	} {
		cfg := testConfig("postgres://nobody@127.0.0.1:1/x")
		cfg.Serve.TLS = config.ServeTLS{CertFile: tc.cert, KeyFile: tc.key}
		_, err := serve.New(cfg, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
