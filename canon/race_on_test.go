//go:build race

package canon

// raceEnabled: sync.Pool drops items under -race, so allocation counts are meaningless.
const raceEnabled = true
