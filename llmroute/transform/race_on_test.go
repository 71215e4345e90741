//go:build race

package transform

// raceEnabled skips allocation assertions: the race detector allocates.
const raceEnabled = true
