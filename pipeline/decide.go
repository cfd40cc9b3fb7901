package pipeline

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/retry"
)

// Step 1 of DESIGN §2, decide: a partition's records are decided in offset
// order, a batch per PostgreSQL transaction (dedup.Store.Decide: state, log
// and P change together), and each decided batch is queued for delivery
// as a job.

// decideLoop turns polled records into jobs, in offset order, until the
// worker stops or parks.
func (w *worker) decideLoop() {
	defer close(w.jobs)
	flushWait := w.d.set.retry.Backoff()
	for {
		// Batches forwarded undecided are written back as soon as the
		// store answers, new records or not: until then the partition
		// reports the outage.
		var wait time.Duration
		if len(w.pending) > 0 {
			wait = flushWait.NextBackOff()
		} else {
			flushWait.Reset()
		}
		recs, polled, ok := w.q.take(w.dctx, w.batchLimit(), wait)
		if !ok {
			return
		}
		w.unreleased += len(recs)
		w.unreleasedBytes += recordsBytes(recs)
		var err error
		if len(recs) == 0 {
			if err = w.flush(); errors.Is(err, dedup.ErrUnavailable) {
				w.log.Debug("store still unavailable: the records forwarded undecided wait to be written", zap.Error(err))
				err = nil
			}
		} else {
			err = w.process(recs, polled)
		}
		if err != nil {
			if w.dctx.Err() != nil {
				return // stopping
			}
			w.park(err)
			if errors.Is(err, dedup.ErrFenced) {
				// Another owner has the partition: deliver nothing more.
				w.cancel()
			}
			return
		}
	}
}

// batchLimit is how many records the next decide takes: batch_size while
// the partition keeps up (small batches, low latency), up to max_batch while
// a backlog waits (a decide transaction's fixed costs, its round trips and
// its commit, shared by more records: Kafka Streams' and Flink's
// mini-batches, applied to the decide transaction).
func (w *worker) batchLimit() int {
	return min(max(w.q.len(), w.d.set.batchSize), w.d.set.maxBatch)
}

// process handles one run of polled records: the replay of recovery first,
// then catching up to Kafka's offset, then deciding.
func (w *worker) process(recs []*kgo.Record, polled time.Time) error {
	for len(recs) > 0 {
		var err error
		switch {
		case w.plan.replay != nil:
			recs, err = w.replay(recs, polled)
		case recs[0].Offset < w.next:
			// Already decided, and recovery found nothing to re-deliver
			// (offsets moved back by hand): DESIGN §2 continues from P.
			i := sort.Search(len(recs), func(i int) bool { return recs[i].Offset >= w.next })
			w.log.Debug("skipping records below the decided progress", zap.Int64("offset", recs[0].Offset), zap.Int64("next", w.next))
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

// decideBatch classifies recs (in offset order, all at or above P) once
// each, decides them in one transaction and queues their delivery. With
// catchUp the state is brought up to date with records Kafka's committed
// offset is already past: nothing is delivered, logged or dead-lettered.
//
// On a route without a dead-letter topic, bad input halts the partition at
// that record: what precedes it is decided and delivered first.
func (w *worker) decideBatch(recs []*kgo.Record, polled time.Time, catchUp bool) error {
	b := &dedup.Batch{
		Service:   w.rt.service,
		Partition: w.part,
		Epoch:     w.epoch,
		Start:     w.next,
		End:       recs[len(recs)-1].Offset + 1,
		Records:   make([]dedup.Record, 0, len(recs)),
		NoLog:     catchUp,
		Rule:      w.rt.rule,
		Delivered: w.knownC.Load(),
	}
	var causes []error // per record, only once a record is bad
	var halt error
	if w.digests == nil {
		w.digests = w.rt.hasher.NewBatch()
	}
	for i, r := range recs {
		rec, err := w.rt.classifyIn(r, w.digests, i)
		if err != nil {
			if w.rt.dlq == "" && !catchUp {
				halt = fmt.Errorf("%w: %s/%d offset %d: %s (route %s has no dead_letter topic); %s", ErrHalted, r.Topic, r.Partition, r.Offset, boundDetail(err.Error()), w.rt.service,
					skipHint(r.Topic, r.Partition, r.Offset))
				recs, b.End = recs[:i], r.Offset
				break
			}
			if causes == nil {
				causes = make([]error, len(recs))
			}
			causes[i] = err
		}
		b.Records = append(b.Records, rec)
	}
	// Every queued digest, before anything returns: a record found bad
	// after its value was hashed (or the one that halts) has one too.
	w.digests.Flush(func(i int, d canon.Digest) {
		if i < len(b.Records) && !b.Records[i].Invalid {
			b.Records[i].Digest = d
		}
	})
	if len(recs) == 0 {
		return halt
	}
	tap := tapNone
	if !catchUp {
		tap = w.d.tap.admit(w.rt.service, b.Records)
	}
	if tap == tapBuild {
		b.Sources = make([]dedup.Source, len(b.Records)) // for the tap: what each drop duplicates
	}

	decisions, undecided, err := w.decide(b)
	if err != nil && (dedup.RecordError(err) || workerFailed(err)) {
		// The store refuses something of the batch that the checks before
		// it did not catch (or, on Citus, fails on it try after try): find
		// the record, so that it alone is bad input and the partition goes
		// on.
		var n int
		var stop error
		how := apartLetter
		if catchUp {
			how = apartCatchUp
		}
		decisions, n, stop, err = w.decideApart(b, &causes, how, err)
		b.Sources = nil // decided apart: not known
		if err == nil && n < len(recs) {
			if n == 0 {
				return stop
			}
			recs, b.Records, halt = recs[:n], b.Records[:n], stop
		}
	}
	if err != nil {
		return err
	}
	if !undecided {
		w.step(StepDecided)
	}
	w.next = b.End
	j := &job{polled: polled, commitTo: b.End, epoch: recs[len(recs)-1].LeaderEpoch, halt: halt}
	if catchUp {
		if w.next >= w.plan.catchUpTo {
			w.plan.catchUpTo = 0
		}
		j.counts[outcomeCaughtUp] = len(recs)
		j.commitTo = 0 // Kafka's offset is already ahead
		return w.emit(j)
	}
	// The batch's forwards in one slab, and the job's records in one
	// slice: two allocations per batch, not one or more per record.
	letters, forwards := 0, 0
	for i := range recs {
		switch {
		case b.Records[i].Invalid:
			letters++
		case undecided || decisions[i].Forwards() || w.rt.shadow:
			forwards++
		}
	}
	slab := make([]kgo.Record, forwards)
	j.out = make([]outRecord, 0, letters+forwards)
	for i, r := range recs {
		switch {
		case b.Records[i].Invalid:
			// Dead-lettered whether or not the store could decide.
			w.log.Warn("bad input: dead-lettered", zap.Int64("offset", r.Offset), zap.String("dead_letter", w.rt.dlq), zap.String("error", boundDetail(causes[i].Error())))
			j.add(w.rt.deadLetter(r, causes[i]), r, outcomeInvalid)
		case undecided:
			j.add(w.forward(&slab, r, false), r, outcomeUndecided)
		case decisions[i].Forwards():
			j.add(w.forward(&slab, r, false), r, outcomeOf(decisions[i]))
		case w.rt.shadow: // a duplicate (or stale): marked
			j.add(w.forward(&slab, r, true), r, outcomeOf(decisions[i]))
		default:
			j.counts[outcomeOf(decisions[i])]++
		}
	}
	if tap != tapNone || w.d.tap.active() { // a reader attached since admit: it is told of the batch as lost
		w.tap(tap, recs, b, decisions, undecided, causes)
	}
	return w.emit(j)
}

// forward builds r's output record in the next record of the slab.
func (w *worker) forward(slab *[]kgo.Record, r *kgo.Record, duplicate bool) *kgo.Record {
	out := &(*slab)[0]
	*slab = (*slab)[1:]
	w.rt.outputTo(out, r, duplicate)
	return out
}

// apart is what decideApart makes of a record the store refuses.
type apart uint8

const (
	// apartLetter: bad input, dead-lettered with the store's error as its
	// cause; on a route without a dead-letter topic the partition halts
	// at it.
	apartLetter apart = iota
	// apartCatchUp: a catch-up, which delivers nothing: marked invalid,
	// no halt.
	apartCatchUp
	// apartForwarded: the batch went out already, forwarded undecided
	// (flush): the record is logged as what it was, a forward, and its
	// entity's state is reset; no halt.
	apartForwarded
)

// decideApart decides b's records one at a time, each in a transaction
// of its own, after b as a whole failed with an error the store may have
// because of a record (first: dedup.RecordError, or workerFailed). A
// record the store refuses alone (or fails on alone, try after try, while
// it answers for the record's identity: decideBounded) is decided again as
// invalid (it changes no state), and how says what it is then:
//   - apartLetter: bad input, its dead letter's cause the store's error,
//     kept in the decision log for a recovery to name it again. On a route
//     without a dead-letter topic the partition halts at it instead: n is
//     then the number of records decided before it, b.End their end, and
//     halt says why.
//   - apartCatchUp: nothing more (nothing is delivered or logged).
//   - apartForwarded: it went out as a forward: logged as one
//     (dedup.Record.Forwarded), so that a recovery delivers it again as a
//     forward, never as a dead letter (which, without a dead-letter topic,
//     would halt the partition on a record that was never bad input). Its
//     entity's state is reset first: the state cannot hold what the
//     adapter received, so the entity's next record is forwarded whatever
//     it holds (a possible duplicate, never a loss).
//
// Any other error is returned as err.
func (w *worker) decideApart(b *dedup.Batch, causes *[]error, how apart, first error) (decisions []dedup.Decision, n int, halt error, err error) {
	w.log.Warn("the store refuses a batch: deciding its records one by one to find the one it refuses",
		zap.Int64("offset", b.Start), zap.Int("records", len(b.Records)), zap.String("error", boundDetail(first.Error())))
	next := b.Start
	for i := range b.Records {
		r := &b.Records[i]
		end := r.Offset + 1
		if i == len(b.Records)-1 {
			end = b.End
		}
		one := *b
		one.Start, one.End, one.Records = next, end, b.Records[i:i+1]
		decideOne := func() ([]dedup.Decision, error) {
			return w.decideBounded(&one, func() bool { return !r.Invalid && w.answersFor(r) })
		}
		d, err := decideOne()
		if err != nil && !r.Invalid && (dedup.RecordError(err) || workerFailed(err)) {
			if how == apartLetter && w.rt.dlq == "" {
				b.End = next
				return decisions, i, fmt.Errorf("%w: %s/%d offset %d: the store refuses the record: %s (route %s has no dead_letter topic); %s",
					ErrHalted, w.part.Topic, w.part.Partition, r.Offset, boundDetail(err.Error()), w.rt.service, skipHint(w.part.Topic, w.part.Partition, r.Offset)), nil
			}
			cause := fmt.Errorf("the store refuses the record: %w", err)
			r.Invalid = true
			if how == apartForwarded {
				w.log.Warn("the store refuses a record forwarded undecided: logged as forwarded, its entity's state reset",
					zap.Int64("offset", r.Offset), zap.String("error", boundDetail(cause.Error())))
				r.Forwarded = true
				if err := w.resetEntity(r.Entity); err != nil {
					return nil, 0, nil, err
				}
			} else {
				if *causes == nil {
					*causes = make([]error, len(b.Records))
				}
				(*causes)[i] = cause
				r.Cause = boundDetail(cause.Error())
			}
			d, err = decideOne()
		}
		if err != nil {
			return nil, 0, nil, err
		}
		decisions = append(decisions, d[0])
		next = end
	}
	return decisions, len(b.Records), nil, nil
}

// resetEntity deletes the stored state of one entity of the route.
func (w *worker) resetEntity(entity []byte) error {
	_, err := retryStep(w, sideDecide, "resetting an entity", w.d.metrics.storeErrors, storeOp(func() (int64, error) {
		ctx, cancel := w.storeCtx(w.decideCtx())
		defer cancel()
		return w.d.store.Reset(ctx, w.rt.service, entity)
	}))
	return err
}

// decide runs b's transaction until its outcome is known.
//
// undecided reports that the store is down and the route forwards records
// undecided (on_store_failure: forward): b is then kept, to be written to
// the store, with its log, before the next decision.
func (w *worker) decide(b *dedup.Batch) (decisions []dedup.Decision, undecided bool, err error) {
	if len(w.pending) > 0 {
		if err := w.flush(); err != nil {
			if w.rt.forwardUndecided && errors.Is(err, dedup.ErrUnavailable) {
				w.pending = append(w.pending, b)
				return nil, true, nil
			}
			return nil, false, err
		}
	}
	if w.rt.forwardUndecided {
		decisions, err := w.decideOnce(b)
		if errors.Is(err, dedup.ErrUnavailable) {
			w.d.metrics.storeErrors.WithLabelValues(w.rt.service).Inc()
			w.health.pause(sideDecide, err)
			w.log.Warn("store unavailable: forwarding undecided (on_store_failure: forward)", zap.Int64("offset", b.Start), zap.Error(err))
			w.pending = append(w.pending, b)
			return nil, true, nil
		}
		if err == nil {
			w.health.resume(sideDecide)
		}
		return decisions, false, err
	}
	decisions, err = w.decideBounded(b, nil)
	return decisions, false, err
}

// decideOnce is one Decide of b.
func (w *worker) decideOnce(b *dedup.Batch) ([]dedup.Decision, error) {
	start := time.Now()
	ctx, cancel := w.storeCtx(w.decideCtx())
	defer cancel()
	decisions, err := w.d.store.Decide(ctx, b, nil)
	if err != nil {
		return nil, err
	}
	w.proven()
	w.d.metrics.decideSeconds.WithLabelValues(w.rt.service).Observe(time.Since(start).Seconds())
	w.d.metrics.batchRecords.WithLabelValues(w.rt.service).Observe(float64(len(b.Records)))
	return decisions, nil
}

// decideResolving is one attempt of decide for retryStep. After an outage
// error the transaction's outcome is unknown (a lost COMMIT reply looks the
// same as a refused BEGIN), so it is learned from P once the transaction
// has settled (SettledProgress: on Citus a two-phase commit may still be
// in flight on a worker), waiting for the store as long as it takes,
// before anything else: P at b.End means the batch
// committed (its decisions are read back from the log), P at b.Start that it
// did not (retried after the backoff); anything else means another owner.
// Deciding again without knowing would fence a batch that did commit.
func (w *worker) decideResolving(b *dedup.Batch) ([]dedup.Decision, error) {
	decisions, err := w.decideOnce(b)
	if err == nil {
		return decisions, nil
	}
	if !errors.Is(err, dedup.ErrUnavailable) {
		return nil, retry.Permanent(err) // fenced, or a store error retrying cannot fix
	}
	prog, perr := retryStep(w, sideDecide, "reading progress after a failed decide", w.d.metrics.storeErrors, storeOp(func() (dedup.Progress, error) {
		ctx, cancel := w.storeCtx(w.decideCtx())
		defer cancel()
		return w.d.store.SettledProgress(ctx, w.part)
	}))
	if perr != nil {
		return nil, retry.Permanent(perr)
	}
	switch {
	case prog.Epoch != w.epoch:
		return nil, retry.Permanent(fmt.Errorf("%w: %s/%d: epoch %d, ours %d", dedup.ErrFenced, w.part.Topic, w.part.Partition, prog.Epoch, w.epoch))
	case prog.HasNext && prog.Next == b.Start:
		return nil, err // not committed: decide again after the backoff
	case prog.HasNext && prog.Next == b.End:
		w.log.Info("the decide transaction committed before its reply was lost: reading its decisions from the log", zap.Int64("offset", b.Start))
		decisions, lerr := w.decisionsFromLog(b)
		if lerr != nil {
			return nil, retry.Permanent(lerr)
		}
		return decisions, nil
	default:
		return nil, retry.Permanent(fmt.Errorf("%w: %s/%d: progress at %d, batch [%d, %d)", dedup.ErrFenced, w.part.Topic, w.part.Partition, prog.Next, b.Start, b.End))
	}
}

// decisionsFromLog rebuilds a committed batch's decisions from the decision
// log: a logged offset was forwarded or dead-lettered, an unlogged one was
// a duplicate.
func (w *worker) decisionsFromLog(b *dedup.Batch) ([]dedup.Decision, error) {
	decisions := make([]dedup.Decision, len(b.Records))
	if b.NoLog {
		return decisions, nil // nothing is delivered for a catch-up batch
	}
	logged, err := retryStep(w, sideDecide, "reading the decision log", w.d.metrics.storeErrors, storeOp(func() ([]dedup.LoggedDecision, error) {
		ctx, cancel := w.storeCtx(w.decideCtx())
		defer cancel()
		entries, _, err := w.d.store.Logged(ctx, w.part, b.Start, b.End)
		return entries, err
	}))
	if err != nil {
		return nil, err
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
	return decisions, nil
}

// flush writes the batches forwarded undecided to the store, in order,
// each in its own transaction with its decision log: the log then covers
// every decided range, so recovery re-delivers their forwards if the crash
// comes before their offsets are committed, whatever mix of decided and
// undecided batches lies there. Their decisions bring the state up to what
// the adapter received (each identity's last forwarded digest), so no later
// change is mistaken for a duplicate. Batches of bad input alone are
// flushed too: P must cover them.
//
// The first batch may have committed before its reply was lost: P says
// where to resume.
func (w *worker) flush() error {
	ctx, cancel := w.storeCtx(w.decideCtx())
	prog, err := w.d.store.SettledProgress(ctx, w.part)
	cancel()
	if err != nil {
		return err
	}
	if prog.Epoch != w.epoch {
		return fmt.Errorf("%w: %s/%d: epoch %d, ours %d", dedup.ErrFenced, w.part.Topic, w.part.Partition, prog.Epoch, w.epoch)
	}
	i := sort.Search(len(w.pending), func(i int) bool { return w.pending[i].Start >= prog.Next })
	last := w.pending[len(w.pending)-1]
	switch {
	case !prog.HasNext:
		return fmt.Errorf("%w: %s/%d: progress unset", dedup.ErrFenced, w.part.Topic, w.part.Partition)
	case i < len(w.pending) && w.pending[i].Start == prog.Next:
	case prog.Next == last.End:
	default:
		return fmt.Errorf("%w: %s/%d: progress at %d, undecided batches from %d to %d", dedup.ErrFenced,
			w.part.Topic, w.part.Partition, prog.Next, w.pending[0].Start, last.End)
	}
	w.pending = w.pending[i:]
	n := 0
	for len(w.pending) > 0 {
		b := w.pending[0]
		if _, err := w.decideOnce(b); err != nil {
			if !dedup.RecordError(err) {
				return err
			}
			// A record of it the store refuses: its records went out
			// already (but a catch-up's), so none halts; the refused one
			// is logged as the forward it was.
			how := apartForwarded
			if b.NoLog {
				how = apartCatchUp
			}
			var causes []error
			if _, _, _, err := w.decideApart(b, &causes, how, err); err != nil {
				return err
			}
		}
		n += len(b.Records)
		w.pending = w.pending[1:]
	}
	w.pending = nil
	w.health.resume(sideDecide)
	w.log.Info("store back: the records forwarded undecided are decided and logged", zap.Int("records", n))
	return nil
}

// emit hands a decided job on for delivery, in order: to the deliverer
// goroutine in at-least-once mode, to the current transaction's round in
// exactly-once mode. It returns the job's halt, so that the decider stops
// right after the records before it.
func (w *worker) emit(j *job) error {
	// The job carries the input records taken so far: they leave the
	// budget once it is delivered.
	j.inputs, w.unreleased = w.unreleased, 0
	j.inBytes, w.unreleasedBytes = w.unreleasedBytes, 0
	if w.d.transactional {
		w.eos.round = append(w.eos.round, j)
		return j.halt
	}
	return w.send(j)
}

// send queues a job for the deliverer goroutine.
func (w *worker) send(j *job) error {
	select {
	case w.jobs <- j:
		return j.halt
	case <-w.ctx.Done():
		return w.ctx.Err()
	}
}

// workerFailureTries bounds the tries of one batch, or of one record
// decided alone, that fail on a Citus worker's relayed error
// (dedup.WorkerFailure). Such an error is mostly a worker lost in the
// middle of the statement, gone at the next try; but Citus relays some
// errors that a record's own content causes on a worker the same way, and
// those fail at every try: unbounded, the partition would retry that
// record forever.
const workerFailureTries = 5

// workerFailures ends decideBounded: a batch failed on a worker's relayed
// error workerFailureTries times (err is the last), or a record alone did
// while the store answered for its identity (answered).
type workerFailures struct {
	tries    int
	answered bool
	err      error
}

func (e *workerFailures) Error() string {
	if e.answered {
		return fmt.Sprintf("decided alone, it failed %d times on a Citus worker's error while the store answered for its identity: %v", e.tries, e.err)
	}
	return fmt.Sprintf("failed %d times on a Citus worker's error: %v", e.tries, e.err)
}

func (e *workerFailures) Unwrap() error { return e.err }

// workerFailed reports an error of decideBounded that gave up.
func workerFailed(err error) bool {
	var wf *workerFailures
	return errors.As(err, &wf)
}

// decideBounded runs b's transaction until its outcome is known, with the
// pipeline's backoff (decideResolving), as long as it takes an outage to
// end, except for a failure on a Citus worker's relayed error: from the
// workerFailureTries-th on, each ends it with a workerFailures
// error if atFault says that b is at fault (nil: at once). A batch is
// then decided apart, a record at a time (decideApart); a record alone is
// at fault if the store answers for its identity meanwhile (answersFor):
// its shard's worker is up, and the failure follows the record. While
// the store does not answer for it, the failure is an outage, waited out.
func (w *worker) decideBounded(b *dedup.Batch, atFault func() bool) ([]dedup.Decision, error) {
	failures := 0
	return retryStep(w, sideDecide, "decide", w.d.metrics.storeErrors, func() ([]dedup.Decision, error) {
		decisions, err := w.decideResolving(b)
		if !dedup.WorkerFailure(err) {
			return decisions, err
		}
		if failures++; failures >= workerFailureTries && (atFault == nil || atFault()) {
			return nil, retry.Permanent(&workerFailures{tries: failures, answered: atFault != nil, err: err})
		}
		return nil, err
	})
}

// answersFor reports whether the store answers a read of r's identity
// (found or not): on Citus, a single-shard read on the worker that holds
// it, which a write of r would reach too.
func (w *worker) answersFor(r *dedup.Record) bool {
	ctx, cancel := w.storeCtx(w.decideCtx())
	defer cancel()
	_, err := w.d.store.GetMode(ctx, w.rt.service, r.Entity, w.rt.rule.Mode)
	if err != nil && !errors.Is(err, dedup.ErrNotFound) {
		w.log.Warn("a record keeps failing on a Citus worker's error, and the store does not answer for its identity either: waiting for the worker", zap.Int64("offset", r.Offset), zap.Error(err))
		return false
	}
	return true
}
