package dedup

import "context"

// SetDecideAttempts sets the base number of runs of a Decide that loses
// races, for a test, and returns a function restoring it.
func SetDecideAttempts(n int) (restore func()) {
	old := maxDecideAttempts
	maxDecideAttempts = n
	return func() { maxDecideAttempts = old }
}

// SetClaims makes s run the statements of Citus on any engine, for a
// test: Decide locks by writing, and ResetService, PruneState, PruneWindow
// and CleanupWindow delete without FOR UPDATE.
func SetClaims(s *Store) { s.claims = true }

// CitusShapes reports whether s runs the statements written for Citus
// (its tables are distributed, or SetClaims).
func CitusShapes(ctx context.Context, s *Store) (bool, error) { return s.citusShapes(ctx) }
