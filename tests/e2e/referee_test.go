package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// groupReferee gives kfake's classic consumer groups the liveness rules of
// Kafka's group coordinator that kfake lacks, so that a rebalance ends as
// it would against Kafka. Without them a rebalance storm can livelock: in
// CI every member's JoinGroup went unanswered for two minutes, each
// retried at franz-go's deadline (rebalance_timeout + 10 s), each retry
// restarting the join phase. The divergences (kfake groups.go):
//
//  1. Kafka keeps a member awaiting JoinGroup or SyncGroup alive
//     (MemberMetadata.shouldKeepAlive). kfake leaves the member's session
//     timer running from its last heartbeat (updateMemberAndRebalance does
//     not stop it) and, when it fires, removes the member without
//     answering its parked request (removeMember): the client waits out
//     its deadline, then rejoins, which restarts the phase (2).
//     The referee heartbeats on behalf of such a member.
//  2. Kafka ends the join phase one rebalance timeout after it began
//     (DelayedJoin), removing the members that did not rejoin. kfake's
//     rebalance() restarts its timer at every join or removal ("Always
//     reset the timer"), so a member that does not rejoin holds the phase
//     open as long as something joins every rebalance_timeout. The referee
//     removes, one rebalance timeout into the phase, the members not
//     awaiting JoinGroup.
//  3. Kafka schedules every member's session expiry when the join phase
//     completes. kfake arms it only when the reply was written (reply ->
//     updateHeartbeat), and stopped the member's pending timer when it
//     joined (addMemberAndRebalance -> stopPending): a member killed while
//     its JoinGroup was parked, answered into its dead connection, can
//     stay in the group with no session at all, holding its partitions.
//     The referee removes a member it has not heard from for a session
//     timeout (plus a margin, so that kfake's own timer goes first).
//
// Removing is a LeaveGroup on the member's behalf: in kfake, handleLeave
// and the session expiry both call updateMemberAndRebalance(m, nil, nil).
// The referee sees the members' requests and kfake's replies as bytes in
// faultNet, and the group's state through Cluster.GroupInfo. It can be
// turned off (DAM_TEST_NO_REFEREE=1) to see kfake's own behaviour, as
// TestRebalanceLivelock does.
type groupReferee struct {
	b    *broker
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	members map[string]*refMember               // by member ID
	pending map[*faultConn]map[int32]refPending // JoinGroup/SyncGroup awaiting a reply, by connection and correlation ID
	phases  map[string]refPhase                 // by group
	acted   map[string]int                      // what it did, for the log: "heartbeat", "expelled", "expired"

	cl *kgo.Client
}

type refMember struct {
	group              string
	session, rebalance time.Duration
	// lastHeard is when the member last sent a JoinGroup, SyncGroup or
	// Heartbeat, or was answered a JoinGroup or SyncGroup: its session
	// runs from there.
	lastHeard time.Time
	awaiting  map[int16]int // outstanding JoinGroup (11) / SyncGroup (14) requests
	lastKeep  time.Time
}

type refPending struct {
	member string
	key    int16
}

// refPhase is a join phase: PreparingRebalance at a generation.
type refPhase struct {
	gen      int32
	start    time.Time
	expelled map[string]bool
}

const refereeClientID = "e2e-referee"

var refereeOff = os.Getenv("DAM_TEST_NO_REFEREE") == "1"

func newGroupReferee(b *broker) *groupReferee {
	r := &groupReferee{b: b, stop: make(chan struct{}), done: make(chan struct{}),
		members: map[string]*refMember{}, pending: map[*faultConn]map[int32]refPending{},
		phases: map[string]refPhase{}, acted: map[string]int{}}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addr()), kgo.ClientID(refereeClientID),
		kgo.RequestRetries(0), kgo.RetryTimeout(time.Second))
	if err != nil {
		b.t.Fatalf("referee client: %v", err)
	}
	r.cl = cl
	go r.run()
	return r
}

// close stops the referee and logs what it did.
func (r *groupReferee) close() {
	close(r.stop)
	<-r.done
	r.cl.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.acted) > 0 {
		r.b.t.Logf("kfake group referee: %v", r.acted)
	}
}

// request sees a request a client sent to the broker (a whole frame,
// without its size).
func (r *groupReferee) request(c *faultConn, frame []byte) {
	rd := kbin.Reader{Src: frame}
	key, version, corr := rd.Int16(), rd.Int16(), rd.Int32()
	cid := rd.NullableString()
	if cid != nil && *cid == refereeClientID {
		return
	}
	req := kmsg.RequestForKey(key)
	if req == nil {
		return
	}
	req.SetVersion(version)
	if req.IsFlexible() {
		kmsg.SkipTags(&rd)
	}
	if rd.Complete() != nil || req.ReadFrom(rd.Src) != nil {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var id string
	switch q := req.(type) {
	case *kmsg.JoinGroupRequest:
		if q.MemberID == "" {
			return // it gets its member ID first (or, v3-, see the next join)
		}
		id = q.MemberID
		m := r.member(id, q.Group)
		m.session = time.Duration(q.SessionTimeoutMillis) * time.Millisecond
		m.rebalance = time.Duration(q.RebalanceTimeoutMillis) * time.Millisecond
		if q.Version == 0 {
			m.rebalance = m.session
		}
	case *kmsg.SyncGroupRequest:
		id = q.MemberID
		r.member(id, q.Group)
	case *kmsg.HeartbeatRequest:
		if m := r.members[q.MemberID]; m != nil {
			m.lastHeard = now
		}
		return
	default:
		return
	}
	m := r.members[id]
	m.lastHeard = now
	m.awaiting[key]++
	if r.pending[c] == nil {
		r.pending[c] = map[int32]refPending{}
	}
	r.pending[c][corr] = refPending{id, key}
}

func (r *groupReferee) member(id, group string) *refMember {
	m := r.members[id]
	if m == nil {
		m = &refMember{group: group, awaiting: map[int16]int{}, lastHeard: time.Now()}
		r.members[id] = m
	}
	return m
}

// response sees the start of a response the broker wrote: its
// correlation ID.
func (r *groupReferee) response(c *faultConn, corr int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answered(c, corr, true)
}

func (r *groupReferee) answered(c *faultConn, corr int32, replied bool) {
	p, ok := r.pending[c][corr]
	if !ok {
		return
	}
	delete(r.pending[c], corr)
	m := r.members[p.member]
	if m.awaiting[p.key]--; m.awaiting[p.key] <= 0 {
		delete(m.awaiting, p.key)
	}
	if replied {
		m.lastHeard = time.Now()
	}
}

// closed: the connection's parked requests will not be answered.
func (r *groupReferee) closed(c *faultConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for corr := range r.pending[c] {
		r.answered(c, corr, false)
	}
	delete(r.pending, c)
}

func (r *groupReferee) run() {
	defer close(r.done)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		r.b.mu.Lock()
		c := r.b.c
		r.b.mu.Unlock()
		if c == nil {
			continue
		}
		r.mu.Lock()
		groups := map[string]bool{}
		for _, m := range r.members {
			groups[m.group] = true
		}
		r.mu.Unlock()
		for g := range groups {
			info := c.GroupInfo(g)
			if info == nil {
				continue
			}
			r.referee(g, info.State, info.Epoch, info.Members)
		}
	}
}

type refAction struct {
	what, member string
	gen          int32
}

// referee applies the three rules to one group, from a snapshot of it.
func (r *groupReferee) referee(group, state string, gen int32, members []kfake.GroupMember) {
	now := time.Now()
	var acts []refAction
	r.mu.Lock()
	ph := r.phases[group]
	if state == "PreparingRebalance" && (ph.start.IsZero() || ph.gen != gen) {
		ph = refPhase{gen: gen, start: now, expelled: map[string]bool{}}
	} else if state != "PreparingRebalance" {
		ph = refPhase{}
	}
	r.phases[group] = ph
	var deadline time.Duration // the group's rebalance timeout, Kafka's: the largest
	for _, km := range members {
		if m := r.members[km.MemberID]; m != nil && m.rebalance > deadline {
			deadline = m.rebalance
		}
	}
	for _, km := range members {
		id := km.MemberID
		m := r.members[id]
		if m == nil { // not heard from since the referee began
			m = r.member(id, group)
		}
		awaiting := len(m.awaiting) > 0
		switch {
		case awaiting && (state == "PreparingRebalance" || state == "CompletingRebalance"):
			// (1) Kafka keeps a member awaiting join or sync alive.
			if now.Sub(m.lastKeep) >= m.session/4 {
				m.lastKeep = now
				acts = append(acts, refAction{"heartbeat", id, gen})
			}
		case state == "PreparingRebalance" && deadline > 0 && now.Sub(ph.start) >= deadline &&
			m.awaiting[11] == 0 && !ph.expelled[id]:
			// (2) The join phase ends one rebalance timeout after it
			// began, without the members that did not rejoin.
			ph.expelled[id] = true
			acts = append(acts, refAction{"expelled", id, gen})
		case !awaiting && m.session > 0 && now.Sub(m.lastHeard) > m.session+2*time.Second:
			// (3) A member not heard from for its session timeout is
			// gone, whether or not kfake armed its session timer.
			m.lastHeard = now // once per session
			acts = append(acts, refAction{"expired", id, gen})
		}
	}
	r.mu.Unlock()
	for _, a := range acts {
		r.act(group, a)
	}
}

func (r *groupReferee) act(group string, a refAction) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var err error
	switch a.what {
	case "heartbeat":
		req := kmsg.NewPtrHeartbeatRequest()
		req.Group, req.MemberID, req.Generation = group, a.member, a.gen
		_, err = req.RequestWith(ctx, r.cl) // its error (REBALANCE_IN_PROGRESS) says nothing
	default:
		req := kmsg.NewPtrLeaveGroupRequest()
		req.Group = group
		lm := kmsg.NewLeaveGroupRequestMember()
		lm.MemberID = a.member
		req.Members = append(req.Members, lm)
		req.MemberID = a.member // versions 0-2
		var resp *kmsg.LeaveGroupResponse
		if resp, err = req.RequestWith(ctx, r.cl); err == nil {
			code := resp.ErrorCode
			if len(resp.Members) > 0 {
				code = resp.Members[0].ErrorCode
			}
			err = kerr.ErrorForCode(code) // UNKNOWN_MEMBER_ID: gone meanwhile
		}
		if err == nil {
			r.b.t.Logf("kfake group referee: %s %s (group %s, generation %d)", a.what, a.member, group, a.gen)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.acted[a.what+" failed"]++
		return
	}
	r.acted[a.what]++
	if m := r.members[a.member]; m != nil && a.what == "heartbeat" {
		// kfake's session timer restarted: (3) counts from here, so
		// that it stays behind kfake's own expiry.
		m.lastHeard = time.Now()
	}
}

// frameScanner splits one direction of a Kafka connection into frames (a
// 4-byte size, then that many bytes) and hands onFrame each frame's first
// headLen bytes, or the whole frame when keep says so from those.
type frameScanner struct {
	headLen int
	keep    func(head []byte) bool
	onFrame func(frame []byte)

	size    [4]byte
	sizeN   int
	left    int // bytes of the current frame still to come
	buf     []byte
	decided bool
	whole   bool
}

func (s *frameScanner) feed(p []byte) {
	for len(p) > 0 {
		if s.sizeN < 4 {
			n := copy(s.size[s.sizeN:], p)
			s.sizeN += n
			p = p[n:]
			if s.sizeN == 4 {
				s.left = int(binary.BigEndian.Uint32(s.size[:]))
				s.buf, s.decided, s.whole = s.buf[:0], false, false
				if s.left == 0 {
					s.sizeN = 0
				}
			}
			continue
		}
		n := min(len(p), s.left)
		chunk := p[:n]
		if !s.decided {
			k := min(len(chunk), s.headLen-len(s.buf))
			s.buf = append(s.buf, chunk[:k]...)
			chunk = chunk[k:]
			if len(s.buf) == s.headLen || n == s.left {
				s.decided = true
				s.whole = s.keep(s.buf)
			}
		}
		if s.decided && s.whole {
			s.buf = append(s.buf, chunk...)
		}
		s.left -= n
		p = p[n:]
		if s.left == 0 {
			s.sizeN = 0
			s.onFrame(s.buf)
		}
	}
}

// TestFrameScanner: frames come out whole (kept) or as their head,
// however the stream is cut.
func TestFrameScanner(t *testing.T) {
	frame := func(body ...byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
	}
	var stream []byte
	stream = append(stream, frame(0, 11, 1, 2, 3)...) // kept
	stream = append(stream, frame(0, 1, 9, 9, 9, 9)...)
	stream = append(stream, frame()...)
	stream = append(stream, frame(0)...) // shorter than the head
	stream = append(stream, frame(0, 14)...)
	want := [][]byte{{0, 11, 1, 2, 3}, {0, 1}, {0}, {0, 14}}
	for _, chunk := range []int{1, 2, 3, 7, len(stream)} {
		var got [][]byte
		s := &frameScanner{headLen: 2,
			keep:    func(head []byte) bool { return len(head) == 2 && (head[1] == 11 || head[1] == 14) },
			onFrame: func(f []byte) { got = append(got, slices.Clone(f)) }}
		for p := stream; len(p) > 0; {
			n := min(chunk, len(p))
			s.feed(p[:n])
			p = p[n:]
		}
		if !slices.EqualFunc(got, want, bytes.Equal) {
			t.Errorf("chunks of %d: frames %v, want %v", chunk, got, want)
		}
	}
}
