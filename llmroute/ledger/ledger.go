package ledger

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/keys"
)

// Ledger is everything one handler counts or remembers on the request
// path: slot and provider-capacity claims and releases, long-context
// slots, backoff failures, successes and Retry-After holds, client keys'
// rates and budgets, session ids, and the views of the shared state the
// route headers and the status show. Each handler owns one, made from its
// `state` block, and each of its compiled upstreams carries it, so the
// request path reaches the state through the upstream it claims on and
// never through a process-wide "current" state: two handlers in one
// process, one on Redis and one on memory, each count in their own.
//
// Both implementations count in this process's pooled state first
// (state.go, capacity.go): the memory ledger only there; the redis ledger
// then fleet-wide, in the fleet of its state block (fleet.go). The pooled
// state is shared by id, whatever the ledger: an upstream id that a redis
// handler and a memory handler of the same process both use has one local
// count, and the redis fleet's renewal writes that count (both handlers'
// requests) to Redis. Two handlers naming the same upstream id mean the
// same server, so the local limit holds for the two together, as it always
// did.
//
// The ledger is passive: it never names the queue. It wakes it through the
// hook its handler gives it (wake) when a slot frees, and the scheduler
// asks it, through Pin, whether a waiter's turn may be claimed now.
type Ledger interface {
	// Claim takes a slot on u and a unit of its provider's capacity, both
	// or neither, in this process and then, on Redis, fleet-wide. wake
	// tells the caller to wake the queue: a rollback freed a slot that a
	// waiter may have seen taken.
	Claim(u *Upstream) (n int64, ok, wake bool)
	// Pin prepares, under the scheduler's lock and without waiting, a
	// local claim (Upstream.ClaimLocal) whose shared part the waiter
	// finishes in its own goroutine (Finish). ok is false while a renewal
	// of the shared state holds it: the turn is deferred, and the
	// ledger wakes the queue when the renewal lets go. pinned tells that
	// Finish or Unpin must follow.
	Pin() (pinned, ok bool)
	// Finish completes, outside the scheduler's lock, a local claim made
	// under a pin, and gives the pin back; false: the fleet had no room,
	// and the local claim was undone.
	Finish(u *Upstream) bool
	// Unpin gives back a pin whose claim was not made or was undone.
	Unpin()
	// Release frees u's slot and provider unit (fleet-wide first) and
	// wakes the queue; it returns the upstream's new in-flight count.
	Release(u *Upstream) int64

	// ClaimLong takes one of a provider's long-context slots (nil: no
	// bound, always free), before the normal slot; ReleaseLong gives it
	// back, before the normal slot's release (which wakes the queue).
	// They count in this process only, with either backend.
	ClaimLong(l *LongSlots) bool
	ReleaseLong(l *LongSlots)

	// Failed records a failed attempt on backoff scope b and returns the
	// cooling it started; Hold cools u (its backoff scope, or u alone)
	// for at least d because the upstream asked (Retry-After); Recovered
	// ends b's cooling after a success. On Redis they are shared with
	// the fleet off the request path.
	Failed(b *Backoff, now time.Time) time.Duration
	Hold(u *Upstream, now time.Time, d time.Duration)
	Recovered(b *Backoff, now time.Time)
	// CoolKey leaves a provider key out for at least d (the provider
	// refused it); on Redis the fleet leaves it out as long.
	CoolKey(k *KeyState, now time.Time, d time.Duration)

	// Keys is the store of client keys' rates and budgets: this
	// process's (LocalKeys), or with Redis the fleet's in front of it.
	// KeepKeys holds what a key request's reservations and settlements
	// need (the fleet's client) from its admission to its end: the
	// returned func gives it back; nil when there is nothing to hold.
	Keys() keys.Store
	KeepKeys() (done func())

	// SessionID names the conversation of a final outgoing body
	// (sessions.go).
	SessionID(body []byte) string
	// Affinity is the member (upstream id) the fleet last placed a pool's
	// affinity key hash on, "" when none is known or the state is not
	// shared (memory: each pool's own index holds its pins); SetAffinity
	// records it for ttl, "" forgets it (affinity.go).
	Affinity(pool string, key uint64) string
	SetAffinity(pool string, key uint64, member string, ttl time.Duration)

	// FleetFull is the fleet's answer to this process's last claim on u
	// (FleetFree with memory, or while Redis does not answer: the local
	// counts are the truth then), for X-LLM-Route-Skipped.
	FleetFull(u *Upstream) int32
	// FleetUse returns the fleet-wide in-flight counts for the status;
	// nil maps with memory or while Redis does not answer.
	FleetUse(upstreams, providers []string) (map[string]int64, map[string]int64)
	// Status is the backend and its health, for the status.
	Status() Status

	// Start runs once the handler's config runs: a redis fleet starts its
	// background work and takes on ups' upstreams, providers and backoff
	// scopes. Close, at Cleanup, gives them back (scopes whose requests
	// still run are renewed until they end) and gives the fleet back to
	// its pool.
	Start(logger *zap.Logger, ups []*Upstream)
	Close()
}

// Status is the state part of GET /llm_route/status.
type Status struct {
	Backend string `json:"backend"`
	// Healthy is false while Redis is unreachable (always true for memory).
	Healthy bool `json:"healthy"`
	// Fallback names the mode while unhealthy: local or reject.
	Fallback string `json:"fallback,omitempty"`
}

// FleetFull's answers: the fleet had room (or was not asked), or which
// limit was full fleet-wide.
const (
	FleetFree int32 = iota
	FleetUpstreamFull
	FleetProviderFull
)

// local is what both ledgers count in this process alone: the long-context
// slots.
type local struct{}

func (local) ClaimLong(l *LongSlots) bool { return l.claim() }
func (local) ReleaseLong(l *LongSlots)    { l.release() }

// memoryLedger counts in this process's pooled state only.
type memoryLedger struct {
	local
	wake func() // the queue's
}

// NewMemory returns a ledger that counts in this process only; wake is
// the queue's hook, called when a slot frees.
func NewMemory(wake func()) Ledger { return &memoryLedger{wake: wake} }

func (*memoryLedger) Claim(u *Upstream) (int64, bool, bool) { return u.ClaimLocal() }
func (*memoryLedger) Pin() (bool, bool)                     { return false, true }
func (*memoryLedger) Finish(*Upstream) bool                 { return true }
func (*memoryLedger) Unpin()                                {}

func (l *memoryLedger) Release(u *Upstream) int64 {
	n := u.ReleaseLocal()
	l.wake() // a waiting request may take the slot
	return n
}

func (*memoryLedger) Failed(b *Backoff, now time.Time) time.Duration {
	return b.recordFailure(now)
}

func (*memoryLedger) Hold(u *Upstream, now time.Time, d time.Duration) { u.holdLocal(now, d) }

func (*memoryLedger) Recovered(b *Backoff, now time.Time) { b.recordSuccess(now) }

func (*memoryLedger) Keys() keys.Store             { return localKeys }
func (*memoryLedger) KeepKeys() func()             { return nil }
func (*memoryLedger) SessionID(body []byte) string { return sessions.local.ID(body) }

func (*memoryLedger) FleetFull(*Upstream) int32 { return FleetFree }

func (*memoryLedger) FleetUse([]string, []string) (map[string]int64, map[string]int64) {
	return nil, nil
}

func (*memoryLedger) Status() Status                 { return Status{Backend: "memory", Healthy: true} }
func (*memoryLedger) Start(*zap.Logger, []*Upstream) {}
func (*memoryLedger) Close()                         {}

// redisLedger is the fleet of the handler's state block in front of the
// pooled state. The fleet is shared by the handlers on the same block; the
// ledger records what this handler gave it, so Close takes back exactly
// that.
type redisLedger struct {
	local
	f    *fleet
	keys *fleetKeys
	wake func()

	mu     sync.Mutex
	reg    *fleetRegistration // nil until started, and after Close
	closed bool
}

// NewRedis returns a ledger on the pooled fleet of the state block o,
// made with its client on first use (no connection yet: Redis down at
// start-up must not stop Caddy); wake is the queue's hook.
func NewRedis(o RedisOptions, logger *zap.Logger, wake func()) Ledger {
	f := acquireFleet(o, logger)
	return &redisLedger{f: f, keys: &fleetKeys{f: f, local: localKeys}, wake: wake}
}

func (l *redisLedger) Claim(u *Upstream) (int64, bool, bool) { return l.f.tryClaim(u) }

func (l *redisLedger) Pin() (pinned, ok bool) {
	if !l.f.use() {
		return false, true // a reload has just switched the fleet off: this process's counts only
	}
	if !l.f.mu.TryRLock() {
		l.f.done()
		return false, false
	}
	return true, true
}

func (l *redisLedger) Finish(u *Upstream) bool { return l.f.claimShared(u) }

func (l *redisLedger) Unpin() {
	l.f.mu.RUnlock()
	l.f.done()
}

func (l *redisLedger) Release(u *Upstream) int64 {
	l.f.release(u)
	n := u.ReleaseLocal()
	l.wake()
	return n
}

func (l *redisLedger) Failed(b *Backoff, now time.Time) time.Duration {
	d := b.recordFailure(now)
	l.f.shareBackoff(b.scope, b.maxCooling(), 0)
	return d
}

func (l *redisLedger) Hold(u *Upstream, now time.Time, d time.Duration) {
	u.holdLocal(now, d)
	if b := u.Backoff; b != nil {
		l.f.shareBackoff(b.scope, b.maxCooling(), d)
	} else {
		l.f.shareHold(u.ID, d)
	}
}

func (l *redisLedger) Recovered(b *Backoff, now time.Time) {
	if b.recordSuccess(now) {
		l.f.shareSuccess(b.scope)
	}
}

func (l *redisLedger) Keys() keys.Store { return l.keys }
func (l *redisLedger) KeepKeys() func() { return l.keys.begin() }

func (l *redisLedger) SessionID(body []byte) string { return sessions.shared(l.f, body) }

func (l *redisLedger) FleetFull(u *Upstream) int32 {
	if !l.f.healthy.Load() {
		return FleetFree
	}
	return u.State.fleetFull.Load()
}

func (l *redisLedger) FleetUse(upstreams, providers []string) (map[string]int64, map[string]int64) {
	return l.f.used(upstreams, providers)
}

func (l *redisLedger) Status() Status { return l.f.status() }

func (l *redisLedger) Start(logger *zap.Logger, ups []*Upstream) {
	l.mu.Lock()
	if l.reg == nil {
		reg := &fleetRegistration{}
		for _, u := range ups {
			reg.add(u)
		}
		l.reg = reg
		l.f.register(reg)
		l.f.start(logger, l.wake)
	}
	l.mu.Unlock()
	logger.Info("shared state", zap.String("backend", "redis"), zap.String("address", l.f.address),
		zap.Duration("lease_ttl", l.f.ttl), zap.Bool("reject_on_error", l.f.reject))
}

func (l *redisLedger) Close() {
	l.mu.Lock()
	reg := l.reg
	l.reg = nil
	first := !l.closed
	l.closed = true
	l.mu.Unlock()
	if reg != nil {
		l.f.unregister(reg)
	}
	if first {
		_, _ = fleets.Delete(l.f.poolKey)
	}
}
