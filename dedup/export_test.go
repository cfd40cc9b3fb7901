package dedup

// SetDecideAttempts sets the base number of runs of a Decide that loses
// races, for a test, and returns a function restoring it.
func SetDecideAttempts(n int) (restore func()) {
	old := maxDecideAttempts
	maxDecideAttempts = n
	return func() { maxDecideAttempts = old }
}
