package pipeline

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/retry"
)

// Step 2 of DESIGN §2, deliver: produce a job's forwarded records and dead
// letters (acks=all, idempotent producer), wait for every ack, then commit
// the job's offset. Jobs are delivered strictly in order; this is the only
// place offsets are committed.

// job is one decided batch (or a part of a replay) on its way to Kafka.
type job struct {
	out      []outRecord
	commitTo int64 // offset to commit after the acks; 0: none
	epoch    int32 // leader epoch of the input record before commitTo
	polled   time.Time
	counts   outcomes // counted once delivered
	halt     error    // set on the last job before a halt
	stuck    int      // index+1 of a record refused for good with nowhere to go; 0: none
	inputs   int      // input records taken for it (the budget's)
	inBytes  int64    // their size (recordBytes)
}

// outRecord is a record to produce and the input record it comes from.
type outRecord struct {
	rec     *kgo.Record
	src     *kgo.Record
	outcome outcome
	acked   bool
	err     error // why Kafka refused it, once it did
}

func (j *job) add(rec, src *kgo.Record, o outcome) {
	j.out = append(j.out, outRecord{rec: rec, src: src, outcome: o})
	j.counts[o]++
}

// deliverLoop delivers the jobs in order until the decider closes the
// channel or the worker stops.
func (w *worker) deliverLoop() {
	for j := range w.jobs {
		if err := w.deliver(j); err != nil {
			if w.ctx.Err() == nil {
				w.park(err)
				w.cancel() // the decider may wait to send: nothing more is delivered
			}
			return
		}
		w.delivered(j)
	}
}

// delivered accounts for a job once its records are acknowledged and its
// offset committed: the outcome counters, the latency, the log's pruning.
func (w *worker) delivered(j *job) {
	if !w.d.transactional {
		w.acct.give(j.inputs, j.inBytes)
		w.resumeUnderShare()
	}
	for o, n := range j.counts {
		if n > 0 {
			w.d.metrics.records.WithLabelValues(w.rt.service, outcome(o).String()).Add(float64(n))
			if outcome(o) == outcomeInvalid || outcome(o) == outcomeRefused {
				w.d.metrics.deadLetters.WithLabelValues(w.rt.service, outcome(o).String()).Add(float64(n))
			}
		}
	}
	if j.commitTo > 0 {
		if j.commitTo > w.committed { // (never back: commit set it already)
			w.setCommitted(j.commitTo)
		}
		w.proven()
		w.d.metrics.pollToCommit.WithLabelValues(w.rt.service).Observe(time.Since(j.polled).Seconds())
		w.noteDelivered()
	}
}

// deliver produces and commits one job, retrying with capped backoff until
// it succeeds, the worker stops, or the partition must halt.
func (w *worker) deliver(j *job) error {
	_, err := retryStep(w, sideDeliver, "delivery", w.d.metrics.deliverErrors, func() (struct{}, error) {
		if err := w.checkOwner(); err != nil {
			return struct{}{}, err
		}
		if err := w.produce(j); err != nil {
			return struct{}{}, err
		}
		if j.stuck > 0 {
			// Everything else is delivered: commit up to the refused
			// record, so the partition resumes there, and halt.
			s := j.out[j.stuck-1]
			if s.src.Offset > w.committed {
				if err := w.commit(s.src.Offset, -1); err != nil {
					return struct{}{}, err
				}
			}
			return struct{}{}, retry.Permanent(w.stuckErr(s))
		}
		if j.commitTo > 0 {
			w.step(StepAcked)
			if err := w.commit(j.commitTo, j.epoch); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	})
	return err
}

// produce hands the job's records not yet acknowledged to the producer and
// waits for every promise, so that an acknowledged record is never
// produced again. A record Kafka refuses for good (too large, invalid) is
// replaced by a dead letter without its value, produced at once; if the
// route has no dead-letter topic, or even that letter is refused, the job
// is marked stuck at it, and the records after it are not produced (unless
// the broker refused it, after they were sent). Any other failure is
// returned, to be retried.
func (w *worker) produce(j *job) error {
	w.precheck(j)
	for {
		var (
			wg      sync.WaitGroup
			errs    = make([]error, len(j.out))
			pending int
		)
		end := len(j.out)
		if j.stuck > 0 {
			end = j.stuck - 1
		}
		for i := range j.out[:end] {
			if j.out[i].acked {
				continue
			}
			pending++
			wg.Add(1)
			w.d.client.Produce(w.ctx, j.out[i].rec, func(_ *kgo.Record, err error) {
				errs[i] = err
				wg.Done()
			})
		}
		if pending == 0 {
			return nil
		}
		w.step(StepProducing)
		wg.Wait()
		var first error
		replaced := false
		for i := range j.out[:end] {
			o := &j.out[i]
			if o.acked {
				continue
			}
			err := errs[i]
			switch {
			case err == nil:
				o.acked = true
			case refusedForGood(err):
				if !w.refuse(j, i, err) && (j.stuck == 0 || i < j.stuck-1) {
					j.stuck = i + 1
				}
				replaced = true
			case first == nil:
				first = fmt.Errorf("produce to %s: %w", o.rec.Topic, err)
			}
		}
		if first != nil || !replaced {
			return first
		}
	}
}

// precheck refuses, before they are sent, the records larger than their
// topic accepts (what the producer would refuse at once) and those Kafka
// refused in an aborted round (exactly-once): so that, on a route without
// a dead-letter topic, nothing after such a record is delivered before the
// partition halts at it. A dead letter that replaced a refused record is
// checked too: refused in its turn, the partition halts at its record.
func (w *worker) precheck(j *job) {
	for i := 0; i < len(j.out); {
		o := &j.out[i]
		if o.acked {
			i++
			continue
		}
		limit := int(w.d.limits.get(o.rec.Topic))
		err := w.eos.refusedAt[o.src.Offset]
		if o.outcome == outcomeRefused {
			err = w.eos.letterRefusedAt[o.src.Offset]
		}
		if n := recordBatchSize(o.rec); err == nil && n > limit {
			err = fmt.Errorf("%w (the record takes %d bytes in a batch of its own; %s accepts %d)", kerr.MessageTooLarge, n, o.rec.Topic, limit)
		}
		if err != nil {
			if !w.refuse(j, i, err) {
				j.stuck = i + 1
				return
			}
			continue // check the dead letter that replaced it
		}
		i++
	}
}

// stuckErr is the halt of a partition at a record Kafka refuses for good
// (s), with nowhere to send it.
func (w *worker) stuckErr(s outRecord) error {
	why := fmt.Sprintf("route %s has no dead_letter topic", w.rt.service)
	if w.rt.dlq != "" {
		why = "its dead letter, without the value, was refused too"
	}
	return fmt.Errorf("%w: %s/%d offset %d: Kafka refuses the record for good and %s: %s; %s",
		ErrHalted, s.src.Topic, s.src.Partition, s.src.Offset, why, boundDetail(s.err.Error()), skipHint(s.src.Topic, s.src.Partition, s.src.Offset))
}

// recordBatchSize is the size of a record batch holding r alone, as
// Kafka's v2 format encodes it and as max.message.bytes bounds it.
func recordBatchSize(r *kgo.Record) int {
	const batchHeader = 61
	body := 1 + 1 + 1 // attributes, timestamp delta 0, offset delta 0
	body += varintLen(len(r.Key)) + len(r.Key)
	if r.Key == nil {
		body = body - varintLen(0) + varintLen(-1)
	}
	body += varintLen(len(r.Value)) + len(r.Value)
	if r.Value == nil {
		body = body - varintLen(0) + varintLen(-1)
	}
	body += varintLen(len(r.Headers))
	for _, h := range r.Headers {
		body += varintLen(len(h.Key)) + len(h.Key) + varintLen(len(h.Value)) + len(h.Value)
	}
	return batchHeader + varintLen(body) + body
}

// varintLen is the length of n as a zigzag varint.
func varintLen(n int) int {
	u := uint64((n << 1) ^ (n >> 63))
	l := 1
	for u >= 0x80 {
		u >>= 7
		l++
	}
	return l
}

// refusedForGood reports a produce error caused by the record itself, which
// no retry can fix. Everything else (a broker down, a missing topic, an
// authorization error) is retried: it needs the cluster or an operator, not
// a dead letter.
func refusedForGood(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.InvalidTimestamp)
}

// refuse replaces j.out[i], refused by Kafka with err, by a dead letter
// without the value (and without the input's headers: either may be what
// made it too large), or reports false when there is nowhere to send it.
func (w *worker) refuse(j *job, i int, err error) bool {
	o := &j.out[i]
	if w.rt.dlq == "" || o.outcome == outcomeRefused {
		o.err = err
		return false
	}
	w.log.Error("Kafka refused a record for good: dead-lettered without its value",
		zap.Int64("offset", o.src.Offset), zap.String("dead_letter", w.rt.dlq), zap.Int("value_bytes", len(o.src.Value)), zap.Error(err))
	j.counts[o.outcome]--
	j.counts[outcomeRefused]++
	*o = outRecord{rec: w.rt.refusedLetter(o.src, err), src: o.src, outcome: outcomeRefused, err: err}
	return true
}

// checkOwner makes sure the partition is still ours before records are
// handed to the producer, when the last proof of it is older than the
// lease: a process paused past the group session (a zombie) must not
// deliver after the next owner started. The epoch in PostgreSQL is the
// proof (every new owner bumps it first); while PostgreSQL is down, an
// offset commit accepted in our group generation is.
func (w *worker) checkOwner() error {
	if time.Since(time.Unix(0, w.provenAt.Load())) < w.d.set.lease {
		return nil
	}
	ctx, cancel := w.storeCtx(w.ctx)
	prog, err := w.d.store.ReadProgress(ctx, w.part)
	cancel()
	if err == nil {
		if prog.Epoch != w.epoch {
			return retry.Permanent(fmt.Errorf("%w: %s/%d: epoch %d, ours %d", dedup.ErrFenced, w.part.Topic, w.part.Partition, prog.Epoch, w.epoch))
		}
		w.proven()
		return nil
	}
	if w.committed >= 0 {
		if cerr := w.commit(w.committed, -1); cerr == nil {
			return nil
		}
	}
	return fmt.Errorf("checking that the partition is still ours: %w", err)
}

// commit commits the partition's offset and returns once it is answered
// (coalesced with the other partitions' commits: committer).
func (w *worker) commit(offset int64, epoch int32) error {
	cerr := w.d.commits.commit(w.ctx, w.part.Topic, w.part.Partition, kgo.EpochOffset{Epoch: epoch, Offset: offset})
	if cerr == nil {
		w.setCommitted(offset)
		w.proven()
	}
	return cerr
}

// noteDelivered records the committed offset in the store now and then
// (progress.delivered): the decision log below it is delivered, history
// that recovery never replays, even when Kafka has no committed offset any
// more. The log itself is kept for decision_log.keep and pruned off this
// path (logkeep.go).
func (w *worker) noteDelivered() {
	if w.d.transactional || time.Since(w.lastNote) < w.d.set.noteEvery {
		// (Exactly-once: each round records its commits, recordDelivered.)
		return
	}
	w.lastNote = time.Now()
	ctx, cancel := w.storeCtx(w.ctx)
	defer cancel()
	if err := w.d.store.SetDelivered(ctx, []dedup.Delivered{{Partition: w.part, Offset: w.committed}}); err != nil && w.ctx.Err() == nil {
		w.log.Warn("recording the committed offset in the store failed; it is retried later", zap.Error(err))
	}
}
