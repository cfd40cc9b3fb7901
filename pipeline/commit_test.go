package pipeline

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// commitRig is a client that is a member of group "g" with every
// partition of "in", and a committer over it whose OffsetCommit requests
// the test sees and can hold.
type commitRig struct {
	t    *testing.T
	kc   *testkafka.Cluster
	c    *committer
	mu   sync.Mutex
	reqs [][]int32 // the partitions of each OffsetCommit request, in order
	hold chan struct{}
	seen chan struct{} // one per request, as it arrives
}

func newCommitRig(t *testing.T, partitions int32, opts ...kgo.Opt) *commitRig {
	t.Helper()
	kc := testkafka.New(t, partitions, "in")
	assigned := make(chan struct{})
	var once sync.Once
	cl := kc.Client(append([]kgo.Opt{kgo.ConsumerGroup("g"), kgo.ConsumeTopics("in"), kgo.DisableAutoCommit(),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { once.Do(func() { close(assigned) }) })}, opts...)...)
	r := &commitRig{t: t, kc: kc, c: newCommitter(cl), hold: make(chan struct{}), seen: make(chan struct{}, 16)}
	close(r.hold) // not held until hold is called
	kc.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		var parts []int32
		for _, tp := range req.(*kmsg.OffsetCommitRequest).Topics {
			for _, p := range tp.Partitions {
				parts = append(parts, p.Partition)
			}
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, parts)
		hold := r.hold
		r.mu.Unlock()
		r.seen <- struct{}{}
		kc.SleepControl(func() { <-hold })
		return nil, nil, false
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			cl.PollFetches(ctx) // joins the group, and keeps the member alive
		}
	}()
	select {
	case <-assigned:
	case <-time.After(30 * time.Second):
		t.Fatal("the rig's client was not assigned the partitions")
	}
	done := make(chan struct{})
	go func() { defer close(done); r.c.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// holdRequests makes the next OffsetCommit requests wait until the
// returned release is called.
func (r *commitRig) holdRequests() (release func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := make(chan struct{})
	r.hold = h
	return sync.OnceFunc(func() { close(h) })
}

// holdFirst sends a commit of partition 0 at 10 and holds its request at
// the broker until release: the commits after it queue meanwhile.
func (r *commitRig) holdFirst() (release func(), first <-chan error) {
	r.t.Helper()
	release = r.holdRequests()
	first = r.commitAsync(context.Background(), 0, 10)
	r.waitRequest()
	return release, first
}

// waitQueued waits until n commits wait in the committer's queue.
func (r *commitRig) waitQueued(n int) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(r.c.reqs) < n {
		if time.Now().After(deadline) {
			r.t.Fatalf("%d of %d commits queued behind the request in flight", len(r.c.reqs), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *commitRig) waitRequest() {
	r.t.Helper()
	select {
	case <-r.seen:
	case <-time.After(30 * time.Second):
		r.t.Fatal("no OffsetCommit request arrived")
	}
}

func (r *commitRig) requests() [][]int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]int32(nil), r.reqs...)
}

func (r *commitRig) committed() map[int32]int64 {
	r.t.Helper()
	os, err := kadm.NewClient(r.kc.Client()).FetchOffsets(context.Background(), "g")
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[int32]int64{}
	os.Each(func(o kadm.OffsetResponse) { out[o.Partition] = o.At })
	return out
}

// commitAsync commits in the background and returns where its answer
// arrives.
func (r *commitRig) commitAsync(ctx context.Context, part int32, at int64) <-chan error {
	done := make(chan error, 1)
	go func() { done <- r.c.commit(ctx, "in", part, kgo.EpochOffset{Epoch: -1, Offset: at}) }()
	return done
}

// unhold lets the OffsetCommit requests arriving from now on through at
// once (a request already held stays held until its own release).
func (r *commitRig) unhold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := make(chan struct{})
	close(h)
	r.hold = h
}

// settle waits until the broker's committed offsets satisfy want, or
// for 3 s, and returns them: a request released late lands meanwhile.
func (r *commitRig) settle(want func(map[int32]int64) bool) map[int32]int64 {
	r.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	got := r.committed()
	for time.Now().Before(deadline) && !want(got) {
		time.Sleep(50 * time.Millisecond)
		got = r.committed()
	}
	return got
}

// inFlightWith sends a request holding the commits that queue starts (a
// commit of partition 2 goes first, held, so that they are coalesced),
// and holds that request at the broker until the returned release.
func (r *commitRig) inFlightWith(queue func() []<-chan error) (release func(), answers []<-chan error) {
	r.t.Helper()
	releaseFirst := r.holdRequests()
	first := r.commitAsync(context.Background(), 2, 5)
	r.waitRequest()
	answers = queue()
	r.waitQueued(len(answers))
	release = r.holdRequests() // the coalesced request is held in its turn
	releaseFirst()
	if err := answer(r.t, first); err != nil {
		r.t.Fatalf("the first commit: %v", err)
	}
	r.waitRequest()
	return release, answers
}

// unanswered fails the test if done is answered within 200 ms.
func unanswered(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s was answered (%v) before its request", what, err)
	case <-time.After(200 * time.Millisecond):
	}
}

// queuedBehind waits until done's commit waits in the committer's queue
// (behind the request in flight), and fails the test if it is answered
// first: it was sent while that request was at the broker.
func (r *commitRig) queuedBehind(done <-chan error, what string) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(r.c.reqs) < 1 {
		select {
		case err := <-done:
			r.t.Fatalf("%s was sent and answered (%v) while the request before it was at the broker: the broker may apply the two in either order", what, err)
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s never queued", what)
		}
	}
}

func answer(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("a commit was never answered")
		return nil
	}
}

// Commits asked for while a commit is in flight go out together, in the
// next request, and each is answered and lands: a caught-up partition's
// commit waits for one round trip, not for every other partition's in
// turn.
func TestCommitterCoalescesCommitsWaitingForTheRequestInFlight(t *testing.T) {
	t.Parallel()
	r := newCommitRig(t, 6)
	release, first := r.holdFirst()
	var rest []<-chan error
	for p := int32(1); p < 6; p++ {
		rest = append(rest, r.commitAsync(context.Background(), p, 10+int64(p)))
	}
	r.waitQueued(5)
	release()
	if err := answer(t, first); err != nil {
		t.Fatalf("the first commit: %v", err)
	}
	for i, done := range rest {
		if err := answer(t, done); err != nil {
			t.Fatalf("the commit of partition %d: %v", i+1, err)
		}
	}
	reqs := r.requests()
	if len(reqs) != 2 || len(reqs[0]) != 1 || len(reqs[1]) != 5 {
		t.Fatalf("OffsetCommit requests by partition: %v; want [[0] [1 2 3 4 5]]", reqs)
	}
	got := r.committed()
	for p := int32(0); p < 6; p++ {
		if got[p] != 10+int64(p) {
			t.Errorf("partition %d committed at %d, want %d (all: %v)", p, got[p], 10+int64(p), got)
		}
	}
}

// A commit whose worker stopped while it waited is not sent: a revoked
// partition's offset is never committed after its worker gave it up.
func TestCommitterDropsTheCommitOfAStoppedWorker(t *testing.T) {
	t.Parallel()
	r := newCommitRig(t, 2)
	release, first := r.holdFirst()
	ctx, stop := context.WithCancel(context.Background())
	stopped := r.commitAsync(ctx, 1, 20)
	r.waitQueued(1)
	stop()
	if err := answer(t, stopped); !errors.Is(err, context.Canceled) {
		t.Fatalf("the stopped worker's commit returned %v, want context.Canceled", err)
	}
	release()
	if err := answer(t, first); err != nil {
		t.Fatalf("the first commit: %v", err)
	}
	// One more commit, so that anything the committer still held is sent.
	if err := answer(t, r.commitAsync(context.Background(), 0, 11)); err != nil {
		t.Fatal(err)
	}
	if reqs := r.requests(); len(reqs) != 2 || len(reqs[1]) != 1 || reqs[1][0] != 0 {
		t.Fatalf("OffsetCommit requests by partition: %v; want [[0] [0]]", reqs)
	}
	if got := r.committed(); got[1] != 0 && got[1] != -1 {
		t.Fatalf("the stopped worker's partition was committed at %d", got[1])
	}
}

// A commit waiting for a rebalance to end (franz-go sends no commit
// between joining and syncing) is canceled as soon as its worker stops,
// as at a revocation: it is not sent in the next generation, where it
// could move back the offset the partition's next owner committed.
func TestCommitterNeverSendsAStoppedWorkersCommitAfterARebalance(t *testing.T) {
	t.Parallel()
	r := newCommitRig(t, 2)
	// Every SyncGroup waits until released: the rig's client, rejoining,
	// holds its commits meanwhile.
	var armed atomic.Bool
	syncHeld, syncs := make(chan struct{}), make(chan struct{}, 16)
	releaseSync := sync.OnceFunc(func() { close(syncHeld) })
	defer releaseSync()
	r.kc.ControlKey(int16(kmsg.SyncGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		r.kc.KeepControl()
		if !armed.Load() {
			return nil, nil, false
		}
		syncs <- struct{}{}
		r.kc.SleepControl(func() { <-syncHeld })
		return nil, nil, false
	})
	armed.Store(true)
	other := r.kc.Client(kgo.ConsumerGroup("g"), kgo.ConsumeTopics("in"), kgo.DisableAutoCommit())
	pctx, pstop := context.WithCancel(context.Background())
	defer pstop()
	go func() {
		for pctx.Err() == nil {
			other.PollFetches(pctx)
		}
	}()
	for range 2 { // both members are between joining and syncing
		select {
		case <-syncs:
		case <-time.After(30 * time.Second):
			t.Fatal("the rebalance never reached SyncGroup")
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	done := r.commitAsync(ctx, 0, 10)
	deadline := time.Now().Add(30 * time.Second)
	for len(r.c.reqs) > 0 || len(r.requests()) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the committer never took the commit")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // into franz-go's wait for the rebalance
	stop()
	if err := answer(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("the stopped worker's commit returned %v, want context.Canceled", err)
	}
	releaseSync()
	// Any commit after the rebalance: the committer is free, and what it
	// sends is that one alone.
	var err error
	for time.Now().Before(deadline) {
		if err = answer(t, r.commitAsync(context.Background(), 1, 7)); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond) // a partition the new generation gave the other member
	}
	for _, req := range r.requests() {
		if slices.Contains(req, 0) {
			t.Fatalf("the stopped worker's commit of partition 0 was sent after the rebalance (requests: %v)", r.requests())
		}
	}
	if got := r.committed(); got[0] == 10 {
		t.Fatal("partition 0 was committed at 10 by a stopped worker")
	}
}

// A partition that is still owned never has its committed offset moved
// back when another partition of the same request stops while the
// request is at the broker. Canceling a written request drops its
// connection, not the request: the broker applies it whenever it gets to
// it, possibly after the commits that follow it on a new connection. So
// a written request is answered, not canceled, and the partition's next
// commit waits for it.
func TestCommitterNeverMovesBackAStillOwnedPartitionsCommittedOffset(t *testing.T) {
	t.Parallel()
	r := newCommitRig(t, 3)
	ctxA, stopA := context.WithCancel(context.Background())
	defer stopA()
	release, answers := r.inFlightWith(func() []<-chan error {
		return []<-chan error{
			r.commitAsync(ctxA, 0, 10),                 // a partition about to be revoked
			r.commitAsync(context.Background(), 1, 20), // a partition that stays
		}
	})
	defer release()
	stopA() // partition 0's worker stops (lost, or its grace ran out)
	if err := answer(t, answers[0]); !errors.Is(err, context.Canceled) {
		t.Fatalf("the stopped worker's commit returned %v, want context.Canceled", err)
	}
	unanswered(t, answers[1], "partition 1's commit, in a request written before partition 0's worker stopped,")
	// Partition 1's worker delivers its next batch meanwhile and commits
	// after it.
	r.unhold()
	next := r.commitAsync(context.Background(), 1, 30)
	r.waitQueued(1)
	release() // the broker gets to the request
	if err := answer(t, answers[1]); err != nil {
		t.Fatalf("partition 1's commit at 20: %v", err)
	}
	if err := answer(t, next); err != nil {
		t.Fatalf("partition 1's commit at 30: %v", err)
	}
	if got := r.settle(func(got map[int32]int64) bool { return got[1] != 30 }); got[1] != 30 {
		t.Fatalf("partition 1's committed offset moved from 30 to %d after 30 was answered (requests: %v)", got[1], r.requests())
	}
}

// A stopped worker's offset never lands after the commits of its
// partition's next owner in the same generation (onJoined recovers a
// fenced partition anew in this member, in the generation it has): the
// stopped worker returns at once, but its request, already written, is
// answered before the next owner's commit is sent.
func TestCommitterNeverSendsAStoppedWorkersOffsetAfterItsNextOwners(t *testing.T) {
	t.Parallel()
	r := newCommitRig(t, 3)
	ctxOld, stopOld := context.WithCancel(context.Background())
	defer stopOld()
	release, answers := r.inFlightWith(func() []<-chan error {
		return []<-chan error{r.commitAsync(ctxOld, 0, 10)}
	})
	defer release()
	stopOld() // the old worker is stopped hard (stopAll(fenced, false))
	if err := answer(t, answers[0]); !errors.Is(err, context.Canceled) {
		t.Fatalf("the stopped worker's commit returned %v, want context.Canceled", err)
	}
	// The next owner (a new worker, same member, same generation)
	// recovers and commits further on.
	r.unhold()
	next := r.commitAsync(context.Background(), 0, 15)
	r.queuedBehind(next, "the next owner's commit")
	release()
	if err := answer(t, next); err != nil {
		t.Fatalf("the next owner's commit: %v", err)
	}
	if got := r.settle(func(got map[int32]int64) bool { return got[0] != 15 }); got[0] != 15 {
		t.Fatalf("partition 0 committed at %d after its next owner committed 15: the stopped worker's request landed after it (requests: %v)", got[0], r.requests())
	}
}

// refuseNextCommit makes the broker answer the next OffsetCommit request
// with code for every partition, as Kafka does: from v10 on the response
// names each topic by its id only (Topic is not on the wire).
func (r *commitRig) refuseNextCommit(code int16) {
	r.kc.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.OffsetCommitRequest)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		resp.Version = req.Version
		for _, t := range req.Topics {
			rt := kmsg.NewOffsetCommitResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetCommitResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})
}

// A commit the broker refuses is answered with its error, also when the
// OffsetCommit response (v10 on) names its topics by id only: a refused
// offset is never taken for committed (the worker's committed offset, its
// proof of owning the partition while PostgreSQL is down). The committer
// maps the errors by topic name, which franz-go fills in from the request
// (updateCommitted) only while its session has uncommitted offsets: a
// member's first session has none until the offset fetch that follows
// AdjustFetchOffsetsFn (dam's recovery) returns, and a session's end
// (onLost, a cooperative revocation of all it tracked) clears them.
func TestCommitterAnswersARefusedCommitWithItsError(t *testing.T) {
	t.Parallel()
	recovering := make(chan struct{})
	defer close(recovering)
	r := newCommitRig(t, 2, kgo.AdjustFetchOffsetsFn(func(ctx context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
		select { // a recovery that takes a while
		case <-recovering:
		case <-ctx.Done():
		}
		return offs, nil
	}))
	r.refuseNextCommit(kerr.OffsetMetadataTooLarge.Code)
	err := answer(t, r.commitAsync(context.Background(), 0, 10))
	if err == nil {
		t.Fatalf("a commit the broker refused (OFFSET_METADATA_TOO_LARGE) was answered as committed; committed offsets: %v", r.committed())
	}
	t.Logf("refused commit answered: %v", err)
}
