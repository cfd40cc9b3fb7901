package config

import (
	"strings"
	"testing"
	"time"
)

// TestDecisionLogKeep guards decision_log.keep: 7 days by default, days
// accepted in the file and the environment, negative and over-long
// values refused with the key named.
func TestDecisionLogKeep(t *testing.T) {
	if got := Default().DecisionLog.Keep; got != 7*24*time.Hour {
		t.Errorf("default keep %s, want 168h", got)
	}
	base := `kafka: {brokers: [localhost:9092], group: g}
postgres: {dsn: postgres://dam@localhost/dam}
routes: [{service: a, from: in.a, to: out.a}]
`
	for _, tc := range []struct {
		yaml, env string
		want      time.Duration
		err       string
	}{
		{yaml: "decision_log: {keep: 7d}", want: 7 * 24 * time.Hour},
		{yaml: "decision_log: {keep: 1d12h}", want: 36 * time.Hour},
		{yaml: "decision_log: {keep: 0s}", want: 0},
		{yaml: "decision_log: {keep: 90m}", want: 90 * time.Minute},
		{env: "DAM_DECISION_LOG_KEEP=2d", want: 48 * time.Hour},
		{yaml: "decision_log: {keep: -1h}", err: "decision_log.keep: must not be negative"},
		{yaml: "decision_log: {keep: 400d}", err: "decision_log.keep: 9600h0m0s is more than"},
		{yaml: "decision_log: {keep: 7days}", err: `decision_log.keep: invalid duration "7days"`},
		{yaml: "decision_log: {kept: 7d}", err: "decision_log.kept"},
	} {
		var env []string
		if tc.env != "" {
			env = []string{tc.env}
		}
		c, err := Load(writeFile(t, base+tc.yaml+"\n"), env)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q %q: error %v, want one containing %q", tc.yaml, tc.env, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q %q: %v", tc.yaml, tc.env, err)
			continue
		}
		if c.DecisionLog.Keep != tc.want {
			t.Errorf("%q %q: keep %s, want %s", tc.yaml, tc.env, c.DecisionLog.Keep, tc.want)
		}
	}
}
