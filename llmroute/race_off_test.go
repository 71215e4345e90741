//go:build !race

package llmroute

// raceEnabled skips allocation assertions: the race detector allocates.
// .ci/run runs this package once more without -race, where they count.
const raceEnabled = false
