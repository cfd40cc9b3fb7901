package serve_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/testcert"
)

// timedChecks sends n checks of service a with token, one after the
// other, on a client of its own (keep-alive), and returns their latencies
// and the answers that were not 200.
func timedChecks(t *testing.T, url, token string, n int, tr *http.Transport) ([]time.Duration, []string) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	var lat []time.Duration
	var bad []string
	for i := range n {
		body := fmt.Sprintf(`{"service":"a","entity":"tenant-%d","payload":%d}`, i, i)
		req, _ := http.NewRequest("POST", url+"/v1/check", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		began := time.Now()
		resp, err := client.Do(req)
		took := time.Since(began)
		if err != nil {
			bad = append(bad, fmt.Sprintf("check %d after %s: %v", i, took.Round(time.Millisecond), err))
			continue
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			bad = append(bad, fmt.Sprintf("check %d after %s: %d %.200s", i, took.Round(time.Millisecond), resp.StatusCode, out))
			continue
		}
		lat = append(lat, took)
	}
	slices.Sort(lat)
	if len(bad) > 3 {
		bad = append(bad[:3], fmt.Sprintf("and %d more", len(bad)-3))
	}
	return lat, bad
}

// p99 of sorted latencies (the largest below 100).
func p99(lat []time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	return lat[min(len(lat)-1, len(lat)*99/100)]
}

// One tenant cannot take the room of the bodies in flight from another:
// a request takes room as its body arrives, not from its Content-Length
// before a byte arrived; each token has its own share of
// serve.max_in_flight_bytes; a body that arrives slower than the minimum
// rate is ended with 408 to its client alone. While one tenant's requests
// announce the largest body and send nothing, and others send most of a
// body and stall (holding room for it), another tenant's checks are
// answered 200 at once.
func TestBodyBudgetPerToken(t *testing.T) {
	t.Parallel()
	const max = 1 << 20
	h := newServer(t, func(c *config.Config) {
		c.Serve.MaxBodyBytes = max
		c.Serve.MaxInFlightBytes = 8 * max
		c.Serve.RequestTimeout = 3 * time.Second
	})
	addr := h.run()
	h.check("a", "warm", "1")

	// Silent hogs: the largest body announced, nothing sent (16: twice
	// what the whole room would hold).
	var silent []net.Conn
	for range 16 {
		silent = append(silent, headOnly(t, addr, "", tokenAll, max, ""))
	}
	// Stalled hogs: 900 KiB of a 1 MiB body sent, then nothing, holding
	// room for what they sent (8: as much as the whole room).
	part := `{"service":"a","entity":"hog","payload":"` + strings.Repeat("x", 900<<10)
	var stalled []net.Conn
	for range 8 {
		stalled = append(stalled, headOnly(t, addr, "", tokenAll, max, part))
	}
	time.Sleep(300 * time.Millisecond)

	lat, bad := timedChecks(t, h.url, tokenA, 20, &http.Transport{})
	if len(bad) > 0 || p99(lat) > 500*time.Millisecond {
		t.Errorf("another tenant's checks beside the hogs: p99 %s, not 200: %v; want 200 at once", p99(lat), bad)
	}

	// The silent hogs are ended for their slowness, with 408, well before
	// serve.request_timeout.
	for i, c := range silent {
		code, _, body, err := rawResponse(c, 5*time.Second)
		if code != 408 || !strings.Contains(body, `"body_timeout"`) {
			t.Errorf("silent hog %d: %d %s %v; want 408 body_timeout", i, code, body, err)
			break
		}
	}
	for _, c := range stalled {
		c.Close()
	}
}

// Connections that send nothing (no request, or on TLS no ClientHello)
// do not keep other clients out: beyond serve.max_connections, the one
// that has not finished its request headers the longest is closed to
// make room, and a connection silent for longer than the first-byte
// timeout is closed. Other clients' checks, on new connections and on
// kept-alive ones, are answered 200 at once.
func TestSilentConnectionsKeepNoClientOut(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "dam-serve-test")
	pair := ca.Issue(t, "serve", "127.0.0.1")
	for _, useTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "tls"}[useTLS], func(t *testing.T) {
			t.Parallel()
			h := newServer(t, func(c *config.Config) {
				c.Serve.MaxConnections = 16
				if useTLS {
					c.Serve.TLS = config.ServeTLS{CertFile: pair.CertFile, KeyFile: pair.KeyFile}
				}
			})
			addr := h.run()
			tr := &http.Transport{}
			if useTLS {
				tr.TLSClientConfig = &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
				h.url = "https://" + addr
				h.client = &http.Client{Transport: tr}
			}
			h.check("a", "warm", "1")

			// 200 silent connections, kept coming for 2 s: whenever one is
			// closed, another takes its place.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var conns []net.Conn
					defer func() {
						for _, c := range conns {
							c.Close()
						}
					}()
					for {
						select {
						case <-stop:
							return
						default:
						}
						if len(conns) < 50 {
							c, err := net.DialTimeout("tcp", addr, time.Second)
							if err == nil {
								conns = append(conns, c)
							}
							continue
						}
						// Drop the connections the server closed.
						kept := conns[:0]
						for _, c := range conns {
							_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
							if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
								c.Close()
								continue
							}
							kept = append(kept, c)
						}
						conns = kept
						time.Sleep(20 * time.Millisecond)
					}
				}()
			}
			time.Sleep(300 * time.Millisecond)
			fresh := &http.Transport{DisableKeepAlives: true, TLSClientConfig: tr.TLSClientConfig}
			latNew, badNew := timedChecks(t, h.url, tokenA, 20, fresh)
			latKept, badKept := timedChecks(t, h.url, tokenA, 20, tr)
			close(stop)
			wg.Wait()
			if len(badNew) > 0 || p99(latNew) > 500*time.Millisecond {
				t.Errorf("checks on new connections beside silent ones: p99 %s, not 200: %v", p99(latNew), badNew)
			}
			if len(badKept) > 0 || p99(latKept) > 500*time.Millisecond {
				t.Errorf("checks on a kept-alive connection beside silent ones: p99 %s, not 200: %v", p99(latKept), badKept)
			}

			// Below the bound, a silent connection is closed after the
			// first-byte timeout, well before the header timeout (5 s).
			time.Sleep(200 * time.Millisecond)
			c := dialFrom(t, addr, "")
			began := time.Now()
			_ = c.SetReadDeadline(time.Now().Add(6 * time.Second))
			_, err := c.Read(make([]byte, 1))
			if took := time.Since(began); isTimeout(err) || took > 3*time.Second {
				t.Errorf("a silent connection: %v after %s; want it closed after the first-byte timeout", err, took.Round(time.Millisecond))
			}
		})
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
