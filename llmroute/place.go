package llmroute

import (
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llm-route/caddy-llm-route/llmroute/placement"
)

// Pools: a model's chain step that names a pool expands, at provision, to
// the pool's members as targets (contiguous in the route, each knowing its
// step and pool). Per request, each pool step's members are ranked once by
// the pool's placement policy (placement.Pool.Rank over the members'
// in-flight counts, limits and cooling); non-pool steps keep their list
// order. The ranks are carried with the request (frontReq.place, and a
// queued waiter's own), so a failover goes on after the failed target's
// position in this request's order, and a waiter is served by the first
// member, in its own order, that frees up.

// maxPlaced is the longest route a request ranks; a longer one keeps its
// list order (a pool that large is not a fleet this router is meant for).
const maxPlaced = 64

// pool is one configured pool, compiled.
type pool struct {
	id    string
	place placement.Pool
	// keyless ranks a sticky pool's members for a request that has no
	// affinity key: least busy, with its own round-robin.
	keyless     placement.Pool
	affinityKey string // placeholder expression; "" for none
}

// compilePools compiles the handler's pools.
func compilePools(pcs []Pool) map[string]*pool {
	if len(pcs) == 0 {
		return nil
	}
	out := make(map[string]*pool, len(pcs))
	for _, pc := range pcs {
		policy, _ := placement.ParsePolicy(pc.Placement) // validated
		threshold := 0.5
		if pc.CacheThreshold != nil {
			threshold = *pc.CacheThreshold
		}
		out[pc.ID] = &pool{id: pc.ID, affinityKey: pc.AffinityKey,
			place:   placement.Pool{Policy: policy, Threshold: threshold},
			keyless: placement.Pool{Policy: placement.LeastBusy}}
	}
	return out
}

// key is the request's affinity key for p, the first present: the pool's
// affinity_key when it evaluates non-empty, the client's own session id
// (its session headers), X-Session-Id. Prompt-derived keys (body fields,
// the prefix-hash session) are not looked at yet.
func (p *pool) key(r *http.Request, repl *caddy.Replacer) (string, bool) {
	if p.affinityKey != "" && repl != nil {
		if v := repl.ReplaceAll(p.affinityKey, ""); v != "" {
			return v, true
		}
	}
	if r == nil {
		return "", false
	}
	// Every front's, chat's too (whose session is not passed upstream).
	if s := clientSession(r); s != "" {
		return s, true
	}
	if v := r.Header.Get("X-Session-Id"); v != "" {
		return v, true
	}
	return "", false
}

// placing is one request's placement: each target's rank inside its pool
// step (by the target's index in the model's full route, which every
// variant of the route keeps), and the order last computed from it.
type placing struct {
	rank  [maxPlaced]uint8
	rt    *route // the route order is for
	order [maxPlaced]int
}

var placings = sync.Pool{New: func() any { return new(placing) }}

// placeRequest ranks rt's pool steps for one request; nil when rt has no
// pool step (its list order is the order). The caller puts a non-nil
// result back with donePlacing when the request is done.
func placeRequest(rt *route, r *http.Request, repl *caddy.Replacer, now time.Time) *placing {
	pooled := false
	for i := range rt.targets {
		if rt.targets[i].base >= maxPlaced {
			return nil
		}
		pooled = pooled || rt.targets[i].pool != nil
	}
	if !pooled {
		return nil
	}
	pl := placings.Get().(*placing)
	pl.rt = nil
	var ms [maxPlaced]placement.Member
	var order [maxPlaced]int
	var reasons [maxPlaced]placement.Reason
	n := len(rt.targets)
	for lo := 0; lo < n; {
		hi := lo + 1
		for hi < n && rt.targets[hi].step == rt.targets[lo].step {
			hi++
		}
		p := rt.targets[lo].pool
		if p == nil {
			for i := lo; i < hi; i++ {
				pl.rank[rt.targets[i].base] = 0
			}
			lo = hi
			continue
		}
		k := hi - lo
		for i := lo; i < hi; i++ {
			t := &rt.targets[i]
			ms[i-lo] = placement.Member{ID: t.memberID, InFlight: t.up.State.Inflight(), Limit: t.up.Limit,
				Weight: t.weight, Cooling: t.up.Cooling(now) > 0}
		}
		req := placement.Request{Now: now}
		pp := &p.place
		if pp.Policy == placement.Sticky || pp.Policy == placement.CacheAware {
			if key, ok := p.key(r, repl); ok {
				req.Key, req.HasKey = placement.HashString(key), true
			} else if pp.Policy == placement.Sticky {
				pp = &p.keyless
			}
		}
		pp.Rank(ms[:k], req, order[:k], reasons[:k])
		for j, m := range order[:k] {
			pl.rank[rt.targets[lo+m].base] = uint8(j)
		}
		lo = hi
	}
	return pl
}

// donePlacing returns a request's placing for reuse.
func donePlacing(pl *placing) {
	if pl != nil {
		placings.Put(pl)
	}
}

// orderFor is the order in which this request tries rt's targets: the
// chain's steps in order, a pool step's members by this request's rank.
// Without a placing (no pool step) it is the list order.
func (rt *route) orderFor(pl *placing) []int {
	n := len(rt.targets)
	if pl == nil || n > maxPlaced {
		return rt.order()
	}
	o := pl.order[:n]
	if pl.rt == rt {
		return o
	}
	for i := range o {
		o[i] = i
	}
	// Targets are in chain order already: sorting by (step, rank) only
	// reorders inside each pool step. Insertion sort: n is small.
	for i := 1; i < n; i++ {
		for j := i; j > 0; j-- {
			a, b := &rt.targets[o[j-1]], &rt.targets[o[j]]
			if a.step < b.step || a.step == b.step && pl.rank[a.base] <= pl.rank[b.base] {
				break
			}
			o[j-1], o[j] = o[j], o[j-1]
		}
	}
	pl.rt = rt
	return o
}
