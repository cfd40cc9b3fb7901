package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRebalanceLivelock replays, at a smaller time scale, the rebalance
// storm's interleaving that livelocked kfake's classic group in CI (see
// groupReferee): a member joins a stable group; one member rejoins at
// once, another a few seconds later (its revocation takes that long,
// within the rebalance timeout), and one stays in the group without
// rejoining (in the storm, the killed d that kfake answered into a dead
// connection and left with no session; here a member that heartbeats
// and never rejoins). Against Kafka the join phase ends one rebalance
// timeout after it began, without the member that did not rejoin, and
// the three others are answered. Against bare kfake
// (DAM_TEST_NO_REFEREE=1) the members waiting in join are dropped at
// their session timeout, unanswered; each rejoins at franz-go's deadline
// (rebalance timeout + overhead), restarting the phase's timer, and the
// staggered rejoins keep it open: no generation completes until the
// retries drift far enough apart (here after some 30 s, six rebalance
// timeouts; in CI, at 20 s and 10 s, not within two minutes).
//
// The clients are franz-go's group consumers (eager, so that the
// revocation comes before the rejoin) and, for the member that does not
// rejoin, raw requests. Sessions of 2 s, rebalance timeout 5 s, request
// overhead 2 s: the harness's 6 s, 20 s and franz-go's 10 s, scaled.
func TestRebalanceLivelock(t *testing.T) {
	t.Parallel()
	const (
		group     = "livelock"
		session   = 2 * time.Second
		rebalance = 5 * time.Second
		overhead  = 2 * time.Second
		hb        = 400 * time.Millisecond
		slowBy    = 3 * time.Second // b's revocation once the storm began
	)
	b := newBrokerOpts(t, false, []kfake.Opt{kfake.GroupMinSessionTimeout(time.Second)})
	var storm atomic.Bool
	var slowOnce sync.Once
	consumer := func(name string) *kgo.Client {
		opts := []kgo.Opt{kgo.SeedBrokers(b.addr()), kgo.ClientID(name),
			kgo.ConsumerGroup(group), kgo.ConsumeTopics(inTopic),
			kgo.Balancers(kgo.RangeBalancer()),
			kgo.SessionTimeout(session), kgo.RebalanceTimeout(rebalance),
			kgo.HeartbeatInterval(hb), kgo.RequestTimeoutOverhead(overhead)}
		if name == "b" {
			opts = append(opts, kgo.OnPartitionsRevoked(func(context.Context, *kgo.Client, map[string][]int32) {
				if storm.Load() {
					slowOnce.Do(func() { time.Sleep(slowBy) })
				}
			}))
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stable := func(within time.Duration, names ...string) (time.Duration, *kfake.GroupInfo, bool) {
		start := time.Now()
		wctx, wcancel := context.WithTimeout(ctx, within)
		defer wcancel()
		info, err := b.cluster().WaitGroupInfo(wctx, group, func(g *kfake.GroupInfo) bool {
			if g == nil || g.State != "Stable" || len(g.Members) != len(names) {
				return false
			}
			for _, m := range g.Members {
				if !slices.Contains(names, m.ClientID) {
					return false
				}
			}
			return true
		})
		return time.Since(start), info, err == nil
	}

	consumer("a")
	if _, info, ok := stable(15*time.Second, "a"); !ok {
		t.Fatalf("a alone: not stable: %+v", info)
	}
	h := newHolder(t, b.addr(), group, session, rebalance, hb, &storm)
	go h.run(ctx)
	if _, info, ok := stable(15*time.Second, "a", "holder"); !ok {
		t.Fatalf("a and the holder: not stable: %+v", info)
	}
	consumer("b")
	if _, info, ok := stable(15*time.Second, "a", "holder", "b"); !ok {
		t.Fatalf("a, the holder and b: not stable: %+v", info)
	}

	// The storm: c joins; a rejoins at once, b slowBy later, the holder
	// never.
	storm.Store(true)
	go traceGroup(ctx, t, b.cluster(), group)
	consumer("c")
	within := rebalance + 3*time.Second
	took, info, ok := stable(within, "a", "b", "c")
	if ok {
		t.Logf("a, b and c stable %s after c joined (the holder out)", took.Round(10*time.Millisecond))
		return
	}
	t.Errorf("a, b and c not stable within %s (rebalance timeout + 3 s) of c joining: %s, generation %d, %d members",
		within, info.State, info.Epoch, len(info.Members))
	// Is it late, or never? A livelock keeps the phase open past every
	// client's deadline, several times.
	more := 4 * (rebalance + overhead)
	if took, info, ok = stable(more, "a", "b", "c"); ok {
		t.Logf("stable %s later", took.Round(10*time.Millisecond))
	} else {
		t.Errorf("still not stable %s later (livelock): %s, generation %d", more, info.State, info.Epoch)
	}
}

// holder is a classic group member on raw requests: it joins and syncs
// like a consumer, heartbeats, and rejoins when told to, until the
// storm: then it only heartbeats, staying in the group without rejoining.
type holder struct {
	t                  *testing.T
	cl                 *kgo.Client
	group              string
	session, rebalance time.Duration
	hb                 time.Duration
	storm              *atomic.Bool
	id                 string
	gen                int32
}

func newHolder(t *testing.T, addr, group string, session, rebalance, hb time.Duration, storm *atomic.Bool) *holder {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ClientID("holder"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &holder{t: t, cl: cl, group: group, session: session, rebalance: rebalance, hb: hb, storm: storm}
}

func (h *holder) join(ctx context.Context) error {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{inTopic}
	for {
		req := kmsg.NewPtrJoinGroupRequest()
		req.Group, req.MemberID, req.ProtocolType = h.group, h.id, "consumer"
		req.SessionTimeoutMillis = int32(h.session.Milliseconds())
		req.RebalanceTimeoutMillis = int32(h.rebalance.Milliseconds())
		p := kmsg.NewJoinGroupRequestProtocol()
		p.Name, p.Metadata = "range", meta.AppendTo(nil)
		req.Protocols = append(req.Protocols, p)
		resp, err := req.RequestWith(ctx, h.cl)
		if err != nil {
			return err
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			if errors.Is(err, kerr.MemberIDRequired) {
				h.id = resp.MemberID
				continue
			}
			return err
		}
		h.gen = resp.Generation
		sync := kmsg.NewPtrSyncGroupRequest()
		sync.Group, sync.MemberID, sync.Generation = h.group, h.id, h.gen
		sync.ProtocolType, sync.Protocol = kmsg.StringPtr("consumer"), kmsg.StringPtr("range")
		sresp, err := sync.RequestWith(ctx, h.cl)
		if err != nil {
			return err
		}
		if err := kerr.ErrorForCode(sresp.ErrorCode); err != nil {
			if errors.Is(err, kerr.RebalanceInProgress) {
				continue
			}
			return err
		}
		return nil
	}
}

func (h *holder) run(ctx context.Context) {
	if err := h.join(ctx); err != nil {
		h.t.Logf("holder: join: %v", err)
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.hb):
		}
		req := kmsg.NewPtrHeartbeatRequest()
		req.Group, req.MemberID, req.Generation = h.group, h.id, h.gen
		resp, err := req.RequestWith(ctx, h.cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		switch {
		case err == nil:
		case errors.Is(err, kerr.RebalanceInProgress) && h.storm.Load():
			// Stays without rejoining.
		case errors.Is(err, kerr.RebalanceInProgress):
			if err := h.join(ctx); err != nil {
				h.t.Logf("holder: rejoin: %v", err)
				return
			}
		default:
			h.t.Logf("holder: out of the group: %v", err)
			return
		}
	}
}

// traceGroup logs each change of the group's state, generation or
// members (shown on failure, or with -v).
func traceGroup(ctx context.Context, t *testing.T, c *kfake.Cluster, group string) {
	start := time.Now()
	last := ""
	for ctx.Err() == nil {
		if g := c.GroupInfo(group); g != nil {
			var names []string
			for _, m := range g.Members {
				names = append(names, m.ClientID)
			}
			slices.Sort(names)
			now := fmt.Sprintf("%s, generation %d, members %v", g.State, g.Epoch, names)
			if now != last {
				t.Logf("+%5.1fs %s", time.Since(start).Seconds(), now)
				last = now
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}
