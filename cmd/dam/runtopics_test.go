package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/testkafka"
)

// dam run names a missing input topic at start: an error in the log with
// the topic and the command that creates it, and /readyz says which topic
// is missing. Once the topic is created, dam logs it, consumes it without
// a restart, and is ready.
func TestRunNamesMissingInputTopic(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t, 2, "out")
	cfg := sidecarConfig(t, kc, pgtest.DSN(t), nil)
	addr, logs := startSidecar(t, cfg)
	readyz := func() (int, string) { t.Helper(); return readyz(t, addr) }
	waitFor := func(what string, ok func() (bool, string)) {
		t.Helper()
		var last string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			var done bool
			if done, last = ok(); done {
				return
			}
		}
		t.Fatalf("%s: still %s", what, last)
	}

	// Named at start, with its fix.
	fix := "kafka-topics.sh --bootstrap-server " + kc.Addr() + " --create --topic in --partitions <partitions>"
	named := func() int {
		return logs.Filter(func(e observer.LoggedEntry) bool {
			m := e.ContextMap()
			return e.Level == zapcore.ErrorLevel && m["topic"] == "in" && m["check"] == "routes[0].from" && m["fix"] == fix
		}).Len()
	}
	waitFor("an error naming the missing input topic and its fix", func() (bool, string) {
		return named() == 1, fmt.Sprint(logs.FilterLevelExact(zapcore.ErrorLevel).All())
	})
	waitFor("/readyz naming the missing topic", func() (bool, string) {
		code, body := readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "kafka topic in missing (routes[0].from)"), fmt.Sprint(code, " ", body)
	})

	// Created: consumed without a restart.
	kc.CreateTopic("in", 2)
	waitFor("ready once the topic exists", func() (bool, string) {
		code, body := readyz()
		return code == http.StatusOK, fmt.Sprint(code, " ", body)
	})
	if n := logs.FilterMessage("kafka topic exists now").FilterField(zap.String("topic", "in")).Len(); n != 1 {
		t.Errorf("the topic's creation logged %d times, want once", n)
	}
	kc.Produce("in", &kgo.Record{Key: []byte("k"), Value: []byte(`{"v":1}`)})
	waitFor("the record delivered", func() (bool, string) {
		out := kc.ReadAll("out")
		return len(out) == 1, fmt.Sprintf("%d records in out", len(out))
	})
}
