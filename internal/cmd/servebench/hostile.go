package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// hostileOptions sizes the hostile-client run (servebench -hostile): the
// security review's attacks on a shared dam serve, at once, beside a
// well-behaved client.
type hostileOptions struct {
	// Large is the number of concurrent large bodies (the full run: 100).
	Large int
	// LargeBytes is the size of each (10 MB).
	LargeBytes int
	// RSSLimit bounds dam serve's peak resident memory (VmHWM) over the
	// run (300 MB).
	RSSLimit int64
	// Good is the least number of well-behaved checks sent meanwhile,
	// eight at a time, for as long as the flood lasts; each must be
	// answered 200.
	Good int
	// Poison is the number of checks with an identity the store cannot
	// hold (an oversized entity, a service name with NUL) sent among the
	// first Good good checks (more follow at that rate while the flood
	// lasts).
	Poison int
	// MadeUp is the number of checks of made-up services ("*" token).
	MadeUp int
	// BodyHogs is the number of requests of another tenant (hogToken)
	// that announce the largest body and send nothing, kept up (each
	// sent again once answered) for HogFor (the full run: 60).
	BodyHogs int
	// IdleConns is the number of connections that send nothing, kept up
	// (each opened again once closed) for HogFor (the full run: 2,000).
	IdleConns int
	// HogFor is how long the well-behaved tenant checks beside the hogs,
	// eight at a time; each check must be answered 200, their p99 under
	// HogP99.
	HogFor time.Duration
	HogP99 time.Duration
}

// fullHostile is the size the issue names.
var fullHostile = hostileOptions{Large: 100, LargeBytes: 10_000_000, RSSLimit: 300 << 20, Good: 2000, Poison: 200, MadeUp: 5000,
	BodyHogs: 60, IdleConns: 2000, HogFor: 10 * time.Second, HogP99: 250 * time.Millisecond}

// hogToken is the token of the tenant whose requests hog bodies.
const hogToken = "servebench-hog-tenant-9f8e7d6c5b4a"

// hostileServeConfig is the serve section the run needs beyond the
// defaults: bodies of 10 MB are allowed, so that what bounds their memory
// is what is in flight, not their size, and a second tenant's token (the
// body hogs'); the rest (in flight, connections, timeouts) are dam's
// defaults.
const hostileServeConfig = "  max_body_bytes: 16777216\n  tokens:\n    - token: " + hogToken + "\n      services: [\"*\"]\n"

// refusedWhileSending is a large body's answer when the connection was
// reset while the client was still sending it.
const refusedWhileSending = "reset while sending (refused unread)"

// hostileResult is what the run saw.
type hostileResult struct {
	PeakRSS      int64          // dam serve's VmHWM, bytes
	RSSAfter     int64          // its VmRSS at the end
	LargeAnswers map[string]int // "413 body_too_large", "503 overloaded", ...
	Good         int            // good checks sent
	GoodOK       int            // of them answered 200
	GoodBad      []string       // good checks not answered 200, with their answer
	PoisonBad    []string       // poison checks not answered 400 naming their field
	MetricsBytes int            // size of /metrics after the made-up services
	MetricsLeak  bool           // a made-up service is a label value
	Hogs         hogResult
	Took         time.Duration
}

// failures lists what broke the run's bounds.
func (r hostileResult) failures(o hostileOptions) []string {
	var out []string
	if r.PeakRSS > o.RSSLimit {
		out = append(out, fmt.Sprintf("peak RSS %d MB, over the bound of %d MB", r.PeakRSS>>20, o.RSSLimit>>20))
	}
	if len(r.GoodBad) > 0 {
		out = append(out, fmt.Sprintf("%d of %d good checks not answered 200, e.g. %s", len(r.GoodBad), r.Good, r.GoodBad[0]))
	}
	if len(r.PoisonBad) > 0 {
		out = append(out, fmt.Sprintf("%d bad identities not answered 400 naming the field, e.g. %s", len(r.PoisonBad), r.PoisonBad[0]))
	}
	for a, n := range r.LargeAnswers {
		// (408: the body arrived slower than the minimum rate, which a
		// sender starved of CPU on a loaded machine may be.)
		if a != "200" && a != "400 bad_payload" && a != "413 body_too_large" && a != "503 overloaded Retry-After" && a != "408 body_timeout" && a != refusedWhileSending {
			out = append(out, fmt.Sprintf("%d large bodies answered %s", n, a))
		}
	}
	if r.MetricsLeak || r.MetricsBytes > 64<<10 {
		out = append(out, fmt.Sprintf("/metrics is %d bytes after %d made-up services (a made-up service labelled: %v)", r.MetricsBytes, o.MadeUp, r.MetricsLeak))
	}
	if h := r.Hogs; o.HogFor > 0 {
		if h.NotOK > 0 {
			out = append(out, fmt.Sprintf("beside the hogs, %d of %d checks not answered 200, e.g. %s", h.NotOK, h.Checks, h.Bad[0]))
		}
		if h.Checks == 0 || h.P99 >= o.HogP99 {
			out = append(out, fmt.Sprintf("beside the hogs, %d checks with p99 %s, not under %s", h.Checks, h.P99.Round(time.Millisecond), o.HogP99))
		}
	}
	return out
}

func (r hostileResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "peak RSS %d MB (VmHWM), %d MB after; took %s\n", r.PeakRSS>>20, r.RSSAfter>>20, r.Took.Round(time.Millisecond))
	fmt.Fprintf(&b, "large bodies: %v\n", r.LargeAnswers)
	fmt.Fprintf(&b, "good checks during the flood: %d, %d answered 200, %d not\n", r.Good, r.GoodOK, len(r.GoodBad))
	fmt.Fprintf(&b, "bad identities: %d not answered 400 naming the field\n", len(r.PoisonBad))
	fmt.Fprintf(&b, "/metrics: %d bytes after the made-up services\n", r.MetricsBytes)
	if h := r.Hogs; h.Checks > 0 {
		fmt.Fprintf(&b, "beside %d body hogs (%d requests, answered %v) and %d idle connections (%d opened): %d checks, %d not 200, p50 %s p99 %s max %s\n",
			h.BodyHogs, h.BodyRequests, h.BodyAnswers, h.IdleConns, h.IdleOpened, h.Checks, h.NotOK,
			h.P50.Round(time.Millisecond), h.P99.Round(time.Millisecond), h.Max.Round(time.Millisecond))
	}
	return b.String()
}

// procStatus reads a field of /proc/PID/status in bytes (VmHWM, VmRSS).
func procStatus(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// largeBodies are the large requests' bodies: one check whose payload
// is the whole body (too large for the route: decoded, then refused 400),
// a batch of checks of 1 MB payloads (decoded and decided), and a body
// larger than serve.max_body_bytes (refused 413, unread).
func largeBodies(size int) [][]byte {
	pad := strings.Repeat("x", size-100)
	single := []byte(`{"service":"` + service + `","entity":"large","payload":"` + pad + `"}`)
	var batch bytes.Buffer
	batch.WriteString(`{"checks":[`)
	for i := 0; batch.Len() < size-1_100_000; i++ {
		if i > 0 {
			batch.WriteByte(',')
		}
		fmt.Fprintf(&batch, `{"service":%q,"entity":"large-%d","payload":{"blob":"%s","n":%d}}`, service, i, pad[:1_000_000], i)
	}
	batch.WriteString(`]}`)
	tooLarge := append(bytes.Repeat([]byte(" "), 17<<20), single...)
	return [][]byte{single, batch.Bytes(), tooLarge}
}

// hostilePost sends body to path with the all-services token; chunked
// hides its length, expect waits for the server's 100 Continue before
// sending it. It returns "STATUS CODE [Retry-After][: message of a 400]".
func hostilePost(client *http.Client, url, path string, body []byte, chunked, expect bool) string {
	var r io.Reader = bytes.NewReader(body)
	if chunked {
		r = io.MultiReader(r) // not a *bytes.Reader: no Content-Length
	}
	req, err := http.NewRequest("POST", url+path, r)
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if expect {
		req.Header.Set("Expect", "100-continue")
	}
	resp, err := client.Do(req)
	if err != nil {
		return "error " + err.Error()
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var e struct{ Code, Message string }
	_ = json.Unmarshal(out, &e)
	a := strconv.Itoa(resp.StatusCode)
	if e.Code != "" {
		a += " " + e.Code
	}
	if resp.Header.Get("Retry-After") != "" {
		a += " Retry-After"
	}
	if e.Message != "" && resp.StatusCode == 400 {
		a += ": " + e.Message
	}
	return a
}

// runHostile attacks the dam serve at url (process pid) as o says, with a
// well-behaved client checking all along, and reports what it saw.
func runHostile(url string, pid int, o hostileOptions) (hostileResult, error) {
	began := time.Now()
	res := hostileResult{LargeAnswers: map[string]int{}}
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64, ExpectContinueTimeout: 10 * time.Second}}
	bodies := largeBodies(o.LargeBytes)
	var mu sync.Mutex
	var wg sync.WaitGroup

	// The flood: o.Large large bodies at once.
	start := make(chan struct{})
	for i := range o.Large {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var a string
			switch i % 4 {
			case 0, 1: // a single check, a batch
				a = hostilePost(client, url, []string{"/v1/check", "/v1/check:batch"}[i%2], bodies[i%2], false, false)
			case 2: // a batch without a Content-Length, waiting for 100 Continue
				a = hostilePost(client, url, "/v1/check:batch", bodies[1], true, true)
			case 3: // announced larger than serve.max_body_bytes
				a = hostilePost(client, url, "/v1/check", bodies[2], false, true)
			}
			switch {
			case strings.HasPrefix(a, "400 bad_payload:"):
				a = "400 bad_payload"
			case strings.HasPrefix(a, "400 "):
				// Unexpected: kept with its message (at most 200 bytes),
				// which the failure then shows.
				a = a[:min(len(a), 200)]
			case strings.HasPrefix(a, "error ") && (strings.Contains(a, "connection reset") || strings.Contains(a, "broken pipe")):
				// Answered (413, 503) and closed before the client had
				// sent its body: an HTTP/1.1 client that does not wait
				// for 100 Continue may see the reset first.
				a = refusedWhileSending
			}
			mu.Lock()
			res.LargeAnswers[a]++
			mu.Unlock()
		}()
	}

	// Beside it, the well-behaved client and the bad identities, eight at
	// a time, interleaved.
	type job struct {
		body  string
		field string // "" for a good check
	}
	// They go on until the flood is over, o.Good good checks at least,
	// with a bad identity every o.Good/o.Poison good checks.
	flooded := make(chan struct{})
	jobs := make(chan job)
	var sentGood atomic.Int64
	go func() {
		defer close(jobs)
		every := max(1, o.Good/max(1, o.Poison))
		for i := 0; ; i++ {
			if i >= o.Good {
				select {
				case <-flooded:
					return
				default:
				}
			}
			jobs <- job{body: fmt.Sprintf(`{"service":%q,"entity":"good-%d","payload":{"n":%d}}`, service, i, i)}
			sentGood.Add(1)
			if i%every != every-1 {
				continue
			}
			if (i/every)%2 == 0 {
				jobs <- job{body: `{"service":"other","entity_hex":"` + hex.EncodeToString(bytes.Repeat([]byte{0xab}, 3000)) + `","payload":1}`, field: "entity_hex"}
			} else {
				jobs <- job{body: `{"service":"nul\u0000","entity":"e","payload":1}`, field: "service"}
			}
		}
	}()
	var goodOK atomic.Int64
	var side sync.WaitGroup
	for range 8 {
		side.Add(1)
		go func() {
			defer side.Done()
			for j := range jobs {
				a := hostilePost(client, url, "/v1/check", []byte(j.body), false, false)
				switch {
				case j.field == "" && a == "200":
					goodOK.Add(1)
				case j.field == "":
					mu.Lock()
					res.GoodBad = append(res.GoodBad, a)
					mu.Unlock()
				case !strings.HasPrefix(a, "400 bad_field: "+j.field+": "):
					mu.Lock()
					res.PoisonBad = append(res.PoisonBad, a)
					mu.Unlock()
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(flooded)
	side.Wait()
	res.GoodOK, res.Good = int(goodOK.Load()), int(sentGood.Load())

	// Made-up services, then /metrics.
	jobsM := make(chan int)
	var made sync.WaitGroup
	for range 8 {
		made.Add(1)
		go func() {
			defer made.Done()
			for i := range jobsM {
				hostilePost(client, url, "/v1/check", []byte(fmt.Sprintf(`{"service":"made-up-%d","entity":"e","payload":1}`, i)), false, false)
			}
		}()
	}
	for i := range o.MadeUp {
		jobsM <- i
	}
	close(jobsM)
	made.Wait()
	if o.HogFor > 0 {
		res.Hogs = runHogs(url, o)
	}

	resp, err := client.Get(url + "/metrics")
	if err != nil {
		return res, err
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	res.MetricsBytes, res.MetricsLeak = len(metrics), bytes.Contains(metrics, []byte("made-up-"))

	if res.PeakRSS, err = procStatus(pid, "VmHWM"); err != nil {
		return res, err
	}
	if res.RSSAfter, err = procStatus(pid, "VmRSS"); err != nil {
		return res, err
	}
	res.Took = time.Since(began)
	return res, nil
}
