package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// faultNet sits between the broker and its clients (kfake.ListenFn): the
// chaos tests reset every open connection (as a broker restart or a
// network failure does) or delay every reply of the broker.
type faultNet struct {
	latency atomic.Int64 // nanoseconds before each write of the broker
	// ref watches the group requests and replies that pass (referee_test.go).
	ref   *groupReferee
	mu    sync.Mutex
	conns map[*faultConn]struct{}
}

func newFaultNet() *faultNet { return &faultNet{conns: map[*faultConn]struct{}{}} }

func (f *faultNet) listen(network, addr string) (net.Listener, error) {
	l, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	return &faultListener{Listener: l, f: f}, nil
}

// reset closes every open connection with a TCP reset and returns how
// many there were; new connections are accepted.
func (f *faultNet) reset() int {
	f.mu.Lock()
	conns := f.conns
	f.conns = map[*faultConn]struct{}{}
	f.mu.Unlock()
	for c := range conns {
		if tc, ok := c.Conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, not FIN
		}
		_ = c.Conn.Close()
	}
	return len(conns)
}

// setLatency delays every write of the broker by d (0 ends it).
func (f *faultNet) setLatency(d time.Duration) { f.latency.Store(int64(d)) }

type faultListener struct {
	net.Listener
	f *faultNet
}

func (l *faultListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	fc := &faultConn{Conn: c, f: l.f}
	if ref := l.f.ref; ref != nil {
		// Requests: the whole frame of JoinGroup, Heartbeat and
		// SyncGroup (keys 11, 12, 14). Replies: the correlation ID.
		fc.requests = &frameScanner{headLen: 2, keep: func(head []byte) bool {
			if len(head) < 2 {
				return false
			}
			k := int16(binary.BigEndian.Uint16(head))
			return k == 11 || k == 12 || k == 14
		}, onFrame: func(frame []byte) {
			if len(frame) >= 8 {
				ref.request(fc, frame)
			}
		}}
		fc.replies = &frameScanner{headLen: 4, keep: func([]byte) bool { return false }, onFrame: func(head []byte) {
			if len(head) == 4 {
				ref.response(fc, int32(binary.BigEndian.Uint32(head)))
			}
		}}
	}
	l.f.mu.Lock()
	l.f.conns[fc] = struct{}{}
	l.f.mu.Unlock()
	return fc, nil
}

type faultConn struct {
	net.Conn
	f                 *faultNet
	requests, replies *frameScanner // nil without a referee
}

func (c *faultConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.requests != nil && n > 0 {
		c.requests.feed(b[:n])
	}
	return n, err
}

func (c *faultConn) Write(b []byte) (int, error) {
	if d := c.f.latency.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	n, err := c.Conn.Write(b)
	if c.replies != nil && n > 0 {
		c.replies.feed(b[:n])
	}
	return n, err
}

func (c *faultConn) Close() error {
	c.f.mu.Lock()
	delete(c.f.conns, c)
	c.f.mu.Unlock()
	if c.f.ref != nil {
		c.f.ref.closed(c)
	}
	return c.Conn.Close()
}

// signal sends sig to the running process.
func (s *sidecar) signal(sig syscall.Signal) {
	s.t.Helper()
	p := s.running()
	if p == nil {
		s.t.Fatalf("%s: not running", s.name)
	}
	if err := p.Signal(sig); err != nil {
		s.t.Fatalf("%s: %v: %v", s.name, sig, err)
	}
}

// stopped reports whether the process is stopped by a signal (SIGSTOP):
// state T in /proc/PID/stat.
func (s *sidecar) stopped() (bool, error) {
	p := s.running()
	if p == nil {
		return false, errors.New("not running")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID()))
	if err != nil {
		return false, err
	}
	// pid (comm) state ...: comm may hold spaces, so cut at the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false, fmt.Errorf("/proc/%d/stat: %q", p.PID(), b)
	}
	return b[i+2] == 'T', nil
}

// waitStopped waits until the process has stopped itself (the
// DAM_TEST_PAUSE_AT hook) and fails the test if it has not within limit.
func (s *sidecar) waitStopped(limit time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		st, err := s.stopped()
		if err == nil && st {
			return
		}
		s.checkAlive()
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("%s: did not stop itself at its pause step within %s", s.name, limit)
}

// exited reports whether the process has exited by itself, and how; it is
// then no longer running (start it again).
func (s *sidecar) exited() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return false, nil
	}
	exited, err := s.proc.Exited()
	if exited {
		s.proc = nil
	}
	return exited, err
}

// watchHalted polls the sidecar until stop is closed and reports whether
// it was seen halted (dam_halted > 0), not ready (/readyz 503), and not
// ready for a partition's reason: not for one of the whole instance's
// (Kafka or PostgreSQL unreachable, the group not joined, shutting down),
// which a health probe timing out on a starved machine reports too.
func watchHalted(s *sidecar, stop <-chan struct{}) <-chan [3]bool {
	res := make(chan [3]bool, 1)
	go func() {
		var halted, notReady, partition bool
		for {
			if h, err := s.halted(); err == nil && h > 0 {
				halted = true
			}
			if code, body := s.readyBody(); code == http.StatusServiceUnavailable {
				notReady = true
				if !instanceReason(body) {
					partition = true
				}
			}
			select {
			case <-stop:
				res <- [3]bool{halted, notReady, partition}
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return res
}

// The operator's side of the chaos rows: what a person does to the group
// and the input topic with Kafka's admin API, and what dam's progress in
// PostgreSQL says.

const group = "dam-e2e" // the sidecars' kafka.group

// admin returns an admin client of the run's broker, closed at cleanup
// (one per run, so that a loop polling the offsets opens no more).
func (c *chaosRun) admin() *kadm.Client {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.adm != nil {
		return c.adm
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.b.addr()))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(cl.Close)
	c.adm = kadm.NewClient(cl)
	return c.adm
}

func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// committed returns the group's committed offsets of the input topic.
func (c *chaosRun) committed() map[int32]int64 {
	c.t.Helper()
	ctx, cancel := opCtx()
	defer cancel()
	// Require-stable: a transaction in flight makes the broker answer
	// UNSTABLE_OFFSET_COMMIT, to be asked again.
	resps, err := c.admin().FetchOffsetsForTopics(kadm.RequireStable(ctx), group, inTopic)
	for (errors.Is(err, kerr.UnstableOffsetCommit) || err == nil && errors.Is(resps.Error(), kerr.UnstableOffsetCommit)) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		resps, err = c.admin().FetchOffsetsForTopics(kadm.RequireStable(ctx), group, inTopic)
	}
	if err == nil {
		err = resps.Error()
	}
	if err != nil {
		c.t.Fatalf("fetching the committed offsets: %v", err)
	}
	out := map[int32]int64{}
	resps.Each(func(o kadm.OffsetResponse) {
		if o.Topic == inTopic && o.At >= 0 {
			out[o.Partition] = o.At
		}
	})
	return out
}

// endOffsets returns the input topic's end offsets.
func (c *chaosRun) endOffsets() map[int32]int64 {
	c.t.Helper()
	ctx, cancel := opCtx()
	defer cancel()
	ends, err := c.admin().ListEndOffsets(ctx, inTopic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		c.t.Fatalf("listing the end offsets: %v", err)
	}
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// progress returns dam's progress P (next offset to decide) of each input
// partition, from PostgreSQL.
func (c *chaosRun) progress() map[int32]int64 {
	c.t.Helper()
	ctx, cancel := opCtx()
	defer cancel()
	conn, err := pgx.Connect(ctx, c.dsn)
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT part, next_offset FROM progress WHERE grp = $1 AND topic = $2 AND next_offset IS NOT NULL`, group, inTopic)
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[int32]int64{}
	var part int32
	var next int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &next}, func() error { out[part] = next; return nil }); err != nil {
		c.t.Fatal(err)
	}
	return out
}

// stoppedCleanly checks, after a SIGTERM, that every partition's committed
// offset is dam's progress (docs/delivery.md: a clean stop delivers and
// commits what it decided), and returns that position.
func (c *chaosRun) stoppedCleanly() map[int32]int64 {
	c.t.Helper()
	prog, comm := c.progress(), c.committed()
	for p := range int32(partitions) {
		if prog[p] != comm[p] {
			c.t.Errorf("after a clean stop partition %d is committed at %d, decided up to %d", p, comm[p], prog[p])
		}
	}
	return prog
}

// moveOffsets commits offsets of the input topic for the group, as an
// operator does (kafka-consumer-groups --reset-offsets): only while the
// group is empty, so it waits for the stopped members to be gone.
func (c *chaosRun) moveOffsets(to map[int32]int64) {
	c.t.Helper()
	ctx, cancel := opCtx()
	defer cancel()
	adm := c.admin()
	offs := kadm.Offsets{}
	for p, o := range to {
		offs.Add(kadm.Offset{Topic: inTopic, Partition: p, At: o, LeaderEpoch: -1})
	}
	for {
		var err error
		var groups kadm.DescribedGroups
		if groups, err = adm.DescribeGroups(ctx, group); err == nil {
			if g := groups[group]; g.Err != nil {
				err = g.Err
			} else if g.State != "Empty" {
				err = fmt.Errorf("group %s is %s, with %d members", group, g.State, len(g.Members))
			}
		}
		if err == nil {
			var resps kadm.OffsetResponses
			if resps, err = adm.CommitOffsets(ctx, group, offs); err == nil {
				err = resps.Error()
			}
			if err == nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("moving the offsets of %s: %v", group, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// recreateInput deletes the input topic and creates it again, empty, with
// as many partitions: a new topic under the old name (another topic id).
func (c *chaosRun) recreateInput() {
	c.t.Helper()
	ctx, cancel := opCtx()
	defer cancel()
	adm := c.admin()
	if resp, err := adm.DeleteTopic(ctx, inTopic); err != nil || resp.Err != nil {
		c.t.Fatalf("deleting %s: %v %v", inTopic, err, resp.Err)
	}
	for {
		td, err := adm.ListTopics(ctx, inTopic)
		if err == nil && !td.Has(inTopic) {
			break
		}
		if ctx.Err() != nil {
			c.t.Fatalf("%s still listed after its deletion: %v", inTopic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if resp, err := adm.CreateTopic(ctx, partitions, 1, nil, inTopic); err != nil || resp.Err != nil {
		c.t.Fatalf("creating %s again: %v %v", inTopic, err, resp.Err)
	}
}

// commitFloors watches every offset commit the broker receives for the
// group's input partitions (OffsetCommit, TxnOffsetCommit, whether or not
// its transaction commits) and records those below the partition's floor:
// the offset an operator moved it forward to, below which dam must never
// commit (docs/delivery.md: a catch-up commits nothing below C); and
// those above its ceiling: the offset of a record the partition halts at,
// past which dam must never commit.
type commitFloors struct {
	topicID [16]byte
	mu      sync.Mutex
	floor   map[int32]int64
	ceil    map[int32]int64
	checked int      // commits of a partition with a floor or a ceiling
	below   []string // the commits below a floor or above a ceiling
}

func (c *chaosRun) watchCommits() *commitFloors {
	c.t.Helper()
	ctx, cancel := opCtx()
	defer cancel()
	td, err := c.admin().ListTopics(ctx, inTopic)
	if err != nil || !td.Has(inTopic) {
		c.t.Fatalf("listing %s: %v", inTopic, err)
	}
	f := &commitFloors{topicID: td[inTopic].ID, floor: map[int32]int64{}, ceil: map[int32]int64{}}
	see := func(kind string, topic string, id [16]byte, part int32, offset int64) {
		if topic != inTopic && id != f.topicID {
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		fl, floor := f.floor[part]
		cl, ceil := f.ceil[part]
		if !floor && !ceil {
			return
		}
		f.checked++
		switch {
		case len(f.below) >= 20:
		case floor && offset < fl:
			f.below = append(f.below, fmt.Sprintf("%s of partition %d at %d, below the offset %d it was moved to", kind, part, offset, fl))
		case ceil && offset > cl:
			f.below = append(f.below, fmt.Sprintf("%s of partition %d at %d, past the record at %d it halts at", kind, part, offset, cl))
		}
	}
	observe := func(req kmsg.Request) (kmsg.Response, error, bool) {
		switch req := req.(type) {
		case *kmsg.OffsetCommitRequest:
			if req.Group == group {
				for _, t := range req.Topics {
					for _, p := range t.Partitions {
						see("OffsetCommit", t.Topic, t.TopicID, p.Partition, p.Offset)
					}
				}
			}
		case *kmsg.TxnOffsetCommitRequest:
			if req.Group == group {
				for _, t := range req.Topics {
					for _, p := range t.Partitions {
						see("TxnOffsetCommit", t.Topic, t.TopicID, p.Partition, p.Offset)
					}
				}
			}
		}
		return nil, nil, false // observe only: the broker handles it
	}
	cl := c.b.cluster()
	cl.ControlKey(int16(kmsg.OffsetCommit), observe)
	cl.ControlKey(int16(kmsg.TxnOffsetCommit), observe)
	return f
}

// raise sets the floors of the partitions moved.
func (f *commitFloors) raise(to map[int32]int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for p, o := range to {
		f.floor[p] = max(f.floor[p], o)
	}
}

// cap sets the ceiling of a partition.
func (f *commitFloors) cap(part int32, offset int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ceil[part] = offset
}

func (f *commitFloors) result() (checked int, below []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checked, slices.Clone(f.below)
}

// readyBody returns /readyz's status code and body (0 when unreachable).
// instanceReason reports a /readyz answer giving a reason of the whole
// instance, not of one of its partitions (pipeline's NotReadyError).
func instanceReason(body string) bool {
	for _, r := range []string{"kafka unreachable", "kafka refuses dam", "postgres unreachable", "consumer group not joined yet", "shutting down"} {
		if strings.Contains(body, ": "+r+" (") {
			return true
		}
	}
	return false
}

func (s *sidecar) readyBody() (int, string) {
	resp, err := httpClient.Get("http://" + s.httpAddr + "/readyz")
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
