package main

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/dam-dedup/dam/config"
)

// The JSON log's time is ISO 8601, as people and log stores read it, not
// an epoch float.
func TestLogTimeIsISO8601(t *testing.T) {
	zc, err := loggerConfig(config.Log{Level: "info", Format: "json"})
	if err != nil {
		t.Fatal(err)
	}
	enc := zapcore.NewJSONEncoder(zc.EncoderConfig)
	at := time.Date(2026, 11, 27, 23, 59, 1, 250e6, time.UTC)
	buf, err := enc.EncodeEntry(zapcore.Entry{Time: at, Message: "m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if line := buf.String(); !strings.Contains(line, `"ts":"2026-11-27T23:59:01.250Z"`) {
		t.Errorf("log line %s: want ts in ISO 8601", line)
	}
}
