package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/retry"
)

// Exactly-once delivery (kafka.delivery: exactly-once, DESIGN §2): the
// forwards, the dead letters and the offset commit of what was decided are
// one Kafka transaction, through franz-go's GroupTransactSession (KIP-447:
// the group's generation fences a zombie's offset commit, and the
// transactional id fences this instance's previous self). Consumers of the
// output read it read_committed.
//
// It runs in rounds, in the poll goroutine: poll; decide every polled
// record (each partition's worker, partitions in parallel); one transaction
// produces every record the round delivers and commits every polled offset;
// then the next round. A transaction commits everything polled, so
// everything polled is decided first. A round that does not commit (an
// abort, or an error whose outcome is unknown: franz-go may report an error
// for a transaction that did commit) rewinds to the committed offsets, and
// every partition of the round runs recovery again before it goes on,
// reading C from Kafka (require-stable, so a transaction still in flight is
// settled first): what it decided is in the decision log, and a later
// round's replay delivers it once.
//
// A partition that cannot deliver what was polled of it (bad input or a
// refused record without a dead-letter topic, a fence, lost input) makes
// the round abort and halts, paused: its offsets are never committed past
// what it delivered.

// errProducerFenced: another live client took this instance's
// transactional id (a restart of this instance, or a configuration that
// gives two instances the same id): this one must stop.
var errProducerFenced = errors.New("pipeline: fenced by another producer with the same transactional id")

// transactionalID is this instance's transactional id: kafka.transactional_id,
// or client_id-group-hostname.
func (p *Pipeline) transactionalID() string {
	if id := p.cfg.Kafka.TransactionalID; id != "" {
		return id
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return fmt.Sprintf("%s-%s-%s", p.cfg.Kafka.ClientID, p.cfg.Kafka.Group, host)
}

// transactLoop runs rounds until ctx ends, or returns the error that stops
// this instance (fenced by its own transactional id).
func (p *Pipeline) transactLoop(ctx context.Context, sess *kgo.GroupTransactSession) error {
	wait := p.retry.Backoff()
	// A round in flight at shutdown gets the grace period to finish; then
	// its transaction is given up (the next owner replays it).
	rctx, rcancel := context.WithCancel(p.base)
	defer rcancel()
	go func() {
		select {
		case <-ctx.Done():
		case <-rctx.Done():
			return
		}
		t := time.NewTimer(p.finishWithin())
		defer t.Stop()
		select {
		case <-t.C:
			rcancel()
		case <-rctx.Done():
		}
	}()
	for {
		// A round takes what was fetched, up to the in-flight budget
		// (max_in_flight per assigned partition): with a backlog, each
		// transaction's fixed costs (the decide transactions, AddOffsets,
		// TxnOffsetCommit, a heartbeat, EndTxn) are shared by that many
		// records; caught up, a round is what arrived since the last one.
		maxPoll := p.cfg.Pipeline.MaxInFlight * max(1, int(p.deps.budget.partitions.Load()))
		fetches := sess.PollRecords(ctx, maxPoll)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			sess.AllowRebalance()
			return nil
		}
		fetches.EachError(p.fetchError)
		// A round holds what it polled until it ends (dam_records_in_flight).
		n := int64(fetches.NumRecords())
		p.deps.budget.queued.Add(n)
		err := p.round(rctx, sess, fetches)
		p.deps.budget.queued.Add(-n)
		sess.AllowRebalance()
		switch {
		case errors.Is(err, errProducerFenced):
			return err
		case err != nil:
			d := wait.NextBackOff()
			p.log.Warn("transaction not committed: the round's partitions replay it from the decision log", zap.Duration("retry_in", d), zap.Error(err))
			if !sleep(ctx, d) {
				return nil
			}
		default:
			wait.Reset()
		}
	}
}

// roundPart is one partition's share of a round.
type roundPart struct {
	w    *worker
	recs []*kgo.Record
	jobs []*job
	err  error
}

// round decides what was polled and delivers it in one transaction. It
// returns nil once the transaction committed (or there was nothing to do);
// otherwise the error, after the round's partitions are planned again.
func (p *Pipeline) round(ctx context.Context, sess *kgo.GroupTransactSession, fetches kgo.Fetches) error {
	polled := time.Now()
	var parts []*roundPart
	fetches.EachPartition(func(ftp kgo.FetchTopicPartition) {
		if len(ftp.Records) == 0 {
			return
		}
		w := p.worker(ftp.Topic, ftp.Partition)
		if w == nil || w.health.isParked() {
			// Revoked meanwhile (the transaction aborts: franz-go sees the
			// revocation), or halted: its offsets must not move.
			if w != nil {
				p.holdHalted(w)
			}
			return
		}
		parts = append(parts, &roundPart{w: w, recs: ftp.Records})
		last := ftp.Records[len(ftp.Records)-1].Offset
		p.metrics.lag.WithLabelValues(w.rt.service, w.label).Set(float64(ftp.HighWatermark - last - 1))
	})
	if len(parts) == 0 {
		return nil
	}

	// 1. Decide, partitions in parallel.
	var wg sync.WaitGroup
	for _, rp := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rp.jobs, rp.err = rp.w.decideRound(rp.recs, polled)
			if rp.err == nil {
				for _, j := range rp.jobs {
					rp.w.precheck(j)
					if j.stuck > 0 {
						s := j.out[j.stuck-1]
						rp.err = fmt.Errorf("%w: %s/%d offset %d: Kafka refuses the record for good and route %s has no dead_letter topic: %v",
							ErrHalted, s.src.Topic, s.src.Partition, s.src.Offset, rp.w.rt.service, s.err)
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	var cause error
	for _, rp := range parts {
		if rp.err == nil {
			continue
		}
		cause = errors.Join(cause, rp.err)
		if rp.w.dctx.Err() == nil { // not stopped meanwhile: it halts
			rp.w.park(rp.err)
			p.holdHalted(rp.w)
		}
	}
	if cause != nil {
		return p.uncommitted(ctx, sess, parts, kgo.TryAbort, cause)
	}

	// 2. Deliver: one transaction for every record of the round and every
	// polled offset.
	if err := sess.Begin(); err != nil {
		return p.uncommitted(ctx, sess, parts, kgo.TryAbort, p.fenced(fmt.Errorf("beginning a transaction: %w", err)))
	}
	var (
		pwg   sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, rp := range parts {
		for _, j := range rp.jobs {
			for i := range j.out {
				o := &j.out[i]
				pwg.Add(1)
				sess.Produce(ctx, o.rec, func(_ *kgo.Record, err error) {
					defer pwg.Done()
					if err == nil {
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if refusedForGood(err) {
						rp.w.refusedAt[o.src.Offset] = err // its replay dead-letters it
					}
					if first == nil {
						first = fmt.Errorf("produce to %s: %w", o.rec.Topic, err)
					}
				})
			}
		}
		rp.w.step(StepProducing)
	}
	pwg.Wait()
	if first != nil {
		return p.uncommitted(ctx, sess, parts, kgo.TryAbort, first)
	}
	for _, rp := range parts {
		rp.w.step(StepAcked)
	}
	// End waits for a heartbeat between committing the offsets and
	// EndTxn. If the group session broke meanwhile (a heartbeat lost with
	// its connection), franz-go's manage loop waits for AllowRebalance,
	// which comes after End, and End waits for that loop: bounded by the
	// transaction timeout (past it the broker aborts the transaction
	// anyway), End gives up, aborts, and franz-go re-initializes the
	// producer id on the abort below, which fences whatever is left.
	endCtx, cancel := context.WithTimeout(ctx, p.cfg.Kafka.TransactionTimeout)
	committed, err := sess.End(endCtx, kgo.TryCommit)
	cancel()
	if err != nil || !committed {
		if err == nil {
			err = errors.New("the transaction was aborted (a rebalance, or the group fenced this member)")
		}
		return p.uncommitted(ctx, sess, parts, kgo.TryAbort, p.fenced(err))
	}
	for _, rp := range parts {
		for _, j := range rp.jobs {
			rp.w.delivered(j)
		}
		rp.w.health.resume(sideDeliver)
	}
	return nil
}

// fenced marks an error that means this instance's transactional id was
// taken over: it must stop (errProducerFenced).
func (p *Pipeline) fenced(err error) error {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
		return fmt.Errorf("%w %q: %w", errProducerFenced, p.transactionalID(), err)
	}
	return err
}

// uncommitted ends a round that does not commit: it aborts what the
// transaction holds (the session rewinds to the committed offsets) and
// plans each partition of the round again from Kafka's committed offset,
// which is read from Kafka: the transaction may have committed after all.
func (p *Pipeline) uncommitted(ctx context.Context, sess *kgo.GroupTransactSession, parts []*roundPart, end kgo.TransactionEndTry, cause error) error {
	if ctx.Err() != nil {
		// Given up at shutdown: end what can be ended, briefly; the next
		// owner's recovery settles the rest.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(p.base, time.Second)
		defer cancel()
	}
	if _, err := sess.End(ctx, end); err != nil {
		cause = errors.Join(cause, p.fenced(fmt.Errorf("ending the transaction: %w", err)))
	}
	if errors.Is(cause, errProducerFenced) {
		return cause
	}
	p.metrics.deliverErrors.WithLabelValues(parts[0].w.rt.service).Inc()
	for _, rp := range parts {
		w := rp.w
		if w.dctx.Err() != nil || w.health.isParked() {
			continue // stopped or halted
		}
		w.health.pause(sideDeliver, cause)
		if err := p.replan(w); err != nil {
			if w.dctx.Err() == nil {
				w.park(err)
				p.holdHalted(w)
			}
		}
	}
	return cause
}

// replan runs recovery again for a partition whose round did not commit:
// P from PostgreSQL, C from Kafka (require-stable), the plan, and the
// fetch position. The epoch is not bumped: the partition is still ours.
func (p *Pipeline) replan(w *worker) error {
	ctx := w.dctx
	notify := func(err error, wait time.Duration) {
		w.log.Warn("recovery after an uncommitted round failed: retrying", zap.Duration("retry_in", wait), zap.Error(err))
	}
	prog, err := retry.Do(ctx, p.retry, notify, storeOp(func() (dedup.Progress, error) {
		ctx, cancel := w.storeCtx(ctx)
		defer cancel()
		return p.store.ReadProgress(ctx, w.part)
	}))
	if err != nil {
		return err
	}
	if prog.Epoch != w.epoch {
		return fmt.Errorf("%w: %s/%d: epoch %d, ours %d", dedup.ErrFenced, w.part.Topic, w.part.Partition, prog.Epoch, w.epoch)
	}
	committed, err := retry.Do(ctx, p.retry, notify, func() (map[int32]int64, error) {
		return p.fetchCommitted(ctx, w.part.Topic, []int32{w.part.Partition})
	})
	if err != nil {
		return err
	}
	c, hasC := committed[w.part.Partition]
	r, err := retry.Do(ctx, p.retry, notify, func() (recovered, error) {
		ctx, cancel := w.storeCtx(ctx)
		defer cancel()
		return p.planPartition(ctx, w.rt, w.part, prog, c, hasC)
	})
	if err != nil {
		return err
	}
	w.plan, w.next, w.committed, w.fetchFrom, w.pending, w.round = r.plan, r.next, r.committed, r.startAt, nil, nil
	p.client.SetOffsets(map[string]map[int32]kgo.EpochOffset{w.part.Topic: {w.part.Partition: {Epoch: -1, Offset: r.startAt}}})
	w.log.Info("partition planned again after an uncommitted round", zap.Int64("progress", r.next), zap.Int64("committed", r.committed),
		zap.Int64("fetch_from", r.startAt), zap.Bool("replay", r.plan.replay != nil))
	return nil
}

// holdHalted keeps a halted partition's committed offset where it is: it
// stops fetching the partition, and puts back what was polled of it, so
// that no transaction commits past what it delivered.
func (p *Pipeline) holdHalted(w *worker) {
	p.client.PauseFetchPartitions(map[string][]int32{w.part.Topic: {w.part.Partition}})
	at := w.committed
	if at < 0 {
		at = w.fetchFrom
	}
	p.client.SetOffsets(map[string]map[int32]kgo.EpochOffset{w.part.Topic: {w.part.Partition: {Epoch: -1, Offset: at}}})
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

// decideRound decides one round's records of the partition, in batches of
// pipeline.batch_size, and returns the jobs to deliver.
func (w *worker) decideRound(recs []*kgo.Record, polled time.Time) ([]*job, error) {
	w.round = w.round[:0]
	for len(recs) > 0 {
		n := min(len(recs), w.d.set.maxBatch)
		if err := w.process(recs[:n], polled); err != nil {
			return nil, err
		}
		recs = recs[n:]
	}
	return w.round, nil
}
