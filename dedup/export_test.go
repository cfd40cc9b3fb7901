package dedup

// SetDecideAttempts sets the base number of runs of a Decide that loses
// races, for a test, and returns a function restoring it.
func SetDecideAttempts(n int) (restore func()) {
	old := maxDecideAttempts
	maxDecideAttempts = n
	return func() { maxDecideAttempts = old }
}

// SetClaims makes s decide with the statements of Citus (locks by
// writing) on any engine, for a test.
func SetClaims(s *Store) { s.claims = true }

// Classify classifies err as a store of the given engine does.
func Classify(distributed bool, err error) error {
	s := &Store{}
	if distributed {
		s.engine.Store(engineDistributed)
	} else {
		s.engine.Store(engineOneServer)
	}
	return s.classify("op", err)
}
