package pipeline_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// Kafka: faults of the broker (kfake), and a witness of its commits.

// produceGate makes the broker refuse produce requests to some topics with
// a retriable error (NOT_ENOUGH_REPLICAS) while it is closed: the producer
// keeps retrying, nothing is delivered or committed, and a stopped
// pipeline's records fail at once (their context is canceled). It can be
// closed for one producer only (by producer id), and it remembers the last
// producer id it saw.
type produceGate struct {
	closed atomic.Bool
	only   atomic.Int64 // with closed: refuse only this producer id (0: all)
	last   atomic.Int64 // the last producer id seen producing to the topics
	topics []string
	ids    [][16]byte // the topics' ids: newer produce requests name topics by id
}

func newProduceGate(t *testing.T, kc *testkafka.Cluster, topics ...string) *produceGate {
	t.Helper()
	g := &produceGate{topics: topics}
	td, err := kadm.NewClient(kc.Client()).ListTopics(context.Background(), topics...)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range td {
		if d.Err != nil {
			t.Fatalf("produce gate: topic %s: %v", d.Topic, d.Err)
		}
		g.ids = append(g.ids, d.ID)
	}
	gated := func(t kmsg.ProduceRequestTopic) bool {
		return slices.Contains(g.topics, t.Topic) || slices.Contains(g.ids, t.TopicID)
	}
	kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		preq := req.(*kmsg.ProduceRequest)
		if !slices.ContainsFunc(preq.Topics, gated) {
			return nil, nil, false
		}
		pid := producerID(preq)
		g.last.Store(pid)
		if !g.closed.Load() || (g.only.Load() != 0 && g.only.Load() != pid) {
			return nil, nil, false
		}
		kc.KeepControl()
		resp := preq.ResponseKind().(*kmsg.ProduceResponse)
		for _, t := range preq.Topics {
			rt := kmsg.NewProduceResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition = p.Partition
				rp.ErrorCode = kerr.NotEnoughReplicas.Code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})
	return g
}

// close refuses the produce requests of every producer; open lets them
// through again.
func (g *produceGate) close() { g.only.Store(0); g.closed.Store(true) }
func (g *produceGate) open()  { g.closed.Store(false) }

// closeFor closes the gate for one producer id only.
func (g *produceGate) closeFor(pid int64) { g.only.Store(pid); g.closed.Store(true) }

// producerID reads the producer id of the first record batch of a produce
// request (bytes 43 to 50 of a v2 batch), or -1.
func producerID(req *kmsg.ProduceRequest) int64 {
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			if len(p.Records) >= 51 {
				return int64(binary.BigEndian.Uint64(p.Records[43:51]))
			}
		}
	}
	return -1
}

// lossyListener wraps a kfake broker's listener: once armed for a request
// kind, the broker handles the next request of that kind, but its reply is
// dropped and the connection closed: the client cannot know the outcome
// (franz-go issues #1052, #1207: a transaction reported failed that did
// commit). Kafka frames: a 4-byte size, then for a request the api key,
// version and correlation id, for a response the correlation id.
type lossyListener struct {
	net.Listener
	f *lossyFaults
}

// lossyFaults loses the reply to a Kafka request the broker handled: it is
// shared by the listeners of a cluster's brokers (kfake.ListenFn(listen)),
// and armed with loseNext.
type lossyFaults struct {
	armed atomic.Int32 // the kmsg.Key to lose the reply of, +1; 0: none
	lost  atomic.Int32 // replies lost
}

// loseNext loses the reply to the next request of kind key, on any broker.
func (f *lossyFaults) loseNext(key kmsg.Key) { f.armed.Store(int32(key) + 1) }

// listen is a kfake.ListenFn whose listeners lose replies as armed.
func (f *lossyFaults) listen(network, addr string) (net.Listener, error) {
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	return &lossyListener{Listener: ln, f: f}, nil
}

// Accept wraps each connection in a lossyConn.
func (l *lossyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, l: l.f, drop: map[int32]bool{}}, nil
}

// lossyConn is a broker's connection that spots the armed request among
// those it reads and drops its reply, closing the connection, instead of
// writing it.
type lossyConn struct {
	net.Conn
	l    *lossyFaults
	mu   sync.Mutex
	in   []byte // requests read, not yet a whole frame
	out  []byte // responses written, not yet a whole frame
	drop map[int32]bool
}

// Read passes requests through, noting the correlation id of the armed
// one.
func (c *lossyConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	c.in = append(c.in, b[:n]...)
	for len(c.in) >= 4 {
		size := int(binary.BigEndian.Uint32(c.in))
		if len(c.in) < 4+size {
			break
		}
		frame := c.in[4 : 4+size]
		if len(frame) >= 8 {
			key := int32(binary.BigEndian.Uint16(frame))
			if a := c.l.armed.Load(); a != 0 && a == key+1 && c.l.armed.CompareAndSwap(a, 0) {
				c.drop[int32(binary.BigEndian.Uint32(frame[4:]))] = true
			}
		}
		c.in = c.in[4+size:]
	}
	c.mu.Unlock()
	return n, err
}

// Write passes whole replies through, but for the one to drop, where it
// closes the connection.
func (c *lossyConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out = append(c.out, b...)
	for len(c.out) >= 8 {
		size := int(binary.BigEndian.Uint32(c.out))
		if len(c.out) < 4+size {
			break
		}
		frame := c.out[:4+size]
		if c.drop[int32(binary.BigEndian.Uint32(frame[4:]))] {
			c.l.lost.Add(1)
			c.Conn.Close()
			return len(b), nil
		}
		if _, err := c.Conn.Write(frame); err != nil {
			return 0, err
		}
		c.out = c.out[4+size:]
	}
	return len(b), nil
}

// refuseProduce makes the broker refuse every produce to each topic of
// codes, for good (a non-retriable error code per partition), while on.
func refuseProduce(t *testing.T, kc *testkafka.Cluster, codes map[string]int16) *atomic.Bool {
	t.Helper()
	on := &atomic.Bool{}
	ids := map[[16]byte]string{}
	td, err := kadm.NewClient(kc.Client()).ListTopics(context.Background(), slices.Collect(maps.Keys(codes))...)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range td {
		ids[d.ID] = d.Topic
	}
	kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		preq := req.(*kmsg.ProduceRequest)
		refused := false
		resp := preq.ResponseKind().(*kmsg.ProduceResponse)
		for _, pt := range preq.Topics {
			name := pt.Topic
			if name == "" {
				name = ids[pt.TopicID]
			}
			code, ok := codes[name]
			if !ok {
				return nil, nil, false // a request mixing topics: let it through
			}
			refused = true
			rt := kmsg.NewProduceResponseTopic()
			rt.Topic, rt.TopicID = pt.Topic, pt.TopicID
			for _, p := range pt.Partitions {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, refused
	})
	return on
}

// failNextTxnOffsetCommit makes the broker answer the next
// TxnOffsetCommit with an abortable error on every partition
// (UNKNOWN_SERVER_ERROR: franz-go's End aborts the transaction and
// reports it not committed), after running then (nil: nothing).
func failNextTxnOffsetCommit(kc *testkafka.Cluster, then func()) <-chan struct{} {
	done := make(chan struct{})
	kc.ControlKey(int16(kmsg.TxnOffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.TxnOffsetCommitRequest)
		resp := r.ResponseKind().(*kmsg.TxnOffsetCommitResponse)
		for _, t := range r.Topics {
			rt := kmsg.NewTxnOffsetCommitResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
				rp.Partition = p.Partition
				rp.ErrorCode = kerr.UnknownServerError.Code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		if then != nil {
			then()
		}
		close(done)
		return resp, nil, true
	})
	return done
}

// faultFetchPast makes the broker answer fetches of topic/part from an
// offset above past with NOT_LEADER_FOR_PARTITION (franz-go keeps its
// cursor and retries) until the handle is removed; the channel gets a
// value at the first such fetch.
func faultFetchPast(t *testing.T, kc *testkafka.Cluster, topic string, part int32, past int64) (*kfake.FaultHandle, <-chan struct{}) {
	t.Helper()
	td, err := kadm.NewClient(kc.Client()).ListTopics(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	id := td[topic].ID
	seen := make(chan struct{}, 1)
	h := kc.Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.Fetch}, Topic: topic, TopicID: id, Partitions: []int32{part}, Count: -1,
		Err: kerr.NotLeaderForPartition,
		When: func(req kmsg.Request) bool {
			for _, ft := range req.(*kmsg.FetchRequest).Topics {
				if ft.Topic != topic && ft.TopicID != id {
					continue
				}
				for _, p := range ft.Partitions {
					if p.Partition == part && p.FetchOffset > past {
						select {
						case seen <- struct{}{}:
						default:
						}
						return true
					}
				}
			}
			return false
		},
	})
	return h, seen
}

// txnCommits records every offset a transaction commits, per topic and
// partition, as the broker receives it.
type txnCommits struct {
	mu   sync.Mutex
	seen map[string][]int64 // "topic/partition" -> offsets, in order
}

// watchTxnCommits records the broker's TxnOffsetCommit requests, which it
// lets through untouched: no fault, the witness the exactly-once tests
// check their faults against.
func watchTxnCommits(kc *testkafka.Cluster) *txnCommits {
	c := &txnCommits{seen: map[string][]int64{}}
	kc.ControlKey(int16(kmsg.TxnOffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		r := req.(*kmsg.TxnOffsetCommitRequest)
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				k := fmt.Sprintf("%s/%d", t.Topic, p.Partition)
				c.seen[k] = append(c.seen[k], p.Offset)
			}
		}
		return nil, nil, false
	})
	return c
}

// since returns the offsets committed for tp from the i-th on.
func (c *txnCommits) since(tp string, i int) []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.seen[tp][min(i, len(c.seen[tp])):]...)
}

// count returns how many offsets were committed for tp.
func (c *txnCommits) count(tp string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen[tp])
}

// PostgreSQL: faults of the connection and of the store itself.

// pgProxy puts a fault-injecting proxy in front of the test schema's
// PostgreSQL; it returns the proxy, the DSN through it and the direct DSN
// (for the test's own look at the store). Statements are sent with their
// text (exec mode), so that the proxy can see a COMMIT.
func pgProxy(t *testing.T) (*tcpproxy.Proxy, string, string) {
	t.Helper()
	direct := pgtest.DSN(t)
	target, rewrite := tcpproxy.PostgresDSN(t, direct)
	proxy := tcpproxy.New(t, target)
	return proxy, withParam(rewrite(proxy.Addr()), "default_query_exec_mode", "exec"), direct
}

// withParam adds the parameter k=v to dsn.
func withParam(dsn, k, v string) string {
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + k + "=" + v
}

// storeRefuses makes the store itself refuse to write the state of entity
// poison (a data exception, as an index row too large is), the way a
// record that passed dam's own checks could still be refused.
func storeRefuses(t *testing.T, dsn string) {
	t.Helper()
	createTrigger(t, openStore(t, dsn), `CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.entity = 'poison'::bytea THEN
				RAISE EXCEPTION 'value refused for the test' USING ERRCODE = '22023';
			END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON state FOR EACH ROW EXECUTE FUNCTION refuse_poison()`)
}

// createTrigger creates a trigger function and its trigger on st's
// schema, on Citus too: Citus refuses triggers on distributed tables
// unless citus.enable_unsafe_triggers is on (it then creates them on every
// shard), and propagates a new function to the workers with the text of
// the query that created it, so each statement is a query of its own. On
// plain PostgreSQL the setting is a placeholder nothing reads.
func createTrigger(t *testing.T, st *dedup.Store, function, trigger string) {
	t.Helper()
	ctx := context.Background()
	conn, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, sql := range []string{`SET citus.enable_unsafe_triggers TO on`, function, trigger, `RESET citus.enable_unsafe_triggers`} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
}

// dropTrigger drops a trigger createTrigger made, on Citus too (with the
// same setting: Citus refuses DDL on a distributed table's triggers
// without it).
func dropTrigger(t *testing.T, st *dedup.Store, trigger string) {
	t.Helper()
	ctx := context.Background()
	conn, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, sql := range []string{`SET citus.enable_unsafe_triggers TO on`, trigger, `RESET citus.enable_unsafe_triggers`} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
}

// failAcquire makes the store refuse every Acquire of the partitions of
// group (a permanent error, as a broken grant or schema would be).
func failAcquire(t *testing.T, dsn, group string) { failAcquireWith(t, dsn, group, "P0001") }

// failAcquireWith makes the store refuse every Acquire of group's
// partitions with SQLSTATE code: a permanent refusal (P0001, a person must
// look, on either engine), or a transient one that recovery retries.
func failAcquireWith(t *testing.T, dsn, group, code string) {
	t.Helper()
	createTrigger(t, openStore(t, dsn), fmt.Sprintf(`CREATE FUNCTION refuse_acquire() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.grp = %s AND NEW.epoch > OLD.epoch THEN
				RAISE EXCEPTION 'acquire refused for the test' USING ERRCODE = %s;
			END IF;
			RETURN NEW;
		END $$`, quoteLiteral(group), quoteLiteral(code)),
		`CREATE TRIGGER refuse_acquire BEFORE UPDATE ON progress FOR EACH ROW EXECUTE FUNCTION refuse_acquire()`)
}

// quoteLiteral quotes s as an SQL string literal (s holds no quote).
func quoteLiteral(s string) string { return "'" + s + "'" }

// loseWorker makes the first n writes to table, from now on, fail as a
// Citus coordinator reports a worker lost mid-statement (only those whose
// row matches when, a condition on NEW).
func loseWorker(t *testing.T, dsn, table, when string, n int) {
	t.Helper()
	st := openStore(t, dsn)
	if _, err := st.Pool().Exec(context.Background(), `CREATE SEQUENCE lose_worker_`+table); err != nil {
		t.Fatal(err)
	}
	createTrigger(t, st, fmt.Sprintf(`CREATE FUNCTION lose_worker_%[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (%[2]s) AND nextval('lose_worker_%[1]s') <= %[3]d THEN
				RAISE EXCEPTION 'connection to the remote node lost (the test''s)' USING ERRCODE = 'XX000';
			END IF;
			RETURN NEW;
		END $$`, table, when, n),
		fmt.Sprintf(`CREATE TRIGGER lose_worker BEFORE INSERT OR UPDATE ON %[1]s FOR EACH ROW EXECUTE FUNCTION lose_worker_%[1]s()`, table))
}

// commitPreparedDropper stands between the Citus coordinator and one
// worker: once armed, the next COMMIT PREPARED the coordinator sends never
// reaches the worker, and the connection is dropped, as when the worker
// crashes (or the network fails) between the two phases of a commit. The
// coordinator has committed: it warns and answers the client's COMMIT with
// success; the worker keeps the transaction prepared, its rows locked and
// its changes invisible, until Citus's recovery of prepared transactions
// commits it.
type commitPreparedDropper struct {
	ln      net.Listener
	target  string
	armed   atomic.Bool
	dropped chan struct{}
	once    sync.Once
}

// newCommitPreparedDropper listens on a port of its own and relays each
// connection to target (a Citus worker), until the test ends; it drops
// nothing until armed.
func newCommitPreparedDropper(t *testing.T, target string) *commitPreparedDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &commitPreparedDropper{ln: ln, target: target, dropped: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.serve(c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return d
}

// serve relays one connection of the coordinator to the worker, and drops
// it at the armed COMMIT PREPARED.
func (d *commitPreparedDropper) serve(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", d.target)
	if err != nil {
		return
	}
	defer up.Close()
	go func() {
		_, _ = io.Copy(c, up)
		c.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if bytes.Contains(buf[:n], []byte("COMMIT PREPARED")) && d.armed.CompareAndSwap(true, false) {
				d.once.Do(func() { close(d.dropped) })
				return // never delivered; both connections closed
			}
			if _, werr := up.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
