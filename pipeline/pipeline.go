// Package pipeline is dam's Kafka loop: it consumes every route's projection
// topic in a consumer group, decides each partition's records in offset
// order through package dedup, delivers the records that changed (and dead
// letters) with acks=all and the idempotent producer, and commits offsets
// only after every ack: the delivery protocol of DESIGN §2, in
// at-least-once mode.
//
// Each assigned partition has a worker: a decider goroutine and a deliverer
// goroutine, so batch n+1 is decided while batch n is delivered, deliveries
// stay in order, and partitions proceed in parallel. Recovery runs when a
// partition is assigned (in franz-go's AdjustFetchOffsetsFn, which sees
// Kafka's committed offset C before fetching starts) and compares C with
// PostgreSQL's progress P:
//
//   - C = P, or no C: continue from P.
//   - C < P and the decision log covers [C, P): re-read [C, P) and deliver
//     exactly what the log marks forwarded, then continue from P.
//   - C < P without a log (offsets moved back by hand): continue from P.
//   - C > P (offsets moved forward, or state restored from a backup): decide
//     [P, C) without forwarding, then continue from C.
//   - Neither: start at kafka.start (latest or earliest).
//
// Failures pause, never guess: while PostgreSQL or Kafka is unreachable, the
// affected partitions retry with capped exponential backoff, report
// dam_halted and not-ready, and resume exactly where they stopped.
//
// Metrics (all on the Registerer given to New):
//
//	dam_records_total{service,outcome}        forwarded, duplicate, invalid, rebuilt, caught_up, undecided
//	dam_dead_letters_total{service}           records produced to the dead-letter topic
//	dam_decision_seconds{service}             decide transaction latency
//	dam_batch_records{service}                records per decided batch
//	dam_poll_to_commit_seconds{service}       poll of a batch to its offset commit
//	dam_store_errors_total{service}           PostgreSQL errors (retried)
//	dam_delivery_errors_total{service}        Kafka produce/commit errors (retried)
//	dam_halted{service}                       partitions paused by an outage or halted on bad input
//	dam_consumer_lag{service,partition}       high watermark minus next offset
//	dam_partitions_assigned{service}          partitions owned by this instance
//	dam_state_rows{service}                   identities with stored state
//	dam_kafka_*                               franz-go client metrics (kprom)
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/plugin/kprom"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// Sentinel errors.
var (
	// ErrNotReady is wrapped by Ready while the pipeline cannot make
	// progress: not yet consuming, or a partition paused or halted.
	ErrNotReady = errors.New("pipeline: not ready")
	// ErrUnsupported is returned by New for configuration this version
	// does not run (exactly-once delivery).
	ErrUnsupported = errors.New("pipeline: unsupported configuration")
)

// Option configures a Pipeline.
type Option func(*Pipeline)

// WithLogger sets the logger (default: a no-op logger).
func WithLogger(l *zap.Logger) Option { return func(p *Pipeline) { p.log = l } }

// WithRegisterer sets where metrics are registered (default: none kept).
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

	client     *kgo.Client
	runCtx     context.Context
	pruneEvery time.Duration

	mu      sync.Mutex
	workers map[string]map[int32]*worker
	started bool // the group has been joined at least once
	stopped bool
	// room is signalled when the queued records may have dropped below the
	// budget: the poll loop waits on it while the budget is used up.
	room chan struct{}
	// brokerErr is set while no broker answers the health probe: every
	// partition is then paused, busy or idle.
	brokerErr error
}

// New validates what the configuration asks of the pipeline and builds it.
// It does not connect to anything.
func New(cfg config.Config, store *dedup.Store, opts ...Option) (*Pipeline, error) {
	p := &Pipeline{
		cfg:        cfg,
		store:      store,
		log:        zap.NewNop(),
		reg:        prometheus.NewRegistry(),
		routes:     map[string]*route{},
		workers:    map[string]map[int32]*worker{},
		pruneEvery: 5 * time.Second,
		room:       make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(p)
	}
	if cfg.Kafka.Delivery == "exactly-once" {
		return nil, fmt.Errorf("%w: kafka.delivery: exactly-once is not available in this version; use at-least-once", ErrUnsupported)
	}
	for i, rc := range cfg.Routes {
		rt, err := compileRoute(rc)
		if err != nil {
			return nil, fmt.Errorf("routes[%d]: %w", i, err)
		}
		p.routes[rt.from] = rt
	}
	p.metrics = newMetrics(p.reg)
	for _, rt := range p.routes {
		// At 0 from the start, so that increase() sees the first dead letters.
		p.metrics.deadLetters.WithLabelValues(rt.service)
	}
	if err := p.reg.Register(newHaltedCollector(p)); err != nil {
		return nil, fmt.Errorf("pipeline: registering metrics: %w", err)
	}
	return p, nil
}

// fetchMaxBytes bounds one fetch response. Kafka still returns a record
// batch larger than this on its own, so it never stalls a partition.
const fetchMaxBytes = 4 << 20

func (p *Pipeline) clientOptions() []kgo.Opt {
	var topics []string
	var routes []*route
	for t, r := range p.routes {
		topics = append(topics, t)
		routes = append(routes, r)
	}
	start := kgo.NewOffset().AtEnd()
	if p.cfg.Kafka.Start == "earliest" {
		start = kgo.NewOffset().AtStart()
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(p.cfg.Kafka.Brokers...),
		kgo.ClientID(p.cfg.Kafka.ClientID),
		kgo.WithLogger(kzap.New(p.log.Named("kafka"), kzap.Level(kgo.LogLevelWarn))),
		kgo.WithHooks(kprom.NewMetrics("dam_kafka", kprom.Registerer(p.reg))),
		// Consumer: a group over every route's input, read_committed, no
		// auto-commit: offsets are committed only after delivery.
		kgo.ConsumerGroup(p.cfg.Kafka.Group),
		kgo.ConsumeTopics(topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.SessionTimeout(p.cfg.Kafka.SessionTimeout),
		kgo.RebalanceTimeout(p.cfg.Kafka.RebalanceTimeout),
		kgo.ConsumeStartOffset(start),
		// A committed offset that fell below the log start resumes at the
		// log start: every record that still exists is decided.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// One fetch is buffered while the workers are busy, decompressed,
		// on top of the max_in_flight budget: franz-go's default (50 MiB)
		// doubled peak memory and gained nothing.
		kgo.FetchMaxBytes(fetchMaxBytes),
		kgo.OnPartitionsAssigned(p.onJoined),
		kgo.AdjustFetchOffsetsFn(p.onAssigned),
		kgo.OnPartitionsRevoked(p.onRevoked),
		kgo.OnPartitionsLost(p.onLost),
		// Producer: acks=all and idempotence (franz-go's defaults, stated),
		// records partitioned by key with murmur2 or preserved.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(newPartitioner(routes)),
		kgo.ProducerLinger(0),
		kgo.MaxBufferedRecords(max(p.cfg.Pipeline.MaxInFlight*2, 10000)),
	}
	if tlsOpt, err := tlsOption(p.cfg.Kafka.TLS); err == nil && tlsOpt != nil {
		opts = append(opts, tlsOpt)
	}
	if sasl := saslOption(p.cfg.Kafka.SASL); sasl != nil {
		opts = append(opts, sasl)
	}
	return append(opts, p.kopts...)
}

// Run consumes until ctx is canceled, then finishes the batches in flight,
// commits, leaves the group and returns nil. It returns an error only when
// it cannot start (bad TLS files, a preserve route whose output has fewer
// partitions than its input).
func (p *Pipeline) Run(ctx context.Context) error {
	if _, err := tlsOption(p.cfg.Kafka.TLS); err != nil {
		return err
	}
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	p.runCtx = runCtx
	cl, err := kgo.NewClient(p.clientOptions()...)
	if err != nil {
		return fmt.Errorf("pipeline: kafka client: %w", err)
	}
	p.client = cl
	if err := p.checkPreserve(ctx); err != nil {
		cl.Close()
		return err
	}
	go p.stateRowsLoop(runCtx)
	go p.brokerProbeLoop(runCtx)
	p.log.Info("consuming", zap.String("group", p.cfg.Kafka.Group), zap.Int("routes", len(p.routes)))

	maxPoll := p.cfg.Pipeline.BatchSize * 4
	for {
		// Backpressure: no poll while the partitions hold max_in_flight
		// records each on average. (Not franz-go's per-partition pause: a
		// partition paused when revoked was seen never to fetch again once
		// reassigned.)
		p.waitForRoom(ctx)
		fetches := cl.PollRecords(ctx, maxPoll)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			cl.AllowRebalance()
			break
		}
		now := time.Now()
		fetches.EachError(func(t string, part int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			p.log.Warn("fetch error (the client retries)", zap.String("topic", t), zap.Int32("partition", part), zap.Error(err))
		})
		fetches.EachPartition(func(ftp kgo.FetchTopicPartition) {
			if len(ftp.Records) == 0 {
				return
			}
			w := p.worker(ftp.Topic, ftp.Partition)
			if w == nil {
				// Not ours any more (revoked between fetch and poll): the
				// next owner reads these from its committed offset.
				return
			}
			w.push(ftp.Records, now)
			last := ftp.Records[len(ftp.Records)-1].Offset
			p.metrics.lag.WithLabelValues(w.rt.service, w.label).Set(float64(ftp.HighWatermark - last - 1))
		})
		cl.AllowRebalance()
	}
	p.shutdown()
	return nil
}

// shutdown stops every worker, letting each deliver and commit what it has
// decided within the grace period, then leaves the group.
func (p *Pipeline) shutdown() {
	p.mu.Lock()
	p.stopped = true
	var ws []*worker
	for _, parts := range p.workers {
		for _, w := range parts {
			ws = append(ws, w)
		}
	}
	p.workers = map[string]map[int32]*worker{}
	p.mu.Unlock()
	p.log.Info("shutting down: finishing the batches in flight", zap.Int("partitions", len(ws)))
	p.stopWorkers(ws, true)
	p.client.Close() // leaves the group
	p.log.Info("stopped")
}

func (p *Pipeline) stopWorkers(ws []*worker, finish bool) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.stop(finish, p.cfg.Pipeline.ShutdownGrace)
			p.metrics.assigned.WithLabelValues(w.rt.service).Dec()
		}()
	}
	wg.Wait()
}

// waitForRoom blocks while the budget of queued records is used up, until
// ctx ends.
func (p *Pipeline) waitForRoom(ctx context.Context) {
	for p.overBudget() {
		select {
		case <-p.room:
		case <-ctx.Done():
			return
		case <-time.After(time.Second): // a signal missed is only a delay
		}
	}
}

// overBudget reports whether the workers' queues hold max_in_flight records
// per assigned partition or more. The budget is shared rather than per
// partition: a fetch brings a run of one partition at a time, and stopping
// every poll while one partition's queue is full left the others idle
// (throughput fell tenfold with max_in_flight equal to one poll's records).
// Memory stays bounded by the total: budget plus one poll.
func (p *Pipeline) overBudget() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, queued := 0, 0
	for _, parts := range p.workers {
		for _, w := range parts {
			n++
			queued += w.queued()
		}
	}
	return n > 0 && queued >= n*p.cfg.Pipeline.MaxInFlight
}

// roomMaybe wakes the poll loop if it waits for room.
func (p *Pipeline) roomMaybe() {
	select {
	case p.room <- struct{}{}:
	default:
	}
}

func (p *Pipeline) worker(topic string, part int32) *worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.workers[topic][part]
}

// onJoined marks the group joined. franz-go calls it after every join, even
// with nothing assigned: an instance with no partition (more replicas than
// partitions) is a ready standby.
func (p *Pipeline) onJoined(context.Context, *kgo.Client, map[string][]int32) {
	p.mu.Lock()
	p.started = true
	p.mu.Unlock()
}

// onAssigned is recovery (DESIGN §2) for newly assigned partitions: it
// fences any previous owner by bumping the epoch, compares Kafka's committed
// offset C with PostgreSQL's progress P, starts a worker with the resulting
// plan and tells franz-go where to start fetching. It retries PostgreSQL
// until it answers (the partitions stay unfetched meanwhile: pause, not
// guess) or the group session ends.
func (p *Pipeline) onAssigned(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	var started []*worker
	for topic, parts := range offsets {
		rt := p.routes[topic]
		if rt == nil {
			continue
		}
		for part, off := range parts {
			c := off.EpochOffset().Offset
			pl, start, err := p.recover(ctx, rt, part, c)
			if err != nil {
				p.stopWorkers(started, false)
				p.unregister(started)
				return nil, err
			}
			w := newWorker(p, rt, part, pl)
			p.mu.Lock()
			if p.stopped {
				p.mu.Unlock()
				return nil, context.Canceled
			}
			if p.workers[topic] == nil {
				p.workers[topic] = map[int32]*worker{}
			}
			p.workers[topic][part] = w
			p.started = true
			p.mu.Unlock()
			w.start()
			started = append(started, w)
			p.metrics.assigned.WithLabelValues(rt.service).Inc()
			parts[part] = start
		}
	}
	return offsets, nil
}

// recover works out one partition's plan from C (negative: none) and P.
func (p *Pipeline) recover(ctx context.Context, rt *route, part int32, c int64) (plan, kgo.Offset, error) {
	dp := dedup.Partition{Group: p.cfg.Kafka.Group, Topic: rt.from, Partition: part}
	log := p.log.With(zap.String("service", rt.service), zap.String("topic", rt.from), zap.Int32("partition", part))
	var pl plan
	var start kgo.Offset
	err := p.retry(ctx, log, "recovery", func(ctx context.Context) error {
		prog, err := p.store.Acquire(ctx, dp)
		if err != nil {
			return err
		}
		pl = plan{epoch: prog.Epoch, next: prog.Next, hasNext: prog.HasNext}
		switch {
		case !prog.HasNext && c >= 0:
			if err := p.store.InitProgress(ctx, dp, prog.Epoch, c); err != nil {
				return err
			}
			pl.next, pl.hasNext = c, true
			start = kgo.NewOffset().At(c)
		case !prog.HasNext:
			start = kgo.NewOffset().AtEnd()
			if p.cfg.Kafka.Start == "earliest" {
				start = kgo.NewOffset().AtStart()
			}
		case c < 0 || c == prog.Next:
			start = kgo.NewOffset().At(prog.Next)
		case c < prog.Next:
			entries, covered, err := p.store.Logged(ctx, dp, c, prog.Next)
			if err != nil {
				return err
			}
			if covered {
				pl.replayUntil, pl.replay = prog.Next, entries
				start = kgo.NewOffset().At(c)
			} else {
				start = kgo.NewOffset().At(prog.Next)
			}
		default: // c > P
			pl.catchUpTo = c
			start = kgo.NewOffset().At(prog.Next)
		}
		return nil
	})
	if err != nil {
		return plan{}, kgo.Offset{}, err
	}
	log.Info("partition assigned", zap.Int64("epoch", pl.epoch), zap.Int64("committed", c),
		zap.Int64("progress", pl.next), zap.Bool("has_progress", pl.hasNext),
		zap.Int64("replay_until", pl.replayUntil), zap.Int("replay_entries", len(pl.replay)),
		zap.Int64("catch_up_to", pl.catchUpTo))
	return pl, start.WithEpoch(-1), nil
}

func (p *Pipeline) retry(ctx context.Context, log *zap.Logger, what string, op func(context.Context) error) error {
	bo := p.backoff()
	for {
		err := op(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, dedup.ErrInvalid) {
			return err
		}
		wait := bo.NextBackOff()
		log.Warn(what+" failed: retrying", zap.Duration("retry_in", wait), zap.Error(err))
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// onRevoked lets each revoked partition deliver and commit what it has
// decided before another member takes it.
func (p *Pipeline) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	p.stopWorkers(p.take(revoked), true)
}

// onLost stops lost partitions at once: another member may own them
// already, so nothing more is committed (its recovery replays the rest).
func (p *Pipeline) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	p.stopWorkers(p.take(lost), false)
}

func (p *Pipeline) take(tps map[string][]int32) []*worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ws []*worker
	for t, parts := range tps {
		for _, part := range parts {
			if w := p.workers[t][part]; w != nil {
				ws = append(ws, w)
				delete(p.workers[t], part)
			}
		}
	}
	if len(ws) > 0 {
		p.log.Info("partitions leaving this instance", zap.Any("partitions", tps))
	}
	return ws
}

func (p *Pipeline) unregister(ws []*worker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range ws {
		if p.workers[w.part.Topic][w.part.Partition] == w {
			delete(p.workers[w.part.Topic], w.part.Partition)
		}
	}
}

// commit commits one partition's offset synchronously.
func (p *Pipeline) commit(ctx context.Context, topic string, part int32, offset int64, epoch int32) error {
	var cerr error
	p.client.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{
		topic: {part: {Epoch: epoch, Offset: offset}},
	}, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, pr := range t.Partitions {
				if e := kerr.ErrorForCode(pr.ErrorCode); e != nil {
					cerr = fmt.Errorf("commit %s/%d@%d: %w", t.Topic, pr.Partition, offset, e)
				}
			}
		}
	})
	return cerr
}

func (p *Pipeline) backoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = p.cfg.Pipeline.RetryMin
	bo.MaxInterval = p.cfg.Pipeline.RetryMax
	return bo
}

// Ready reports whether the pipeline is making progress: it has joined the
// group (with or without partitions), a broker answers, and no partition is
// paused by an outage or halted on bad input. The
// error (wrapping ErrNotReady) says why not.
func (p *Pipeline) Ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return fmt.Errorf("%w: shutting down", ErrNotReady)
	}
	if !p.started {
		return fmt.Errorf("%w: consumer group not joined yet", ErrNotReady)
	}
	if p.brokerErr != nil {
		return fmt.Errorf("%w: kafka unreachable: %v", ErrNotReady, p.brokerErr)
	}
	for t, parts := range p.workers {
		for part, w := range parts {
			if err := w.halted(); err != nil {
				return fmt.Errorf("%w: %s/%d: %v", ErrNotReady, t, part, err)
			}
		}
	}
	return nil
}

// haltedCounts returns, per service, the partitions not making progress:
// those halted or paused by an outage, or all of them while Kafka is down.
func (p *Pipeline) haltedCounts() map[string]int {
	counts := make(map[string]int, len(p.routes))
	for _, r := range p.routes {
		counts[r.service] = 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, parts := range p.workers {
		for _, w := range parts {
			if p.brokerErr != nil || w.halted() != nil {
				counts[w.rt.service]++
			}
		}
	}
	return counts
}

// brokerProbeLoop asks a broker for its API versions every few seconds, so
// that an outage is reported (not ready, halted) even when no record is
// waiting to be delivered.
func (p *Pipeline) brokerProbeLoop(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := p.client.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		was := p.brokerErr
		p.brokerErr = err
		p.mu.Unlock()
		switch {
		case err != nil && was == nil:
			p.log.Warn("kafka unreachable: partitions paused until a broker answers", zap.Error(err))
		case err == nil && was != nil:
			p.log.Info("kafka reachable again")
		}
	}
}

// checkPreserve refuses to start when a partitioning: preserve route's
// output has fewer partitions than its input.
func (p *Pipeline) checkPreserve(ctx context.Context) error {
	var topics []string
	for _, r := range p.routes {
		if r.preserve {
			topics = append(topics, r.from, r.to)
		}
	}
	if len(topics) == 0 {
		return nil
	}
	adm := kadm.NewClient(p.client)
	details, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return fmt.Errorf("pipeline: partitioning: preserve: listing topics: %w", err)
	}
	for _, r := range p.routes {
		if !r.preserve {
			continue
		}
		in, out := details[r.from], details[r.to]
		if in.Err != nil || out.Err != nil {
			return fmt.Errorf("pipeline: route %s: partitioning: preserve needs both topics to exist: %v %v", r.service, in.Err, out.Err)
		}
		if len(out.Partitions) < len(in.Partitions) {
			return fmt.Errorf("pipeline: route %s: partitioning: preserve: %s has %d partitions, fewer than the %d of %s",
				r.service, r.to, len(out.Partitions), len(in.Partitions), r.from)
		}
	}
	return nil
}

// stateRowsEvery is the refresh interval of dam_state_rows.
const stateRowsEvery = time.Minute

// stateRowsLoop refreshes dam_state_rows every stateRowsEvery, counting
// only this instance's services (every replica of every adapter's dam runs
// it, so it must not read the whole table).
func (p *Pipeline) stateRowsLoop(ctx context.Context) {
	t := time.NewTicker(stateRowsEvery)
	defer t.Stop()
	for {
		for service := range p.serviceNames() {
			if n, err := p.store.Count(ctx, service); err == nil {
				p.metrics.stateRows.WithLabelValues(service).Set(float64(n))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *Pipeline) serviceNames() map[string]struct{} {
	m := make(map[string]struct{}, len(p.routes))
	for _, r := range p.routes {
		m[r.service] = struct{}{}
	}
	return m
}
