package llmroute

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
var providerPool = caddy.NewUsagePool() // provider id → *providerState

// providerState is the live accounting of one provider id.
type providerState struct {
	id       string
	inflight atomic.Int64
	capacity atomic.Int64 // unlimited when none is configured
}

// tryClaim takes one unit of the provider's capacity if there is room.
func (p *providerState) tryClaim() bool {
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
func (p *providerState) release() {
	if p.inflight.Add(-1) == 0 {
		providerDraining.CompareAndDelete(p.id, p)
	}
}

// Destruct parks the state while requests of a removed provider still run,
// so that a config re-adding the id meanwhile counts them (see
// upstreamState.Destruct).
func (p *providerState) Destruct() error {
	providerDraining.Store(p.id, p)
	if p.inflight.Load() <= 0 {
		providerDraining.CompareAndDelete(p.id, p)
	}
	return nil
}

// providerDraining holds destroyed provider states with requests in flight.
var providerDraining sync.Map

// adoptProvider returns the shared state of provider id and records the
// reference. fresh reports that no other config holds it.
func (p *poolRefs) adoptProvider(id string) (st *providerState, fresh bool) {
	candidate := &providerState{id: id}
	candidate.capacity.Store(unlimited)
	if old, ok := providerDraining.Load(id); ok {
		candidate = old.(*providerState)
	}
	v, loaded := providerPool.LoadOrStore(id, candidate)
	p.providers = append(p.providers, id)
	return v.(*providerState), !loaded
}

// tryClaim takes a slot on the upstream and a unit of its provider's
// capacity, both or neither, through its handler's ledger: in this process
// and, with the redis state, fleet-wide. forQueue tells that the claim is a
// waiter's turn, whose rollback must not wake the queue (it would hand the
// same turn out again).
func (u *upstream) tryClaim(forQueue bool) (int64, bool) {
	n, ok, wake := u.led.claim(u)
	if wake && !forQueue {
		sched.dispatch() // a waiter that saw our transient slot may take it
	}
	return n, ok
}

// claimLocal claims in this process: the upstream slot first, rolled back
// if the provider is full. Every provider is counted, with a capacity or
// not (one more atomic add), so that setting a capacity by a reload counts
// the requests already running. A rollback can make a concurrent claim see
// the upstream full for an instant; rolledBack tells the caller to wake the
// queue, where such a claimer ends up (the admission fast path falls back
// to it).
func (u *upstream) claimLocal() (n int64, ok, rolledBack bool) {
	n, ok = u.state.tryClaim()
	if !ok || u.prov == nil { // nil: an upstream built by hand in a unit test
		return n, ok, false
	}
	if u.prov.tryClaim() {
		return n, true, false
	}
	u.state.unclaim()
	return n - 1, false, true
}

// unclaimLocal undoes claimLocal without waking the queue (the caller does).
func (u *upstream) unclaimLocal() {
	if u.prov != nil {
		u.prov.release()
	}
	u.state.unclaim()
}

// unclaim undoes a tryClaim whose request never started.
func (s *upstreamState) unclaim() {
	if s.inflight.Add(-1) == 0 {
		draining.CompareAndDelete(s.id, s)
	}
}

// release frees the upstream slot and the provider unit claimed with it
// through its handler's ledger (fleet-wide first, with the redis state),
// which then wakes the queue once: a waiter may have been held by either.
func (u *upstream) release() int64 { return u.led.release(u) }

// releaseLocal frees the slot and the provider unit in this process; the
// ledger wakes the queue.
func (u *upstream) releaseLocal() int64 {
	if u.prov != nil {
		u.prov.release()
	}
	return u.state.release()
}

// providerFull reports whether the upstream's provider has no capacity left.
func (u *upstream) providerFull() bool {
	return u.prov != nil && u.prov.inflight.Load() >= u.prov.capacity.Load()
}

var (
	providerInflightDesc = prometheus.NewDesc("llm_proxy_provider_inflight",
		"Requests in flight on all upstreams of the provider.", []string{"provider"}, nil)
	providerCapacityDesc = prometheus.NewDesc("llm_proxy_provider_capacity",
		"The provider's capacity: its in-flight bound over all its upstreams (only providers that set one).", []string{"provider"}, nil)
)

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
	report := func(p *providerState) {
		if seen[p.id] {
			return
		}
		seen[p.id] = true
		ch <- prometheus.MustNewConstMetric(providerInflightDesc, prometheus.GaugeValue, float64(p.inflight.Load()), p.id)
		if c := p.capacity.Load(); c != unlimited {
			ch <- prometheus.MustNewConstMetric(providerCapacityDesc, prometheus.GaugeValue, float64(c), p.id)
		}
	}
	providerPool.Range(func(_, v any) bool { report(v.(*providerState)); return true })
	providerDraining.Range(func(_, v any) bool { report(v.(*providerState)); return true })
}
