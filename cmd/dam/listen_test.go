package main

import "testing"

// The start-up log line of dam run and dam serve says which interfaces
// the listener binds: all of them by default.
func TestListenInterfaces(t *testing.T) {
	for listen, want := range map[string]string{
		":9090":          "all",
		"0.0.0.0:9090":   "all",
		"[::]:8080":      "all",
		"127.0.0.1:9090": "loopback",
		"[::1]:9090":     "loopback",
		"localhost:9090": "loopback",
		"10.1.2.3:9090":  "one",
		"dam.local:9090": "one",
		"9090":           "unknown",
	} {
		if got := listenInterfaces(listen); got != want {
			t.Errorf("listenInterfaces(%q) = %q, want %q", listen, got, want)
		}
	}
}
