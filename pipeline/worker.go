package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/dedup"
)

// errHalted stops a partition on bad input when its route has no dead-letter
// topic. The partition stays assigned, deciding nothing, until an operator
// acts.
var errHalted = errors.New("pipeline: partition halted on bad input")

// plan is where a newly assigned partition starts, as worked out by
// recovery (DESIGN §2) from Kafka's committed offset C and PostgreSQL's
// progress P.
type plan struct {
	epoch   int64
	next    int64 // P: next offset to decide
	hasNext bool  // false: no position anywhere yet; set from the first record
	// replayUntil > 0: offsets below it (from C) were decided but perhaps
	// not delivered; deliver exactly what the log marks.
	replayUntil int64
	replay      []dedup.LoggedDecision
	// catchUpTo > next: Kafka is ahead (offsets moved forward by hand);
	// decide [P, C) without forwarding.
	catchUpTo int64
}

// job is one decided batch on its way to Kafka. Jobs are delivered strictly
// in order; the commit of job n happens only after every record of job n is
// acknowledged.
type job struct {
	out      []*kgo.Record
	commitTo int64 // offset to commit after the acks; 0 for none
	epoch    int32 // leader epoch of the last input record, for the commit
	polled   time.Time
	counts   map[string]int // outcome -> records, counted once delivered
	halt     error          // set on the last job before a halt
}

// pollRun is a run of n queued records polled at the same time.
type pollRun struct {
	n  int
	at time.Time
}

// worker owns one input partition for as long as it is assigned: a decider
// goroutine (hash, decide in PostgreSQL) and a deliverer goroutine (produce,
// wait for acks, commit), connected by a short queue so that batch n+1 is
// decided while batch n is delivered.
type worker struct {
	pl    *Pipeline
	rt    *route
	part  dedup.Partition
	log   *zap.Logger
	plan  plan
	label string // partition number, for metrics

	ctx    context.Context // canceled on a hard stop (partition lost)
	cancel context.CancelFunc

	mu      sync.Mutex
	queue   []*kgo.Record
	polls   []pollRun // when the queued records were polled, oldest first
	closing bool      // finish what is decided, take nothing new
	wake    chan struct{}

	jobs chan *job
	done chan struct{}

	// undecided holds records forwarded undecided while the store was down
	// (on_store_failure: forward), from offset undecidedFrom; they are
	// written to the state before the next decision. A revoked owner's
	// leftovers are caught up by the next owner's recovery (C > P).
	undecided     []dedup.Record
	undecidedFrom int64

	// halted is set while the partition makes no progress (outage or bad
	// input); read by readiness.
	haltMu sync.Mutex
	halt   error
	parked bool // halted by fail: only stop lifts the halt
}

func newWorker(pl *Pipeline, rt *route, partition int32, p plan) *worker {
	ctx, cancel := context.WithCancel(pl.runCtx)
	w := &worker{
		pl:     pl,
		rt:     rt,
		part:   dedup.Partition{Group: pl.cfg.Kafka.Group, Topic: rt.from, Partition: partition},
		plan:   p,
		label:  strconv.Itoa(int(partition)),
		ctx:    ctx,
		cancel: cancel,
		wake:   make(chan struct{}, 1),
		jobs:   make(chan *job, 2),
		done:   make(chan struct{}),
	}
	w.log = pl.log.With(zap.String("service", rt.service), zap.String("topic", rt.from), zap.Int32("partition", partition))
	return w
}

func (w *worker) start() {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); w.decideLoop() }()
	go func() { defer wg.Done(); w.deliverLoop() }()
	go func() { wg.Wait(); close(w.done) }()
}

// push hands polled records to the worker. It never blocks the poll loop;
// the loop stops polling while the workers hold their budget (overBudget).
func (w *worker) push(recs []*kgo.Record, polled time.Time) {
	w.mu.Lock()
	if w.closing {
		w.mu.Unlock()
		return
	}
	w.queue = append(w.queue, recs...)
	w.polls = append(w.polls, pollRun{n: len(recs), at: polled})
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// take waits for records and returns up to n of them, or ok=false when the
// worker is closing or stopped.
func (w *worker) take(n int) (recs []*kgo.Record, polled time.Time, ok bool) {
	for {
		w.mu.Lock()
		if w.closing || w.ctx.Err() != nil {
			w.mu.Unlock()
			return nil, time.Time{}, false
		}
		if len(w.queue) > 0 {
			if n > len(w.queue) {
				n = len(w.queue)
			}
			recs = w.queue[:n:n]
			w.queue = w.queue[n:]
			polled = w.polls[0].at // the batch's oldest record
			for left := n; left > 0; {
				if w.polls[0].n > left {
					w.polls[0].n -= left
					break
				}
				left -= w.polls[0].n
				w.polls = w.polls[1:]
			}
			if len(w.queue) == 0 {
				w.queue, w.polls = nil, nil
			}
			w.mu.Unlock()
			w.pl.roomMaybe()
			return recs, polled, true
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-w.ctx.Done():
		}
	}
}

// stop ends the worker. With finish, the decided batches are delivered and
// committed first (revoke, shutdown); without, everything stops at once
// (partition lost: another member may already own it).
func (w *worker) stop(finish bool, grace time.Duration) {
	w.mu.Lock()
	w.closing = true
	w.queue, w.polls = nil, nil
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	if !finish {
		w.cancel()
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-w.done:
	case <-t.C:
		w.log.Warn("partition did not finish within the grace period; stopping it", zap.Duration("grace", grace))
		w.cancel()
		<-w.done
	}
	w.cancel()
	w.setHalt(nil)
	w.pl.metrics.lag.DeleteLabelValues(w.rt.service, w.label)
	w.pl.roomMaybe()
}

// queued reports how many polled records wait to be decided.
func (w *worker) queued() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue)
}

func (w *worker) setHalt(err error) {
	w.haltMu.Lock()
	w.halt = err
	w.haltMu.Unlock()
}

// clearOutage lifts a halt once delivery works again, unless the partition
// is parked by fail (bad input): a delivery that completes after the decider
// halted must not make the partition look ready.
func (w *worker) clearOutage() {
	w.haltMu.Lock()
	if w.halt == nil || w.parked {
		w.haltMu.Unlock()
		return
	}
	w.halt = nil
	w.haltMu.Unlock()
}

func (w *worker) halted() error {
	w.haltMu.Lock()
	defer w.haltMu.Unlock()
	return w.halt
}

// decideLoop turns polled records into jobs, in offset order.
func (w *worker) decideLoop() {
	defer close(w.jobs)
	for {
		recs, polled, ok := w.take(w.pl.cfg.Pipeline.BatchSize)
		if !ok {
			return
		}
		if err := w.process(recs, polled); err != nil {
			if w.ctx.Err() != nil {
				return
			}
			w.fail(err)
			return
		}
	}
}

// fail parks the partition after an error that retrying cannot fix: fencing
// (another owner has it) or a halt on bad input. The worker takes nothing
// more (records still fetched are dropped, never committed) and waits to be
// revoked; nothing is skipped: the next owner or the next start resumes at
// the last committed decision.
func (w *worker) fail(err error) {
	// Halted either way: a fence is normally followed at once by the
	// partition's revocation (which clears it), and one that is not must
	// show, not stall silently.
	w.haltMu.Lock()
	w.parked = true
	w.haltMu.Unlock()
	w.setHalt(err)
	if errors.Is(err, dedup.ErrFenced) {
		w.log.Warn("partition fenced: another instance owns it now; stopping work on it until it is revoked", zap.Error(err))
	} else {
		w.log.Error("partition halted", zap.Error(err))
	}
	w.mu.Lock()
	w.closing = true
	w.queue, w.polls = nil, nil
	w.mu.Unlock()
	w.pl.roomMaybe()
}

// process decides one polled run of records and queues the resulting jobs.
func (w *worker) process(recs []*kgo.Record, polled time.Time) error {
	for len(recs) > 0 {
		var err error
		switch {
		case w.plan.replayUntil > 0:
			recs, err = w.replay(recs, polled)
		case !w.plan.hasNext:
			err = w.initProgress(recs[0].Offset)
		case recs[0].Offset < w.plan.next:
			// Already decided (offsets moved back by hand, without a
			// log): DESIGN §2 continues from P.
			w.log.Debug("skipping records below the decided progress", zap.Int64("offset", recs[0].Offset), zap.Int64("next", w.plan.next))
			i := sort.Search(len(recs), func(i int) bool { return recs[i].Offset >= w.plan.next })
			recs = recs[i:]
		case w.plan.catchUpTo > recs[0].Offset:
			i := sort.Search(len(recs), func(i int) bool { return recs[i].Offset >= w.plan.catchUpTo })
			err = w.decideBatch(recs[:i], polled, true)
			recs = recs[i:]
		default:
			err = w.decideBatch(recs, polled, false)
			recs = nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// initProgress sets P for a partition that had no position anywhere: the
// first record fetched (at kafka.start) is where deciding begins.
func (w *worker) initProgress(first int64) error {
	err := w.retry("init progress", func(ctx context.Context) error {
		return w.pl.store.InitProgress(ctx, w.part, w.plan.epoch, first)
	})
	if err != nil {
		return err
	}
	w.plan.next, w.plan.hasNext = first, true
	return nil
}

// replay re-delivers the logged decisions of [C, P): the records the log
// marks forwarded or dead-lettered, and, in shadow mode, the duplicates
// with their marker. A logged record that can no longer be read (deleted by
// retention or compaction) resets its entity's state, so that entity's next
// record is forwarded: a possible duplicate, never a loss.
func (w *worker) replay(recs []*kgo.Record, polled time.Time) ([]*kgo.Record, error) {
	until := w.plan.replayUntil
	j := &job{polled: polled, counts: map[string]int{}}
	var missing [][]byte
	log := w.plan.replay
	i := 0
	for ; i < len(recs) && recs[i].Offset < until; i++ {
		r := recs[i]
		for len(log) > 0 && log[0].Offset < r.Offset {
			if log[0].Decision == dedup.Forward {
				missing = append(missing, log[0].Entity)
			}
			log = log[1:]
		}
		if len(log) > 0 && log[0].Offset == r.Offset {
			switch log[0].Decision {
			case dedup.Forward:
				j.out = append(j.out, w.rt.output(r, false))
			case dedup.Invalid:
				_, cause := w.rt.classify(r)
				if cause == nil {
					cause = errors.New("invalid when decided (configuration changed since)")
				}
				if w.rt.dlq != "" {
					j.out = append(j.out, w.rt.deadLetter(r, cause))
				}
			}
			log = log[1:]
		} else if w.rt.shadow {
			j.out = append(j.out, w.rt.output(r, true))
		}
		j.counts[outcomeRebuilt]++
		j.commitTo, j.epoch = r.Offset+1, r.LeaderEpoch
	}
	w.plan.replay = log
	done := i < len(recs) || (i > 0 && recs[i-1].Offset == until-1)
	if done {
		for _, e := range log {
			if e.Decision == dedup.Forward {
				missing = append(missing, e.Entity)
			}
		}
		w.plan.replay, w.plan.replayUntil = nil, 0
		j.commitTo = until
	}
	if len(missing) > 0 {
		w.log.Warn("logged forwards can no longer be read; resetting their entities so their next record is forwarded", zap.Int("entities", len(missing)))
		err := w.retry("reset unreadable entities", func(ctx context.Context) error {
			_, err := w.pl.store.Reset(ctx, w.rt.service, missing...)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	if j.commitTo > 0 {
		if err := w.send(j); err != nil {
			return nil, err
		}
	}
	return recs[i:], nil
}

// decideBatch hashes and decides recs (in offset order, all >= P) in one
// transaction and queues their delivery. With catchUp the state is brought
// up to date but nothing is forwarded or logged.
func (w *worker) decideBatch(recs []*kgo.Record, polled time.Time, catchUp bool) error {
	b := &dedup.Batch{
		Service:   w.rt.service,
		Partition: w.part,
		Epoch:     w.plan.epoch,
		Start:     w.plan.next,
		End:       recs[len(recs)-1].Offset + 1,
		Records:   make([]dedup.Record, 0, len(recs)),
		NoLog:     catchUp,
	}
	causes := map[int]error{}
	haltAt := -1
	for i, r := range recs {
		rec, err := w.rt.classify(r)
		if err != nil {
			if w.rt.dlq == "" && !catchUp {
				haltAt = i
				break
			}
			causes[i] = err
		}
		b.Records = append(b.Records, rec)
	}
	if haltAt == 0 {
		r := recs[0]
		_, cause := w.rt.classify(r)
		return fmt.Errorf("%w: %s/%d offset %d: %v (route %s has no dead_letter topic)", errHalted, r.Topic, r.Partition, r.Offset, cause, w.rt.service)
	}
	var halt error
	if haltAt > 0 {
		// Decide and deliver what precedes the bad record, then halt.
		r := recs[haltAt]
		_, cause := w.rt.classify(r)
		halt = fmt.Errorf("%w: %s/%d offset %d: %v (route %s has no dead_letter topic)", errHalted, r.Topic, r.Partition, r.Offset, cause, w.rt.service)
		recs = recs[:haltAt]
		b.End = r.Offset
	}

	decisions, undecided, err := w.decide(b)
	if err != nil {
		return err
	}
	w.plan.next = b.End
	j := &job{polled: polled, counts: map[string]int{}, commitTo: b.End, epoch: recs[len(recs)-1].LeaderEpoch, halt: halt}
	if catchUp {
		j.counts[outcomeCaughtUp] = len(recs)
		j.commitTo = 0 // Kafka's offset is already ahead
		return w.send(j)
	}
	for i, r := range recs {
		switch {
		case b.Records[i].Invalid:
			// Bad input is dead-lettered whether or not the store could
			// decide the batch.
			cause := causes[i]
			w.log.Warn("bad input: dead-lettered", zap.Int64("offset", r.Offset), zap.String("dead_letter", w.rt.dlq), zap.Error(cause))
			j.out = append(j.out, w.rt.deadLetter(r, cause))
			j.counts[outcomeInvalid]++
		case undecided:
			j.out = append(j.out, w.rt.output(r, false))
			j.counts[outcomeUndecided]++
		case decisions[i] == dedup.Forward:
			j.out = append(j.out, w.rt.output(r, false))
			j.counts[outcomeForwarded]++
		case decisions[i] == dedup.Duplicate:
			if w.rt.shadow {
				j.out = append(j.out, w.rt.output(r, true))
			}
			j.counts[outcomeDuplicate]++
		}
	}
	return w.send(j)
}

// decide runs the batch's transaction until its outcome is known. An error
// whose outcome is unknown (a lost COMMIT reply, a dropped connection) is
// resolved by reading the partition's progress: P at End means the batch
// committed and its decisions are read back from the log; P at Start means
// it did not and it is retried; another epoch means another owner.
//
// undecided reports that the store is down and the route forwards
// undecided records (on_store_failure: forward); the batch's records are
// then kept to be written to the state once the store is back.
func (w *worker) decide(b *dedup.Batch) (decisions []dedup.Decision, undecided bool, err error) {
	if err := w.flushUndecided(); err != nil {
		if w.rt.forwardUndecided && errors.Is(err, dedup.ErrUnavailable) {
			w.keepUndecided(b)
			return nil, true, nil
		}
		return nil, false, err
	}
	bo := w.pl.backoff()
	for {
		start := time.Now()
		decisions, err = w.pl.store.Decide(w.ctx, b, nil)
		if err == nil {
			w.pl.metrics.decideSeconds.WithLabelValues(w.rt.service).Observe(time.Since(start).Seconds())
			w.pl.metrics.batchRecords.WithLabelValues(w.rt.service).Observe(float64(len(b.Records)))
			w.setHalt(nil)
			return decisions, false, nil
		}
		if w.ctx.Err() != nil {
			return nil, false, w.ctx.Err()
		}
		if errors.Is(err, dedup.ErrFenced) || errors.Is(err, dedup.ErrInvalid) {
			return nil, false, err
		}
		w.pl.metrics.storeErrors.WithLabelValues(w.rt.service).Inc()
		w.setHalt(err)
		if w.rt.forwardUndecided {
			w.log.Warn("store unavailable: forwarding undecided (on_store_failure: forward)", zap.Int64("offset", b.Start), zap.Error(err))
			w.keepUndecided(b)
			return nil, true, nil
		}
		wait := bo.NextBackOff()
		w.log.Warn("store unavailable: pausing the partition and retrying", zap.Int64("offset", b.Start), zap.Duration("retry_in", wait), zap.Error(err))
		if !sleep(w.ctx, wait) {
			return nil, false, w.ctx.Err()
		}
		prog, err := w.pl.store.ReadProgress(w.ctx, w.part)
		if err != nil {
			continue // still down: try the whole batch again after the next wait
		}
		switch {
		case prog.Epoch != b.Epoch:
			return nil, false, fmt.Errorf("%w: epoch %d, ours %d", dedup.ErrFenced, prog.Epoch, b.Epoch)
		case prog.HasNext && prog.Next == b.Start:
			// Not committed: decide again.
		case prog.HasNext && prog.Next == b.End:
			// Committed, reply lost: the decisions are in the log.
			return w.decisionsFromLog(b)
		default:
			return nil, false, fmt.Errorf("%w: progress at %d, batch [%d, %d)", dedup.ErrFenced, prog.Next, b.Start, b.End)
		}
	}
}

// decisionsFromLog rebuilds a committed batch's decisions from the decision
// log: a logged offset was forwarded or dead-lettered, an unlogged one was
// a duplicate.
func (w *worker) decisionsFromLog(b *dedup.Batch) ([]dedup.Decision, bool, error) {
	decisions := make([]dedup.Decision, len(b.Records))
	if b.NoLog {
		return decisions, false, nil // nothing is delivered for a catch-up batch
	}
	var logged []dedup.LoggedDecision
	err := w.retry("read decision log", func(ctx context.Context) error {
		var err error
		logged, _, err = w.pl.store.Logged(ctx, w.part, b.Start, b.End)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	byOffset := make(map[int64]dedup.Decision, len(logged))
	for _, e := range logged {
		byOffset[e.Offset] = e.Decision
	}
	for i, r := range b.Records {
		if d, ok := byOffset[r.Offset]; ok {
			decisions[i] = d
		} else {
			decisions[i] = dedup.Duplicate
		}
	}
	return decisions, false, nil
}

// keepUndecided remembers records forwarded while the store was down, so
// that the state can be brought up to date before deciding again: without
// this, an entity's next record would be compared against content older
// than what the adapter last received.
func (w *worker) keepUndecided(b *dedup.Batch) {
	if w.undecided == nil {
		w.undecidedFrom = b.Start
	}
	for _, r := range b.Records {
		if !r.Invalid {
			w.undecided = append(w.undecided, r)
		}
	}
	w.plan.next = b.End
}

// flushUndecided writes the digests forwarded undecided to the state, with
// the progress, in batch-sized transactions decided without a log (they are
// already delivered). A batch whose decide committed just before the outage
// (reply lost) is found below P and skipped.
func (w *worker) flushUndecided() error {
	if w.undecided == nil {
		return nil
	}
	prog, err := w.pl.store.ReadProgress(w.ctx, w.part)
	if err != nil {
		return err
	}
	if prog.Epoch != w.plan.epoch {
		return fmt.Errorf("%w: epoch %d, ours %d", dedup.ErrFenced, prog.Epoch, w.plan.epoch)
	}
	if prog.HasNext && prog.Next > w.undecidedFrom {
		i := sort.Search(len(w.undecided), func(i int) bool { return w.undecided[i].Offset >= prog.Next })
		w.undecided, w.undecidedFrom = w.undecided[i:], prog.Next
	}
	n := len(w.undecided)
	for len(w.undecided) > 0 || w.undecidedFrom < w.plan.next {
		k := min(len(w.undecided), w.pl.cfg.Pipeline.BatchSize)
		end := w.plan.next
		if k < len(w.undecided) {
			end = w.undecided[k].Offset
		}
		b := &dedup.Batch{
			Service: w.rt.service, Partition: w.part, Epoch: w.plan.epoch,
			Start: w.undecidedFrom, End: end, Records: w.undecided[:k], NoLog: true,
		}
		if _, err := w.pl.store.Decide(w.ctx, b, nil); err != nil {
			return err
		}
		w.undecided, w.undecidedFrom = w.undecided[k:], end
	}
	w.undecided = nil
	w.log.Info("store back: state updated with the records forwarded undecided", zap.Int("records", n))
	return nil
}

// send queues a job for delivery, in order.
func (w *worker) send(j *job) error {
	select {
	case w.jobs <- j:
		if j.halt != nil {
			return j.halt
		}
		return nil
	case <-w.ctx.Done():
		return w.ctx.Err()
	}
}

// deliverLoop produces each job's records, waits for every ack, then
// commits the job's offset: the only place offsets are committed.
func (w *worker) deliverLoop() {
	var lastPrune time.Time
	for j := range w.jobs {
		if !w.deliver(j) {
			return
		}
		for outcome, n := range j.counts {
			w.pl.metrics.records.WithLabelValues(w.rt.service, outcome).Add(float64(n))
		}
		if n := j.counts[outcomeInvalid]; n > 0 {
			w.pl.metrics.deadLetters.WithLabelValues(w.rt.service).Add(float64(n))
		}
		if j.commitTo > 0 {
			w.pl.metrics.pollToCommit.WithLabelValues(w.rt.service).Observe(time.Since(j.polled).Seconds())
			if time.Since(lastPrune) > w.pl.pruneEvery {
				lastPrune = time.Now()
				if _, err := w.pl.store.PruneLog(w.ctx, w.part, j.commitTo); err != nil && w.ctx.Err() == nil {
					w.log.Warn("pruning the decision log failed; it is retried later", zap.Error(err))
				}
			}
		}
	}
}

// deliver produces and commits one job, retrying with capped backoff until
// it succeeds or the worker is stopped. A retry may produce again records
// already acknowledged: at-least-once, never a loss.
func (w *worker) deliver(j *job) bool {
	bo := w.pl.backoff()
	for {
		err := w.produce(j.out)
		if err == nil && j.commitTo > 0 {
			err = w.pl.commit(w.ctx, w.part.Topic, w.part.Partition, j.commitTo, j.epoch)
		}
		if err == nil {
			if j.halt == nil {
				w.clearOutage()
			}
			return true
		}
		if w.ctx.Err() != nil {
			return false
		}
		w.pl.metrics.deliverErrors.WithLabelValues(w.rt.service).Inc()
		w.setHalt(err)
		wait := bo.NextBackOff()
		w.log.Warn("delivery failed: retrying", zap.Int64("commit_offset", j.commitTo), zap.Duration("retry_in", wait), zap.Error(err))
		if !sleep(w.ctx, wait) {
			return false
		}
	}
}

func (w *worker) produce(out []*kgo.Record) error {
	if len(out) == 0 {
		return nil
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	wg.Add(len(out))
	for _, r := range out {
		w.pl.client.Produce(w.ctx, r, func(r *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("produce to %s: %w", r.Topic, err)
				}
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	return first
}

// retry runs op until it succeeds, with capped exponential backoff; the
// partition reports halted meanwhile. It gives up only when the worker is
// stopped or on fencing.
func (w *worker) retry(what string, op func(context.Context) error) error {
	bo := w.pl.backoff()
	for {
		err := op(w.ctx)
		if err == nil {
			w.setHalt(nil)
			return nil
		}
		if w.ctx.Err() != nil {
			return w.ctx.Err()
		}
		if errors.Is(err, dedup.ErrFenced) || errors.Is(err, dedup.ErrInvalid) {
			return err
		}
		w.pl.metrics.storeErrors.WithLabelValues(w.rt.service).Inc()
		w.setHalt(err)
		wait := bo.NextBackOff()
		w.log.Warn(what+" failed: retrying", zap.Duration("retry_in", wait), zap.Error(err))
		if !sleep(w.ctx, wait) {
			return w.ctx.Err()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
