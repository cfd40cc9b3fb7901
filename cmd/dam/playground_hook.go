//go:build damtest

package main

import "os"

// playgroundListen is the default of dam playground's --listen.
func playgroundListen() string {
	if v := os.Getenv(envPlaygroundListen); v != "" {
		return v
	}
	return defaultPlaygroundListen
}
