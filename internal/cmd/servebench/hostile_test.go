package main

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/dam-dedup/dam/internal/testutil/damproc"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// reducedHostile is the hostile-client run of make test: fewer clients
// than the 100, the same 10 MB bodies and the same RSS bound,
// which does not depend on the number of clients (without the bounds on
// what is in flight, 40 of them took dam serve far past it).
var reducedHostile = hostileOptions{Large: 40, LargeBytes: 10_000_000, RSSLimit: 300 << 20, Good: 300, Poison: 40, MadeUp: 500,
	BodyHogs: 60, IdleConns: 2000, HogFor: 4 * time.Second, HogP99: 250 * time.Millisecond}

// The hostile-client run against the real binary: large
// bodies flood dam serve while a well-behaved client checks, beside
// checks with identities the store cannot hold and checks of made-up
// services; then 60 body hogs of another tenant (the largest body
// announced, nothing sent, again and again) and 2,000 idle connections
// (nothing sent, opened again once closed) beside a well-behaved tenant's
// checks. Every good check is answered 200, every bad identity 400
// naming its field, every large body 200, 400, 408 (a sender slower than
// the minimum rate), 413 or 503 with
// Retry-After; beside the hogs every check is answered 200 with a p99
// under 250 ms; dam serve's peak RSS (VmHWM, measured on the process)
// stays under 300 MB, and /metrics does not grow with the made-up
// services. DAM_TEST_HOSTILE=full runs it at the size (100
// concurrent 10 MB bodies), as does go run ./internal/cmd/servebench -hostile.
func TestHostileClients(t *testing.T) {
	o := reducedHostile
	if pgtest.Citus() {
		// A check on Citus is a distributed transaction on one machine
		// with its coordinator and workers: its own latency, not the
		// hogs', sets the tail there.
		o.HogP99 = 2 * time.Second
	}
	if os.Getenv("DAM_TEST_HOSTILE") == "full" {
		o = fullHostile
	}
	// The hogs' connections, both ends (dam serve's own limit is raised
	// to its hard limit by the Go runtime, as this process's is).
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < uint64(o.IdleConns+o.BodyHogs+512) {
		lim.Cur = min(lim.Max, uint64(o.IdleConns+o.BodyHogs+512))
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
		if lim.Cur < uint64(o.IdleConns+o.BodyHogs+512) {
			// Fewer idle connections than the 2,000 on a machine
			// whose hard limit of open files does not allow them.
			o.IdleConns = max(0, int(lim.Cur)-o.BodyHogs-512)
			t.Logf("RLIMIT_NOFILE %d: %d idle connections only", lim.Cur, o.IdleConns)
		}
	}
	bin, err := damproc.Build(damproc.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := startServe(options{damBin: bin, extra: hostileServeConfig}, pgtest.DSN(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()

	type outcome struct {
		res hostileResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := runHostile(srv.url, srv.proc.PID(), o)
		done <- outcome{res, err}
	}()
	var r outcome
	select {
	case r = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the hostile-client run did not end within 3 minutes")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("%+v\n%s", o, r.res)
	if err := srv.alive(); err != nil {
		t.Fatal(err)
	}
	for _, f := range r.res.failures(o) {
		t.Error(f)
	}
}
