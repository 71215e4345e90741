package ledger

import (
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// Provider capacity: a provider-wide bound on in-flight requests
// over all its upstreams and models, on top of each upstream's own limit.
// Its state is keyed by provider id in a pool, like the upstream slots, so a
// reload keeps it exact: an upstream renamed on the same provider still
// counts against it, because the count lives with the provider and not with
// the upstream.
var providerPool = caddy.NewUsagePool() // provider id → *ProviderState

// ProviderState is the live accounting of one provider id.
type ProviderState struct {
	id       string
	inflight atomic.Int64
	capacity atomic.Int64 // Unlimited when none is configured
}

// Inflight returns the requests in flight on all the provider's upstreams
// in this process.
func (p *ProviderState) Inflight() int64 { return p.inflight.Load() }

// Capacity returns the capacity in force (Unlimited when none).
func (p *ProviderState) Capacity() int64 { return p.capacity.Load() }

// SetCapacity sets the capacity of a state no other config uses yet.
func (p *ProviderState) SetCapacity(n int64) { p.capacity.Store(n) }

// tryClaim takes one unit of the provider's capacity if there is room.
func (p *ProviderState) tryClaim() bool {
	for {
		cur := p.inflight.Load()
		if cur >= p.capacity.Load() {
			return false
		}
		if p.inflight.CompareAndSwap(cur, cur+1) {
			return true
		}
	}
}

// release gives one unit back. The caller wakes the queue.
func (p *ProviderState) release() {
	if p.inflight.Add(-1) == 0 {
		providerDraining.CompareAndDelete(p.id, p)
	}
}

// Destruct parks the state while requests of a removed provider still run,
// so that a config re-adding the id meanwhile counts them (see
// UpstreamState.Destruct).
func (p *ProviderState) Destruct() error {
	providerDraining.Store(p.id, p)
	if p.inflight.Load() <= 0 {
		providerDraining.CompareAndDelete(p.id, p)
	}
	return nil
}

// providerDraining holds destroyed provider states with requests in flight.
var providerDraining sync.Map

// AdoptProvider returns the shared state of provider id and records the
// reference. fresh reports that no other config holds it.
func (p *PoolRefs) AdoptProvider(id string) (st *ProviderState, fresh bool) {
	candidate := &ProviderState{id: id}
	candidate.capacity.Store(Unlimited)
	if old, ok := providerDraining.Load(id); ok {
		candidate = old.(*ProviderState)
	}
	v, loaded := providerPool.LoadOrStore(id, candidate)
	p.providers = append(p.providers, id)
	return v.(*ProviderState), !loaded
}

// ClaimLocal claims in this process: the upstream slot first, rolled back
// if the provider is full. Every provider is counted, with a capacity or
// not (one more atomic add), so that setting a capacity by a reload counts
// the requests already running. A rollback can make a concurrent claim see
// the upstream full for an instant; rolledBack tells the caller to wake the
// queue, where such a claimer ends up (the admission fast path falls back
// to it).
func (u *Upstream) ClaimLocal() (n int64, ok, rolledBack bool) {
	n, ok = u.State.tryClaim()
	if !ok || u.Prov == nil { // nil: an upstream built by hand in a unit test
		return n, ok, false
	}
	if u.Prov.tryClaim() {
		return n, true, false
	}
	u.State.unclaim()
	return n - 1, false, true
}

// UnclaimLocal undoes ClaimLocal without waking the queue (the caller does).
func (u *Upstream) UnclaimLocal() {
	if u.Prov != nil {
		u.Prov.release()
	}
	u.State.unclaim()
}

// unclaim undoes a tryClaim whose request never started.
func (s *UpstreamState) unclaim() {
	if s.inflight.Add(-1) == 0 {
		draining.CompareAndDelete(s.id, s)
	}
}

// ReleaseLocal frees the slot and the provider unit in this process; the
// ledger wakes the queue.
func (u *Upstream) ReleaseLocal() int64 {
	if u.Prov != nil {
		u.Prov.release()
	}
	return u.State.release()
}

// ProviderFull reports whether the upstream's provider has no capacity left.
func (u *Upstream) ProviderFull() bool {
	return u.Prov != nil && u.Prov.inflight.Load() >= u.Prov.capacity.Load()
}

var (
	providerInflightDesc = prometheus.NewDesc("llm_proxy_provider_inflight",
		"Requests in flight on all upstreams of the provider.", []string{"provider"}, nil)
	providerCapacityDesc = prometheus.NewDesc("llm_proxy_provider_capacity",
		"The provider's capacity: its in-flight bound over all its upstreams (only providers that set one).", []string{"provider"}, nil)
)

// Collectors are the package's metrics, for each config's registry: the
// provider gauges and the count of failed calls to Redis.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{providerCollector{}, stateErrors}
}

// providerCollector reports the provider gauges from the pooled state at
// scrape time: in-flight for every provider, capacity for those that set
// one.
type providerCollector struct{}

func (providerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- providerInflightDesc
	ch <- providerCapacityDesc
}

func (providerCollector) Collect(ch chan<- prometheus.Metric) {
	seen := make(map[string]bool)
	report := func(p *ProviderState) {
		if seen[p.id] {
			return
		}
		seen[p.id] = true
		ch <- prometheus.MustNewConstMetric(providerInflightDesc, prometheus.GaugeValue, float64(p.inflight.Load()), p.id)
		if c := p.capacity.Load(); c != Unlimited {
			ch <- prometheus.MustNewConstMetric(providerCapacityDesc, prometheus.GaugeValue, float64(c), p.id)
		}
	}
	providerPool.Range(func(_, v any) bool { report(v.(*ProviderState)); return true })
	providerDraining.Range(func(_, v any) bool { report(v.(*ProviderState)); return true })
}
