package main

// Moved to docs/gone.md, which was not written.
func main() {}
