package serve

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// certCheckInterval is how often, at most, a handshake looks whether the
// certificate files changed.
const certCheckInterval = time.Second

// certReloader serves the certificate of serve.tls.cert_file and
// key_file, and loads them again when either file changes, so that a
// rotated certificate (cert-manager renews a Secret's files in place) is
// served without a restart. Checking costs two stat calls, at most once a
// second, at a handshake: no goroutine, no file watcher. A pair that
// cannot be loaded (a rotation seen half-written: the new certificate with
// the old key) leaves the previous certificate in use, is logged, and is
// tried again at the next check.
type certReloader struct {
	certFile, keyFile string
	log               *zap.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   [2]os.FileInfo // of certFile and keyFile when cert was loaded
	checked time.Time
	lastErr string // the last reload error, logged once
}

// newCertReloader loads the pair, or returns an error naming the key of
// the file that cannot be used.
func newCertReloader(certFile, keyFile string, log *zap.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	stamp, err := r.stat()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("serve.tls: %s and %s: %w", certFile, keyFile, err)
	}
	r.cert, r.stamp, r.checked = &cert, stamp, time.Now()
	return r, nil
}

func (r *certReloader) stat() ([2]os.FileInfo, error) {
	var out [2]os.FileInfo
	for i, f := range []struct{ key, path string }{{"serve.tls.cert_file", r.certFile}, {"serve.tls.key_file", r.keyFile}} {
		fi, err := os.Stat(f.path)
		if err != nil {
			return out, fmt.Errorf("%s: %w", f.key, err)
		}
		out[i] = fi
	}
	return out, nil
}

// same reports whether two stats show the same file, unchanged: the same
// inode (a Secret's files are replaced through a symbolic link), size and
// modification time.
func same(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// getCertificate is tls.Config.GetCertificate.
func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) >= certCheckInterval {
		r.checked = time.Now()
		r.reload()
	}
	return r.cert, nil
}

// reload loads the pair again if a file changed. r.mu is held.
func (r *certReloader) reload() {
	stamp, err := r.stat()
	if err == nil && same(stamp[0], r.stamp[0]) && same(stamp[1], r.stamp[1]) {
		return
	}
	var cert tls.Certificate
	if err == nil {
		cert, err = tls.LoadX509KeyPair(r.certFile, r.keyFile)
	}
	if err != nil {
		if err.Error() != r.lastErr {
			r.lastErr = err.Error()
			r.log.Warn("serve: the TLS certificate files changed but do not load; still serving the previous certificate",
				zap.String("cert_file", r.certFile), zap.String("key_file", r.keyFile), zap.Error(err))
		}
		return
	}
	r.cert, r.stamp, r.lastErr = &cert, stamp, ""
	r.log.Info("serve: TLS certificate reloaded", zap.String("cert_file", r.certFile))
}

// aeadSuites are the TLS 1.2 cipher suites offered: ECDHE with an AEAD
// only (no CBC, no SHA-1 MAC, no RSA key exchange). TLS 1.3's suites are
// all AEAD, and not configurable.
var aeadSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// tlsConfig is the server's TLS configuration: TLS 1.2 or later with AEAD
// suites only, HTTP/1.1 only (see Server.Run), the certificate from r.
func (r *certReloader) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		CipherSuites:   aeadSuites,
		GetCertificate: r.getCertificate,
		NextProtos:     []string{"http/1.1"},
	}
}
