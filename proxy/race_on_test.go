//go:build race

package proxy

// raceEnabled: sync.Pool drops items at random under the race detector, so
// allocation budgets are only checked without it.
const raceEnabled = true
