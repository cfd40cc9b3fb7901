package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/dam-dedup/dam/dedup"
)

// The decision log after delivery: kept for decision_log.keep, so that
// `dam explain --offset` answers from it, then deleted in bounded batches
// by a loop of its own, off the decide and deliver path. Recovery reads
// the log only from the committed offset up (recover.go: max(C,
// delivered)); what is kept below it is history, never replayed.
//
// And the way out of a halt without a dead-letter topic: `dam state skip`
// records an operator skip in the store and bumps the partition's epoch;
// the halted worker notices (haltWatchLoop) and the partition is planned
// again from the store, which passes over the skipped record.

// logPruneEvery is how often the decision log of the owned partitions is
// pruned; logPruneBatch bounds each delete (logged batches, not records).
var (
	logPruneEvery = 10 * time.Second
	logPruneBatch = 500
)

// logKeepLoop prunes the decision log of the partitions this instance
// owns, every logPruneEvery, until ctx ends: each partition's batches
// delivered (below the committed offset its worker knows) and logged more
// than decision_log.keep ago, a bounded delete at a time.
func (p *Pipeline) logKeepLoop(ctx context.Context) {
	keep := p.cfg.DecisionLog.Keep
	t := time.NewTicker(logPruneEvery)
	defer t.Stop()
	warned := time.Time{}
	for {
		for _, w := range p.allWorkers() {
			c := w.knownC.Load()
			if c <= 0 {
				continue
			}
			for ctx.Err() == nil {
				sctx, cancel := context.WithTimeout(ctx, p.deps.set.storeTimeout)
				n, err := p.store.PruneLogKept(sctx, w.part, c, keep, logPruneBatch)
				cancel()
				if err != nil {
					if ctx.Err() == nil && time.Since(warned) > time.Minute {
						warned = time.Now()
						w.log.Warn("pruning the decision log failed; it is retried later", zap.Error(err))
					}
					break
				}
				if n < int64(logPruneBatch) {
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// haltWatchEvery is how often a halted partition checks whether an
// operator skip moved it (its epoch changed in the store).
var haltWatchEvery = 2 * time.Second

// haltWatchLoop looks, every haltWatchEvery until ctx ends, at each halted
// partition's epoch in the store: an operator's `dam state skip` bumps it.
// Such a partition is parked as fenced and a rebalance is asked for, so
// that onJoined recovers it anew: recovery reads the skip from the store
// (the log marks the record skipped, P is past it) and the partition goes
// on after the skipped record, without a restart.
func (p *Pipeline) haltWatchLoop(ctx context.Context) {
	t := time.NewTicker(haltWatchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, w := range p.allWorkers() {
			err := w.health.parkedErr()
			if err == nil || !errors.Is(err, ErrHalted) || errors.Is(err, dedup.ErrFenced) || w.epoch == 0 {
				continue // (epoch 0: its recovery failed, it never owned the epoch)
			}
			sctx, cancel := context.WithTimeout(ctx, p.deps.set.storeTimeout)
			prog, perr := p.store.ReadProgress(sctx, w.part)
			cancel()
			if perr != nil || prog.Epoch == w.epoch {
				continue
			}
			w.log.Info("the halted partition was changed in the store (an operator skip): recovering it",
				zap.Int64("epoch", prog.Epoch), zap.Int64("progress", prog.Next))
			w.replan(fmt.Errorf("%w: %s/%d: its epoch moved to %d while it was halted (an operator skip): it is recovered again",
				dedup.ErrFenced, w.part.Topic, w.part.Partition, prog.Epoch))
		}
	}
}

// replan parks a halted worker as fenced (err wraps dedup.ErrFenced) and
// asks for a rebalance, after which onJoined recovers its partition anew,
// as it does a fenced one.
func (w *worker) replan(err error) {
	w.health.park(err)
	w.q.close()
	w.dcancel()
	if w.d.client != nil {
		w.d.client.ForceRebalance()
	}
}

// skipHint is what a halt's message says to step past the record at
// offset without a dead-letter topic.
func skipHint(topic string, part int32, offset int64) string {
	return fmt.Sprintf("to step past this record: dam state skip -c CONFIG --topic %s --partition %d --offset %d --reason TEXT --yes (or set dead_letter and restart)",
		topic, part, offset)
}
