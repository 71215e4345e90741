package llmroute

import (
	"container/list"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

// The queue lets a request wait briefly for a slot instead of failing when
// every upstream of its model is busy. There is one process-wide scheduler,
// shared by every handler whatever its ledger, so that:
//   - arrival order is global: a slot freed on an upstream that several
//     models use goes to the earliest waiter of any of them;
//   - one freed slot admits exactly one waiter (the slot is claimed for the
//     waiter before it is woken: no thundering herd, no barging);
//   - waiters survive a config reload: they hold pointers into the pooled
//     slot state, which the new config shares;
//   - the slots are pooled by upstream id, and two handlers naming the same
//     id share them: a slot one handler frees may be the one another
//     handler's waiter needs.
//
// The ledgers (llmroute/ledger) wake it through a hook (dispatch) and never see
// it.
//
// The hot path stays lock-free: while nobody waits, claims are a CAS and a
// release is an atomic add plus one atomic load of the waiter count.
//
// Under the redis state a claim has two parts: this process's counts (a
// CAS), then the fleet's (a call to Redis). The scheduler's lock covers
// only the first: a pass claims locally for each waiter in arrival order
// and hands it the slot, and the waiter finishes the claim in Redis in its
// own goroutine (grant.complete). A slow Redis therefore delays only the
// waiters whose turn came, never the queue itself (requests of other models
// joining or leaving, the status, explain, the metrics). A renewal that
// defers a pass (ledger.pin) holds back only the waiters on its own ledger:
// a memory model's waiter behind them is still served.

var sched = &scheduler{waiters: list.New(), depth: make(map[string]int)}

type scheduler struct {
	// waiting counts queued waiters plus requests about to queue. It is
	// raised before a request's last claim attempt, so a release that does
	// not see it has already freed the slot that attempt will find.
	waiting atomic.Int64

	mu      sync.Mutex
	waiters *list.List     // *waiter in arrival order
	depth   map[string]int // waiters per model name (probes not counted)
}

// waiter is one request in the scheduler's list.
type waiter struct {
	rt *route
	pl *placing // its own placement order (nil: the list order)
	// only, when ≥ 0, is the one target it waits for (its warm member,
	// affinity_wait): a pass that finds that one full says nothing of the
	// route's other targets.
	only  int
	ready chan grant // its turn: a slot claimed for it, or none for a probe
	elem  *list.Element
	since time.Time // when it queued, for the status's oldest wait
	// probe: a request that may not wait (its model has no queue, or the
	// queue is full) and only takes its turn after the earlier waiters:
	// the first pass that reaches it answers it, with a slot or without.
	probe bool
	// claiming: it has its turn's slot and is finishing the claim in the
	// shared state; passes go past it. passed: one did meanwhile (a slot
	// may have freed that it would have had).
	claiming, passed bool
}

// grant is a slot the scheduler claimed for a waiter in this process, on
// target idx of its route (-1: none, the answer to a probe). pinned: the
// route's ledger holds a pin for it (ledger.pin: under the redis state, a
// use of the fleet and its read lock, which orders the claim against a
// renewal), and the waiter still finishes the claim there; complete or
// giveBack gives the pin back.
type grant struct {
	idx    int
	pinned bool
}

// dispatch admits waiters to whatever slots are free.
func (s *scheduler) dispatch() {
	if s.waiting.Load() == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dispatchLocked()
}

// dispatchLocked walks the waiters in arrival order and gives each one that
// can claim a slot in this process its slot; a probe that cannot leaves
// with nothing. No call to the shared state is made here.
func (s *scheduler) dispatchLocked() {
	if s.waiters.Len() == 0 {
		return
	}
	now := time.Now()
	var stuck map[*route]bool // routes that found nothing in this pass
	var held []ledger.Ledger  // ledgers whose renewal deferred this pass
	for e := s.waiters.Front(); e != nil; {
		next := e.Next()
		w := e.Value.(*waiter)
		switch {
		case w.claiming:
			w.passed = true
		case w.only < 0 && stuck[w.rt]:
			s.endProbeLocked(w)
		case held != nil && slices.Contains(held, w.rt.ledger()):
			// Its ledger's renewal runs and dispatches when done; the
			// waiters of other ledgers behind it still get their turn.
		default:
			g, res := grantFirst(w.rt, w.pl, w.only, now)
			switch res {
			case granted:
				w.claiming = true
				w.ready <- g
			case deferred:
				held = append(held, w.rt.ledger())
			case noSlot:
				if w.only >= 0 {
					break // only its own target is full
				}
				fallthrough
			default:
				s.endProbeLocked(w)
				if stuck == nil {
					stuck = make(map[*route]bool)
				}
				stuck[w.rt] = true
			}
		}
		e = next
	}
}

// endProbeLocked answers a probe that found no slot in its turn.
func (s *scheduler) endProbeLocked(w *waiter) {
	if w.probe {
		s.removeLocked(w)
		w.ready <- grant{idx: -1}
	}
}

func (s *scheduler) pushLocked(w *waiter) {
	w.elem = s.waiters.PushBack(w)
	if !w.probe {
		s.depth[w.rt.name]++
	}
	s.waiting.Add(1)
}

func (s *scheduler) removeLocked(w *waiter) {
	if w.elem == nil {
		return
	}
	s.waiters.Remove(w.elem)
	w.elem = nil
	if !w.probe {
		s.depth[w.rt.name]--
	}
	s.waiting.Add(-1)
}

// What grantFirst found.
const (
	noSlot   = iota
	granted  // a slot, claimed in this process
	deferred // a renewal of the route's ledger holds its lock: try after it
)

// grantFirst claims in this process a slot on the first non-cooling
// upstream of rt with room, as claimFrom does, without the shared state's
// part (grant.complete); only target only when only ≥ 0. It runs under
// the scheduler's lock, so it never waits: a renewal that holds or awaits
// the ledger's lock defers rt's turn.
func grantFirst(rt *route, pl *placing, only int, now time.Time) (grant, int) {
	l := rt.ledger()
	if l == nil {
		return grant{idx: -1}, noSlot
	}
	pinned, ok := l.Pin()
	if !ok {
		return grant{idx: -1}, deferred
	}
	for _, i := range rt.orderFor(pl) {
		u := rt.targets[i].up
		if only >= 0 && i != only || u.Cooling(now) > 0 {
			continue
		}
		long := rt.targets[i].long
		if !l.ClaimLong(long) {
			continue
		}
		if _, ok, _ := u.ClaimLocal(); ok {
			return grant{idx: i, pinned: pinned}, granted
		}
		l.ReleaseLong(long)
	}
	if pinned {
		l.Unpin()
	}
	return grant{idx: -1}, noSlot
}

// complete finishes the grant's claim in the shared state, in the waiter's
// goroutine. When the fleet has no room there, the later upstreams of the
// route are tried in order, as claimFrom would have; it returns the target
// claimed, or false with nothing held.
func (g grant) complete(rt *route, pl *placing, only int) (int, bool) {
	if !g.pinned {
		return g.idx, true
	}
	if rt.ledger().Finish(&rt.targets[g.idx].up.Upstream) {
		return g.idx, true
	}
	rt.ledger().ReleaseLong(rt.targets[g.idx].long)
	if only >= 0 {
		return -1, false // its one target is full in the fleet: wait on
	}
	return claimFrom(rt, pl, g.idx, time.Now(), nil)
}

// giveBack returns a grant its waiter did not take (it left meanwhile):
// the local claim, the ledger's pin, then the slot goes to the next
// waiter.
func (g grant) giveBack(rt *route) {
	rt.ledger().ReleaseLong(rt.targets[g.idx].long)
	rt.targets[g.idx].up.UnclaimLocal()
	if g.pinned {
		rt.ledger().Unpin()
	}
	sched.dispatch()
}

// take completes w's turn g in w's goroutine. Claimed: w leaves the
// list. Not (the fleet was full, or a probe's turn found nothing): w waits
// for its next turn, or, a probe, is out.
func (s *scheduler) take(w *waiter, g grant) (int, bool) {
	idx, ok := -1, false
	if g.idx >= 0 {
		idx, ok = g.complete(w.rt, w.pl, w.only)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w.claiming = false
	if ok || w.probe {
		s.removeLocked(w)
	} else if w.passed {
		s.dispatchLocked() // a slot freed while it was claiming may be its
	}
	w.passed = false
	return idx, ok
}

// claimFrom claims a slot on the first target after target index after
// (-1: from the start), in the route's order, that is not
// cooling and has room (its provider's capacity included). With a logger it
// logs skipped and accepted upstreams; a waiter finishing its turn passes
// none, and no logger is also how a claim knows it is made for the queue
// (whose rollbacks must not wake the queue: that waiter would be woken
// again by its own failed claim).
func claimFrom(rt *route, pl *placing, after int, now time.Time, log *zap.Logger) (int, bool) {
	order := rt.orderFor(pl)
	if after >= 0 {
		order = order[slices.Index(order, after)+1:]
	}
	for _, i := range order {
		u := rt.targets[i].up
		if left := u.Cooling(now); left > 0 {
			if log != nil {
				if c := log.Check(zapcore.DebugLevel, "upstream cooling, skipped"); c != nil {
					c.Write(zap.String("model", rt.name), zap.String("upstream", u.ID), zap.Duration("left", left))
				}
			}
			continue
		}
		long := rt.targets[i].long
		if !u.led.ClaimLong(long) {
			if log != nil {
				if c := log.Check(zapcore.DebugLevel, "provider long-context slots full, skipped"); c != nil {
					c.Write(zap.String("model", rt.name), zap.String("upstream", u.ID), zap.String("provider", u.Provider))
				}
			}
			continue
		}
		if n, ok := u.tryClaim(log == nil); ok {
			if log != nil {
				if c := log.Check(zapcore.DebugLevel, "request accepted"); c != nil {
					c.Write(zap.String("model", rt.name), zap.String("upstream", u.ID), zap.String("provider", u.Provider),
						zap.Int64("slot", n), limitField(u.Limit))
				}
			}
			return i, true
		}
		u.led.ReleaseLong(long)
		if log != nil && u.ProviderFull() {
			if c := log.Check(zapcore.DebugLevel, "provider at capacity, skipped"); c != nil {
				c.Write(zap.String("model", rt.name), zap.String("upstream", u.ID), zap.String("provider", u.Provider),
					zap.Int64("capacity", u.Capacity))
			}
		}
	}
	return -1, false
}

// soonestBack returns how long until the first cooling upstream of rt comes
// back, and whether every upstream is cooling.
func soonestBack(rt *route, now time.Time) (time.Duration, bool) {
	soonest, all := time.Duration(math.MaxInt64), true
	for _, t := range rt.targets {
		left := t.up.Cooling(now)
		if left <= 0 {
			all = false
			continue
		}
		soonest = min(soonest, left)
	}
	if soonest == math.MaxInt64 {
		soonest = 0
	}
	return soonest, all
}

// oldestWaits reports, per model with waiters, when its oldest queued
// request arrived. The list is in arrival order, so the first seen wins.
func oldestWaits() map[string]time.Time {
	out := make(map[string]time.Time)
	sched.mu.Lock()
	defer sched.mu.Unlock()
	for e := sched.waiters.Front(); e != nil; e = e.Next() {
		w := e.Value.(*waiter)
		if _, ok := out[w.rt.name]; !ok && !w.probe {
			out[w.rt.name] = w.since
		}
	}
	return out
}

// forEachQueue reports the queue depth of every model seen so far.
func forEachQueue(f func(model string, depth int)) {
	sched.mu.Lock()
	defer sched.mu.Unlock()
	for m, d := range sched.depth {
		f(m, d)
	}
}

// wait queues the request until a slot of its model frees, the queue
// timeout passes, or the client leaves. A request of a model without a
// queue, or whose queue is full, takes one turn after the earlier waiters
// instead (a probe) and is refused if that turn finds no slot.
func (h *Handler) wait(r *http.Request, rt *route, pl *placing) (int, *apiError) {
	start := time.Now()
	s := sched
	// Waiting does not hide an outage: if everything is cooling and nothing
	// comes back within the wait, answer the cooling 503 now. With no
	// queue_timeout the request waits for the first cooling to end (or for
	// the client to leave), as it would for a busy slot.
	if back, all := soonestBack(rt, start); all && rt.queueSize > 0 && rt.queueTimeout > 0 && back > rt.queueTimeout {
		return -1, h.reject(rt)
	}
	s.mu.Lock()
	w := &waiter{rt: rt, pl: pl, only: -1, ready: make(chan grant, 1), since: start, probe: s.depth[rt.name] >= rt.queueSize}
	s.pushLocked(w)
	s.dispatchLocked() // its turn, after the earlier waiters'
	depth := s.depth[rt.name]
	s.mu.Unlock()
	select {
	case g := <-w.ready:
		if idx, ok := s.take(w, g); ok {
			if rt.queueSize > 0 {
				h.observeWait(rt, "admitted", 0)
			}
			return idx, nil
		}
		if w.probe {
			return -1, h.refuseProbe(rt)
		}
	default: // not served yet (or its turn was deferred by a renewal)
	}
	if w.probe {
		select {
		case g := <-w.ready:
			if idx, ok := s.take(w, g); ok {
				if rt.queueSize > 0 {
					h.observeWait(rt, "admitted", time.Since(start))
				}
				return idx, nil
			}
			return -1, h.refuseProbe(rt)
		case <-r.Context().Done():
			h.leave(w, start, "cancelled")
			return -1, errClientGone
		}
	}
	if c := h.logger.Check(zapcore.DebugLevel, "request queued"); c != nil {
		c.Write(zap.String("model", rt.name), zap.Int("depth", depth))
	}

	var timeout <-chan time.Time
	if rt.queueTimeout > 0 {
		t := time.NewTimer(rt.queueTimeout)
		defer t.Stop()
		timeout = t.C
	}
	// Cooling ends are not events: wake up when the first one is due.
	recheck := time.NewTimer(time.Hour)
	defer recheck.Stop()
	armRecheck := func() {
		if back, _ := soonestBack(rt, time.Now()); back > 0 {
			recheck.Reset(back + time.Millisecond)
		}
	}
	armRecheck()

	for {
		select {
		case g := <-w.ready:
			if idx, ok := s.take(w, g); ok {
				h.observeWait(rt, "admitted", time.Since(start))
				return idx, nil
			}
			// The fleet had no room for its turn: it waits for the next.
		case <-recheck.C:
			s.dispatch()
			armRecheck()
		case <-r.Context().Done():
			h.leave(w, start, "cancelled")
			return -1, errClientGone
		case <-timeout:
			h.leave(w, start, "timeout")
			if back, all := soonestBack(rt, time.Now()); all && back > 0 {
				return -1, h.reject(rt)
			}
			e := errQueueTimeout
			return -1, &e
		}
	}
}

// refuseProbe answers a probe whose turn found no slot: the 503 of a
// model without a queue (busy or cooling), or queue full.
func (h *Handler) refuseProbe(rt *route) *apiError {
	if rt.queueSize == 0 {
		return h.reject(rt)
	}
	h.observeWait(rt, "full", 0) // the refusal is logged where it is answered
	e := errQueueFull
	return &e
}

// leave takes a waiter out of the queue. If it was admitted in the meantime,
// the slot it got is handed back (to the next waiter).
func (h *Handler) leave(w *waiter, start time.Time, result string) {
	withdraw(w)
	if w.probe && w.rt.queueSize == 0 {
		return // a model without a queue has no wait to observe
	}
	h.observeWait(w.rt, result, time.Since(start))
	if c := h.logger.Check(zapcore.InfoLevel, "gave up waiting for a slot"); c != nil {
		c.Write(zap.String("model", w.rt.name), zap.String("reason", result), zap.Duration("waited", time.Since(start)))
	}
}

// withdraw takes a waiter out of the queue, handing back a slot it was
// granted meanwhile.
func withdraw(w *waiter) {
	sched.mu.Lock()
	sched.removeLocked(w)
	sched.mu.Unlock()
	select {
	case g := <-w.ready:
		if g.idx >= 0 {
			g.giveBack(w.rt)
		}
	default:
	}
}

// waitWarm waits up to d for target i of rt alone: the request's pinned or
// warm pool member, busy when the request was placed (affinity_wait). It
// waits in the queue, so earlier waiters of any model keep their turn. It
// returns false when the wait ends without the slot (the request then
// takes a cold member, or queues, as it would have); pl.waited is set when
// it got it.
func (h *Handler) waitWarm(r *http.Request, rt *route, pl *placing, i int, d time.Duration) (int, bool) {
	s := sched
	start := time.Now()
	s.mu.Lock()
	w := &waiter{rt: rt, pl: pl, only: i, ready: make(chan grant, 1), since: start}
	s.pushLocked(w)
	s.dispatchLocked()
	s.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case g := <-w.ready:
			if idx, ok := s.take(w, g); ok {
				pl.waited = max(time.Since(start), time.Millisecond)
				return idx, true
			}
		case <-t.C:
			withdraw(w)
			return -1, false
		case <-r.Context().Done():
			withdraw(w)
			return -1, false
		}
	}
}

func (h *Handler) observeWait(rt *route, result string, d time.Duration) {
	h.metrics.queueWait.WithLabelValues(rt.name, result).Observe(d.Seconds())
}
