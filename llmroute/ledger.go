package llmroute

import (
	"sync"
	"time"
)

// The ledger is everything one handler counts or remembers on the request
// path: slot and provider-capacity claims and releases, backoff failures,
// successes and Retry-After holds, session ids, and the views of the
// shared state the route headers and the status show. Each Handler owns
// one, made from its `state` block, and each of its compiled upstreams
// carries it, so the request path reaches the state through the upstream
// it claims on and never through a process-wide "current" state: two
// handlers in one process, one on Redis and one on memory, each count in
// their own.
//
// Both implementations count in this process's pooled state first (state.go,
// capacity.go): memoryLedger only there; redisLedger then fleet-wide, in
// the fleet of its state block (fleet.go). The pooled state is shared by
// id, whatever the ledger: an upstream id that a redis handler and a memory
// handler of the same process both use has one local count, and the redis
// fleet's renewal writes that count (both handlers' requests) to Redis. Two
// handlers naming the same upstream id mean the same server, so the local
// limit holds for the two together, as it always did.
//
// The ledger is passive: it never names the queue. It wakes it through the
// hook its handler gives it (wake) when a slot frees, and the scheduler
// asks it, through pin, whether a waiter's turn may be claimed now.
type ledger interface {
	// claim takes a slot on u and a unit of its provider's capacity, both
	// or neither, in this process and then, on Redis, fleet-wide. wake
	// tells the caller to wake the queue: a rollback freed a slot that a
	// waiter may have seen taken.
	claim(u *upstream) (n int64, ok, wake bool)
	// pin prepares, under the scheduler's lock and without waiting, a
	// local claim (upstream.claimLocal) whose shared part the waiter
	// finishes in its own goroutine (finish). ok is false while a renewal
	// of the shared state holds it: the turn is deferred, and the
	// ledger wakes the queue when the renewal lets go. pinned tells that
	// finish or unpin must follow.
	pin() (pinned, ok bool)
	// finish completes, outside the scheduler's lock, a local claim made
	// under a pin, and gives the pin back; false: the fleet had no room,
	// and the local claim was undone.
	finish(u *upstream) bool
	// unpin gives back a pin whose claim was not made or was undone.
	unpin()
	// release frees u's slot and provider unit (fleet-wide first) and
	// wakes the queue; it returns the upstream's new in-flight count.
	release(u *upstream) int64

	// failed records a failed attempt on backoff scope b and returns the
	// cooling it started; hold cools u (its backoff scope, or u alone)
	// for at least d because the upstream asked (Retry-After); recovered
	// ends b's cooling after a success. On Redis they are shared with
	// the fleet off the request path.
	failed(b *backoffState, now time.Time) time.Duration
	hold(u *upstream, now time.Time, d time.Duration)
	recovered(b *backoffState, now time.Time)

	// sessionID names the conversation of a final outgoing body
	// (sessions.go).
	sessionID(body []byte) string

	// fleetFull is the fleet's answer to this process's last claim on u
	// (fleetFree with memory, or while Redis does not answer: the local
	// counts are the truth then), for X-LLM-Route-Skipped.
	fleetFull(u *upstream) int32
	// fleetUse returns the fleet-wide in-flight counts for the status;
	// nil maps with memory or while Redis does not answer.
	fleetUse(upstreams, providers []string) (map[string]int64, map[string]int64)
	// status is the backend and its health, for the status.
	status() fleetStatus

	// start runs once h's config runs: a redis fleet starts its
	// background work and takes on h's upstreams, providers and backoff
	// scopes. stop, at Cleanup, gives them back (scopes whose requests
	// still run are renewed until they end).
	start(h *Handler)
	stop()
}

// memoryLedger counts in this process's pooled state only.
type memoryLedger struct {
	wake func() // the queue's
}

func newMemoryLedger(wake func()) *memoryLedger { return &memoryLedger{wake: wake} }

func (*memoryLedger) claim(u *upstream) (int64, bool, bool) { return u.claimLocal() }
func (*memoryLedger) pin() (bool, bool)                     { return false, true }
func (*memoryLedger) finish(*upstream) bool                 { return true }
func (*memoryLedger) unpin()                                {}

func (l *memoryLedger) release(u *upstream) int64 {
	n := u.releaseLocal()
	l.wake() // a waiting request may take the slot
	return n
}

func (*memoryLedger) failed(b *backoffState, now time.Time) time.Duration {
	return b.recordFailure(now)
}

func (*memoryLedger) hold(u *upstream, now time.Time, d time.Duration) { u.holdLocal(now, d) }

func (*memoryLedger) recovered(b *backoffState, now time.Time) { b.recordSuccess(now) }

func (*memoryLedger) sessionID(body []byte) string { return sessions.local.ID(body) }

func (*memoryLedger) fleetFull(*upstream) int32 { return fleetFree }

func (*memoryLedger) fleetUse([]string, []string) (map[string]int64, map[string]int64) {
	return nil, nil
}

func (*memoryLedger) status() fleetStatus { return fleetStatus{Backend: "memory", Healthy: true} }
func (*memoryLedger) start(*Handler)      {}
func (*memoryLedger) stop()               {}

// redisLedger is the fleet of the handler's state block in front of the
// pooled state. The fleet is shared by the handlers on the same block; the
// ledger records what this handler gave it, so stop takes back exactly that.
type redisLedger struct {
	f    *fleet
	wake func()

	mu  sync.Mutex
	reg *fleetRegistration // nil until started, and after stop
}

func newRedisLedger(f *fleet, wake func()) *redisLedger { return &redisLedger{f: f, wake: wake} }

func (l *redisLedger) claim(u *upstream) (int64, bool, bool) { return l.f.tryClaim(u) }

func (l *redisLedger) pin() (pinned, ok bool) {
	if !l.f.use() {
		return false, true // a reload has just switched the fleet off: this process's counts only
	}
	if !l.f.mu.TryRLock() {
		l.f.done()
		return false, false
	}
	return true, true
}

func (l *redisLedger) finish(u *upstream) bool { return l.f.claimShared(u) }

func (l *redisLedger) unpin() {
	l.f.mu.RUnlock()
	l.f.done()
}

func (l *redisLedger) release(u *upstream) int64 {
	l.f.release(u)
	n := u.releaseLocal()
	l.wake()
	return n
}

func (l *redisLedger) failed(b *backoffState, now time.Time) time.Duration {
	d := b.recordFailure(now)
	l.f.shareBackoff(b.scope, b.maxCooling(), 0)
	return d
}

func (l *redisLedger) hold(u *upstream, now time.Time, d time.Duration) {
	u.holdLocal(now, d)
	if b := u.backoff; b != nil {
		l.f.shareBackoff(b.scope, b.maxCooling(), d)
	} else {
		l.f.shareHold(u.id, d)
	}
}

func (l *redisLedger) recovered(b *backoffState, now time.Time) {
	if b.recordSuccess(now) {
		l.f.shareSuccess(b.scope)
	}
}

func (l *redisLedger) sessionID(body []byte) string { return sessions.shared(l.f, body) }

func (l *redisLedger) fleetFull(u *upstream) int32 {
	if !l.f.healthy.Load() {
		return fleetFree
	}
	return u.state.fleetFull.Load()
}

func (l *redisLedger) fleetUse(upstreams, providers []string) (map[string]int64, map[string]int64) {
	return l.f.used(upstreams, providers)
}

func (l *redisLedger) status() fleetStatus { return l.f.status() }

func (l *redisLedger) start(h *Handler) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reg != nil {
		return
	}
	reg := &fleetRegistration{}
	for _, u := range h.table.upstreams {
		reg.add(u)
	}
	l.reg = reg
	l.f.register(reg)
	l.f.start(h.logger, l.wake)
}

func (l *redisLedger) stop() {
	l.mu.Lock()
	reg := l.reg
	l.reg = nil
	l.mu.Unlock()
	if reg != nil {
		l.f.unregister(reg)
	}
}
