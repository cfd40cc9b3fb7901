package serve_test

// dam serve where Citus differs from one server; see dedup/citus_test.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"testing"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgcitus"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
)

// proxyWorker routes the coordinator's connections to worker i of cc
// through a tcpproxy (pgtest.RouteWorker), so that a test can lose what a
// worker answers the coordinator.
func proxyWorker(t *testing.T, cc *pgcitus.Cluster, i int) *tcpproxy.Proxy {
	t.Helper()
	px := tcpproxy.New(t, fmt.Sprintf("127.0.0.1:%d", cc.Worker(i).Port()))
	pgtest.RouteWorker(t, cc.Worker(i), px.Addr())
	return px
}

// TestCitusServeBatchLostWorkerCommitReplyNotDuplicate: on Citus, checks
// whose transaction's commit reached the worker but whose reply was lost
// are answered 503 (an unknown outcome), never "duplicate": nobody was
// ever told to forward them, and a caller would drop the records.
//
// The checks of a batch that all sit on one worker commit in one phase:
// the coordinator sends COMMIT to the worker, then commits itself. The
// worker commits; its reply is lost (the worker crashes right after, a
// network fault); Citus then fails the client's COMMIT with "could not
// commit transaction for shard N on at least one active node", SQLSTATE
// XX000. Were that taken for a permanent refusal, serve, told that the
// store refused the transaction "for a reason no retry fixes", would
// decide the checks again one by one (api.go checkSeparately; combine.go
// does the same for single checks sharing a transaction), and each would
// find its own content, stored by the commit that "failed": duplicate.
// docs/check-service.md: "A 503 is never a guess: the service ... answers
// nothing it did not decide"; an unknown commit is answered 503
// unavailable, never decided again.
func TestCitusServeBatchLostWorkerCommitReplyNotDuplicate(t *testing.T) {
	cc := pgtest.NeedCitusCluster(t)
	var px *tcpproxy.Proxy
	h := newHarness(t, func(c *config.Config) { px = proxyWorker(t, cc, 0) }) // before the store connects
	ctx := context.Background()
	_, pxPort, _ := net.SplitHostPort(px.Addr())
	var ents []string
	for i := 0; len(ents) < 2 && i < 1000; i++ {
		e := fmt.Sprint("e-", i)
		var port string
		if err := h.store.Pool().QueryRow(ctx, `SELECT nodeport::text FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column('state', $1::bytea)`, []byte(e)).Scan(&port); err != nil {
			t.Fatal(err)
		}
		if port == pxPort {
			ents = append(ents, e)
		}
	}
	if len(ents) < 2 {
		t.Fatal("no entities on the proxied worker")
	}

	// The next COMMIT the coordinator sends that worker reaches it; the
	// reply is lost.
	px.LoseNextCommitReply(nil)
	code, _, out := h.do("POST", "/v1/check:batch", tokenAll, fmt.Sprintf(`{"checks":[
		{"service":"a","entity":%q,"payload":{"v":1}},
		{"service":"a","entity":%q,"payload":{"v":1}}]}`, ents[0], ents[1]))
	t.Logf("batch of two new checks, the worker's COMMIT reply lost: %d %s", code, out)
	if code != 200 {
		return // 503: the outcome is unknown and said so
	}
	var resp struct {
		Results []struct {
			Decision string
			Error    *struct{ Code, Message string }
		}
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.Results {
		if r.Error == nil && r.Decision == "duplicate" {
			t.Errorf("check %d (%s, never checked before) answered duplicate: the lost commit stored it, "+
				"serve decided it again, and no caller was ever told to forward it", i, ents[i])
		}
	}
}
