package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/damproc"
)

// histName is dam's poll-to-commit histogram; the children record the same.
const histName = "dam_poll_to_commit_seconds"

// childArgs are the flags of `e2ebench -child passthrough|naive`.
type childArgs struct {
	kind, brokers, group, in, out, dsn, http string
}

// quantiles are latency estimates in seconds.
type quantiles struct {
	Count float64 `json:"count"`
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
}

// histogram is a cumulative bucket snapshot summed over label sets.
type histogram struct {
	le  []float64 // upper bounds, ascending, +Inf last
	cum []float64 // cumulative counts
}

// parseHistogram extracts name's buckets, summed over its series, from
// a Prometheus text exposition.
func parseHistogram(text, name string) histogram {
	m, err := damproc.Parse(strings.NewReader(text))
	if err != nil {
		return histogram{}
	}
	h := m.Histogram(name)
	return histogram{le: h.Bounds, cum: h.Counts}
}

// sub returns h minus an earlier snapshot of the same histogram.
func (h histogram) sub(earlier histogram) histogram {
	out := histogram{le: h.le, cum: append([]float64(nil), h.cum...)}
	for i, le := range h.le {
		for j, le2 := range earlier.le {
			if le == le2 {
				out.cum[i] -= earlier.cum[j]
			}
		}
	}
	return out
}

// quantile estimates the q-quantile like PromQL's histogram_quantile:
// linear interpolation inside the bucket; the highest finite bound when it
// falls in +Inf.
func (h histogram) quantile(q float64) float64 {
	if len(h.cum) == 0 || h.cum[len(h.cum)-1] == 0 {
		return math.NaN()
	}
	total := h.cum[len(h.cum)-1]
	rank := q * total
	for i, c := range h.cum {
		if c < rank {
			continue
		}
		if math.IsInf(h.le[i], 1) {
			if i == 0 {
				return math.NaN()
			}
			return h.le[i-1]
		}
		lo, below := 0.0, 0.0
		if i > 0 {
			lo, below = h.le[i-1], h.cum[i-1]
		}
		if c == below {
			return h.le[i]
		}
		return lo + (h.le[i]-lo)*(rank-below)/(c-below)
	}
	return h.le[len(h.le)-1]
}

func (h histogram) quantiles() quantiles {
	q := quantiles{P50: h.quantile(0.5), P99: h.quantile(0.99)}
	if len(h.cum) > 0 {
		q.Count = h.cum[len(h.cum)-1]
	}
	return q
}

// runChild is a baseline consumer: passthrough (consume, produce, wait for
// the acks, commit, per polled batch) or naive (per record: hash, CAS in
// PostgreSQL, produce if forwarded, commit synchronously). It serves
// /metrics on args.http and prints its quantiles as JSON on exit.
func runChild(a childArgs) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	reg := prometheus.NewRegistry()
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    histName,
		Help:    "Time from polling a batch's first record to committing its offset.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	})
	reg.MustRegister(hist)
	handler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	if a.http != "" {
		ln, err := net.Listen("tcp", a.http)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", handler)
		go func() { _ = http.Serve(ln, mux) }()
	}

	// The pipeline's franz-go settings (pipeline.clientOptions).
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(a.brokers),
		kgo.ClientID("e2ebench-"+a.kind),
		kgo.ConsumerGroup(a.group),
		kgo.ConsumeTopics(a.in),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.SessionTimeout(45*time.Second),
		kgo.RebalanceTimeout(60*time.Second),
		kgo.ConsumeStartOffset(kgo.NewOffset().AtStart()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.MaxBufferedRecords(20000),
	)
	if err != nil {
		return err
	}

	var process func(ctx context.Context, fs kgo.Fetches, polled time.Time) error
	switch a.kind {
	case "passthrough":
		process = func(ctx context.Context, fs kgo.Fetches, polled time.Time) error {
			var recs []*kgo.Record
			fs.EachRecord(func(r *kgo.Record) {
				recs = append(recs, &kgo.Record{Topic: a.out, Key: r.Key, Value: r.Value, Headers: r.Headers})
			})
			if len(recs) == 0 {
				return nil
			}
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				return fmt.Errorf("produce: %w", err)
			}
			if err := cl.CommitRecords(ctx, fs.Records()...); err != nil {
				return fmt.Errorf("commit: %w", err)
			}
			// One observation per partition batch, as dam observes per batch.
			d := time.Since(polled).Seconds()
			fs.EachPartition(func(p kgo.FetchTopicPartition) {
				if len(p.Records) > 0 {
					hist.Observe(d)
				}
			})
			return nil
		}
	case "naive":
		h, err := canon.New()
		if err != nil {
			return err
		}
		store, err := dedup.Open(ctx, a.dsn, dedup.Config{MaxConns: 2})
		if err != nil {
			return err
		}
		defer store.Close()
		pool := store.Pool()
		process = func(ctx context.Context, fs kgo.Fetches, polled time.Time) error {
			for _, r := range fs.Records() {
				d, err := h.Sum(r.Value)
				if err != nil {
					return fmt.Errorf("hash %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
				}
				dec, err := dedup.Check(ctx, pool, "e2e", r.Key, d)
				if err != nil {
					return fmt.Errorf("check: %w", err)
				}
				if dec == dedup.Forward {
					out := &kgo.Record{Topic: a.out, Key: r.Key, Value: r.Value, Headers: r.Headers}
					if err := cl.ProduceSync(ctx, out).FirstErr(); err != nil {
						return fmt.Errorf("produce: %w", err)
					}
				}
				if err := cl.CommitRecords(ctx, r); err != nil {
					return fmt.Errorf("commit: %w", err)
				}
				hist.Observe(time.Since(polled).Seconds())
			}
			return nil
		}
	default:
		return fmt.Errorf("unknown -child %q", a.kind)
	}

	var runErr error
	for runErr == nil {
		fs := cl.PollRecords(ctx, 2000)
		if fs.IsClientClosed() || ctx.Err() != nil {
			cl.AllowRebalance()
			break
		}
		polled := time.Now()
		fs.EachError(func(t string, p int32, err error) {
			if ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "e2ebench %s: fetch %s/%d: %v\n", a.kind, t, p, err)
			}
		})
		if err := process(ctx, fs, polled); err != nil && ctx.Err() == nil {
			runErr = err
		}
		cl.AllowRebalance()
	}
	cl.Close()

	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	q := parseHistogram(rec.Body.String(), histName).quantiles()
	_ = json.NewEncoder(os.Stdout).Encode(map[string]float64{"count": q.Count, "p50": nanToNeg(q.P50), "p99": nanToNeg(q.P99)})
	return runErr
}

func nanToNeg(v float64) float64 {
	if math.IsNaN(v) {
		return -1
	}
	return v
}
