package ledger

import (
	"context"
	"time"
)

// Affinity pins under the redis state: a pool's cache_aware placement
// keeps, per affinity key, the member that served it last, so that a
// session's next turn reaches the GPU holding its cache whichever instance
// it arrives at. A pin is worth a round trip but never a failure: while
// Redis is unhealthy, or when a call fails, the instance's own pins decide
// (the call errors count in llm_proxy_state_errors_total; the claims
// report Redis's health).

func (*memoryLedger) Affinity(string, uint64) string                    { return "" }
func (*memoryLedger) SetAffinity(string, uint64, string, time.Duration) {}

func (l *redisLedger) Affinity(pool string, key uint64) string {
	f := l.f
	if !f.healthy.Load() || !f.use() {
		return ""
	}
	defer f.done()
	m, err := f.store.Affinity(context.Background(), pool, key)
	if err != nil {
		stateErrors.Inc()
		return ""
	}
	return m
}

func (l *redisLedger) SetAffinity(pool string, key uint64, member string, ttl time.Duration) {
	f := l.f
	if !f.healthy.Load() || !f.use() {
		return
	}
	defer f.done()
	if err := f.store.SetAffinity(context.Background(), pool, key, member, ttl); err != nil {
		stateErrors.Inc()
	}
}
