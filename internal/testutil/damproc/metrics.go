package damproc

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape of a Prometheus text exposition, by metric family.
type Metrics map[string]*dto.MetricFamily

// Scrape reads http://addr/metrics.
func Scrape(ctx context.Context, addr string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, fmt.Errorf("damproc: %s/metrics: %s", addr, resp.Status)
	}
	return Parse(resp.Body)
}

// Parse reads a Prometheus text exposition.
func Parse(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("damproc: /metrics: %w", err)
	}
	return Metrics(fams), nil
}

// matches reports whether m has every label pair (name, value, name,
// value, ...).
func matches(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Sum adds the values of the series of name (a counter, gauge or untyped
// family; a histogram's or summary's _sum and _count as their own names)
// whose labels include the pairs (name, value, ...); 0 when none.
func (ms Metrics) Sum(name string, labels ...string) float64 {
	fam, suffix := ms.family(name)
	if fam == nil {
		return 0
	}
	total := 0.0
	for _, m := range fam.GetMetric() {
		if !matches(m, labels) {
			continue
		}
		switch {
		case suffix == "_sum" && m.Histogram != nil:
			total += m.GetHistogram().GetSampleSum()
		case suffix == "_count" && m.Histogram != nil:
			total += float64(m.GetHistogram().GetSampleCount())
		case suffix == "_sum" && m.Summary != nil:
			total += m.GetSummary().GetSampleSum()
		case suffix == "_count" && m.Summary != nil:
			total += float64(m.GetSummary().GetSampleCount())
		case m.Counter != nil:
			total += m.GetCounter().GetValue()
		case m.Gauge != nil:
			total += m.GetGauge().GetValue()
		case m.Untyped != nil:
			total += m.GetUntyped().GetValue()
		}
	}
	return total
}

// family returns the family of a sample name: the name itself, or a
// histogram's or summary's family for name_sum, name_count (and
// name_bucket), with the suffix.
func (ms Metrics) family(name string) (*dto.MetricFamily, string) {
	if f := ms[name]; f != nil {
		return f, ""
	}
	for _, suffix := range []string{"_sum", "_count", "_bucket"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f := ms[base]; f != nil && (f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY) {
				return f, suffix
			}
		}
	}
	return nil, ""
}

// Has reports whether the scrape has a sample named name (a family, or a
// histogram's name_bucket, name_sum, name_count).
func (ms Metrics) Has(name string) bool {
	f, _ := ms.family(name)
	return f != nil
}

// SampleNames returns the names of the samples as exposed: the families,
// and for each histogram or summary its name_sum and name_count (and a
// histogram's name_bucket).
func (ms Metrics) SampleNames() map[string]bool {
	out := map[string]bool{}
	for name, f := range ms {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			out[name], out[name+"_sum"], out[name+"_count"] = true, true, true
		default:
			out[name] = true
		}
	}
	return out
}

// Histogram is a histogram's cumulative buckets, summed over its series.
type Histogram struct {
	// Bounds are the buckets' upper bounds, ascending, +Inf last.
	Bounds []float64
	// Counts are the cumulative counts of the buckets.
	Counts []float64
}

// Histogram returns the buckets of histogram name summed over the series
// whose labels include the pairs (name, value, ...); empty when none.
func (ms Metrics) Histogram(name string, labels ...string) Histogram {
	f := ms[name]
	if f == nil || f.GetType() != dto.MetricType_HISTOGRAM {
		return Histogram{}
	}
	byBound := map[float64]float64{}
	for _, m := range f.GetMetric() {
		if !matches(m, labels) {
			continue
		}
		h := m.GetHistogram()
		inf := false
		for _, b := range h.GetBucket() {
			byBound[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			inf = inf || math.IsInf(b.GetUpperBound(), 1)
		}
		if !inf { // the +Inf bucket is the count
			byBound[math.Inf(1)] += float64(h.GetSampleCount())
		}
	}
	var out Histogram
	for b := range byBound {
		out.Bounds = append(out.Bounds, b)
	}
	sort.Float64s(out.Bounds)
	for _, b := range out.Bounds {
		out.Counts = append(out.Counts, byBound[b])
	}
	return out
}
