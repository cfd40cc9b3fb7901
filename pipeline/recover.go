package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/retry"
)

// Recovery (DESIGN §2) runs when partitions are assigned, in franz-go's
// AdjustFetchOffsetsFn, before any record of them is fetched:
//
//  1. bump each partition's fencing epoch in PostgreSQL (dedup.Acquire): a
//     previous owner can no longer decide;
//  2. then read Kafka's committed offsets C (require-stable), so an old
//     owner's last commit is either seen or fenced;
//  3. check the input topic against the progress (recreated, truncated:
//     halt), compare C with P and plan (planRecovery, in plan.go, a pure
//     function of what was read):
//     - no P, no C: P := the start offset (kafka.start), set at once, so a
//     crash before the first decision cannot skip what was produced
//     meanwhile;
//     - no P: P := C;
//     - C = P: continue from P;
//     - C < P, and the log covers [C, P) (from the delivered offset dam
//     recorded, if higher: what it delivered is not delivered again):
//     re-read that range and deliver exactly the records the log marks
//     (replay), then continue from P;
//     - C < P without such a log (offsets moved back by hand): continue
//     from P;
//     - no C (it expired), with log rows: replay from the log's start (or
//     the delivered offset dam recorded, if higher); without: continue
//     from P;
//     - C > P (offsets moved forward, or the state restored from a
//     backup): decide [P, C) without forwarding (catch up), then continue.
//
// The worker then carries the plan out (replay below, catch-up in
// decide.go) as the records arrive.

// plan is what a worker must do before deciding normally.
type plan struct {
	replay    *replay // non-nil: deliver the logged decisions up to replay.until
	catchUpTo int64   // > P: decide [P, catchUpTo) without forwarding
}

// replay re-delivers the logged decisions of [from, until).
type replay struct {
	until int64
	log   []dedup.LoggedDecision // entries not reached yet, in offset order
	// owed: entities whose logged forward could not be read (retention or
	// compaction removed it), with that forward's offset. Each entity's
	// next readable record in the range is delivered, even one logged as
	// its duplicate; an entity still owed at the end has its state reset,
	// so that its next record is forwarded: a possible duplicate, never a
	// loss.
	owed map[string]int64
	// versions: in version mode, the stored version of owed entities.
	versions map[string]int64
}

// recovered is one partition's recovery result.
type recovered struct {
	epoch     int64
	next      int64 // P
	committed int64 // C; -1: none
	plan      plan
	start     kgo.Offset // where fetching starts
	startAt   int64      // its offset
	// halt: the partition cannot go on (its input lost records dam had
	// decided): it is assigned halted, and nothing of it is fetched.
	halt error
}

// inputInfo is what recovery checks the progress against: the input
// topic's id and each partition's end (high watermark).
type inputInfo struct {
	id   [16]byte
	ends map[int32]int64
}

// readInput reads the id and the partitions' ends of an input topic.
func (p *Pipeline) readInput(ctx context.Context, topic string) (inputInfo, error) {
	adm := kadm.NewClient(p.client)
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return inputInfo{}, err
	}
	d, ok := td[topic]
	if !ok {
		return inputInfo{}, fmt.Errorf("topic %s missing from the metadata", topic)
	}
	if d.Err != nil {
		return inputInfo{}, fmt.Errorf("topic %s: %w", topic, d.Err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return inputInfo{}, err
	}
	in := inputInfo{id: d.ID, ends: map[int32]int64{}}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			in.ends[o.Partition] = o.Offset
		}
	})
	return in, nil
}

// recoverPartitions runs recovery for newly assigned partitions of one
// route. It waits for PostgreSQL and Kafka as long as it takes (the
// partitions stay unfetched meanwhile: pause, not guess), until ctx ends
// (the group session is revoked).
func (p *Pipeline) recoverPartitions(ctx context.Context, rt *route, parts []int32) (map[int32]recovered, error) {
	log := p.log.With(zap.String("service", rt.service), zap.String("topic", rt.from))
	notify := func(what string) retry.Notify {
		return func(err error, wait time.Duration) {
			log.Warn("recovery: "+what+" failed: retrying", zap.Int32s("partitions", parts), zap.Duration("retry_in", wait), zap.Error(err))
		}
	}
	out := make(map[int32]recovered, len(parts))
	// 1. Fence the previous owners.
	progress := make(map[int32]dedup.Progress, len(parts))
	for _, part := range parts {
		dp := p.dpart(rt, part)
		prog, err := retry.Do(ctx, p.retry, notify("acquire"), storeOp(func() (dedup.Progress, error) {
			ctx, cancel := context.WithTimeout(ctx, p.deps.set.storeTimeout)
			defer cancel()
			return p.store.Acquire(ctx, dp)
		}))
		if err != nil {
			return nil, err
		}
		progress[part] = prog
	}
	// 2. Then read C.
	committed, err := retry.Do(ctx, p.retry, notify("fetching committed offsets"), func() (map[int32]int64, error) {
		return p.fetchCommitted(ctx, rt.from, parts)
	})
	if err != nil {
		return nil, err
	}
	// 3. Read what the input holds now.
	input, err := retry.Do(ctx, p.retry, notify("reading the input topic"), func() (inputInfo, error) {
		return p.readInput(ctx, rt.from)
	})
	if err != nil {
		return nil, err
	}
	// 4. Plan.
	for _, part := range parts {
		dp := p.dpart(rt, part)
		prog := progress[part]
		c, hasC := committed[part]
		r, err := retry.Do(ctx, p.retry, notify("planning"), func() (recovered, error) {
			ctx, cancel := context.WithTimeout(ctx, p.deps.set.storeTimeout)
			defer cancel()
			in := p.planInput(dp, prog, c, hasC)
			in.input = &inputFacts{id: input.id}
			in.input.end, in.input.hasEnd = input.ends[part]
			return p.recoverPartition(ctx, rt, in)
		})
		if err != nil {
			return nil, err
		}
		out[part] = r
		fields := []zap.Field{zap.Int32("partition", part), zap.Int64("epoch", r.epoch), zap.Int64("progress", r.next)}
		if hasC {
			fields = append(fields, zap.Int64("committed", c))
		}
		if r.plan.replay != nil {
			fields = append(fields, zap.Int64("replay_until", r.plan.replay.until), zap.Int("replay_entries", len(r.plan.replay.log)))
		}
		if r.plan.catchUpTo > 0 {
			fields = append(fields, zap.Int64("catch_up_to", r.plan.catchUpTo))
		}
		if r.halt != nil {
			log.Error("partition assigned halted", append(fields, zap.Error(r.halt))...)
			continue
		}
		log.Info("partition assigned", fields...)
	}
	return out, nil
}

// planPartition plans a partition again while it stays ours (replan):
// its input is not checked.
func (p *Pipeline) planPartition(ctx context.Context, rt *route, dp dedup.Partition, prog dedup.Progress, c int64, hasC bool) (recovered, error) {
	return p.recoverPartition(ctx, rt, p.planInput(dp, prog, c, hasC))
}

// planInput is what recovery knows of a partition before reading more.
func (p *Pipeline) planInput(dp dedup.Partition, prog dedup.Progress, c int64, hasC bool) planInput {
	return planInput{part: dp, progress: prog, committed: c, hasCommitted: hasC, start: p.cfg.Kafka.Start}
}

// recoverPartition plans one partition (planRecovery), reading the facts
// the plan needs, and carries the plan out: P set on a first join, the
// replay's log entries, where fetching starts.
func (p *Pipeline) recoverPartition(ctx context.Context, rt *route, in planInput) (recovered, error) {
	dp, prog := in.part, in.progress
	r := recovered{epoch: prog.Epoch, next: prog.Next, committed: -1}
	var logged []dedup.LoggedDecision
	pl, err := planWith(in, func(n need, from int64, in *planInput) error {
		switch n {
		case needBind:
			bound, err := p.store.BindTopic(ctx, dp, prog.Epoch, in.input.id)
			if err != nil {
				return permanentUnlessOutage(err)
			}
			in.bound = &bound
		case needFirst:
			first, err := p.listedOffset(ctx, dp.Topic, dp.Partition, kadm.NewClient(p.client).ListStartOffsets)
			if err != nil {
				return err
			}
			in.first = &first
		case needLastStable:
			// The input is read read_committed: its end is the last
			// stable offset.
			end, err := p.listedOffset(ctx, dp.Topic, dp.Partition, kadm.NewClient(p.client).ListCommittedOffsets)
			if err != nil {
				return err
			}
			in.lastStable = &end
		case needLogStart:
			first, ok, err := p.store.LogStart(ctx, dp)
			if err != nil {
				return err
			}
			in.logStart = &logStartFact{first: first, ok: ok}
		case needLog:
			entries, covered, err := p.store.Logged(ctx, dp, from, prog.Next)
			if err != nil {
				return err
			}
			logged, in.log = entries, &logCover{from: from, covered: covered}
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	if pl.halt != nil {
		r.halt, r.start, r.startAt = pl.halt, kgo.NewOffset().At(prog.Next), prog.Next
		return r, nil
	}
	if in.hasCommitted {
		r.committed = in.committed
	}
	if pl.init {
		if err := p.store.InitProgress(ctx, dp, prog.Epoch, pl.startAt); err != nil {
			return r, permanentUnlessOutage(err)
		}
		if pl.firstJoin {
			p.logFirstStart(rt, dp.Partition, pl.startAt, pl.first)
		}
		r.next = pl.startAt
	}
	if pl.replay {
		r.plan.replay = &replay{until: prog.Next, log: logged}
	}
	r.plan.catchUpTo = pl.catchUpTo
	r.start, r.startAt = kgo.NewOffset().At(pl.startAt), pl.startAt
	return r, nil
}

// listedOffset is the offset of topic/part that list (a kadm listing:
// start offsets, last stable offsets) returns.
func (p *Pipeline) listedOffset(ctx context.Context, topic string, part int32, list func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
	listed, err := list(ctx, topic)
	if err != nil {
		return 0, err
	}
	o, ok := listed.Lookup(topic, part)
	if !ok {
		return 0, fmt.Errorf("listing offsets of %s/%d: partition missing from the reply", topic, part)
	}
	if o.Err != nil {
		return 0, fmt.Errorf("listing offsets of %s/%d: %w", topic, part, o.Err)
	}
	return o.Offset, nil
}

// logFirstStart logs where a partition starts on the group's first join
// (neither a committed offset nor a progress), and, with kafka.start:
// latest, how many earlier records it leaves behind: they are never
// decided nor forwarded (docs/cutover.md).
func (p *Pipeline) logFirstStart(rt *route, part int32, start, first int64) {
	fields := []zap.Field{zap.String("service", rt.service), zap.String("topic", rt.from), zap.Int32("partition", part),
		zap.String("kafka.start", p.cfg.Kafka.Start), zap.Int64("start", start)}
	switch skipped := start - first; {
	case p.cfg.Kafka.Start == config.StartEarliest:
		p.log.Info("first join: the partition starts at its first offset (kafka.start: earliest)", fields...)
	case skipped > 0:
		// Offsets, not records: compaction and transaction markers make
		// the records fewer.
		p.log.Warn("first join: the partition starts at its end (kafka.start: latest), leaving its earlier records behind: they are not forwarded (to start from the first, see docs/cutover.md)",
			append(fields, zap.Int64("first", first), zap.Int64("offsets_left_behind", skipped))...)
	default:
		p.log.Info("first join: the partition starts at its end (kafka.start: latest); it holds no earlier record", fields...)
	}
}

// fetchCommitted reads the group's committed offsets of topic's parts,
// waiting for pending transactional commits to settle (require-stable).
// A partition without a commit is absent from the result.
func (p *Pipeline) fetchCommitted(ctx context.Context, topic string, parts []int32) (map[int32]int64, error) {
	adm := kadm.NewClient(p.client)
	resps, err := adm.FetchOffsetsForTopics(kadm.RequireStable(ctx), p.cfg.Kafka.Group, topic)
	if err != nil {
		return nil, err
	}
	if err := resps.Error(); err != nil {
		return nil, err
	}
	out := make(map[int32]int64, len(parts))
	for _, part := range parts {
		if o, ok := resps.Lookup(topic, part); ok && o.At >= 0 {
			out[part] = o.At
		}
	}
	return out, nil
}

func permanentUnlessOutage(err error) error {
	if err != nil && !errors.Is(err, dedup.ErrUnavailable) {
		return retry.Permanent(err)
	}
	return err
}

// replay re-delivers the logged decisions of [C, P) from recs (the records
// from C on, as fetched: retention and compaction may have removed some),
// and returns the records past the replay. It commits as it goes, but never
// past an unreadable forward whose entity is still owed.
func (w *worker) replay(recs []*kgo.Record, polled time.Time) ([]*kgo.Record, error) {
	rp := w.plan.replay
	j := &job{polled: polled}
	i := 0
	for ; i < len(recs) && recs[i].Offset < rp.until; i++ {
		r := recs[i]
		rp.skipTo(r.Offset)
		if err := w.replayable(rp, r); err != nil {
			// Its record would be delivered (a logged forward, a forward
			// owed, a shadow copy) but cannot be read now: halt before
			// it, never deliver an empty stand-in in its place.
			j.halt = err
			return nil, w.emit(j)
		}
		var owedEntity []byte
		owed := false
		if len(rp.log) == 0 || rp.log[0].Offset != r.Offset {
			var err error
			if owedEntity, owed, err = w.owes(rp, r); err != nil {
				return nil, err
			}
		}
		if len(rp.log) > 0 && rp.log[0].Offset == r.Offset {
			e := rp.log[0]
			rp.log = rp.log[1:]
			switch e.Decision {
			case dedup.Forward:
				j.add(w.rt.output(r, false), r, outcomeRebuilt)
				delete(rp.owed, string(e.Entity))
			case dedup.Invalid:
				cause := loggedCause(w.rt, r, e)
				if w.rt.dlq == "" {
					// Its dead letter can go nowhere now: halt there,
					// as bad input does on a route without dead_letter,
					// rather than count it and drop it.
					j.halt = fmt.Errorf("%w: %s/%d offset %d: dead-lettered when decided (%s), and route %s has no dead_letter topic now: restore dead_letter and restart, or %s",
						ErrHalted, r.Topic, r.Partition, r.Offset, boundDetail(cause.Error()), w.rt.service, skipHint(r.Topic, r.Partition, r.Offset))
					return nil, w.emit(j)
				}
				j.add(w.rt.deadLetter(r, cause), r, outcomeRebuilt)
			case dedup.Skipped: // an operator's skip (dam state skip): never delivered
				j.counts[outcomeRebuilt]++
			}
		} else if owed {
			// A duplicate of a forward that can no longer be read: the
			// adapter may never have received this content.
			j.add(w.rt.output(r, false), r, outcomeRebuilt)
			delete(rp.owed, string(owedEntity))
		} else if w.rt.shadow {
			j.add(w.rt.output(r, true), r, outcomeRebuilt)
		} else {
			j.counts[outcomeRebuilt]++
		}
		if len(rp.owed) == 0 {
			j.commitTo, j.epoch = r.Offset+1, r.LeaderEpoch
		}
	}
	if i < len(recs) || (i > 0 && recs[i-1].Offset == rp.until-1) {
		// The replay is complete: what was not read is gone.
		rp.skipTo(rp.until)
		if len(rp.owed) > 0 {
			entities := make([][]byte, 0, len(rp.owed))
			for e := range rp.owed {
				entities = append(entities, []byte(e))
			}
			w.log.Warn("logged forwards can no longer be read and no later record of their entities is left before the progress; resetting the entities' state so that their next record is forwarded",
				zap.Int("entities", len(entities)))
			_, err := retryStep(w, sideDecide, "resetting unreadable entities", w.d.metrics.storeErrors, storeOp(func() (int64, error) {
				ctx, cancel := w.storeCtx(w.decideCtx())
				defer cancel()
				return w.d.store.Reset(ctx, w.rt.service, entities...)
			}))
			if err != nil {
				return nil, err
			}
			rp.owed = nil
		}
		w.plan.replay = nil
		j.commitTo, j.epoch = rp.until, -1
	}
	if len(j.out) > 0 || j.commitTo > 0 || j.counts != (outcomes{}) {
		if err := w.emit(j); err != nil {
			return nil, err
		}
	}
	return recs[i:], nil
}

// loggedCause is the cause of a dead letter the log holds: the one logged
// with it (what the first dead letter said, be it the record's content or
// the store's refusal of it), or, for a batch logged before the log kept
// causes, the record's content classified again.
func loggedCause(rt *route, r *kgo.Record, e dedup.LoggedDecision) error {
	if e.Cause != "" {
		return errors.New(e.Cause)
	}
	if _, err := rt.classify(r); err != nil {
		return err
	}
	return errors.New("invalid when decided (the route's configuration changed since)")
}

// skipTo passes over the log entries below offset: their records were not
// read (removed by retention or compaction). A dead letter is gone with its
// record; a forward makes its entity owed.
func (rp *replay) skipTo(offset int64) {
	for len(rp.log) > 0 && rp.log[0].Offset < offset {
		e := rp.log[0]
		rp.log = rp.log[1:]
		if e.Decision != dedup.Forward {
			continue
		}
		if rp.owed == nil {
			rp.owed = map[string]int64{}
		}
		if _, ok := rp.owed[string(e.Entity)]; !ok {
			rp.owed[string(e.Entity)] = e.Offset
		}
	}
}

// owes reports whether r, not logged as forwarded, is what the replay
// delivers for an owed entity (and which entity): the entity's next
// readable record. In version mode, only a record whose version is the one
// stored for the entity (the highest forwarded, which the unreadable
// forward had or a later logged forward has) is delivered: an older
// version, logged as stale, never is.
func (w *worker) owes(rp *replay, r *kgo.Record) ([]byte, bool, error) {
	if len(rp.owed) == 0 {
		return nil, false, nil
	}
	entity, version, _, err := w.rt.identify(r)
	if err != nil {
		return nil, false, nil
	}
	if _, ok := rp.owed[string(entity)]; !ok {
		return nil, false, nil
	}
	if w.rt.rule.Mode != dedup.Version {
		return entity, true, nil
	}
	if rp.versions == nil {
		rp.versions = map[string]int64{}
	}
	stored, ok := rp.versions[string(entity)]
	if !ok {
		// Settled: the batch that stored the version may still be
		// committing (on Citus, prepared on the entity's worker).
		v, err := retryStep(w, sideDecide, "reading an owed entity's version", w.d.metrics.storeErrors, func() (int64, error) {
			ctx, cancel := w.storeCtx(w.decideCtx())
			defer cancel()
			v, found, err := w.d.store.SettledVersion(ctx, w.rt.service, entity)
			switch {
			case err != nil && !errors.Is(err, dedup.ErrUnavailable):
				return v, retry.Permanent(err)
			case err == nil && !found:
				return math.MinInt64, nil
			}
			return v, err
		})
		if err != nil {
			return nil, false, err
		}
		stored = v
		rp.versions[string(entity)] = stored
	}
	return entity, version >= stored, nil
}

// errRecoverAgain parks a partition whose recovery failed on an error that
// retrying may fix: onJoined recovers it again, as a fenced one.
var errRecoverAgain = errors.New("pipeline: recovery failed on an error retrying may fix; it runs again after a rebalance")

// holdUnrecovered registers halted workers for partitions this member
// holds and could not recover (err): they stay visible (not ready,
// dam_halted), unfetched, and nothing of them is committed. Recovery cut
// short by a rebalance, or fenced, is tried again at the next join
// (onJoined takes fenced partitions back). So is recovery that failed on
// an error the store judges transient now, knowing its engine
// (dedup.Store.Transient: a Citus worker lost while the store believed its
// tables local), and this member asks for that join at once, as a fenced
// partition does: recovery takes the same error for an outage from then
// on, and waits it out. Any other error needs a person, and the partition
// stays halted until it is assigned anew.
func (p *Pipeline) holdUnrecovered(held map[string]map[int32]kgo.Offset, err error) {
	cause := fmt.Errorf("%w: recovery failed: %w", ErrHalted, err)
	again := false
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, dedup.ErrFenced):
		cause = fmt.Errorf("%w: recovery cut short (%w); it runs again at the next rebalance", dedup.ErrFenced, err)
	case p.transient(err):
		cause, again = fmt.Errorf("%w: %w", errRecoverAgain, err), true
	}
	if again {
		p.log.Warn("recovering partitions this member holds failed on an error retrying may fix: they wait, unfetched, and are recovered again after a rebalance", zap.Error(err))
	} else {
		p.log.Error("recovering partitions this member holds failed: they stay halted, and nothing of them is committed", zap.Error(err))
	}
	for topic, parts := range held {
		rt := p.routes[topic]
		if rt == nil {
			continue
		}
		for part := range parts {
			w := newWorker(p.base, p.deps, rt, part, recovered{committed: -1, startAt: -1},
				p.log.With(zap.String("service", rt.service), zap.String("topic", rt.from), zap.Int32("partition", part)))
			p.mu.Lock()
			if p.stopping || p.workers[topic][part] != nil {
				p.mu.Unlock()
				continue
			}
			if p.workers[topic] == nil {
				p.workers[topic] = map[int32]*worker{}
			}
			p.workers[topic][part] = w
			p.mu.Unlock()
			p.client.PauseFetchPartitions(map[string][]int32{topic: {part}})
			w.start()
			w.park(cause)
		}
	}
	if again {
		p.client.ForceRebalance()
	}
}

// transient reports whether a recovery error is one that retrying may
// fix, as the store judges it now (see holdUnrecovered).
func (p *Pipeline) transient(err error) bool {
	ctx, cancel := context.WithTimeout(p.runCtx, p.deps.set.storeTimeout)
	defer cancel()
	return p.store.Transient(ctx, err)
}

// replayable returns the halt of a replay at r when r stands for an
// offset of a batch past the decompression bound (undecompressable) and
// the replay would deliver it: a forward logged when the bound was
// higher (an operator lowered it, or upgraded from a dam without one),
// owed, or copied in shadow mode. Its content cannot be read now, so it
// can be neither delivered again nor skipped: raising the bound to what
// it was when the batch was decided lets the replay go on. A stand-in the
// log marks invalid, or a duplicate not owed, needs no content: nil.
func (w *worker) replayable(rp *replay, r *kgo.Record) error {
	cause := undecompressable(r)
	if cause == nil {
		return nil
	}
	delivers := w.rt.shadow
	if len(rp.log) > 0 && rp.log[0].Offset == r.Offset {
		delivers = rp.log[0].Decision == dedup.Forward
	} else if len(rp.owed) > 0 {
		delivers = true // it may be owed; its entity cannot be read to tell
	}
	if !delivers {
		return nil
	}
	return fmt.Errorf("%w: %s/%d offset %d: decided when its batch could be read, and its record must be delivered again, but now %s: "+
		"raise pipeline.max_decompressed_batch_bytes to what it was when it was decided, and restart",
		ErrHalted, r.Topic, r.Partition, r.Offset, boundDetail(strings.TrimPrefix(cause.Error(), ErrUndecompressable.Error()+": ")))
}
