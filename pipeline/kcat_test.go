package pipeline_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// TestKcatInterop has librdkafka (kcat) on both sides of the pipeline over
// kfake's TCP listener: kcat produces the projection while the pipeline
// runs, and a read_committed kcat consumer sees exactly the changes, in
// order. It proves the wire-level interop of what dam forwards with a
// non-Go client, not only with franz-go.
//
// In exactly-once mode, the first transaction aborts after its records are
// written (its offset commit is answered REBALANCE_IN_PROGRESS): a
// read_uncommitted kcat sees those records twice, a read_committed one
// exactly once.
func TestKcatInterop(t *testing.T) {
	t.Parallel()
	t.Run("at-least-once", func(t *testing.T) { t.Parallel(); testKcat(t, false) })
	t.Run("exactly-once", func(t *testing.T) { t.Parallel(); testKcat(t, true) })
}

func testKcat(t *testing.T, eos bool) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat not found: run make deps or apt-get install kcat")
	}
	kc := testkafka.New(t, 1, "projections.x", "delivery.x")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("x", "projections.x", "delivery.x"))
	var aborted atomic.Bool
	if eos {
		cfg = eosConfig(t, kc, dsn, "kcat", route("x", "projections.x", "delivery.x"))
		kc.ControlKey(int16(kmsg.TxnOffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
			if aborted.Swap(true) {
				return nil, nil, false
			}
			creq := req.(*kmsg.TxnOffsetCommitRequest)
			resp := creq.ResponseKind().(*kmsg.TxnOffsetCommitResponse)
			for _, t := range creq.Topics {
				rt := kmsg.NewTxnOffsetCommitResponseTopic()
				rt.Topic = t.Topic
				for _, p := range t.Partitions {
					rp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
					rp.Partition, rp.ErrorCode = p.Partition, kerr.RebalanceInProgress.Code
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			return resp, nil, true
		})
	}
	r := start(t, cfg, openStore(t, dsn))

	input := []string{
		`k1:{"a":1,"b":2}`,
		`k2:{"x":"A"}`,
		`k1:{"b":2,"a":1}`,      // key-order variant: dropped
		`k2:{"x":"\u0041"}`,     // escape variant: dropped
		`k1:{"a":1,"b":2}`,      // exact repeat: dropped
		`k1:{"a":1,"b":3}`,      // change: forwarded
		`k3:{"z":[1, 2]}`,       // new entity
		`k3:{ "z" : [ 1,2 ] }`,  // whitespace variant: dropped
		`k2:{"x":"B","y":null}`, // change: forwarded
	}
	want := []string{
		`k1:{"a":1,"b":2}`,
		`k2:{"x":"A"}`,
		`k1:{"a":1,"b":3}`,
		`k3:{"z":[1, 2]}`,
		`k2:{"x":"B","y":null}`,
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prod := exec.CommandContext(ctx, kcat, "-b", kc.Addr(), "-P", "-t", "projections.x", "-K:")
	prod.Stdin = strings.NewReader(strings.Join(input, "\n") + "\n")
	if out, err := prod.CombinedOutput(); err != nil {
		t.Fatalf("kcat -P: %v\n%s", err, out)
	}
	r.waitRecords("x", len(input))

	consume := func(isolation string) []string {
		cons := exec.CommandContext(ctx, kcat, "-b", kc.Addr(), "-C", "-t", "delivery.x", "-e",
			"-f", `%k:%s\n`, "-X", "isolation.level="+isolation)
		var stdout, stderr bytes.Buffer
		cons.Stdout, cons.Stderr = &stdout, &stderr
		if err := cons.Run(); err != nil {
			t.Fatalf("kcat -C: %v\n%s", err, stderr.String())
		}
		return strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	}
	got := consume("read_committed")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("kcat (read_committed) consumed\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if eos {
		if !aborted.Load() {
			t.Error("no offset commit was refused")
		}
		if all := consume("read_uncommitted"); len(all) <= len(want) {
			t.Errorf("kcat (read_uncommitted) consumed %d records: the aborted transaction left nothing to hide", len(all))
		}
	}
	r.stop()
}
