package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
	"github.com/dam-dedup/dam/pipeline"
)

// A missing output topic at start is logged with the command that creates
// it, and Ready names it until it exists; then the records flow.
func TestMissingOutputTopicNotReady(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "in")
	cfg := testConfig(t, kc, pgtest.DSN(t), route("svc", "in", "out"))
	r, logs := startObserved(t, cfg)
	waitFor(t, "Ready naming the missing output topic", func() (bool, string) {
		err := r.pl.Ready()
		var ne *pipeline.NotReadyError
		return errors.As(err, &ne) && ne.Reason == "kafka topic out missing (routes[0].to)", fmt.Sprint(err)
	})
	missing := logs.FilterMessage("kafka topic missing: not ready until it exists").FilterField(zap.String("topic", "out")).All()
	if len(missing) != 1 || !strings.Contains(fmt.Sprint(missing[0].ContextMap()["fix"]), "--create --topic out --partitions 2") {
		t.Fatalf("the missing output topic logged %v, want once with the command that creates it", missing)
	}
	produceTo(t, kc, "in", rec("a", `1`))
	kc.CreateTopic("out", 2)
	waitOutput(t, kc, "out", 1)
	waitFor(t, "ready", func() (bool, string) { err := r.pl.Ready(); return err == nil, fmt.Sprint(err) })
	r.stop()
}

// A missing dead-letter topic is logged at start but leaves dam ready:
// the route works until its first bad record, whose partition pauses
// until the topic is created. Then the partition resumes by itself, and
// the log says so.
func TestMissingDeadLetterTopicResumes(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	rt := route("svc", "in", "out")
	rt.DeadLetter = "dlq"
	cfg := testConfig(t, kc, pgtest.DSN(t), rt)
	r, logs := startObserved(t, cfg)
	waitFor(t, "ready with the dead-letter topic missing", func() (bool, string) { err := r.pl.Ready(); return err == nil, fmt.Sprint(err) })
	if n := logs.FilterLevelExact(zapcore.ErrorLevel).FilterField(zap.String("topic", "dlq")).Len(); n != 1 {
		t.Errorf("the missing dead-letter topic logged %d times as an error, want once", n)
	}
	produceTo(t, kc, "in", rec("a", `1`), rec("b", `not json`), rec("c", `3`))
	waitFor(t, "in/0 paused on the dead letter", func() (bool, string) {
		err := r.pl.Ready()
		return err != nil && strings.Contains(err.Error(), "in/0"), fmt.Sprint(err)
	})
	kc.CreateTopic("dlq", 1)
	waitOutput(t, kc, "dlq", 1)
	waitOutput(t, kc, "out", 2)
	waitFor(t, "the resumption logged", func() (bool, string) {
		n := logs.FilterMessage("partition resumed: delivering (Kafka) succeeds again").FilterField(zap.Int32("partition", 0)).Len()
		return n == 1, fmt.Sprintf("logged %d times", n)
	})
	waitFor(t, "the dead-letter topic's creation logged", func() (bool, string) {
		n := logs.FilterMessage("kafka topic exists now").FilterField(zap.String("topic", "dlq")).Len()
		return n == 1, fmt.Sprintf("logged %d times", n)
	})
	waitFor(t, "ready again", func() (bool, string) { err := r.pl.Ready(); return err == nil, fmt.Sprint(err) })
	r.stop()
}

// A partition paused while PostgreSQL is down resumes by itself once it
// is back, and the log says so, with how long it waited and why.
func TestStoreBackResumeLogged(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 1, "in", "out")
	target, rewrite := tcpproxy.PostgresDSN(t, pgtest.DSN(t))
	proxy := tcpproxy.New(t, target)
	cfg := testConfig(t, kc, rewrite(proxy.Addr()), route("svc", "in", "out"))
	cfg.Pipeline.RetryMin, cfg.Pipeline.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	r, logs := startObserved(t, cfg)
	// Ready with its partition recovered (a member with none is ready too,
	// and a cut during its recovery would pause the recovery instead).
	waitFor(t, "ready with in/0", func() (bool, string) {
		err := r.pl.Ready()
		n := r.gauge("dam_partitions_assigned", "svc")
		return err == nil && n == 1, fmt.Sprint(err, n)
	})
	proxy.Cut()
	produceTo(t, kc, "in", rec("a", `1`))
	waitFor(t, "in/0 paused", func() (bool, string) {
		err := r.pl.Ready()
		return err != nil && strings.Contains(err.Error(), "in/0"), fmt.Sprint(err)
	})
	proxy.Restore()
	waitOutput(t, kc, "out", 1)
	waitFor(t, "the resumption logged", func() (bool, string) {
		e := logs.FilterMessage("partition resumed: deciding (PostgreSQL) succeeds again").FilterField(zap.Int32("partition", 0)).All()
		return len(e) > 0 && e[0].ContextMap()["paused_by"] != nil && e[0].ContextMap()["paused_for"] != nil, fmt.Sprint(e)
	})
	r.stop()
}

// Preflight reports every route's topics: a missing one with the command
// that creates it, an output topic too small for max_size with the
// setting to change, and a preserve route's output with fewer partitions
// than its input.
func TestPreflightTopics(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 3, "in", "in2")
	kc.CreateTopic("small", 3, "max.message.bytes", "200000")
	kc.CreateTopic("narrow", 2)
	a := route("a", "in", "small")
	b := route("b", "in2", "narrow")
	b.Partitioning = config.PartitioningPreserve
	b.DeadLetter = "gone"
	cfg := testConfig(t, kc, "postgres://unused", a, b)
	validate(t, &cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := map[string]pipeline.Check{}
	var names []string
	for _, c := range pipeline.Preflight(ctx, cfg) {
		got[c.Name] = c
		names = append(names, c.Name)
	}
	if want := "kafka routes[0].from routes[0].to routes[1].from routes[1].to routes[1].dead_letter"; strings.Join(names, " ") != want {
		t.Fatalf("checks %v, want %s", names, want)
	}
	for name, want := range map[string]struct {
		status      pipeline.CheckStatus
		detail, fix string
	}{
		"kafka":          {pipeline.CheckOK, "a broker answers", ""},
		"routes[0].from": {pipeline.CheckOK, "in: 3 partitions, max.message.bytes 1048588", ""},
		"routes[0].to":   {pipeline.CheckFail, "routes[0].max_size: 1047552 bytes does not fit in a record of small", "lower routes[0].max_size to 198976, or raise the topic's limit: kafka-configs.sh"},
		"routes[1].to":   {pipeline.CheckFail, "partitioning: preserve: 2 partitions, fewer than the 3 of in2", "--alter --topic narrow --partitions 3"},
		"routes[1].dead_letter": {pipeline.CheckFail, "gone: does not exist",
			"kafka-topics.sh --bootstrap-server " + kc.Addr() + " --create --topic gone --partitions 3"},
	} {
		c := got[name]
		if c.Status != want.status || !strings.Contains(c.Detail, want.detail) || !strings.Contains(c.Fix, want.fix) {
			t.Errorf("%s: %s %q fix %q; want %s %q fix %q", name, c.Status, c.Detail, c.Fix, want.status, want.detail, want.fix)
		}
	}
}

// Preflight says whether the brokers accept dam's credentials: refused,
// it names the mechanism and what to check, and checks nothing more;
// accepted, it says so and goes on to the topics.
func TestPreflightCredentials(t *testing.T) {
	t.Parallel()
	kc := saslCluster(t)
	cfg := testConfig(t, kc, "postgres://unused", route("svc", "in", "out"))
	cfg.Kafka.SASL = config.SASL{Mechanism: "SCRAM-SHA-512", Username: damUser, Password: "not-the-password"}
	validate(t, &cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	checks := pipeline.Preflight(ctx, cfg)
	if len(checks) != 1 || checks[0].Name != "kafka" || checks[0].Status != pipeline.CheckFail ||
		!strings.Contains(checks[0].Detail, "SASL SCRAM-SHA-512 authentication to "+kc.Addr()+" failed") || !strings.Contains(checks[0].Fix, "kafka.sasl") {
		t.Fatalf("wrong password: %+v", checks)
	}
	cfg.Kafka.SASL.Password = damPass
	checks = pipeline.Preflight(ctx, cfg)
	if len(checks) != 3 || checks[0].Status != pipeline.CheckOK || !strings.Contains(checks[0].Detail, "SASL SCRAM-SHA-512 as dam accepted") ||
		checks[2].Status != pipeline.CheckOK || !strings.Contains(checks[2].Detail, "out: 2 partitions") {
		t.Fatalf("right password: %+v", checks)
	}
}
