package pipeline

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/retry"
)

// settings are the parts of the configuration a partition's worker uses.
type settings struct {
	group     string
	batchSize int
	// maxBatch: the most records a decide takes while its queue holds
	// more than batchSize (a backlog).
	maxBatch int
	// grace bounds finishing the decided batches when a partition is
	// revoked or the pipeline stops; then the worker is stopped hard.
	grace time.Duration
	retry retry.Policy
	// lease is how long a proof of ownership (a decide commit, an offset
	// commit, an epoch check) is trusted before records are handed to the
	// producer: a process paused past it (a zombie) checks the epoch first.
	lease     time.Duration
	noteEvery time.Duration // how often the committed offset is recorded in the store
	// storeTimeout bounds each call to PostgreSQL: a connection into a
	// network black hole would otherwise wait for TCP to give up, minutes
	// later. A call cut short has an unknown outcome, resolved as any other.
	storeTimeout time.Duration
}

// deps are what every worker shares: the store, the Kafka client (producer
// and committer), the metrics, the polling budget and the settings.
type deps struct {
	store   *dedup.Store
	client  *kgo.Client
	commits *committer // at-least-once mode's offset commits
	metrics *metrics
	budget  *budget
	limits  *batchLimits
	set     settings
	hook    StepHook
	tap     *Tap // nil unless http.tap.enabled
	// transactional: exactly-once mode; the round loop (transact.go)
	// delivers, and the worker has no goroutines of its own.
	transactional bool
}

// worker owns one input partition for as long as it is assigned: a decider
// goroutine (hash, decide in PostgreSQL; decide.go) and a deliverer goroutine
// (produce, wait for acks, commit; deliver.go), connected by a short channel
// so that batch n+1 is decided while batch n is delivered. Recovery
// (recover.go) gives it its plan before it starts.
type worker struct {
	d     *deps
	rt    *route
	part  dedup.Partition
	label string // partition number, for metrics
	log   *zap.Logger
	q     *queue
	// polledTo is the offset after the last record polled for the worker
	// (where recovery starts it at first).
	polledTo atomic.Int64
	// end is the partition's high watermark as last seen (a fetch, or the
	// end offsets listed for the lag); -1: not yet.
	end atomic.Int64
	// startAt is where recovery started the partition (fetchFrom, for
	// the metrics' goroutine).
	startAt atomic.Int64
	// acct holds the budget of the records the worker took: given back
	// as they are delivered, and whatever is left when it ends.
	acct *account
	// fetchPaused: the partition holds its share of the budget and its
	// fetching is paused (pauseOverShare), until deliveries give enough
	// back (resumeUnderShare) or the worker ends. Guarded by pauseMu.
	pauseMu     sync.Mutex
	fetchPaused bool

	ctx    context.Context // canceled on a hard stop
	cancel context.CancelFunc
	// dctx is the decider's: canceled as soon as the worker stops, since a
	// stopping partition decides nothing more (what it decided is still
	// delivered, under ctx, within the grace period).
	dctx    context.Context
	dcancel context.CancelFunc
	jobs    chan *job
	done    chan struct{} // closed once both goroutines have returned

	epoch int64 // the fencing epoch recovery acquired
	// provenAt (unix nanos) is when ownership was last proven: a decide
	// committed under our epoch, an offset commit accepted in our group
	// generation, or an epoch check.
	provenAt atomic.Int64

	// Decider state.
	unreleased      int   // records taken from the queue not yet counted in a job
	unreleasedBytes int64 // their size
	plan            plan
	next            int64          // P: the next offset to decide
	pending         []*dedup.Batch // batches forwarded undecided, to write to the store first
	digests         *canon.Batch   // the digests of the batch being classified

	// Deliverer state.
	committed int64 // the committed offset C as last known; -1: none
	lastNote  time.Time
	// knownC is committed, for the decider (Batch.Delivered) and for the
	// record made when the worker ends.
	knownC atomic.Int64

	// Exactly-once state (transact.go); unused in at-least-once mode.
	eos eosState

	health partHealth
}

// eosState is a worker's state for exactly-once delivery, which the
// round loop (transact.go) drives instead of the worker's deliverer.
type eosState struct {
	// round: the jobs decided and not yet delivered (the current round's,
	// or a replay's held until it is complete).
	round []*job
	// refusedAt: the input offsets whose output Kafka refused for good in
	// an earlier round (aborted): its replay dead-letters them at once.
	refusedAt map[int64]error
	// letterRefusedAt: the input offsets whose dead letter, without the
	// value, Kafka refused too: its replay halts there.
	letterRefusedAt map[int64]error
	fetchFrom       int64 // where recovery started fetching
	// taken: the offset after the last record a round gave the worker
	// (the plan's start at first): a round drops records below it, which
	// franz-go fetches again after it rewound the partition on an abort.
	// (A replay's input records kept past the end of a round, until it is
	// complete, stay in acct: given back by dropRound or when the worker
	// ends.)
	taken int64
	// replanning: the partition's last round did not commit; it is
	// planned again (recovery from P and C) before it is fetched again.
	replanning bool
	// ops and retry bound the decide side during a round: its calls end
	// at the round's hard deadline, its retries at shutdown or when a
	// rebalance waits for the round (nil outside a round and in
	// at-least-once mode: dctx bounds both).
	ops, retry context.Context
}

func newWorker(parent context.Context, d *deps, rt *route, partition int32, r recovered, log *zap.Logger) *worker {
	ctx, cancel := context.WithCancel(parent)
	dctx, dcancel := context.WithCancel(ctx)
	acct := newAccount(d.budget)
	w := &worker{
		d:         d,
		rt:        rt,
		part:      dedup.Partition{Group: d.set.group, Topic: rt.from, Partition: partition},
		label:     strconv.Itoa(int(partition)),
		log:       log,
		acct:      acct,
		q:         newQueue(acct),
		ctx:       ctx,
		cancel:    cancel,
		dctx:      dctx,
		dcancel:   dcancel,
		jobs:      make(chan *job, 2),
		done:      make(chan struct{}),
		epoch:     r.epoch,
		plan:      r.plan,
		next:      r.next,
		committed: r.committed,
		eos: eosState{
			fetchFrom:       r.startAt,
			taken:           r.startAt,
			refusedAt:       map[int64]error{},
			letterRefusedAt: map[int64]error{},
		},
	}
	w.knownC.Store(r.committed)
	w.polledTo.Store(r.startAt)
	w.end.Store(-1)
	w.startAt.Store(r.startAt)
	w.health.log = log
	w.proven()
	return w
}

// sawEnd records the partition's end offset (a high watermark).
func (w *worker) sawEnd(end int64) {
	if end >= 0 {
		w.end.Store(end)
	}
}

// lag is the records between the partition's end and the committed offset
// (where recovery started it, before any commit), once the end is known.
func (w *worker) lag() (int64, bool) {
	end := w.end.Load()
	if end < 0 {
		return 0, false
	}
	c := w.knownC.Load()
	if c < 0 {
		c = w.startAt.Load()
	}
	return max(end-c, 0), true
}

// setCommitted records a committed offset.
func (w *worker) setCommitted(c int64) {
	w.committed = c
	w.knownC.Store(c)
}

func (w *worker) start() {
	w.d.budget.partitions.Add(1)
	if w.d.transactional {
		// The round loop calls the worker; nothing runs on its own.
		close(w.jobs)
		go func() { <-w.ctx.Done(); w.ended() }()
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); w.decideLoop() }()
	go func() { defer wg.Done(); w.deliverLoop() }()
	go func() {
		wg.Wait()
		w.ended()
	}()
}

// ended releases what the worker held, once its work has ended: the
// budget of the records it took and did not deliver included.
func (w *worker) ended() {
	w.cancel()
	w.recordDelivered()
	if !w.d.transactional {
		for range w.jobs { // closed by the decider: let nothing wait to send
		}
	}
	// Everything the worker took and did not deliver, whatever stopped it:
	// the queue, the records being decided, the jobs left undelivered or
	// failed, a replay's held records (exactly-once).
	w.acct.close()
	w.resumeFetch()
	w.d.budget.partitions.Add(-1)
	w.d.budget.signal()
	close(w.done)
}

// recordDelivered records the committed offset this worker knows in the
// store, briefly (the worker has stopped: a stop in time, a revocation): a
// recovery that finds no committed offset in Kafka later (the group's
// offsets expired) then replays nothing this worker delivered.
func (w *worker) recordDelivered() {
	c := w.knownC.Load()
	if c < 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), time.Second)
	defer cancel()
	if err := w.d.store.SetDelivered(ctx, []dedup.Delivered{{Partition: w.part, Offset: c}}); err != nil {
		w.log.Warn("recording the committed offset in the store failed (a recovery without Kafka's committed offset may deliver again what was delivered since the last decide)", zap.Error(err))
	}
}

// stop ends the worker and returns once it has ended. With finish (a
// revocation, a shutdown), the batches it has decided are delivered and
// committed first, within the given time; then, or at once without finish
// (the partition is lost), it is stopped hard. Either way, when stop
// returns every record the worker handed to the producer has been
// acknowledged or failed: nothing of its can land after the partition's
// next owner has started. Safe to call more than once, concurrently.
func (w *worker) stop(finish bool, within time.Duration) {
	w.q.close()
	w.dcancel()
	if !finish || w.d.transactional {
		// (Exactly-once: nothing is in flight between rounds, and a
		// round that loses the partition aborts its transaction.)
		w.cancel()
	}
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case <-w.done:
	case <-t.C:
		w.log.Warn("partition did not finish within the grace period; stopping it (its next owner delivers what the decision log holds)",
			zap.Duration("grace", within))
		w.cancel()
		<-w.done
	}
}

// park stops the partition's work after an error that retrying cannot
// fix: a fence (another owner has it), a halt (bad input or a refused
// record with nowhere to go), data loss in the input, a store error that
// is not an outage. The worker takes nothing more and stays assigned,
// halted, until it is revoked (or, fenced, recovered again: onJoined);
// nothing is skipped: the committed offset
// stays below what was not delivered.
func (w *worker) park(err error) {
	w.health.park(err)
	switch {
	case errors.Is(err, dedup.ErrFenced):
		w.log.Warn("partition fenced: another instance owns it now; stopping work on it until it is revoked", zap.Error(err))
		// Ask the coordinator whose it is: rejoining, a member that was
		// dropped (a zombie) loses it, while a member that holds it in the
		// current generation gets it back and recovers it (onJoined).
		if w.d.client != nil {
			w.d.client.ForceRebalance()
		}
	default:
		w.log.Error("partition halted", zap.Error(err))
	}
	w.q.close()
	w.dcancel()
}

// decideCtx is the context of the decide side's calls: the worker's own
// (a stop in time lets the decide in flight finish, to be delivered and
// committed with the rest: a clean stop leaves C = P; the retries end at
// once, on dctx), bounded in exactly-once mode by the round's hard
// deadline.
func (w *worker) decideCtx() context.Context {
	if w.eos.ops != nil {
		return w.eos.ops
	}
	return w.ctx
}

// storeCtx bounds one call to PostgreSQL (see settings.storeTimeout).
func (w *worker) storeCtx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, w.d.set.storeTimeout)
}

// proven records that ownership was just proven.
func (w *worker) proven() { w.provenAt.Store(time.Now().UnixNano()) }

// retry runs op with the pipeline's backoff until it succeeds, returns a
// permanent error, or the worker stops. Each failed attempt is logged and
// counted (as a store or delivery error), and marks the partition paused
// until an attempt succeeds.
func retryStep[T any](w *worker, s side, what string, errs *prometheus.CounterVec, op func() (T, error)) (T, error) {
	ctx := w.ctx
	if s == sideDecide {
		ctx = w.dctx
		if w.eos.retry != nil {
			ctx = w.eos.retry
		}
	}
	v, err := retry.Do(ctx, w.d.set.retry, func(err error, wait time.Duration) {
		errs.WithLabelValues(w.rt.service).Inc()
		w.health.pause(s, err)
		w.log.Warn(what+" failed: pausing the partition and retrying", zap.Duration("retry_in", wait), zap.Error(err))
	}, op)
	if err == nil {
		w.health.resume(s)
	}
	return v, err
}

// storeOp adapts a store call for retryStep: only an outage is retried.
func storeOp[T any](f func() (T, error)) func() (T, error) {
	return func() (T, error) {
		v, err := f()
		if err != nil && !errors.Is(err, dedup.ErrUnavailable) {
			return v, retry.Permanent(err)
		}
		return v, err
	}
}

// share is what a partition in trouble may hold of the in-flight budget:
// its fair part, max_in_flight records and its part of
// max_in_flight_bytes. Past it the partition's fetching pauses, so that a
// partition that cannot deliver (paused on a lock, an outage of its own)
// never takes the room the others need (overBudget). A partition making
// progress has no share of its own: it may use what the others leave.
func (w *worker) share() (records, bytes int64) {
	n := max(w.d.budget.partitions.Load(), 1)
	return w.d.budget.perPartition, w.d.budget.maxBytes / n
}

// pauseOverShare, in at-least-once mode's poll loop, returns the part of
// recs that a partition in trouble (retrying: health.status) may take
// within its share of the budget; a partition making progress takes them
// all. When some do not fit, it rewinds the partition to the first of
// them and pauses its fetching, until it makes progress again or its
// deliveries give half of its share back (resumeUnderShare). A worker
// that holds nothing takes at least one record.
func (w *worker) pauseOverShare(cl *kgo.Client, recs []*kgo.Record) []*kgo.Record {
	// Under pauseMu, the held records read here cannot fall to nothing
	// unseen: a delivery after this read resumes what this pauses
	// (resumeUnderShare), one before it is counted.
	if w.health.status() == nil {
		return recs
	}
	w.pauseMu.Lock()
	defer w.pauseMu.Unlock()
	held, heldBytes := w.acct.held()
	maxRecs, maxBytes := w.share()
	k := 0
	for k < len(recs) && held < maxRecs && heldBytes < maxBytes {
		held++
		heldBytes += recordBytes(recs[k])
		k++
	}
	if k == 0 && held == 0 {
		k = 1
	}
	if k == len(recs) {
		return recs
	}
	if w.ctx.Err() != nil {
		return recs // ended: its closed queue drops them
	}
	cl.PauseFetchPartitions(map[string][]int32{w.part.Topic: {w.part.Partition}})
	cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{w.part.Topic: {w.part.Partition: {Epoch: -1, Offset: recs[k].Offset}}})
	if !w.fetchPaused {
		w.fetchPaused = true
		w.log.Debug("partition holds its share of the in-flight budget: fetching paused", zap.Int64("records", held), zap.Int64("bytes", heldBytes))
	}
	return recs[:k]
}

// resumeUnderShare resumes the partition's fetching (after a delivery)
// once it makes progress again or holds less than half its share.
func (w *worker) resumeUnderShare() {
	w.pauseMu.Lock()
	defer w.pauseMu.Unlock()
	if !w.fetchPaused {
		return
	}
	held, heldBytes := w.acct.held()
	maxRecs, maxBytes := w.share()
	if w.health.status() != nil && (held*2 >= maxRecs || heldBytes*2 >= maxBytes) {
		return
	}
	w.resumeLocked()
}

// resumeFetch resumes the partition's fetching if pauseOverShare paused
// it (also when the worker ends: a partition paused when it is revoked
// must not stay paused should it come back).
func (w *worker) resumeFetch() {
	w.pauseMu.Lock()
	defer w.pauseMu.Unlock()
	w.resumeLocked()
}

func (w *worker) resumeLocked() {
	if !w.fetchPaused {
		return
	}
	w.fetchPaused = false
	if w.d.client != nil {
		w.d.client.ResumeFetchPartitions(map[string][]int32{w.part.Topic: {w.part.Partition}})
	}
}
