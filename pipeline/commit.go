package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// committer sends at-least-once mode's offset commits, coalesced. franz-go
// runs one synchronous commit at a time for the whole client, so a
// partition committing a small job waited for the other partitions'
// commits, one round trip after another: caught up at 1,000 records/s over
// 6 partitions a commit is asked for about every millisecond, and a
// record's commit took up to 7 ms of its poll-to-commit time. A commit
// asked for while another is in flight joins the next request, which
// carries every partition then waiting. Each caller still returns only
// once its own offset is answered, so a partition's commits stay in order
// and a job counts as delivered only once its offset is committed.
type committer struct {
	cl      *kgo.Client
	reqs    chan *commitReq
	stopped chan struct{} // closed when run returns
}

// commitReq is one partition's commit, waiting for its answer on done.
type commitReq struct {
	ctx   context.Context // the worker's: a request whose worker stopped is not sent
	topic string
	part  int32
	at    kgo.EpochOffset
	done  chan error // buffered: run never waits for the caller
}

// errCommitterStopped: the pipeline is past its shutdown; nothing more is
// committed.
var errCommitterStopped = errors.New("pipeline: the offset committer has stopped")

// errNothingToCommit: every worker of a request stopped before it was
// written; nothing is sent.
var errNothingToCommit = errors.New("pipeline: every commit of the request is of a stopped worker")

func newCommitter(cl *kgo.Client) *committer {
	// Buffered: a worker hands its commit over without waiting for the
	// request in flight.
	return &committer{cl: cl, reqs: make(chan *commitReq, 64), stopped: make(chan struct{})}
}

// commit commits topic/part at at, coalesced with the commits the other
// partitions ask for meanwhile, and returns once it is answered.
func (c *committer) commit(ctx context.Context, topic string, part int32, at kgo.EpochOffset) error {
	r := &commitReq{ctx: ctx, topic: topic, part: part, at: at, done: make(chan error, 1)}
	select {
	case c.reqs <- r:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.stopped:
		return errCommitterStopped
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-c.stopped:
		select {
		case err := <-r.done: // answered as run returned
			return err
		default:
			return errCommitterStopped
		}
	}
}

// run sends the commits asked for until ctx ends: one request at a time,
// each with every commit waiting when it starts.
func (c *committer) run(ctx context.Context) {
	defer close(c.stopped)
	var held []*commitReq
	for {
		batch := held
		held = nil
		if len(batch) == 0 {
			select {
			case r := <-c.reqs:
				batch = append(batch, r)
			case <-ctx.Done():
				return
			}
		}
	drain:
		for {
			select {
			case r := <-c.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		held = c.send(ctx, batch)
		if ctx.Err() != nil {
			for _, r := range held {
				r.done <- errCommitterStopped
			}
			return
		}
	}
}

// send commits batch in one request and answers each commit, except a
// partition's second commit in the batch (a worker replaced by the next
// owner of its partition, finishing): that one is returned, for the next
// request, so that a partition's commits are sent in the order asked.
//
// A stopped worker's commit is never sent after its partition's next
// owner's: a commit of a revoked partition must not wait through a
// rebalance and be sent in the next generation, where it could move back
// the offset its next owner committed. Until the request is written (it
// waits for a rebalance's join and sync, or for the request before it)
// it is canceled as soon as any of its workers stops, and the others'
// commits are answered with an error, and retried. When franz-go is about
// to write it (preCommit), the partitions of the workers stopped by then
// are taken out. Once written it is never canceled: canceling drops the
// connection, not the request, which the broker may then apply after the
// commits that follow it on a new connection, moving their offsets back.
// It is answered instead, and the commits asked for meanwhile wait for it
// (franz-go writes a commit only after the one before it is answered).
func (c *committer) send(ctx context.Context, batch []*commitReq) (held []*commitReq) {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	byPart := map[string]map[int32]*commitReq{}
	var sent []*commitReq
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.done <- err // not sent: its worker stopped
			continue
		}
		if _, dup := offsets[r.topic][r.part]; dup {
			held = append(held, r)
			continue
		}
		if offsets[r.topic] == nil {
			offsets[r.topic] = map[int32]kgo.EpochOffset{}
			byPart[r.topic] = map[int32]*commitReq{}
		}
		offsets[r.topic][r.part] = r.at
		byPart[r.topic][r.part] = r
		sent = append(sent, r)
	}
	if len(sent) == 0 {
		return held
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu      sync.Mutex
		written bool                    // set by preCommit: the request is no longer canceled
		removed = map[*commitReq]bool{} // taken out of the request: their workers stopped
	)
	for _, r := range sent {
		stop := context.AfterFunc(r.ctx, func() {
			mu.Lock()
			defer mu.Unlock()
			if !written {
				cancel()
			}
		})
		defer stop()
	}
	preCommit := func(req *kmsg.OffsetCommitRequest) error {
		mu.Lock()
		defer mu.Unlock()
		if err := rctx.Err(); err != nil {
			return err // canceled while it waited: not written
		}
		written = true
		topics := req.Topics[:0]
		for _, t := range req.Topics {
			parts := t.Partitions[:0]
			for _, pr := range t.Partitions {
				if r := byPart[t.Topic][pr.Partition]; r != nil && r.ctx.Err() != nil {
					removed[r] = true
					continue
				}
				parts = append(parts, pr)
			}
			if t.Partitions = parts; len(parts) > 0 {
				topics = append(topics, t)
			}
		}
		if req.Topics = topics; len(topics) == 0 {
			return errNothingToCommit
		}
		return nil
	}
	var (
		reqErr error
		errs   = map[string]map[int32]error{}
	)
	c.cl.CommitOffsetsSync(kgo.PreCommitFnContext(rctx, preCommit), offsets, func(_ *kgo.Client, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			reqErr = err
			return
		}
		// From v10 a response names its topics by id only; franz-go
		// fills the names in only while its session tracks uncommitted
		// offsets, so they are taken from the request here.
		names := map[[16]byte]string{}
		for _, t := range req.Topics {
			names[t.TopicID] = t.Topic
		}
		for _, t := range resp.Topics {
			topic := t.Topic
			if topic == "" {
				topic = names[t.TopicID]
			}
			for _, pr := range t.Partitions {
				if e := kerr.ErrorForCode(pr.ErrorCode); e != nil {
					if errs[topic] == nil {
						errs[topic] = map[int32]error{}
					}
					errs[topic][pr.Partition] = fmt.Errorf("commit %s/%d at %d: %w", topic, pr.Partition, offsets[topic][pr.Partition].Offset, e)
				}
			}
		}
	})
	for _, r := range sent {
		switch {
		case removed[r]:
			r.done <- fmt.Errorf("commit not sent: %w", r.ctx.Err())
		case reqErr != nil && r.ctx.Err() == nil && ctx.Err() == nil && errors.Is(reqErr, context.Canceled):
			r.done <- errors.New("commit canceled: another partition of the same request stopped; retried")
		case reqErr != nil:
			r.done <- reqErr
		default:
			r.done <- errs[r.topic][r.part]
		}
	}
	return held
}
