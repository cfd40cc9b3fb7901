//go:build !damtest

package main

// playgroundListen is the default of dam playground's --listen; the test
// suite's build (-tags damtest) lets DAM_TEST_PLAYGROUND_LISTEN change it.
func playgroundListen() string { return defaultPlaygroundListen }
