package pipeline

import "testing"

// TestRoundSizeTakesABufferedFetchWholeUpToTwiceTheBudget guards how many
// records an exactly-once round polls: the budget, or the whole buffered
// fetch when it is at most twice the budget, so that no remainder of a
// fetch is left to make a round of its own; a larger buffer is split by
// the budget, which bounds a round's memory at twice it.
func TestRoundSizeTakesABufferedFetchWholeUpToTwiceTheBudget(t *testing.T) {
	for _, c := range []struct {
		budget, buffered, want int
	}{
		{budget: 100, buffered: 0, want: 100},    // caught up: what arrives, up to the budget
		{budget: 100, buffered: 60, want: 100},   // less than the budget: all of it
		{budget: 100, buffered: 100, want: 100},  // exactly the budget
		{budget: 100, buffered: 101, want: 101},  // a remainder of one is not left behind
		{budget: 100, buffered: 200, want: 200},  // twice the budget: still whole
		{budget: 100, buffered: 201, want: 100},  // past twice: split by the budget
		{budget: 100, buffered: 5000, want: 100}, // a large backlog: one budget a round
		{budget: 1, buffered: 2, want: 2},
		{budget: 1, buffered: 3, want: 1},
	} {
		if got := roundSize(c.budget, c.buffered); got != c.want {
			t.Errorf("roundSize(budget %d, buffered %d) = %d, want %d", c.budget, c.buffered, got, c.want)
		}
	}
}
