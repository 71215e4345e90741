//go:build !race

package gemini

// raceEnabled skips allocation assertions: the race detector allocates.
const raceEnabled = false
