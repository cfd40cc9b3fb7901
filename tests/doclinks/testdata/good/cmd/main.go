package main

// See docs/page.md#second-heading and README.md#fixture-every-kind-of-link-that-resolves.
func main() {}
