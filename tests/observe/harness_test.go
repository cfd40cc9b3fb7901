package observe

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/dam-dedup/dam/internal/testutil/damproc"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// TestMain gives the tests a real PostgreSQL (see pgtest.Main).
func TestMain(m *testing.M) { pgtest.Main(m) }

// buildDam builds dam, version stamped (see damproc.Build).
func buildDam(t *testing.T) string {
	t.Helper()
	bin, err := damproc.Build(damproc.BuildOptions{LDFlags: "-X main.version=v0.0.0-observe"})
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := damproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// process is a subprocess whose output goes to a log file, stopped (and
// its log shown on failure) when the test ends.
type process struct {
	name string
	*damproc.Process
}

// start starts args (the program first), its HTTP listener at httpAddr.
func start(t *testing.T, name, httpAddr string, args ...string) *process {
	t.Helper()
	p, err := damproc.Start(damproc.Options{Args: args, Log: filepath.Join(t.TempDir(), name+".log"), HTTP: httpAddr})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		_, _, _ = p.Stop(20 * time.Second)
		if t.Failed() {
			t.Logf("--- tail of %s's log ---\n%s", name, p.Tail(30))
		}
	})
	return &process{name, p}
}

// alive fails the test if the process has exited.
func (p *process) alive(t *testing.T) {
	t.Helper()
	if exited, err := p.Exited(); exited {
		t.Fatalf("%s exited: %v", p.name, err)
	}
}

var client = &http.Client{Timeout: 5 * time.Second}

// waitFor polls cond every 200 ms until it returns true, failing the test
// after limit with the last state cond described.
func waitFor(t *testing.T, limit time.Duration, what string, procs []*process, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	state := ""
	for time.Now().Before(deadline) {
		var ok bool
		if ok, state = cond(); ok {
			return
		}
		for _, p := range procs {
			p.alive(t)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s (last: %s)", what, limit, state)
}

// get returns the body of a GET, and its status.
func get(u string) (int, string, error) {
	resp, err := client.Get(u)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// scrape reads dam's /metrics.
func scrape(addr string) (damproc.Metrics, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return damproc.Scrape(ctx, addr)
}

// prometheus is a running Prometheus server's HTTP API.
type prometheus struct {
	t    *testing.T
	addr string
}

// promResult is one series of an instant query's vector, or of a range
// selector's matrix.
type promResult struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
	Values [][2]any          `json:"values"`
}

// query runs an instant query at time at (zero: now) and returns the
// result, or Prometheus's error (a parse error names the problem).
func (p *prometheus) query(expr string, at time.Time) ([]promResult, error) {
	q := url.Values{"query": {expr}}
	if !at.IsZero() {
		q.Set("time", strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64))
	}
	_, body, err := get("http://" + p.addr + "/api/v1/query?" + q.Encode())
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promResult `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", expr, err, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", expr, r.Error)
	}
	return r.Data.Result, nil
}

// scalar runs a query that must return exactly one series, and returns
// its value.
func (p *prometheus) scalar(expr string, at time.Time) (float64, error) {
	res, err := p.query(expr, at)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 {
		return 0, fmt.Errorf("%s: %d series, want 1", expr, len(res))
	}
	return sampleValue(res[0].Value)
}

func sampleValue(v [2]any) (float64, error) {
	s, ok := v[1].(string)
	if !ok {
		return 0, fmt.Errorf("sample value %v", v)
	}
	return strconv.ParseFloat(s, 64)
}

func sampleTime(v [2]any) time.Time {
	f, _ := v[0].(float64)
	return time.UnixMilli(int64(f*1000 + 0.5))
}

// alerts returns the firing alerts' names with their service label.
func (p *prometheus) alerts() (map[string][]string, error) {
	_, body, err := get("http://" + p.addr + "/api/v1/alerts")
	if err != nil {
		return nil, err
	}
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, a := range r.Data.Alerts {
		if a.State == "firing" {
			out[a.Labels["alertname"]] = append(out[a.Labels["alertname"]], a.Labels["service"])
		}
	}
	return out, nil
}

// rules returns the loaded alerting rules' names by health.
func (p *prometheus) rules() (map[string]string, error) {
	_, body, err := get("http://" + p.addr + "/api/v1/rules?type=alert")
	if err != nil {
		return nil, err
	}
	var r struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, g := range r.Data.Groups {
		for _, rule := range g.Rules {
			out[rule.Name] = rule.Health + rule.LastError
		}
	}
	return out, nil
}

// startPrometheus runs a Prometheus server scraping target every second
// as job "dam", with the rules file loaded, and waits until it is ready.
func startPrometheus(t *testing.T, target, rulesFile string) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("no prometheus server: run `make promtool` (it installs Debian's prometheus package)")
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: dam
    static_configs:
      - targets: [%q]
`, rulesFile, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &prometheus{t: t, addr: freeAddr(t)}
	proc := start(t, "prometheus", p.addr, bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+p.addr,
		"--log.level=warn")
	waitFor(t, 60*time.Second, "prometheus ready", []*process{proc}, func() (bool, string) {
		code, _, err := get("http://" + p.addr + "/-/ready")
		return code == http.StatusOK, fmt.Sprint(code, err)
	})
	return p
}
