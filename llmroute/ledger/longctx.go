package ledger

import (
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
)

// Long-context admission: a request whose estimated prompt is above the
// handler's long_context_threshold is expensive for the server that runs
// it (KV cache, prefill time), so a provider can bound how many of them it
// serves at once with long_context_capacity. Such a request holds one of
// its provider's long slots as well as the upstream's normal slot; an
// upstream whose provider has no long slot free is passed over like a busy
// one (next upstream, or the queue, which a freed slot wakes).
//
// The long slots are claimed (Ledger.ClaimLong) before the normal slot,
// and released with it, so the pair is taken and freed together. They are
// pooled by provider id like the upstream slots, so a request admitted
// under an old config frees its long slot in the counter the new config
// claims from. They are counted in this process only, with either backend.

// longPool holds the long-context slots of each provider id.
var longPool = caddy.NewUsagePool() // "provider id" → *LongSlots

// LongSlots is one provider's long-context slot counter.
type LongSlots struct {
	inflight atomic.Int64
	limit    atomic.Int64
}

// Inflight returns the long slots in use; Limit their number.
func (l *LongSlots) Inflight() int64 { return l.inflight.Load() }
func (l *LongSlots) Limit() int64    { return l.limit.Load() }

// Full reports whether no long slot is free (false for nil: no bound).
func (l *LongSlots) Full() bool { return l != nil && l.inflight.Load() >= l.limit.Load() }

// claim takes a long slot if one is free; a nil counter (no bound) always
// has one.
func (l *LongSlots) claim() bool {
	if l == nil {
		return true
	}
	for {
		cur := l.inflight.Load()
		if cur >= l.limit.Load() {
			return false
		}
		if l.inflight.CompareAndSwap(cur, cur+1) {
			return true
		}
	}
}

// release frees a long slot claimed by claim. The caller releases the
// normal slot right after, which wakes the queue.
func (l *LongSlots) release() {
	if l != nil {
		l.inflight.Add(-1)
	}
}

// Destruct satisfies caddy.Destructor.
func (l *LongSlots) Destruct() error { return nil }

// AdoptLong returns the shared long-slot counter of a provider with
// long_context_capacity, recording the reference. A new counter gets its
// limit at once (nobody else enforces one yet); a shared one when this
// config starts (Upstream.Apply).
func (p *PoolRefs) AdoptLong(provider string, limit int64) *LongSlots {
	fresh := &LongSlots{}
	fresh.limit.Store(limit)
	v, _ := longPool.LoadOrStore(provider, fresh)
	p.longs = append(p.longs, provider)
	return v.(*LongSlots)
}
