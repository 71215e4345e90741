package llmroute

import (
	"testing"
	"time"
)

// BenchmarkWatchdogCycle is one streamed read's watchdog work: resume
// before the read, hold after it.
func BenchmarkWatchdogCycle(b *testing.B) {
	w := &watchdog{cancel: func() {}}
	w.prime(30*time.Second, codeStalled)
	for b.Loop() {
		w.resume()
		if w.hold() != "" {
			b.Fatal("fired")
		}
	}
	w.stop()
}
