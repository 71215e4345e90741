package ledger

import (
	"sync/atomic"
	"testing"
)

// BenchmarkClaimRelease is the slot accounting hot path under contention:
// every goroutine claims a slot on one shared upstream and releases it.
func BenchmarkClaimRelease(b *testing.B) {
	for _, bc := range []struct {
		name  string
		limit int64
	}{{"unlimited", Unlimited}, {"limit=4", 4}, {"limit=1", 1}} {
		b.Run(bc.name, func(b *testing.B) {
			s := &UpstreamState{id: "bench-claim"}
			s.limit.Store(bc.limit)
			var refused atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, ok := s.tryClaim(); ok {
						s.release()
					} else {
						refused.Add(1)
					}
				}
			})
			b.ReportMetric(float64(refused.Load())/float64(b.N), "refused/op")
			if n := s.inflight.Load(); n != 0 {
				b.Fatalf("inflight %d after the benchmark", n)
			}
		})
	}
}
