package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"

	"github.com/dam-dedup/dam/internal/progress"
)

// topOptions are dam top's flags.
type topOptions struct {
	addrs    []string
	token    string
	interval time.Duration
	asJSON   bool
}

func newTopCmd() *cobra.Command {
	var o topOptions
	var addrs string
	cmd := &cobra.Command{
		Use:   "top --addr HOST:PORT[,HOST:PORT...]",
		Short: "Show running sidecars at a glance: rates, drops, lag, halts",
		Long: `Show, refreshed every second, per service and partition of one or more
running sidecars: records in per second, forwarded, dropped and
dead-lettered per second, the drop rate, the decide latency, each
partition's lag, and whether it is halted and why.

dam top reads the sidecars' own endpoints on http.listen: /metrics and
/v1/status. A partition's reason (the error in full) is shown only with a
tap token (--token or DAM_TAP_TOKEN) allowed its service; without one,
what stops it in fixed words. With -o json, or when stdout is not a
terminal, it prints one snapshot (rates over one --interval) and exits.`,
		Example: `  dam top --addr dam-customer-2-0:9090,dam-customer-2-1:9090
  dam top --addr localhost:9090 -o json`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.asJSON, err = outputJSON(cmd); err != nil {
				return err
			}
			for _, a := range strings.Split(addrs, ",") {
				if a = strings.TrimSpace(a); a != "" {
					o.addrs = append(o.addrs, a)
				}
			}
			if len(o.addrs) == 0 {
				return usagef("--addr is required: the sidecars' http.listen addresses, comma-separated")
			}
			if o.interval <= 0 {
				return usagef("--interval %s: must be positive", o.interval)
			}
			if o.token == "" {
				o.token = os.Getenv(envTapToken)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			out := cmd.OutOrStdout()
			if o.asJSON || !progress.IsTerminal(out) {
				return topOnce(ctx, o, out)
			}
			return topLive(ctx, o, out)
		},
	}
	cmd.Flags().StringVar(&addrs, "addr", "", "the sidecars' HTTP addresses (http.listen), comma-separated HOST:PORT or URLs")
	cmd.Flags().StringVar(&o.token, "token", "", "a tap token of http.tap, to see why a partition stops (default $"+envTapToken+")")
	cmd.Flags().DurationVar(&o.interval, "interval", time.Second, "refresh interval, and the span of the rates")
	addOutputFlag(cmd)
	return cmd
}

// topScrape is what one sidecar's endpoints said at one time.
type topScrape struct {
	at  time.Time
	err error
	// Per service: dam_records_total by outcome, dam_decision_seconds's
	// sum and count, dam_halted.
	records     map[string]map[string]float64
	decideSum   map[string]float64
	decideCount map[string]float64
	halted      map[string]float64
	// lag is dam_consumer_lag by service and partition: the partitions
	// when /v1/status is not served.
	lag    map[string]map[string]float64
	status *statusJSON
}

// topClient scrapes sidecars.
type topClient struct {
	http  *http.Client
	token string
}

func (c *topClient) get(ctx context.Context, url string, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return c.http.Do(req)
}

// scrape reads one sidecar's /metrics and /v1/status.
func (c *topClient) scrape(ctx context.Context, addr string) *topScrape {
	s := &topScrape{at: time.Now(), records: map[string]map[string]float64{}, decideSum: map[string]float64{},
		decideCount: map[string]float64{}, halted: map[string]float64{}, lag: map[string]map[string]float64{}}
	base := baseURL(addr)
	resp, err := c.get(ctx, base+"/metrics", "text/plain;version=0.0.4")
	if err != nil {
		s.err = err
		return s
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("/metrics: %s", resp.Status)
	}
	if err != nil {
		s.err = err
		return s
	}
	for _, m := range mfs["dam_records_total"].GetMetric() {
		svc := label(m, "service")
		if s.records[svc] == nil {
			s.records[svc] = map[string]float64{}
		}
		s.records[svc][label(m, "outcome")] += m.GetCounter().GetValue()
	}
	for _, m := range mfs["dam_decision_seconds"].GetMetric() {
		s.decideSum[label(m, "service")] += m.GetHistogram().GetSampleSum()
		s.decideCount[label(m, "service")] += float64(m.GetHistogram().GetSampleCount())
	}
	for _, m := range mfs["dam_halted"].GetMetric() {
		s.halted[label(m, "service")] = m.GetGauge().GetValue()
	}
	for _, m := range mfs["dam_consumer_lag"].GetMetric() {
		svc := label(m, "service")
		if s.lag[svc] == nil {
			s.lag[svc] = map[string]float64{}
		}
		s.lag[svc][label(m, "partition")] = m.GetGauge().GetValue()
	}
	resp, err = c.get(ctx, base+"/v1/status", "application/json")
	if err != nil {
		s.err = err
		return s
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		var st statusJSON
		if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&st); err != nil {
			s.err = fmt.Errorf("/v1/status: %w", err)
			return s
		}
		s.status = &st
	}
	return s
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// topView is one refresh of dam top (and -o json's output).
type topView struct {
	At       time.Time     `json:"at"`
	Span     float64       `json:"span_seconds"` // the rates' span; 0: no rates yet
	Sidecars []topSidecar  `json:"sidecars"`
	Services []*topService `json:"services"`
}

// topSidecar is one sidecar's state.
type topSidecar struct {
	Addr     string `json:"addr"`
	Error    string `json:"error,omitempty"`
	Ready    bool   `json:"ready"`
	NotReady string `json:"not_ready,omitempty"`
}

// topService is one service across the sidecars. Rates are per second
// over the span; totals since each sidecar started.
type topService struct {
	Service            string  `json:"service"`
	InPerSec           float64 `json:"in_per_sec"`
	ForwardedPerSec    float64 `json:"forwarded_per_sec"`
	DroppedPerSec      float64 `json:"dropped_per_sec"`
	DeadLetteredPerSec float64 `json:"dead_lettered_per_sec"`
	Forwarded          float64 `json:"forwarded"`
	Dropped            float64 `json:"dropped"`
	DeadLettered       float64 `json:"dead_lettered"`
	// DropPercent is of the records decided over the span, or since start
	// when none came over it.
	DropPercent float64 `json:"drop_percent"`
	// DecideMillis is the mean decide transaction over the span (since
	// start when none ran over it); null when none ran.
	DecideMillis *float64 `json:"decide_ms"`
	// Halted counts the partitions halted or paused (dam_halted).
	Halted     int            `json:"halted"`
	Partitions []topPartition `json:"partitions"`

	decideSum, decideCount float64
}

// topPartition is one partition of a service.
type topPartition struct {
	Addr      string `json:"addr"`
	Topic     string `json:"topic,omitempty"`
	Partition int32  `json:"partition"`
	Lag       *int64 `json:"lag"`
	State     string `json:"state"`
	Why       string `json:"why,omitempty"`
}

// The outcomes of dam_records_total in dam top's columns. caught_up and
// rebuilt are not new decisions.
var (
	topForwarded = []string{"forwarded", "refreshed", "undecided"}
	topDropped   = []string{"duplicate", "stale"}
	topLettered  = []string{"invalid", "refused"}
)

func sum(m map[string]float64, keys []string) float64 {
	t := 0.0
	for _, k := range keys {
		t += m[k]
	}
	return t
}

// view computes a refresh from each sidecar's scrape now and before (nil:
// no rates).
func view(addrs []string, now, before map[string]*topScrape) topView {
	v := topView{At: time.Now()}
	services := map[string]*topService{}
	svc := func(name string) *topService {
		if services[name] == nil {
			services[name] = &topService{Service: name, Partitions: []topPartition{}}
		}
		return services[name]
	}
	for _, addr := range addrs {
		cur := now[addr]
		sc := topSidecar{Addr: addr}
		if cur.err != nil {
			sc.Error = cur.err.Error()
			v.Sidecars = append(v.Sidecars, sc)
			continue
		}
		prev := before[addr]
		if prev != nil && prev.err != nil {
			prev = nil
		}
		span := 0.0
		if prev != nil {
			span = cur.at.Sub(prev.at).Seconds()
			v.Span = span
		}
		for name, outcomes := range cur.records {
			s := svc(name)
			f, d, l := sum(outcomes, topForwarded), sum(outcomes, topDropped), sum(outcomes, topLettered)
			s.Forwarded, s.Dropped, s.DeadLettered = s.Forwarded+f, s.Dropped+d, s.DeadLettered+l
			ds, dc := cur.decideSum[name], cur.decideCount[name]
			if prev != nil && span > 0 {
				po := prev.records[name]
				// A counter that went back: the sidecar restarted.
				rate := func(now, then float64) float64 { return max(now-then, 0) / span }
				if sum(po, topForwarded) <= f && sum(po, topDropped) <= d && sum(po, topLettered) <= l {
					s.ForwardedPerSec += rate(f, sum(po, topForwarded))
					s.DroppedPerSec += rate(d, sum(po, topDropped))
					s.DeadLetteredPerSec += rate(l, sum(po, topLettered))
				}
				if prev.decideCount[name] < dc {
					ds, dc = ds-prev.decideSum[name], dc-prev.decideCount[name]
				}
			}
			s.decideSum, s.decideCount = s.decideSum+ds, s.decideCount+dc
		}
		for name, h := range cur.halted {
			svc(name).Halted += int(h)
		}
		if cur.status != nil {
			sc.Ready, sc.NotReady = cur.status.Ready, cur.status.NotReady
			for _, p := range cur.status.Partitions {
				tp := topPartition{Addr: addr, Topic: p.Topic, Partition: p.Partition, Lag: p.Lag, State: p.State, Why: cmp.Or(p.Reason, p.Kind)}
				s := svc(p.Service)
				s.Partitions = append(s.Partitions, tp)
			}
		} else {
			sc.NotReady = "no /v1/status: partition states unknown"
			for name, parts := range cur.lag {
				for part, lag := range parts {
					n, _ := strconv.ParseInt(part, 10, 32)
					l := int64(lag)
					s := svc(name)
					s.Partitions = append(s.Partitions, topPartition{Addr: addr, Partition: int32(n), Lag: &l, State: "unknown"})
				}
			}
		}
		v.Sidecars = append(v.Sidecars, sc)
	}
	for _, s := range services {
		s.InPerSec = s.ForwardedPerSec + s.DroppedPerSec + s.DeadLetteredPerSec
		if s.InPerSec > 0 {
			s.DropPercent = 100 * s.DroppedPerSec / s.InPerSec
		} else if in := s.Forwarded + s.Dropped + s.DeadLettered; in > 0 {
			s.DropPercent = 100 * s.Dropped / in
		}
		if s.decideCount > 0 {
			ms := 1000 * s.decideSum / s.decideCount
			s.DecideMillis = &ms
		}
		slices.SortFunc(s.Partitions, func(a, b topPartition) int {
			return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), strings.Compare(a.Addr, b.Addr))
		})
		v.Services = append(v.Services, s)
	}
	slices.SortFunc(v.Services, func(a, b *topService) int { return strings.Compare(a.Service, b.Service) })
	return v
}

// scrapeAll scrapes every sidecar at once.
func scrapeAll(ctx context.Context, c *topClient, addrs []string) map[string]*topScrape {
	type scraped struct {
		addr string
		s    *topScrape
	}
	ch := make(chan scraped, len(addrs))
	for _, a := range addrs {
		go func() {
			s := c.scrape(ctx, a)
			if s.err != nil {
				s.err = fmt.Errorf("unreachable, or not a dam sidecar: %w", s.err)
			}
			ch <- scraped{a, s}
		}()
	}
	out := make(map[string]*topScrape, len(addrs))
	for range addrs {
		r := <-ch
		out[r.addr] = r.s
	}
	return out
}

func newTopClient(o topOptions) *topClient {
	return &topClient{http: &http.Client{Timeout: max(o.interval, 2*time.Second)}, token: o.token}
}

// topOnce prints one view, with rates over one interval.
func topOnce(ctx context.Context, o topOptions, out io.Writer) error {
	c := newTopClient(o)
	before := scrapeAll(ctx, c, o.addrs)
	select {
	case <-time.After(o.interval):
	case <-ctx.Done():
		return nil
	}
	v := view(o.addrs, scrapeAll(ctx, c, o.addrs), before)
	if o.asJSON {
		return writeJSON(out, v)
	}
	_, err := io.WriteString(out, renderTop(v, o))
	return err
}

// topLive redraws the view every interval on the terminal until ctx
// ends (Ctrl-C).
func topLive(ctx context.Context, o topOptions, out io.Writer) error {
	c := newTopClient(o)
	// The alternate screen, without the cursor; restored on the way out.
	fmt.Fprint(out, "\x1b[?1049h\x1b[?25l")
	defer fmt.Fprint(out, "\x1b[?25h\x1b[?1049l")
	var before map[string]*topScrape
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		now := scrapeAll(ctx, c, o.addrs)
		if ctx.Err() != nil {
			return nil
		}
		text := renderTop(view(o.addrs, now, before), o)
		if f, ok := out.(*os.File); ok {
			text = fitWidth(text, terminalWidth(f))
		}
		fmt.Fprint(out, "\x1b[H\x1b[2J"+strings.ReplaceAll(text, "\n", "\r\n"))
		before = now
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// renderTop is a view as text:
//
//	SERVICE / PARTITION   IN/s  FWD/s  DROP/s  DL/s  DROP%  DECIDE    LAG  STATE
//	customer-2            1200    120    1080     0  90.0%  3.1ms          1 halted
//	  in/0                                                                12  running
//	  in/1                                                                 0  halted: ...
func renderTop(v topView, o topOptions) string {
	var b strings.Builder
	span := "rates from the next refresh"
	if v.Span > 0 {
		span = fmt.Sprintf("rates over %.1fs", v.Span)
	}
	fmt.Fprintf(&b, "dam top  %s  %s  (every %s; Ctrl-C quits)\n", v.At.Format("15:04:05"), span, o.interval)
	for _, sc := range v.Sidecars {
		switch {
		case sc.Error != "":
			fmt.Fprintf(&b, "%s  %s\n", sc.Addr, sc.Error)
		case sc.Ready:
			fmt.Fprintf(&b, "%s  ready\n", sc.Addr)
		default:
			fmt.Fprintf(&b, "%s  not ready: %s\n", sc.Addr, sc.NotReady)
		}
	}
	b.WriteString("\n")
	type row struct {
		name  string
		cells [7]string // in, fwd, drop, dl, drop%, decide, lag
		state string
	}
	rate := func(x float64) string {
		if v.Span == 0 {
			return "-"
		}
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	rows := []row{{name: "SERVICE / PARTITION", cells: [7]string{"IN/s", "FWD/s", "DROP/s", "DL/s", "DROP%", "DECIDE", "LAG"}, state: "STATE"}}
	for _, s := range v.Services {
		dec := "-"
		if s.DecideMillis != nil {
			dec = fmt.Sprintf("%.1fms", *s.DecideMillis)
		}
		state := ""
		if s.Halted > 0 {
			state = fmt.Sprintf("%d halted or paused", s.Halted)
		}
		rows = append(rows, row{name: s.Service, state: state, cells: [7]string{rate(s.InPerSec), rate(s.ForwardedPerSec), rate(s.DroppedPerSec),
			rate(s.DeadLetteredPerSec), fmt.Sprintf("%.1f%%", s.DropPercent), dec, ""}})
		for _, p := range s.Partitions {
			lag := "-"
			if p.Lag != nil {
				lag = strconv.FormatInt(*p.Lag, 10)
			}
			name := fmt.Sprintf("  %s/%d", p.Topic, p.Partition)
			if len(v.Sidecars) > 1 {
				name += " @" + p.Addr
			}
			state := p.State
			if p.Why != "" && p.State != "running" {
				state += ": " + cut(printable(p.Why), 300)
			}
			rows = append(rows, row{name: name, cells: [7]string{6: lag}, state: state})
		}
	}
	var w [8]int
	for _, r := range rows {
		w[0] = max(w[0], len(r.name))
		for i, c := range r.cells {
			w[i+1] = max(w[i+1], len(c))
		}
	}
	for _, r := range rows {
		line := fmt.Sprintf("%-*s", w[0], r.name)
		for i, c := range r.cells {
			line += fmt.Sprintf("  %*s", w[i+1], c)
		}
		b.WriteString(strings.TrimRight(line+"  "+r.state, " ") + "\n")
	}
	return b.String()
}

// fitWidth cuts each line of s to width characters (0: as they are), so
// that a long reason does not wrap and push the screen.
func fitWidth(s string, width int) string {
	if width <= 0 {
		return s
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if r := []rune(l); len(r) > width {
			lines[i] = string(r[:width-1]) + "…"
		}
	}
	return strings.Join(lines, "\n")
}

// cut shortens s to n bytes on a character boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
