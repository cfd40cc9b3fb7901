package pipeline

// This file: the consumer group's callbacks (joined, assigned, revoked,
// lost) and the registry of the partitions' workers they keep.

import (
	"context"
	"errors"
	"maps"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/dedup"
)

// onJoined marks the group joined. franz-go calls it after every join, even
// with nothing assigned: an instance with no partition (more replicas than
// partitions) is a ready standby.
//
// It also takes back the partitions this member was fenced from and still
// holds. A member that paused past its session timeout (a zombie) can
// rejoin claiming the partitions it had: a cooperative rebalance then
// leaves it some of them without revoking or assigning them, while their
// workers are parked on the fence that the interim owner's recovery set.
// Once a rebalance has completed, a partition this member holds is its
// own (a cooperative rebalance moves a partition only after its previous
// owner revoked it), so it is recovered anew and fetched again from its
// recovered start; without this it would stay parked until the next
// rebalance, for good if none came. Partitions whose recovery failed on
// an error that retrying may fix (holdUnrecovered) are recovered again
// the same way.
func (p *Pipeline) onJoined(ctx context.Context, cl *kgo.Client, _ map[string][]int32) {
	<-p.clientSet
	p.mu.Lock()
	p.joined = true
	var fenced []*worker
	for _, parts := range p.workers {
		for _, w := range parts {
			if err := w.health.parkedErr(); errors.Is(err, dedup.ErrFenced) || errors.Is(err, errRecoverAgain) {
				fenced = append(fenced, w)
			}
		}
	}
	p.mu.Unlock()
	if len(fenced) == 0 {
		return
	}
	held := map[string]map[int32]kgo.Offset{}
	names := map[string][]int32{}
	for _, w := range fenced {
		if held[w.rt.from] == nil {
			held[w.rt.from] = map[int32]kgo.Offset{}
		}
		held[w.rt.from][w.part.Partition] = kgo.NewOffset()
		names[w.rt.from] = append(names[w.rt.from], w.part.Partition)
	}
	p.log.Warn("partitions fenced earlier, or whose recovery failed on an error retrying may fix, are still held after the rebalance: recovering them again", zap.Any("partitions", names))
	stopAll(fenced, false, p.cfg.Pipeline.ShutdownGrace)
	p.unregister(fenced)
	starts, err := p.onAssigned(ctx, held)
	if err != nil {
		p.holdUnrecovered(held, err)
		return
	}
	set := map[string]map[int32]kgo.EpochOffset{}
	for topic, parts := range starts {
		set[topic] = map[int32]kgo.EpochOffset{}
		for part, o := range parts {
			set[topic][part] = o.EpochOffset()
		}
	}
	// The parked workers dropped what was fetched for them: fetch again
	// from where recovery starts.
	cl.SetOffsets(set)
}

// onAssigned runs recovery (recover.go) for newly assigned partitions,
// starts their workers and tells franz-go where to start fetching.
func (p *Pipeline) onAssigned(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	<-p.clientSet
	ctx, stop := mergeCtx(ctx, p.runCtx)
	defer stop()
	var started []*worker
	fail := func(err error) (map[string]map[int32]kgo.Offset, error) {
		stopAll(started, false, p.cfg.Pipeline.ShutdownGrace)
		p.unregister(started)
		return nil, err
	}
	for topic, parts := range offsets {
		rt := p.routes[topic]
		if rt == nil {
			continue
		}
		recovered, err := p.recoverPartitions(ctx, rt, slices.Sorted(maps.Keys(parts)))
		if err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			// Recovery failed for good (the store refuses it): these
			// partitions stay assigned, halted where it shows (not
			// ready, dam_halted) and unfetched, until they are assigned
			// anew; the others go on. Handing the error to franz-go would
			// make it leave and rejoin the group, over and over,
			// rebalancing every member, with nothing halted to see.
			p.holdUnrecovered(map[string]map[int32]kgo.Offset{topic: parts}, err)
			continue
		}
		if err != nil {
			return fail(err)
		}
		for part, r := range recovered {
			w := newWorker(p.base, p.deps, rt, part, r,
				p.log.With(zap.String("service", rt.service), zap.String("topic", rt.from), zap.Int32("partition", part)))
			p.mu.Lock()
			if p.stopping {
				p.mu.Unlock()
				return fail(context.Canceled)
			}
			old := p.workers[topic][part]
			if p.workers[topic] == nil {
				p.workers[topic] = map[int32]*worker{}
			}
			p.workers[topic][part] = w
			p.mu.Unlock()
			if old != nil { // cannot happen: franz-go revokes before it reassigns
				old.stop(false, p.cfg.Pipeline.ShutdownGrace)
			}
			w.start()
			started = append(started, w)
			parts[part] = r.start.WithEpoch(-1)
			if r.halt != nil {
				w.park(r.halt)
				p.client.PauseFetchPartitions(map[string][]int32{topic: {part}})
			}
		}
		// A partition halted in exactly-once mode is paused (transact.go);
		// assigned anew, it is fetched again, unless recovery halts it.
		var resume []int32
		for part := range parts {
			if r, ok := recovered[part]; ok && r.halt == nil {
				resume = append(resume, part)
			}
		}
		p.client.ResumeFetchPartitions(map[string][]int32{topic: resume})
	}
	return offsets, nil
}

// onRevoked lets each revoked partition deliver and commit what it has
// decided (or stops it hard after the grace period) before another member
// takes it.
func (p *Pipeline) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	<-p.clientSet
	p.sessionMustEnd()
	ws := p.lookup(revoked)
	if len(ws) > 0 {
		p.log.Info("partitions revoked: finishing them", zap.Any("partitions", revoked))
	}
	stopAll(ws, true, p.cfg.Pipeline.ShutdownGrace)
	p.unregister(ws)
}

// onLost stops lost partitions at once: another member may own them
// already, so nothing more is produced or committed (its recovery replays
// the rest).
func (p *Pipeline) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	<-p.clientSet
	p.sessionMustEnd()
	ws := p.lookup(lost)
	if len(ws) > 0 {
		p.log.Warn("partitions lost: stopping them at once", zap.Any("partitions", lost))
	}
	stopAll(ws, false, p.cfg.Pipeline.ShutdownGrace)
	p.unregister(ws)
}

func (p *Pipeline) lookup(tps map[string][]int32) []*worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ws []*worker
	for t, parts := range tps {
		for _, part := range parts {
			if w := p.workers[t][part]; w != nil {
				ws = append(ws, w)
			}
		}
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
