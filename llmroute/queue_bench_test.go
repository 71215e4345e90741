package llmroute

import (
	"net/http/httptest"
	"strconv"
	"testing"

	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

// benchRoute builds a one-upstream route outside Caddy for white-box
// benchmarks of admission.
func benchRoute(b *testing.B, name string, limit int64, queue int) (*Handler, *route, *upstream) {
	b.Helper()
	u := &upstream{Upstream: ledger.Upstream{ID: name, Provider: "p", Limit: limit, State: ledger.NewUpstreamState(name, limit)},
		led: ledger.NewMemory(sched.dispatch)}
	rt := &route{name: name, targets: []target{{up: u}}, queueSize: queue}
	h := &Handler{logger: zap.NewNop(), metrics: getMetrics()}
	return h, rt, u
}

// BenchmarkAdmitRelease measures a claim plus release through the admission
// path: uncontended with free slots, and under contention where most
// requests wait in the queue for one of a few slots.
func BenchmarkAdmitRelease(b *testing.B) {
	for _, tc := range []struct {
		name  string
		limit int64
		queue int
	}{
		{"free-slots", ledger.Unlimited, 0},
		{"limit-2-queue", 2, 1 << 20},
		{"limit-1-queue", 1, 1 << 20},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h, rt, u := benchRoute(b, "bench-"+tc.name, tc.limit, tc.queue)
			req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			b.ReportAllocs()
			b.SetParallelism(8) // more goroutines than slots: waiters present
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					idx, err := h.admit(req, rt, nil)
					if err != nil {
						b.Error("admission failed: " + err.message + " " + strconv.Itoa(idx))
						return
					}
					u.release()
				}
			})
			if n := u.State.Inflight(); n != 0 {
				b.Fatalf("inflight %d after the run", n)
			}
		})
	}
}
