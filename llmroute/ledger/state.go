package ledger

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llm-route/caddy-llm-route/llmroute/redisstate"
)

// State that outlives a config reload lives in these pools, keyed by stable
// ids. A new config provisions (and adopts the entries) before the old one
// is cleaned up, so an entry both configs use never drops to zero
// references: a request admitted under the old config frees its slot in the
// very counter the new config claims from. An entry is destroyed when the
// last config that uses it is cleaned up; requests still running on it keep
// their pointer, so late releases stay harmless.
var (
	upstreamPool = caddy.NewUsagePool() // "upstream id" → *UpstreamState
	backoffPool  = caddy.NewUsagePool() // backoffKey(...) → *Backoff
)

// Unlimited is the slot limit of an upstream with no max_concurrency.
const Unlimited = math.MaxInt64

// Upstream is one compiled upstream as its ledger counts it: the ids and
// limits its config resolved, and the pooled state it claims in. The
// core's compiled upstream embeds it, so the request path reaches the
// counts through pointer loads and atomics only.
type Upstream struct {
	ID, Provider string
	Limit        int64 // the slot limit; Unlimited when none is configured
	Capacity     int64 // the provider's capacity; Unlimited when none
	LongCap      int64 // the provider's long-context slots (long_context_capacity); 0 = unbounded

	State   *UpstreamState
	Backoff *Backoff       // nil when backoff is off
	Prov    *ProviderState // the provider's shared capacity accounting
	Long    *LongSlots     // the provider's long-context slots; nil = unbounded
	// Keys are the provider's key pool (its `keys`), nil for one key: the
	// fleet shares their cooldowns.
	Keys []*KeyState
}

// Cooling returns how long the upstream is still out of rotation.
func (u *Upstream) Cooling(now time.Time) time.Duration {
	return u.State.CoolingLeft(u.Backoff, now)
}

// Apply writes this config's view of an upstream into the shared state:
// slot limit, provider capacity, metric label, backoff scope and its cap.
func (u *Upstream) Apply(backoffCap time.Duration) {
	u.State.limit.Store(u.Limit)
	u.Prov.capacity.Store(u.Capacity)
	u.State.provider.Store(&u.Provider)
	u.State.backoff.Store(u.Backoff)
	if u.Long != nil {
		u.Long.limit.Store(u.LongCap)
	}
	if u.Backoff != nil {
		u.Backoff.setCap(backoffCap)
	}
}

// UpstreamState is the live accounting of one upstream id: its in-flight
// requests and its current slot limit. The hot path touches only atomics.
type UpstreamState struct {
	id string

	inflight atomic.Int64
	limit    atomic.Int64 // Unlimited when none is configured

	// fleetFull is the shared state's answer to this instance's last claim
	// that reached it (state redis): FleetFree, or which limit was full
	// fleet-wide, for X-LLM-Route-Skipped (the local counts alone would
	// show free slots).
	fleetFull atomic.Int32

	// failStreak counts consecutive failed attempts on this upstream (for the
	// fail_streak gauge), whatever its backoff scope.
	failStreak atomic.Int64

	// provider is the provider id under the newest config, for metric labels.
	provider atomic.Pointer[string]

	// coolUntil (unix nanos) cools this upstream alone; used for an
	// upstream's Retry-After when it has no backoff scope of its own.
	coolUntil atomic.Int64

	// backoff is the backoff scope under the newest config (nil = none), for
	// the cooling gauge.
	backoff atomic.Pointer[Backoff]

	// For the status: the last failed attempt (its result class and when)
	// and the last probe. Written off the success path only.
	lastFailure atomic.Pointer[Event]
	lastProbe   atomic.Pointer[Event]
}

// Event is a past event the status reports: what it was and when.
type Event struct {
	What string
	At   time.Time
}

// NewUpstreamState returns the accounting of an upstream id outside the
// pools, with slot limit limit: for an upstream built by hand in a test.
func NewUpstreamState(id string, limit int64) *UpstreamState {
	s := &UpstreamState{id: id}
	s.limit.Store(limit)
	return s
}

// ID returns the upstream id.
func (s *UpstreamState) ID() string { return s.id }

// Inflight returns the requests in flight on the upstream in this process.
func (s *UpstreamState) Inflight() int64 { return s.inflight.Load() }

// Limit returns the slot limit in force (Unlimited when none).
func (s *UpstreamState) Limit() int64 { return s.limit.Load() }

// FailStreak returns the consecutive failed attempts on the upstream.
func (s *UpstreamState) FailStreak() int64 { return s.failStreak.Load() }

// Failed counts a failed attempt in the fail streak; Succeeded ends the
// streak.
func (s *UpstreamState) Failed()    { s.failStreak.Add(1) }
func (s *UpstreamState) Succeeded() { s.failStreak.Store(0) }

// NoteFailure remembers the upstream's last failed attempt (its result
// class) for the status; NoteProbe its last probe.
func (s *UpstreamState) NoteFailure(what string, at time.Time) {
	s.lastFailure.Store(&Event{What: what, At: at})
}
func (s *UpstreamState) NoteProbe(what string, at time.Time) {
	s.lastProbe.Store(&Event{What: what, At: at})
}

// LastFailure and LastProbe return what NoteFailure and NoteProbe
// remembered; nil when nothing happened yet.
func (s *UpstreamState) LastFailure() *Event { return s.lastFailure.Load() }
func (s *UpstreamState) LastProbe() *Event   { return s.lastProbe.Load() }

// HeldUntil returns the end of the upstream's own Retry-After hold.
func (s *UpstreamState) HeldUntil() time.Time { return time.Unix(0, s.coolUntil.Load()) }

// Backoff returns the backoff scope under the newest config (nil = none).
func (s *UpstreamState) Backoff() *Backoff { return s.backoff.Load() }

// tryClaim takes a slot if the upstream is below its limit. It returns the
// new in-flight count.
func (s *UpstreamState) tryClaim() (int64, bool) {
	for {
		cur := s.inflight.Load()
		if cur >= s.limit.Load() {
			return cur, false
		}
		if s.inflight.CompareAndSwap(cur, cur+1) {
			return cur + 1, true
		}
	}
}

// release frees one slot and returns the new in-flight count. The caller
// (the ledger) wakes the queue.
func (s *UpstreamState) release() int64 {
	n := s.inflight.Add(-1)
	if n == 0 {
		draining.CompareAndDelete(s.id, s) // the last request of a removed upstream
	}
	return n
}

// CoolingLeft returns how long this upstream stays out of rotation, given
// its backoff scope b (nil = none): the longer of the scope's cooling and the
// upstream's own Retry-After hold.
func (s *UpstreamState) CoolingLeft(b *Backoff, now time.Time) time.Duration {
	left := time.Duration(s.coolUntil.Load() - now.UnixNano())
	if b != nil {
		left = max(left, b.remaining(now))
	}
	return left
}

// holdUntil cools this upstream alone until at least until (unix nanos):
// its own Retry-After, or another instance's.
func (s *UpstreamState) holdUntil(until int64) {
	for {
		cur := s.coolUntil.Load()
		if cur >= until || s.coolUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// ProviderID returns the provider label of the newest config.
func (s *UpstreamState) ProviderID() string {
	if p := s.provider.Load(); p != nil {
		return *p
	}
	return ""
}

// Destruct runs when no config uses the upstream any more. Requests still in
// flight keep their pointer and release into it; the state is parked until
// the last of them ends, so that a config re-adding the same id meanwhile
// counts those requests too instead of starting from zero.
func (s *UpstreamState) Destruct() error {
	draining.Store(s.id, s)
	if s.inflight.Load() <= 0 {
		draining.CompareAndDelete(s.id, s)
	}
	return nil
}

// draining holds destroyed upstream states that still have requests in
// flight, by id.
var draining sync.Map

// Backoff is one exponential-backoff counter: an upstream's own, or a
// provider's shared by its upstreams. Cooling is read lock-free; updates take
// the mutex.
type Backoff struct {
	until atomic.Int64 // unix nanos: cooling until then
	scope string       // its key in backoffPool, the scope's name in Redis

	mu sync.Mutex
	// cap bounds the doubling; updated in place by each provision.
	cap time.Duration
	// streak is the number of consecutive failures (written under mu, read
	// lock-free by the success fast path).
	streak atomic.Int64
	// lastFailure is when the cooling began, so probes wait a full interval.
	lastFailure time.Time
	// hardUntil is a cooling period that came from an upstream's Retry-After;
	// a probe must not end it early.
	hardUntil time.Time
}

// remaining returns how long the state is still cooling.
func (b *Backoff) remaining(now time.Time) time.Duration {
	return time.Duration(b.until.Load() - now.UnixNano())
}

// recordFailure doubles the backoff (1s, 2s, 4s, … up to the cap) and starts
// a cooling period. It returns the period.
func (b *Backoff) recordFailure(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := time.Second
	for i := int64(0); i < b.streak.Load() && d < b.cap; i++ {
		d *= 2
	}
	d = min(d, b.cap)
	b.streak.Add(1)
	b.lastFailure = now
	if until := now.Add(d).UnixNano(); until > b.until.Load() {
		b.until.Store(until)
	}
	return d
}

// holdFor cools for at least d because the upstream asked for it
// (Retry-After); a probe cannot end this period early.
func (b *Backoff) holdFor(now time.Time, d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastFailure = now
	if t := now.Add(d); t.After(b.hardUntil) {
		b.hardUntil = t
	}
	if until := now.Add(d).UnixNano(); until > b.until.Load() {
		b.until.Store(until)
	}
}

// recordSuccess resets the counter and ends any cooling that a probe or a
// request proved over. A Retry-After period is kept unless it has passed.
// It reports whether there was anything to reset (the ledger then shares
// the recovery).
func (b *Backoff) recordSuccess(now time.Time) bool {
	if b.until.Load() == 0 && b.streak.Load() == 0 {
		return false // the common case: nothing to reset, no lock
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.streak.Store(0)
	if now.Before(b.hardUntil) {
		b.until.Store(b.hardUntil.UnixNano())
		return true
	}
	b.until.Store(0)
	return true
}

// ProbeDue reports whether a probe may be sent now: the state is cooling,
// not held by a Retry-After, and a full interval has passed since the failure
// that started the cooling.
func (b *Backoff) ProbeDue(now time.Time, interval time.Duration) bool {
	if b.remaining(now) <= 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return !now.Before(b.hardUntil) && now.Sub(b.lastFailure) >= interval
}

// HoldAndLastFailure reads the fields a backoff keeps under its mutex:
// the end of its Retry-After hold, and when its cooling began.
func (b *Backoff) HoldAndLastFailure() (hardUntil, lastFailure time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hardUntil, b.lastFailure
}

// maxCooling returns the cap of the doubling.
func (b *Backoff) maxCooling() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cap
}

// holdLocal cools u for at least d in this process because the upstream
// asked (Retry-After): its backoff scope, or u alone when it has none.
func (u *Upstream) holdLocal(now time.Time, d time.Duration) {
	if u.Backoff != nil {
		u.Backoff.holdFor(now, d)
		return
	}
	u.State.holdUntil(now.Add(d).UnixNano())
}

// setCap updates the cap from a new config.
func (b *Backoff) setCap(c time.Duration) {
	b.mu.Lock()
	b.cap = c
	b.mu.Unlock()
}

// Destruct satisfies caddy.Destructor.
func (b *Backoff) Destruct() error { return nil }

// BackoffKey names a backoff scope ("upstream" or "provider") of id in
// the pool.
func BackoffKey(scope, id string) string { return scope + "/" + id }

// PoolRefs records which pool entries one handler instance holds, so Cleanup
// releases exactly those (Provision may fail halfway).
type PoolRefs struct {
	upstreams []string
	backoffs  []string
	providers []string
	longs     []string
	keys      []string
}

// Release drops every reference p holds.
func (p *PoolRefs) Release() {
	for _, k := range p.upstreams {
		_, _ = upstreamPool.Delete(k)
	}
	for _, k := range p.backoffs {
		_, _ = backoffPool.Delete(k)
	}
	for _, k := range p.providers {
		_, _ = providerPool.Delete(k)
	}
	for _, k := range p.longs {
		_, _ = longPool.Delete(k)
	}
	for _, k := range p.keys {
		_, _ = keyPool.Delete(k)
	}
	p.upstreams, p.backoffs, p.providers, p.longs, p.keys = nil, nil, nil, nil, nil
}

// AdoptUpstream returns the shared state for id, creating it if needed, and
// records the reference.
// fresh reports that no other config holds it.
func (p *PoolRefs) AdoptUpstream(id string) (st *UpstreamState, fresh bool) {
	candidate := &UpstreamState{id: id}
	if old, ok := draining.Load(id); ok {
		candidate = old.(*UpstreamState) // removed, still draining: same slots
	}
	v, loaded := upstreamPool.LoadOrStore(id, candidate)
	p.upstreams = append(p.upstreams, id)
	return v.(*UpstreamState), !loaded
}

// AdoptBackoff returns the shared backoff state for key.
func (p *PoolRefs) AdoptBackoff(key string) *Backoff {
	v, _ := backoffPool.LoadOrStore(key, &Backoff{scope: key})
	p.backoffs = append(p.backoffs, key)
	return v.(*Backoff)
}

// applyFleet applies a change another instance made to this scope (or this
// instance's own, echoed): cooling only ever grows, as it would locally.
func (b *Backoff) applyFleet(ev redisstate.Event, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ev.Kind == "ok" {
		b.streak.Store(0)
		b.until.Store(0)
		if ev.Hold > 0 {
			b.hardUntil = now.Add(ev.Hold)
			b.until.Store(b.hardUntil.UnixNano())
		}
		return
	}
	b.streak.Store(max(b.streak.Load(), ev.Streak))
	if ev.Hold > 0 && now.Add(ev.Hold).After(b.hardUntil) {
		b.hardUntil = now.Add(ev.Hold)
	}
	if until := now.Add(ev.Left).UnixNano(); until > b.until.Load() {
		b.until.Store(until)
		b.lastFailure = now // a new cooling: probes wait a full interval from here
	}
}

// EachUpstream calls fn with the state of every upstream id a config
// holds, then of every one a reload removed while requests still run on
// it (each once: a re-added id is in the pool with the very same state).
func EachUpstream(fn func(*UpstreamState)) {
	seen := make(map[string]bool)
	upstreamPool.Range(func(_, v any) bool {
		s := v.(*UpstreamState)
		seen[s.id] = true
		fn(s)
		return true
	})
	draining.Range(func(_, v any) bool {
		if s := v.(*UpstreamState); !seen[s.id] {
			seen[s.id] = true
			fn(s)
		}
		return true
	})
}

// EachDraining calls fn with the state of every upstream a reload
// removed that is still parked for its running requests (or was re-added
// meanwhile).
func EachDraining(fn func(*UpstreamState)) {
	draining.Range(func(_, v any) bool {
		fn(v.(*UpstreamState))
		return true
	})
}
