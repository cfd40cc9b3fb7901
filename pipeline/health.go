package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Health: readiness (Ready, /readyz), dam_halted, and the probes that keep
// them true while nothing flows: a broker answers, PostgreSQL answers.

// side is which goroutine of a worker a pause comes from: the decider and
// the deliverer fail and recover independently (an outage of PostgreSQL
// must not look cleared by a successful delivery, nor one of Kafka by a
// successful decide).
type side int

const (
	sideDecide side = iota
	sideDeliver
)

// partHealth is why a partition is not making progress, if it is not.
type partHealth struct {
	mu     sync.Mutex
	paused [2]error     // per side: an outage being retried
	since  [2]time.Time // per side: when the pause began
	parked error        // a halt or a fence: only a revocation lifts it
	// log, when set, is told that a pause ended (the partition's logger).
	log *zap.Logger
}

func (h *partHealth) pause(s side, err error) {
	h.mu.Lock()
	if h.paused[s] == nil {
		h.since[s] = time.Now()
	}
	h.paused[s] = err
	h.mu.Unlock()
}

// resume ends a pause of side s. When the partition was paused on that
// side (PostgreSQL or Kafka unavailable, a missing topic), it logs that
// the partition goes on, with how long it waited and why: the retries
// logged the pause, and an operator reading the log wants to know it
// ended without a restart.
func (h *partHealth) resume(s side) {
	h.mu.Lock()
	cause, since := h.paused[s], h.since[s]
	h.paused[s] = nil
	parked, other := h.parked != nil, h.paused[1-s]
	log := h.log
	h.mu.Unlock()
	if cause == nil || parked || log == nil {
		return
	}
	what := [2]string{sideDecide: "deciding (PostgreSQL)", sideDeliver: "delivering (Kafka)"}
	fields := []zap.Field{zap.Duration("paused_for", time.Since(since).Round(time.Millisecond)), zap.NamedError("paused_by", cause)}
	if other != nil {
		log.Info("partition: "+what[s]+" succeeds again; "+what[1-s]+" is still paused", append(fields, zap.NamedError("still_paused_by", other))...)
		return
	}
	log.Info("partition resumed: "+what[s]+" succeeds again", fields...)
}

func (h *partHealth) park(err error) {
	h.mu.Lock()
	h.parked = err
	h.mu.Unlock()
}

// parkedErr is what parked the partition (nil: it is not parked).
func (h *partHealth) parkedErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.parked
}

func (h *partHealth) isParked() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.parked != nil
}

// status is nil while the partition makes progress.
func (h *partHealth) status() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.parked != nil:
		return h.parked
	case h.paused[sideDecide] != nil:
		return h.paused[sideDecide]
	default:
		return h.paused[sideDeliver]
	}
}

// probes holds the results of the health probes.
type probes struct {
	mu        sync.Mutex
	brokerErr error // no broker answers: every partition is paused
	storeErr  error // PostgreSQL does not answer
	// topics are the topic checks that did not pass, by name
	// (preflight.go); topicsUnread: they could not run yet.
	topics       map[string]Check
	topicsUnread bool
}

// Ready reports whether the pipeline is making progress: every route's
// from and to topics exist and agree with it (preflight.go), it has
// joined the group (with or without partitions), a broker and PostgreSQL
// answer, and no partition is paused by an outage or halted. The error
// (a *NotReadyError, wrapping ErrNotReady) says why not.
func (p *Pipeline) Ready() error {
	p.probes.mu.Lock()
	brokerErr, storeErr := p.probes.brokerErr, p.probes.storeErr
	topicErr := p.probes.topicProblem()
	p.probes.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	var ae *AuthError
	switch {
	case p.stopping:
		return &NotReadyError{"shutting down", fmt.Errorf("%w: shutting down", ErrNotReady)}
	case topicErr != nil:
		return topicErr
	case !p.joined:
		return &NotReadyError{"consumer group not joined yet", fmt.Errorf("%w: consumer group not joined yet", ErrNotReady)}
	case errors.As(brokerErr, &ae):
		return &NotReadyError{"kafka refuses dam (TLS or SASL)", fmt.Errorf("%w: %w", ErrNotReady, brokerErr)}
	case brokerErr != nil:
		return &NotReadyError{"kafka unreachable", fmt.Errorf("%w: %w", ErrNotReady, brokerErr)}
	case storeErr != nil:
		return &NotReadyError{"postgres unreachable", fmt.Errorf("%w: postgres unreachable: %v", ErrNotReady, storeErr)}
	}
	for t, parts := range p.workers {
		for part, w := range parts {
			if err := w.health.status(); err != nil {
				return &NotReadyError{fmt.Sprintf("%s/%d: %s", t, part, w.health.kind()), fmt.Errorf("%w: %s/%d: %w", ErrNotReady, t, part, err)}
			}
		}
	}
	return nil
}

// PartitionStatus is the state of one partition this instance owns.
type PartitionStatus struct {
	Service   string `json:"service"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// State is "running", "paused" (an outage being retried) or "halted"
	// (a halt or a fence: only a revocation lifts it).
	State string `json:"state"`
	// Kind says what stops it in fixed words, as /readyz does ("halted",
	// "halted: input data loss", "paused: retrying"); "" while running.
	Kind string `json:"kind,omitempty"`
	// Reason is the error that stops it, in full: it may name the
	// record, hosts and users.
	Reason string `json:"reason,omitempty"`
	// Lag is the partition's end minus its committed offset; nil until
	// the end is known.
	Lag *int64 `json:"lag,omitempty"`
}

// Status returns the state of each partition this instance owns, by
// topic and partition.
func (p *Pipeline) Status() []PartitionStatus {
	p.mu.Lock()
	var out []PartitionStatus
	for t, parts := range p.workers {
		for part, w := range parts {
			st := PartitionStatus{Service: w.rt.service, Topic: t, Partition: part, State: "running"}
			if err := w.health.status(); err != nil {
				st.State, st.Kind, st.Reason = "paused", w.health.kind(), err.Error()
				if w.health.isParked() {
					st.State = "halted"
				}
			}
			if lag, ok := w.lag(); ok {
				st.Lag = &lag
			}
			out = append(out, st)
		}
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b PartitionStatus) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}

// NotReadyError is Ready's error. Err, whose text it has, says why in full:
// PostgreSQL's and Kafka's errors name hosts, users and databases, a
// halt's names the record. Reason says only what kind of stop, and where
// (a topic and partition): what an unauthenticated asker (/readyz) is told.
type NotReadyError struct {
	Reason string
	Err    error
}

func (e *NotReadyError) Error() string { return e.Err.Error() }

// Unwrap returns Err, which wraps ErrNotReady.
func (e *NotReadyError) Unwrap() error { return e.Err }

// kind names what stops a partition, in fixed words: "halted" (a halt or
// a fence, which only a revocation lifts), "input data loss", or
// "paused: retrying" (an outage being retried).
func (h *partHealth) kind() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.parked != nil && errors.Is(h.parked, ErrDataLoss):
		return "halted: input data loss"
	case h.parked != nil:
		return "halted"
	default:
		return "paused: retrying"
	}
}

// haltedCounts returns, per service, the partitions not making progress:
// those halted or paused by an outage, or all of them while no broker
// answers.
func (p *Pipeline) haltedCounts() map[string]int {
	counts := make(map[string]int, len(p.routes))
	for _, r := range p.routes {
		counts[r.service] = 0
	}
	p.probes.mu.Lock()
	brokerDown := p.probes.brokerErr != nil
	p.probes.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, parts := range p.workers {
		for _, w := range parts {
			if brokerDown || w.health.status() != nil {
				counts[w.rt.service]++
			}
		}
	}
	return counts
}

// probeEvery is the interval of the health probes.
const probeEvery = 2 * time.Second

// probeLoop asks a broker for its API versions and pings PostgreSQL every
// probeEvery, so that an outage shows (not ready, halted) even when no
// record is waiting. It returns when ctx ends.
func (p *Pipeline) probeLoop(ctx context.Context) {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, probeEvery+time.Second)
		brokerErr := p.client.Ping(pctx)
		storeErr := p.store.Ping(pctx)
		cancel()
		if brokerErr != nil && ctx.Err() == nil {
			brokerErr = p.brokerProblem(ctx, brokerErr) // refused (TLS, SASL) or unreachable
		}
		if ctx.Err() != nil {
			return
		}
		p.probes.mu.Lock()
		wasBroker, wasStore := p.probes.brokerErr, p.probes.storeErr
		p.probes.brokerErr, p.probes.storeErr = brokerErr, storeErr
		p.probes.mu.Unlock()
		p.reportBroker(wasBroker, brokerErr)
		if brokerErr == nil {
			p.recheckTopics(ctx)
		}
		switch {
		case storeErr != nil && wasStore == nil:
			p.log.Warn("postgres unreachable", zap.Error(storeErr))
		case storeErr == nil && wasStore != nil:
			p.log.Info("postgres reachable again")
		}
	}
}
