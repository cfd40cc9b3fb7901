package pipeline_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/internal/pgtest"
	"github.com/dam-dedup/dam/internal/testkafka"
)

// TestKcatInterop has librdkafka (kcat) on both sides of the pipeline over
// kfake's TCP listener: kcat produces the projection while the pipeline
// runs, and a read_committed kcat consumer sees exactly the changes, in
// order. It proves the wire-level interop of what dam forwards with a
// non-Go client, not only with franz-go.
func TestKcatInterop(t *testing.T) {
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat not found: run make deps or apt-get install kcat")
	}
	kc := testkafka.New(t, 1, "projections.x", "delivery.x")
	dsn := pgtest.DSN(t)
	cfg := testConfig(t, kc, dsn, route("x", "projections.x", "delivery.x"))
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

	cons := exec.CommandContext(ctx, kcat, "-b", kc.Addr(), "-C", "-t", "delivery.x", "-e",
		"-f", `%k:%s\n`, "-X", "isolation.level=read_committed")
	var stdout, stderr bytes.Buffer
	cons.Stdout, cons.Stderr = &stdout, &stderr
	if err := cons.Run(); err != nil {
		t.Fatalf("kcat -C: %v\n%s", err, stderr.String())
	}
	got := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("kcat consumed\n%s\nwant\n%s\n(kcat stderr: %s)", strings.Join(got, "\n"), strings.Join(want, "\n"), stderr.String())
	}
	r.stop()
}
