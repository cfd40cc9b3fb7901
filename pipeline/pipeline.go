// Package pipeline is dam's Kafka loop: it consumes every route's
// projection topic in a consumer group, decides each partition's records in
// offset order through package dedup, delivers the records that changed
// (and dead letters) with acks=all and the idempotent producer, and commits
// offsets only after every ack: the delivery protocol of DESIGN §2, in
// at-least-once mode. One file per protocol step:
//
//   - recover.go: when partitions are assigned, fence the previous owner,
//     compare Kafka's committed offset C with PostgreSQL's progress P, and
//     replay or catch up (the plan); the replay itself;
//   - decide.go: batches decided in one transaction each, outcomes of lost
//     replies resolved, batches forwarded undecided written back;
//   - deliver.go: produce, wait for the acks, commit; records Kafka refuses
//     for good dead-lettered without their value; ownership checked after
//     a pause;
//   - queue.go: per-partition queues and the shared polling budget,
//     records and bytes, each worker's share held in an account that its
//     end gives back whole (backpressure);
//   - decompress.go: fetched batches inflated within their bounds, and a
//     batch past them turned into bad input for its offsets;
//   - logkeep.go: the decision log kept for decision_log.keep, pruned off
//     the hot path, and halted partitions watched for an operator's skip;
//   - health.go: readiness, dam_halted, broker and PostgreSQL probes;
//     each partition's state (Status);
//   - preflight.go: the cluster checked against the configuration (dam
//     check, and Run at start): brokers, every route's topics, limits;
//   - tap.go: the live stream of decisions (Tap, dam tap);
//   - worker.go: a partition's two goroutines and their lifecycle;
//   - group.go: the consumer group's callbacks (joined, assigned,
//     revoked, lost) and the registry of the partitions' workers;
//   - kafkaopts.go: the Kafka client's options (TLS, SASL, the group's
//     timeouts, fetch and produce bounds);
//   - metrics.go: the metrics, and the loops that refresh the gauges
//     nothing else updates (state rows, the lag of unfetched partitions);
//   - transact.go: exactly-once mode's rounds;
//   - pipeline.go: New, Run, the poll loop and shutdown;
//   - errors.go: the sentinel errors.
//
// Each assigned partition has a worker: a decider goroutine and a deliverer
// goroutine, so batch n+1 is decided while batch n is delivered, deliveries
// stay in order, and partitions proceed in parallel. A revoked partition
// finishes (delivers and commits what it decided) or is stopped hard before
// it is released, in every state, shutdown included.
//
// Failures pause, never guess: while PostgreSQL or Kafka is unreachable,
// the affected partitions retry with capped exponential backoff, report
// dam_halted and not-ready, and resume exactly where they stopped. What no
// retry can fix halts its partition alone, with an error naming topic,
// partition and offset.
//
// Metrics (all on the Registerer given to New):
//
//	dam_records_total{service,outcome}        forwarded, duplicate, invalid, refused, rebuilt, caught_up, undecided
//	dam_dead_letters_total{service,reason}    dead letters delivered: invalid (bad input), refused (by Kafka, value dropped)
//	dam_decision_seconds{service}             decide transaction latency
//	dam_batch_records{service}                records per decided batch
//	dam_poll_to_commit_seconds{service}       poll of a batch to its offset commit
//	dam_store_errors_total{service}           PostgreSQL errors (retried)
//	dam_delivery_errors_total{service}        Kafka produce/commit errors (retried)
//	dam_halted{service}                       partitions paused by an outage or halted
//	dam_consumer_lag{service,partition}       high watermark minus committed offset (halted ones too)
//	dam_partitions_assigned{service}          partitions owned by this instance, halted ones included
//	dam_records_in_flight                     records polled, not yet delivered (max_in_flight's bound)
//	dam_records_in_flight_bytes               their size (max_in_flight_bytes's bound)
//	dam_state_rows{service}                   identities with stored state
//	dam_kafka_*                               franz-go client metrics (kprom)
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/retry"
)

// Option configures a Pipeline.
type Option func(*Pipeline)

// WithLogger sets the logger (default: a no-op logger).
func WithLogger(l *zap.Logger) Option { return func(p *Pipeline) { p.log = l } }

// WithRegisterer sets where metrics are registered (default: a registry of
// its own, not exposed).
func WithRegisterer(r prometheus.Registerer) Option { return func(p *Pipeline) { p.reg = r } }

// WithKafkaOptions appends franz-go client options (tests and the demo use
// it to tune timeouts; production needs none).
func WithKafkaOptions(opts ...kgo.Opt) Option {
	return func(p *Pipeline) { p.kopts = append(p.kopts, opts...) }
}

// Pipeline runs dam's routes. Create it with New and run it with Run; it is
// not restartable.
type Pipeline struct {
	cfg     config.Config
	store   *dedup.Store
	log     *zap.Logger
	reg     prometheus.Registerer
	kopts   []kgo.Opt
	metrics *metrics
	routes  map[string]*route // by input topic
	// dec inflates the fetched batches within the decompression bounds.
	dec    *boundedDecompressor
	retry  retry.Policy
	deps   *deps
	limits *batchLimits

	client *kgo.Client
	// clientSet is closed once client is set: the group's callbacks run on
	// the client's goroutines, which start before Run has the client.
	clientSet chan struct{}
	// runCtx is Run's context: a shutdown ends a recovery waiting for the
	// store (the group's callbacks get the client's context, which lives
	// until the client is closed, after they return).
	runCtx context.Context
	// base is the parent of the workers' contexts: Run's context without
	// its cancellation (a stop finishes the batches in flight; each worker
	// cancels its own on a hard stop).
	base context.Context

	mu       sync.Mutex
	workers  map[string]map[int32]*worker
	joined   bool // the group has been joined at least once
	stopping bool

	// roundStop ends the retries of the exactly-once round in flight
	// (onBlocked); pollStop ends its idle poll (a revocation came).
	roundMu   sync.Mutex
	roundStop context.CancelFunc
	pollStop  context.CancelFunc
	// unended: exactly-once: a revocation or a loss reached dam since the
	// transact session last ended; franz-go passes no other one on to dam
	// until the session ends again (transact.go, endSession).
	unended atomic.Bool

	probes probes
	hook   StepHook
	tap    *Tap // the live decision stream; nil unless http.tap.enabled
	// fetchWarned is when each fetch error was last logged (poll loop only).
	fetchWarned map[string]time.Time
}

// New validates the configuration (as config.Validate does: a Config built
// in code gets the same checks and parsing as one loaded from a file) and
// builds the pipeline. It does not connect to anything.
func New(cfg config.Config, store *dedup.Store, opts ...Option) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	p := &Pipeline{
		clientSet: make(chan struct{}),
		cfg:       cfg,
		store:     store,
		log:       zap.NewNop(),
		reg:       prometheus.NewRegistry(),
		routes:    map[string]*route{},
		limits:    &batchLimits{},
		workers:   map[string]map[int32]*worker{},
		retry:     retry.Policy{Min: cfg.Pipeline.RetryMin, Max: cfg.Pipeline.RetryMax},
		dec:       newBoundedDecompressor(cfg.Pipeline.MaxDecompressedBatchBytes, cfg.Pipeline.MaxDecompressedFetchBytes),
	}
	for _, o := range opts {
		o(p)
	}
	for i, rc := range cfg.Routes {
		rt, err := compileRoute(rc)
		if err != nil {
			return nil, fmt.Errorf("%w: routes[%d]: %w", ErrConfig, i, err)
		}
		rt.index = i
		p.routes[rt.from] = rt
	}
	p.metrics = newMetrics(p.reg)
	if cfg.HTTP.Tap.Enabled {
		p.tap = newTap(cfg.HTTP.Tap.MaxReaders)
	}
	for _, rt := range p.routes {
		// Counters that alerts watch exist at 0 from the start, so that
		// increase() sees a process's first dead letters and errors.
		p.metrics.deadLetters.WithLabelValues(rt.service, outcomeInvalid.String())
		p.metrics.deadLetters.WithLabelValues(rt.service, outcomeRefused.String())
		p.metrics.storeErrors.WithLabelValues(rt.service)
		p.metrics.deliverErrors.WithLabelValues(rt.service)
	}
	if err := p.reg.Register(newPartitionsCollector(p)); err != nil {
		return nil, fmt.Errorf("pipeline: registering metrics: %w", err)
	}
	if err := p.reg.Register(newHaltedCollector(p)); err != nil {
		return nil, fmt.Errorf("pipeline: registering metrics: %w", err)
	}
	p.deps = &deps{
		store:   store,
		metrics: p.metrics,
		budget:  newBudget(cfg.Pipeline.MaxInFlight, cfg.Pipeline.MaxInFlightBytes),
		limits:  p.limits,
		hook:    p.hook,
		tap:     p.tap,
		// Exactly-once: the round loop (transact.go) delivers.
		transactional: cfg.Kafka.Delivery == config.DeliveryExactlyOnce,
		set: settings{
			group:     cfg.Kafka.Group,
			batchSize: cfg.Pipeline.BatchSize,
			maxBatch:  cfg.Pipeline.MaxBatch,
			grace:     cfg.Pipeline.ShutdownGrace,
			retry:     p.retry,
			lease:     ownershipLease(cfg.Kafka.SessionTimeout),
			noteEvery: 5 * time.Second,
			// Two statements of a decide, each bounded by the server, a
			// wait for a lock, and a connection.
			storeTimeout: 2*cfg.Postgres.StatementTimeout + cfg.Postgres.LockTimeout + 5*time.Second,
		},
	}
	b := p.deps.budget
	if err := p.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dam_records_in_flight",
		Help: "Records polled and not yet delivered (queued, being decided, or on their way to Kafka): the memory pipeline.max_in_flight bounds.",
	}, func() float64 { return float64(b.queued.Load()) })); err != nil {
		return nil, fmt.Errorf("pipeline: registering metrics: %w", err)
	}
	if err := p.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dam_records_in_flight_bytes",
		Help: "The size of the records in flight (key, value, headers and a fixed overhead each): the memory pipeline.max_in_flight_bytes bounds.",
	}, func() float64 { return float64(b.bytes.Load()) })); err != nil {
		return nil, fmt.Errorf("pipeline: registering metrics: %w", err)
	}
	return p, nil
}

// Run consumes until ctx is canceled, then finishes the batches in flight
// (within pipeline.shutdown_grace), commits, leaves the group and returns
// nil. It returns an error when it cannot start (the TLS files, or a
// configuration the cluster contradicts: ErrConfig), and in exactly-once
// mode when another client took this instance's transactional id.
func (p *Pipeline) Run(ctx context.Context) error {
	opts, err := p.clientOptions()
	if err != nil {
		return err
	}
	p.base = context.WithoutCancel(ctx)
	p.runCtx = ctx
	var cl *kgo.Client
	var sess *kgo.GroupTransactSession
	if p.deps.transactional {
		opts = append(opts, kgo.TransactionalID(p.transactionalID()), kgo.TransactionTimeout(p.cfg.Kafka.TransactionTimeout),
			kgo.OnPartitionsCallbackBlocked(p.onBlocked))
		if sess, err = kgo.NewGroupTransactSession(opts...); err == nil {
			cl = sess.Client()
		}
	} else {
		cl, err = kgo.NewClient(opts...)
	}
	if err != nil {
		return fmt.Errorf("pipeline: kafka client: %w", err)
	}
	p.client, p.deps.client = cl, cl
	p.deps.commits = newCommitter(cl)
	close(p.clientSet)
	if err := p.checkCluster(ctx); err != nil {
		cl.Close()
		return err
	}
	bgCtx, stopBg := context.WithCancel(p.base)
	var bg sync.WaitGroup
	bg.Add(6)
	// The committer outlives the workers' shutdown: their last commits.
	go func() { defer bg.Done(); p.deps.commits.run(bgCtx) }()
	go func() { defer bg.Done(); p.probeLoop(bgCtx) }()
	go func() { defer bg.Done(); p.logKeepLoop(bgCtx) }()
	go func() { defer bg.Done(); p.haltWatchLoop(bgCtx) }()
	go func() { defer bg.Done(); p.endsLoop(bgCtx) }()
	go func() { defer bg.Done(); p.stateRowsLoop(bgCtx) }()
	for _, rt := range p.routes {
		if rt.rule.Mode == dedup.Window {
			bg.Add(1)
			go func() { defer bg.Done(); p.cleanupLoop(bgCtx, rt) }()
		}
	}
	// (The group is in the logger's context already: cmd/dam adds it.)
	p.log.Info("consuming", zap.Int("routes", len(p.routes)),
		zap.String("delivery", p.cfg.Kafka.Delivery), zap.String("sha256", sha256Path()))

	var runErr error
	if sess != nil {
		p.log.Info("exactly-once delivery", zap.String("transactional_id", p.transactionalID()))
		runErr = p.transactLoop(ctx, sess)
	} else {
		p.pollLoop(ctx, cl)
	}
	leaveBy := p.shutdown()
	stopBg()
	bg.Wait()
	// Leave the group within the grace period, broker or not; the
	// partitions are already finished.
	lctx, cancel := context.WithDeadline(p.base, leaveBy)
	if err := cl.LeaveGroupContext(lctx); err != nil {
		p.log.Warn("leaving the consumer group failed; the group expels this member after its session timeout", zap.Error(err))
	}
	cancel()
	cl.Close()
	if runErr != nil {
		p.log.Error("stopped", zap.Error(runErr))
		return runErr
	}
	p.log.Info("stopped")
	return nil
}

// pollLoop is at-least-once mode's consume loop: it hands each partition's
// records to its worker's queue until ctx ends.
func (p *Pipeline) pollLoop(ctx context.Context, cl *kgo.Client) {
	maxPoll := p.cfg.Pipeline.BatchSize * 4
	for {
		// Backpressure: no poll while the partitions hold max_in_flight
		// records each on average. (Not franz-go's per-partition pause: a
		// partition paused when revoked was seen never to fetch again once
		// reassigned.)
		p.deps.budget.waitWhile(ctx, p.overBudget)
		fetches := cl.PollRecords(ctx, maxPoll)
		p.dec.polled()
		if fetches.IsClientClosed() || ctx.Err() != nil {
			cl.AllowRebalance()
			return
		}
		now := time.Now()
		p.takeUndecompressable(cl, fetches, func(w *worker) int64 { return w.polledTo.Load() })
		fetches.EachError(p.fetchError)
		fetches.EachPartition(func(ftp kgo.FetchTopicPartition) {
			w := p.worker(ftp.Topic, ftp.Partition)
			if w == nil {
				// Not ours any more (revoked between fetch and poll): the
				// next owner reads these from its committed offset.
				return
			}
			w.sawEnd(ftp.HighWatermark)
			if len(ftp.Records) == 0 {
				return
			}
			// What exceeds the partition's share is fetched again once it
			// has delivered some (pauseOverShare).
			recs := w.pauseOverShare(cl, ftp.Records)
			if len(recs) == 0 {
				return
			}
			w.q.push(recs, now)
			w.polledTo.Store(recs[len(recs)-1].Offset + 1)
		})
		cl.AllowRebalance()
	}
}

// takeUndecompressable turns the batches franz-go stopped at, past the
// decompression bound, into bad input of the partitions' workers
// (decompress.go). next is where a worker expects its next record.
func (p *Pipeline) takeUndecompressable(cl *kgo.Client, fetches kgo.Fetches, next func(*worker) int64) {
	takeUndecompressable(fetches, p.cfg.Pipeline.MaxDecompressedBatchBytes, p.cfg.Pipeline.MaxInFlight,
		func(topic string, part int32) (int64, bool) {
			w := p.worker(topic, part)
			if w == nil {
				return 0, false
			}
			return next(w), true
		},
		func(topic string, part int32, at kgo.EpochOffset) {
			p.log.Error("a record batch inflates past pipeline.max_decompressed_batch_bytes: its offsets are bad input",
				zap.String("topic", topic), zap.Int32("partition", part), zap.Int64("next_offset", at.Offset))
			cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{topic: {part: at}})
		})
}

// fetchError handles a fetch error of one partition. Lost input halts the
// partition: franz-go's data-loss error (the log was truncated below what
// was read) or an unknown topic id (the topic was deleted, perhaps
// recreated: franz-go keeps failing it). dam never skips records, nor
// reads a new topic's records against the old one's progress. The client
// retries everything else; the warning is logged once a minute per
// partition and error, not at the fetch rate.
func (p *Pipeline) fetchError(topic string, part int32, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	if errors.Is(err, errFetchWindowFull) {
		return // fetched again after this poll
	}
	var dl *kgo.ErrDataLoss
	if errors.As(err, &dl) || errors.Is(err, kerr.UnknownTopicID) {
		if w := p.worker(topic, part); w != nil && w.health.status() == nil {
			w.park(fmt.Errorf("%w: %s/%d: %v: the input lost records dam had reached (was the topic deleted, recreated or truncated?); "+
				"the partition halts: to go on, reset its consumer group offset and progress deliberately", ErrDataLoss, topic, part, err))
		}
		return
	}
	key := fmt.Sprintf("%s/%d: %v", topic, part, err)
	if last, ok := p.fetchWarned[key]; ok && time.Since(last) < time.Minute {
		return
	}
	if p.fetchWarned == nil || len(p.fetchWarned) > 1000 {
		p.fetchWarned = map[string]time.Time{}
	}
	p.fetchWarned[key] = time.Now()
	p.log.Warn("fetch error (the client retries)", zap.String("topic", topic), zap.Int32("partition", part), zap.Error(err))
}

// shutdown stops every worker, letting each deliver and commit what it has
// decided, and returns when the grace period ends: the deadline for leaving
// the group. The workers stay registered until they are revoked: a
// revocation that comes meanwhile (a rolling deploy) waits for the same
// stop instead of releasing a partition still producing.
//
// The workers get the grace period less a reserve for closing the client;
// what they could not deliver by then (a broker down) is abandoned: records
// still buffered in the producer are failed, since a producer waiting for a
// broker does not give them up by itself, and the next owner delivers what
// the decision log holds.
func (p *Pipeline) shutdown() (leaveBy time.Time) {
	grace := p.cfg.Pipeline.ShutdownGrace
	closing, slack := p.closingReserve()
	leaveBy = time.Now().Add(grace - closing)
	p.mu.Lock()
	p.stopping = true
	var ws []*worker
	for _, parts := range p.workers {
		for _, w := range parts {
			ws = append(ws, w)
		}
	}
	p.mu.Unlock()
	p.log.Info("shutting down: finishing the batches in flight", zap.Int("partitions", len(ws)), zap.Duration("grace", grace))
	done := make(chan struct{})
	go func() {
		defer close(done)
		stopAll(ws, true, p.finishWithin())
	}()
	t := time.NewTimer(grace - closing - slack)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		p.log.Warn("abandoning the records still waiting for Kafka; the next owner delivers them from the decision log")
		p.client.UnsafeAbortBufferedRecords()
		<-done
	}
	return leaveBy
}

// closingReserve is the part of the grace period kept for closing the
// client (franz-go's Close waits up to a second for the brokers to close
// their fetch sessions), and a slack between the steps of a shutdown.
func (p *Pipeline) closingReserve() (closing, slack time.Duration) {
	grace := p.cfg.Pipeline.ShutdownGrace
	return min(time.Second, grace/3), min(grace/10, 500*time.Millisecond)
}

// finishWithin is how long the work in flight at shutdown gets to finish.
func (p *Pipeline) finishWithin() time.Duration {
	closing, slack := p.closingReserve()
	return p.cfg.Pipeline.ShutdownGrace - closing - 2*slack
}

// stopAll stops workers in parallel and returns once all have stopped.
func stopAll(ws []*worker, finish bool, within time.Duration) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() { defer wg.Done(); w.stop(finish, within) }()
	}
	wg.Wait()
}

// allWorkers returns the registered workers (every partition owned).
func (p *Pipeline) allWorkers() []*worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ws []*worker
	for _, parts := range p.workers {
		for _, w := range parts {
			ws = append(ws, w)
		}
	}
	return ws
}

func (p *Pipeline) worker(topic string, part int32) *worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.workers[topic][part]
}

func (p *Pipeline) dpart(rt *route, part int32) dedup.Partition {
	return dedup.Partition{Group: p.cfg.Kafka.Group, Topic: rt.from, Partition: part}
}

// sha256Path says, for the start-up log, how this CPU hashes a batch's
// values (canon.Lanes): in vector lanes where the CPU lacks SHA
// extensions, else one at a time with crypto/sha256.
func sha256Path() string {
	if l := canon.Lanes(); l != "off" {
		return "8 values at a time in " + l + " vector lanes (this CPU has no SHA extensions)"
	}
	return "crypto/sha256, one value at a time"
}

// overBudget is at-least-once mode's backpressure: the partitions that
// make progress hold their budget (max_in_flight records each on average,
// max_in_flight_bytes in all). A partition that cannot (paused on an
// outage or a lock of its own, retrying) is left out: it holds what it
// took, and takes no more than its share (pauseOverShare), so that its
// trouble never stops the others from polling. The records in flight are
// then at most twice the budget: what the troubled partitions held when
// their trouble began, and the budget of the others.
func (p *Pipeline) overBudget() bool {
	var healthy, records, bytes int64
	for _, w := range p.allWorkers() {
		if w.health.status() != nil {
			continue
		}
		r, b := w.acct.held()
		healthy++
		records += r
		bytes += b
	}
	bd := p.deps.budget
	return healthy > 0 && (records >= healthy*bd.perPartition || bytes >= bd.maxBytes)
}
