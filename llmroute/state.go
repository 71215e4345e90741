package llmroute

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
	upstreamPool = caddy.NewUsagePool() // "upstream id" → *upstreamState
	backoffPool  = caddy.NewUsagePool() // backoffKey(...) → *backoffState
)

// unlimited is the slot limit of an upstream with no max_concurrency.
const unlimited = math.MaxInt64

// upstreamState is the live accounting of one upstream id: its in-flight
// requests and its current slot limit. The hot path touches only atomics.
type upstreamState struct {
	id string

	inflight atomic.Int64
	limit    atomic.Int64 // unlimited when none is configured

	// fleetFull is the shared state's answer to this instance's last claim
	// that reached it (state redis): fleetFree, or which limit was full
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
	backoff atomic.Pointer[backoffState]

	// For the status: the last failed attempt (its result class and when)
	// and the last probe. Written off the success path only.
	lastFailure atomic.Pointer[eventRecord]
	lastProbe   atomic.Pointer[eventRecord]
}

// eventRecord is a past event the status reports: what it was and when.
type eventRecord struct {
	what string
	at   time.Time
}

// tryClaim takes a slot if the upstream is below its limit. It returns the
// new in-flight count.
func (s *upstreamState) tryClaim() (int64, bool) {
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
func (s *upstreamState) release() int64 {
	n := s.inflight.Add(-1)
	if n == 0 {
		draining.CompareAndDelete(s.id, s) // the last request of a removed upstream
	}
	return n
}

// coolingLeft returns how long this upstream stays out of rotation, given
// its backoff scope b (nil = none): the longer of the scope's cooling and the
// upstream's own Retry-After hold.
func (s *upstreamState) coolingLeft(b *backoffState, now time.Time) time.Duration {
	left := time.Duration(s.coolUntil.Load() - now.UnixNano())
	if b != nil {
		left = max(left, b.remaining(now))
	}
	return left
}

// holdUntil cools this upstream alone until at least until (unix nanos):
// its own Retry-After, or another instance's.
func (s *upstreamState) holdUntil(until int64) {
	for {
		cur := s.coolUntil.Load()
		if cur >= until || s.coolUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// providerID returns the provider label of the newest config.
func (s *upstreamState) providerID() string {
	if p := s.provider.Load(); p != nil {
		return *p
	}
	return ""
}

// Destruct runs when no config uses the upstream any more. Requests still in
// flight keep their pointer and release into it; the state is parked until
// the last of them ends, so that a config re-adding the same id meanwhile
// counts those requests too instead of starting from zero.
func (s *upstreamState) Destruct() error {
	draining.Store(s.id, s)
	if s.inflight.Load() <= 0 {
		draining.CompareAndDelete(s.id, s)
	}
	return nil
}

// draining holds destroyed upstream states that still have requests in
// flight, by id.
var draining sync.Map

// backoffState is one exponential-backoff counter: an upstream's own, or a
// provider's shared by its upstreams. Cooling is read lock-free; updates take
// the mutex.
type backoffState struct {
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
func (b *backoffState) remaining(now time.Time) time.Duration {
	return time.Duration(b.until.Load() - now.UnixNano())
}

// recordFailure doubles the backoff (1s, 2s, 4s, … up to the cap) and starts
// a cooling period. It returns the period.
func (b *backoffState) recordFailure(now time.Time) time.Duration {
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
func (b *backoffState) holdFor(now time.Time, d time.Duration) {
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
func (b *backoffState) recordSuccess(now time.Time) bool {
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

// probeDue reports whether a probe may be sent now: the state is cooling,
// not held by a Retry-After, and a full interval has passed since the failure
// that started the cooling.
func (b *backoffState) probeDue(now time.Time, interval time.Duration) bool {
	if b.remaining(now) <= 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return !now.Before(b.hardUntil) && now.Sub(b.lastFailure) >= interval
}

// maxCooling returns the cap of the doubling.
func (b *backoffState) maxCooling() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cap
}

// holdLocal cools u for at least d in this process because the upstream
// asked (Retry-After): its backoff scope, or u alone when it has none.
func (u *upstream) holdLocal(now time.Time, d time.Duration) {
	if u.backoff != nil {
		u.backoff.holdFor(now, d)
		return
	}
	u.state.holdUntil(now.Add(d).UnixNano())
}

// setCap updates the cap from a new config.
func (b *backoffState) setCap(c time.Duration) {
	b.mu.Lock()
	b.cap = c
	b.mu.Unlock()
}

// Destruct satisfies caddy.Destructor.
func (b *backoffState) Destruct() error { return nil }

// backoffKey names a backoff scope in backoffPool.
func backoffKey(scope, id string) string { return scope + "/" + id }

// poolRefs records which pool entries one handler instance holds, so Cleanup
// releases exactly those (Provision may fail halfway).
type poolRefs struct {
	upstreams []string
	backoffs  []string
	providers []string
}

func (p *poolRefs) release() {
	for _, k := range p.upstreams {
		_, _ = upstreamPool.Delete(k)
	}
	for _, k := range p.backoffs {
		_, _ = backoffPool.Delete(k)
	}
	for _, k := range p.providers {
		_, _ = providerPool.Delete(k)
	}
	p.upstreams, p.backoffs, p.providers = nil, nil, nil
}

// adoptUpstream returns the shared state for id, creating it if needed, and
// records the reference.
// fresh reports that no other config holds it.
func (p *poolRefs) adoptUpstream(id string) (st *upstreamState, fresh bool) {
	candidate := &upstreamState{id: id}
	if old, ok := draining.Load(id); ok {
		candidate = old.(*upstreamState) // removed, still draining: same slots
	}
	v, loaded := upstreamPool.LoadOrStore(id, candidate)
	p.upstreams = append(p.upstreams, id)
	return v.(*upstreamState), !loaded
}

// adoptBackoff returns the shared backoff state for key.
func (p *poolRefs) adoptBackoff(key string) *backoffState {
	v, _ := backoffPool.LoadOrStore(key, &backoffState{scope: key})
	p.backoffs = append(p.backoffs, key)
	return v.(*backoffState)
}

// applyFleet applies a change another instance made to this scope (or this
// instance's own, echoed): cooling only ever grows, as it would locally.
func (b *backoffState) applyFleet(ev redisstate.Event, now time.Time) {
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
