package pipeline

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/dedup"
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
// gives two instances the same id), or its producer failed for good
// (franz-go cannot begin a transaction any more): this one must stop, for
// its orchestrator to start it afresh.
var errProducerFenced = errors.New("pipeline: fenced by another producer with the same transactional id, or the transactional producer failed for good")

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
//
// Three contexts bound a round: ctx (the process's: a shutdown ends the
// round's retries at once, and the loop after the round), the hard
// deadline (the grace period after a shutdown: the round's calls end
// there), and the round's own retry context, which a rebalance waiting for
// the held poll also ends (OnPartitionsCallbackBlocked): a round that
// retries through an outage gives the poll back instead of holding the
// group's rebalance for the length of the outage.
func (p *Pipeline) transactLoop(ctx context.Context, sess *kgo.GroupTransactSession) error {
	wait := p.retry.Backoff()
	replanWait := p.retry.Backoff()
	// A round in flight at shutdown gets the grace period to finish; then
	// its transaction is given up (the next owner replays it).
	hard, hardStop := context.WithCancel(p.base)
	defer hardStop()
	go func() {
		select {
		case <-ctx.Done():
		case <-hard.Done():
			return
		}
		t := time.NewTimer(p.finishWithin())
		defer t.Stop()
		select {
		case <-t.C:
			hardStop()
		case <-hard.Done():
		}
	}()
	for {
		if p.unended.Load() {
			p.endSession(hard, sess)
		}
		// Partitions whose last round did not commit are planned again
		// first, between polls: nothing holds the group's rebalances
		// meanwhile, and a shutdown is seen at once.
		pctx, pcancel := context.WithCancel(ctx)
		if p.replanPending(ctx) {
			// Some wait for the store: poll the others briefly, then
			// try them again.
			pcancel()
			pctx, pcancel = context.WithTimeout(ctx, replanWait.NextBackOff())
		} else {
			replanWait.Reset()
		}
		p.roundMu.Lock()
		p.pollStop = pcancel
		p.roundMu.Unlock()
		if p.unended.Load() {
			pcancel() // a revocation came meanwhile
		}
		fetches := sess.PollRecords(pctx, p.roundPoll(sess.Client()))
		p.roundMu.Lock()
		p.pollStop = nil
		p.roundMu.Unlock()
		pcancel()
		if fetches.IsClientClosed() || ctx.Err() != nil {
			sess.AllowRebalance()
			return nil
		}
		p.dec.polled()
		p.takeUndecompressable(sess.Client(), fetches, func(w *worker) int64 { return w.eos.taken })
		fetches.EachError(p.fetchError)
		// A round holds what it polled until it ends (dam_records_in_flight).
		n, size := int64(0), int64(0)
		fetches.EachRecord(func(r *kgo.Record) { n, size = n+1, size+recordBytes(r) })
		p.deps.budget.add(n, size)
		err := p.round(ctx, hard, sess, fetches)
		p.deps.budget.add(-n, -size)
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

// sessionMustEnd notes, in exactly-once mode, that a revocation or a loss
// reached dam: franz-go's transact session passes on no other one until
// End clears its flags, so the session is ended as soon as the poll in
// flight returns (endSession), round or not. Without it, an idle member
// never heard of a second revocation, and kept workers for partitions it
// no longer had.
func (p *Pipeline) sessionMustEnd() {
	if !p.deps.transactional {
		return
	}
	p.unended.Store(true)
	p.roundMu.Lock()
	stop := p.pollStop
	p.roundMu.Unlock()
	if stop != nil {
		stop()
	}
}

// endSession ends the transact session outside a transaction (nothing to
// abort), which clears franz-go's revoked and lost flags, and puts the
// partitions back where their workers are (End rewinds them).
func (p *Pipeline) endSession(hard context.Context, sess *kgo.GroupTransactSession) {
	p.unended.Store(false)
	ctx, cancel := context.WithTimeout(hard, p.cfg.Kafka.TransactionTimeout)
	defer cancel()
	if _, err := sess.End(ctx, kgo.TryAbort); err != nil {
		p.log.Warn("ending the transact session after a revocation failed", zap.Error(err))
	}
	p.reposition()
}

// reposition sets each partition's fetch position to where its worker
// continues (eosState.taken). franz-go's End, when it does not commit,
// rewinds every partition it tracks to the offset it believes committed,
// including partitions that were not in the round, and that belief is not
// dam's: a replay held across rounds would read records again, or a
// round's commit held back would be skipped over.
func (p *Pipeline) reposition() {
	set := map[string]map[int32]kgo.EpochOffset{}
	p.mu.Lock()
	for topic, parts := range p.workers {
		for part, w := range parts {
			if w.eos.replanning || w.health.isParked() || w.eos.taken < 0 {
				continue
			}
			if set[topic] == nil {
				set[topic] = map[int32]kgo.EpochOffset{}
			}
			set[topic][part] = kgo.EpochOffset{Epoch: -1, Offset: w.eos.taken}
		}
	}
	p.mu.Unlock()
	if len(set) > 0 {
		p.client.SetOffsets(set)
	}
}

// onBlocked is told that a rebalance waits for the poll this process
// holds: the round in flight stops retrying (an outage) and gives the poll
// back; a round making progress finishes.
func (p *Pipeline) onBlocked(context.Context, *kgo.Client) {
	<-p.clientSet
	p.roundMu.Lock()
	stop := p.roundStop
	p.roundMu.Unlock()
	if stop != nil {
		stop()
	}
}

// roundPart is one partition's share of a round.
type roundPart struct {
	w    *worker
	recs []*kgo.Record
	jobs []*job // to deliver in this round; none while a replay is held
	err  error
}

// roundPoll returns the most records a round polls: the in-flight budget
// (max_in_flight per assigned partition), or everything buffered when that
// is at most twice as many. With a backlog, each transaction's fixed costs
// (the decide transactions, AddOffsets, TxnOffsetCommit, a heartbeat,
// EndTxn) are shared by that many records; caught up, a round is what
// arrived since the last one. The buffer is taken whole when it can be
// because franz-go fetches from a broker again only once its buffered fetch
// is polled whole: a fetch split by the budget leaves a remainder of a
// partition or two, which made a round of its own that decided them alone
// while the other CPU waited (a tenth of a backlog's time).
func (p *Pipeline) roundPoll(cl *kgo.Client) int {
	return roundSize(p.cfg.Pipeline.MaxInFlight*max(1, int(p.deps.budget.partitions.Load())), int(cl.BufferedFetchRecords()))
}

// roundSize is roundPoll's rule: budget records, or all buffered ones when
// they are more than budget and at most twice as many.
func roundSize(budget, buffered int) int {
	if buffered > budget && buffered <= 2*budget {
		return buffered
	}
	return budget
}

// round decides what was polled and delivers it in one transaction. It
// returns nil once the transaction committed (or there was nothing to do);
// otherwise the error, after the round's partitions are set to be planned
// again. Its phases: take the polled records (roundParts), decide them
// (decideParts), produce what they deliver (produceRound), and end the
// transaction with the offsets the jobs allow (endRound).
func (p *Pipeline) round(ctx, hard context.Context, sess *kgo.GroupTransactSession, fetches kgo.Fetches) error {
	polled := time.Now()
	parts := p.roundParts(fetches)
	if len(parts) == 0 {
		return nil
	}
	retryCtx, stopRetries := context.WithCancel(ctx)
	p.roundMu.Lock()
	p.roundStop = stopRetries
	p.roundMu.Unlock()
	defer func() {
		p.roundMu.Lock()
		p.roundStop = nil
		p.roundMu.Unlock()
		stopRetries()
	}()

	if err := p.decideParts(hard, retryCtx, parts, polled); err != nil {
		return p.uncommitted(hard, sess, parts, err)
	}
	commits := p.roundCommits(parts)
	produce := false
	for _, rp := range parts {
		for _, j := range rp.jobs {
			produce = produce || len(j.out) > 0
		}
	}
	if !produce && len(commits) == 0 {
		// Only held replays and catch-up: nothing to deliver or commit.
		p.delivered(parts)
		return nil
	}
	if err := p.produceRound(hard, sess, parts); err != nil {
		return p.uncommitted(hard, sess, parts, err)
	}
	if err := p.endRound(hard, sess, commits); err != nil {
		return p.uncommitted(hard, sess, parts, err)
	}
	p.delivered(parts)
	p.recordDelivered(hard, commits)
	return nil
}

// roundParts takes what was polled for the round: each partition's
// records that its worker has not taken yet.
func (p *Pipeline) roundParts(fetches kgo.Fetches) []*roundPart {
	var parts []*roundPart
	fetches.EachPartition(func(ftp kgo.FetchTopicPartition) {
		w := p.worker(ftp.Topic, ftp.Partition)
		if w != nil {
			w.sawEnd(ftp.HighWatermark)
		}
		if len(ftp.Records) == 0 {
			return
		}
		if w == nil || w.health.isParked() || w.eos.replanning {
			// Revoked meanwhile (the transaction aborts: franz-go sees the
			// revocation), halted, or waiting to be planned again: its
			// records are not decided here, and the round commits nothing
			// of it (roundCommits names only the partitions it decided).
			if w != nil && w.health.isParked() {
				p.holdHalted(w)
			}
			return
		}
		recs := ftp.Records
		if i := sort.Search(len(recs), func(i int) bool { return recs[i].Offset >= w.eos.taken }); i > 0 {
			// Read again after franz-go rewound the partition: the worker
			// has them already.
			recs = recs[i:]
			if len(recs) == 0 {
				return
			}
		}
		parts = append(parts, &roundPart{w: w, recs: recs})
	})
	return parts
}

// decideParts is a round's first phase: it decides every part, partitions
// in parallel, and returns the errors joined. A partition whose error no
// retry fixes halts.
func (p *Pipeline) decideParts(hard, retryCtx context.Context, parts []*roundPart, polled time.Time) error {
	var wg sync.WaitGroup
	for _, rp := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := rp.w
			ops, stopOps := mergeCtx(w.dctx, hard)
			retries, stopR := mergeCtx(w.dctx, retryCtx)
			w.eos.ops, w.eos.retry = ops, retries
			rp.jobs, rp.err = w.decideRound(rp.recs, polled)
			w.eos.taken = rp.recs[len(rp.recs)-1].Offset + 1
			w.eos.ops, w.eos.retry = nil, nil
			stopOps()
			stopR()
			if rp.err != nil {
				return
			}
			if rp.jobs == nil {
				// A replay not complete yet: held (see decideRound).
				w.acct.take(len(rp.recs), recordsBytes(rp.recs))
				return
			}
			for _, j := range rp.jobs {
				w.precheck(j)
				if j.stuck > 0 {
					s := j.out[j.stuck-1]
					rp.err = w.stuckErr(s)
					break
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
		if rp.w.dctx.Err() == nil && !dedup.Transient(rp.err) && !errors.Is(rp.err, context.Canceled) {
			// Not stopped meanwhile, and not an outage: it halts.
			rp.w.park(rp.err)
			p.holdHalted(rp.w)
		}
	}
	return cause
}

// produceRound is a round's second phase: it begins the transaction and
// produces every record the round delivers, waiting for each. Not before
// every partition is decided: the broker's transaction timeout runs from
// the first record produced, and a decide retrying through a lock or an
// outage has no bound; a transaction timed out fences the producer, which
// stops the instance.
func (p *Pipeline) produceRound(hard context.Context, sess *kgo.GroupTransactSession, parts []*roundPart) error {
	if err := sess.Begin(); err != nil {
		// franz-go recovers what can be recovered before it refuses to
		// begin: a producer that cannot begin never will (a newer
		// producer with this transactional id can leave it in
		// INVALID_TXN_STATE rather than PRODUCER_FENCED).
		return fmt.Errorf("%w %q: beginning a transaction: %w", errProducerFenced, p.transactionalID(), err)
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
				sess.Produce(hard, o.rec, func(_ *kgo.Record, err error) {
					defer pwg.Done()
					if err == nil {
						return
					}
					mu.Lock()
					defer mu.Unlock()
					switch {
					case refusedForGood(err) && o.outcome == outcomeRefused:
						rp.w.eos.letterRefusedAt[o.src.Offset] = err // its replay halts there
					case refusedForGood(err):
						rp.w.eos.refusedAt[o.src.Offset] = err // its replay dead-letters it
					}
					if first == nil {
						first = fmt.Errorf("produce to %s: %w", o.rec.Topic, err)
					}
				})
			}
		}
		if len(rp.jobs) > 0 {
			rp.w.step(StepProducing)
		}
	}
	pwg.Wait()
	if first != nil {
		return first
	}
	for _, rp := range parts {
		if len(rp.jobs) > 0 {
			rp.w.step(StepAcked)
		}
	}
	return nil
}

// endRound is a round's last phase: it commits the transaction, with the
// offsets commits names in place of those franz-go polled.
//
// End waits for a heartbeat between committing the offsets and EndTxn. If
// the group session broke meanwhile (a heartbeat lost with its
// connection), franz-go's manage loop waits for AllowRebalance, which
// comes after End, and End waits for that loop: bounded by the
// transaction timeout (past it the broker aborts the transaction anyway),
// End gives up, aborts, and franz-go re-initializes the producer id on the
// abort that follows (uncommitted), which fences whatever is left.
func (p *Pipeline) endRound(hard context.Context, sess *kgo.GroupTransactSession, commits map[string]map[int32]kgo.EpochOffset) error {
	endCtx, cancel := context.WithTimeout(hard, p.cfg.Kafka.TransactionTimeout)
	committed, err := sess.End(kgo.PreTxnCommitFnContext(endCtx, rewriteCommits(commits)), kgo.TryCommit)
	cancel()
	p.unended.Store(false)
	if err != nil || !committed {
		if err == nil {
			err = errors.New("the transaction was aborted (a rebalance, or the group fenced this member)")
		}
		return p.fenced(err)
	}
	return nil
}

// delivered accounts for the jobs a committed round delivered.
func (p *Pipeline) delivered(parts []*roundPart) {
	for _, rp := range parts {
		if rp.jobs == nil {
			continue // held
		}
		for _, j := range rp.jobs {
			rp.w.delivered(j)
		}
		rp.w.dropRound()
		rp.w.health.resume(sideDeliver)
	}
}

// recordDelivered records the offsets a round committed in the store
// (dedup.Progress.Delivered), in one statement: a recovery that finds no
// committed offset in Kafka later (the group's offsets expired) then
// replays nothing the round delivered. If it fails, the next decide of
// each partition records them with its batch.
func (p *Pipeline) recordDelivered(ctx context.Context, commits map[string]map[int32]kgo.EpochOffset) {
	var ds []dedup.Delivered
	for topic, parts := range commits {
		for part, eo := range parts {
			ds = append(ds, dedup.Delivered{Partition: dedup.Partition{Group: p.cfg.Kafka.Group, Topic: topic, Partition: part}, Offset: eo.Offset})
		}
	}
	if len(ds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, p.deps.set.storeTimeout)
	defer cancel()
	if err := p.store.SetDelivered(ctx, ds); err != nil && ctx.Err() == nil {
		p.log.Warn("recording the committed offsets in the store failed; the next decides record them", zap.Error(err))
	}
}

// roundCommits returns the offsets a round's transaction may commit: for
// each partition that delivers in it, what its last job allows (commitTo),
// and only when it is past the committed offset C. A catch-up below C, an
// entity owed by a replay and a partition whose records the round did not
// decide commit nothing: the transaction must not move C backwards, past
// an owed entity, or past undecided records. A partition that produces
// records without moving C re-commits C, so that the transaction's offset
// commit, fenced by the group's generation (KIP-447), covers what it
// produces.
func (p *Pipeline) roundCommits(parts []*roundPart) map[string]map[int32]kgo.EpochOffset {
	out := map[string]map[int32]kgo.EpochOffset{}
	for _, rp := range parts {
		w := rp.w
		at := kgo.EpochOffset{Epoch: -1, Offset: -1}
		produces := false
		for _, j := range rp.jobs {
			if j.commitTo > at.Offset {
				at = kgo.EpochOffset{Epoch: j.epoch, Offset: j.commitTo}
			}
			produces = produces || len(j.out) > 0
		}
		switch {
		case at.Offset > w.committed:
		case produces && w.committed >= 0:
			at = kgo.EpochOffset{Epoch: -1, Offset: w.committed}
		default:
			continue
		}
		if out[w.part.Topic] == nil {
			out[w.part.Topic] = map[int32]kgo.EpochOffset{}
		}
		out[w.part.Topic][w.part.Partition] = at
	}
	return out
}

// rewriteCommits returns the hook that makes a transaction's offset commit
// hold exactly commits, in place of every offset franz-go polled.
func rewriteCommits(commits map[string]map[int32]kgo.EpochOffset) func(*kmsg.TxnOffsetCommitRequest) error {
	return func(req *kmsg.TxnOffsetCommitRequest) error {
		ids := make(map[string][16]byte, len(req.Topics))
		for _, t := range req.Topics {
			ids[t.Topic] = t.TopicID
		}
		req.Topics = req.Topics[:0]
		for _, topic := range slices.Sorted(maps.Keys(commits)) {
			rt := kmsg.NewTxnOffsetCommitRequestTopic()
			rt.Topic, rt.TopicID = topic, ids[topic]
			for _, part := range slices.Sorted(maps.Keys(commits[topic])) {
				eo := commits[topic][part]
				rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
				rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = part, eo.Offset, eo.Epoch, &req.MemberID
				rt.Partitions = append(rt.Partitions, rp)
			}
			req.Topics = append(req.Topics, rt)
		}
		return nil
	}
}

// mergeCtx returns a context canceled when either a or b is.
func mergeCtx(a, b context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(a)
	stop := context.AfterFunc(b, func() { cancel(context.Cause(b)) })
	return ctx, func() { stop(); cancel(nil) }
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
// transaction holds (the session rewinds to the committed offsets) and sets
// each partition of the round to be planned again from Kafka's committed
// offset (replanPending): the transaction may have committed after all.
func (p *Pipeline) uncommitted(hard context.Context, sess *kgo.GroupTransactSession, parts []*roundPart, cause error) error {
	ctx := hard
	if ctx.Err() != nil {
		// Given up at shutdown: end what can be ended, briefly; the next
		// owner's recovery settles the rest.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(p.base, time.Second)
		defer cancel()
	}
	if _, err := sess.End(ctx, kgo.TryAbort); err != nil {
		cause = errors.Join(cause, p.fenced(fmt.Errorf("ending the transaction: %w", err)))
	}
	p.unended.Store(false)
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
		w.dropRound()
		w.eos.replanning = true
		// Not fetched until it is planned again: what is buffered of it
		// would be read from the wrong place.
		p.client.PauseFetchPartitions(map[string][]int32{w.part.Topic: {w.part.Partition}})
	}
	// The abort rewound every partition to franz-go's idea of its
	// committed offset, those not in the round too.
	p.reposition()
	return cause
}

// replanPending plans again the partitions whose round did not commit, one
// attempt each, and reports whether some still wait (the store or the
// broker does not answer: they stay paused and not fetched, and are tried
// again after the next poll).
func (p *Pipeline) replanPending(ctx context.Context) (pending bool) {
	p.mu.Lock()
	var ws []*worker
	for _, parts := range p.workers {
		for _, w := range parts {
			if w.eos.replanning {
				ws = append(ws, w)
			}
		}
	}
	p.mu.Unlock()
	for _, w := range ws {
		if w.dctx.Err() != nil || w.health.isParked() {
			w.eos.replanning = false
			continue
		}
		err := p.replan(ctx, w)
		switch {
		case err == nil:
			w.eos.replanning = false
			w.health.resume(sideDeliver)
			p.client.ResumeFetchPartitions(map[string][]int32{w.part.Topic: {w.part.Partition}})
		case w.dctx.Err() != nil || ctx.Err() != nil:
		case errors.Is(err, dedup.ErrFenced) || !transientReplan(err):
			w.eos.replanning = false
			w.park(err)
			p.holdHalted(w)
		default:
			pending = true
			w.health.pause(sideDeliver, err)
			w.log.Warn("planning the partition again after an uncommitted round failed; it stays paused and is tried again", zap.Error(err))
		}
	}
	return pending
}

// transientReplan reports an error of replan that a later attempt may not
// have: an outage of the store or of Kafka (anything but a store error
// that is not an outage).
func transientReplan(err error) bool {
	var storeErr *storeError
	return !errors.As(err, &storeErr) || dedup.Transient(storeErr.err)
}

// storeError marks an error of the store in replan.
type storeError struct{ err error }

func (e *storeError) Error() string { return e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

// replan runs recovery again, once, for a partition whose round did not
// commit: P from PostgreSQL, C from Kafka (require-stable: a transaction
// still in flight settles first), the plan, and the fetch position. The
// epoch is not bumped: the partition is still ours. A shutdown (ctx) ends
// it at once.
func (p *Pipeline) replan(parent context.Context, w *worker) error {
	base, stop := mergeCtx(w.dctx, parent)
	defer stop()
	ctx, cancel := w.storeCtx(base)
	prog, err := p.store.SettledProgress(ctx, w.part)
	cancel()
	if err != nil {
		return &storeError{err}
	}
	if prog.Epoch != w.epoch {
		return fmt.Errorf("%w: %s/%d: epoch %d, ours %d", dedup.ErrFenced, w.part.Topic, w.part.Partition, prog.Epoch, w.epoch)
	}
	// An offset commit in flight settles within the transaction timeout.
	kctx, kcancel := context.WithTimeout(base, p.cfg.Kafka.TransactionTimeout+5*time.Second)
	committed, err := p.fetchCommitted(kctx, w.part.Topic, []int32{w.part.Partition})
	kcancel()
	if err != nil {
		return fmt.Errorf("reading the committed offset: %w", err)
	}
	c, hasC := committed[w.part.Partition]
	ctx, cancel = w.storeCtx(base)
	r, err := p.planPartition(ctx, w.rt, w.part, prog, c, hasC)
	cancel()
	if err != nil {
		return &storeError{err}
	}
	w.plan, w.next, w.eos.fetchFrom, w.pending, w.eos.taken = r.plan, r.next, r.startAt, nil, r.startAt
	w.startAt.Store(r.startAt)
	w.setCommitted(r.committed)
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
		at = w.eos.fetchFrom
	}
	if at < 0 {
		return // never recovered: nothing of it was fetched from a known place
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
// up to pipeline.max_batch, and returns the jobs the round delivers: every
// job decided and not yet delivered. While a replay is not complete it
// returns none and holds its jobs: a replay is delivered whole, in one
// transaction with the commit of its end. Delivering part of it and
// committing less (an entity owed by the replay holds the commit back)
// would deliver that part again at the next replay; committing more would
// forget the owed entity.
func (w *worker) decideRound(recs []*kgo.Record, polled time.Time) ([]*job, error) {
	for len(recs) > 0 {
		n := min(len(recs), w.d.set.maxBatch)
		if err := w.process(recs[:n], polled); err != nil {
			return nil, err
		}
		recs = recs[n:]
	}
	if w.plan.replay != nil {
		return nil, nil
	}
	return w.eos.round, nil
}

// dropRound forgets the jobs not delivered (delivered, or to be decided
// again after a new plan) and gives back what they held of the budget.
func (w *worker) dropRound() {
	w.eos.round = nil
	w.acct.giveAll()
}
