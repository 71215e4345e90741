package llmroute

import (
	"container/list"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The queue lets a request wait briefly for a slot instead of failing when
// every upstream of its model is busy. There is one process-wide scheduler,
// so that:
//   - arrival order is global: a slot freed on an upstream that several
//     models use goes to the earliest waiter of any of them;
//   - one freed slot admits exactly one waiter (the slot is claimed for the
//     waiter before it is woken: no thundering herd, no barging);
//   - waiters survive a config reload: they hold pointers into the pooled
//     slot state, which the new config shares.
//
// The hot path stays lock-free: while nobody waits, claims are a CAS and a
// release is an atomic add plus one atomic load of the waiter count.

var sched = &scheduler{waiters: list.New(), depth: make(map[string]int)}

type scheduler struct {
	// waiting counts queued waiters plus requests about to queue. It is
	// raised before a request's last claim attempt, so a release that does
	// not see it has already freed the slot that attempt will find.
	waiting atomic.Int64

	mu      sync.Mutex
	waiters *list.List     // *waiter in arrival order
	depth   map[string]int // waiters per model name
}

// waiter is one queued request.
type waiter struct {
	rt    *route
	ready chan int // the claimed target index, sent once
	elem  *list.Element
	since time.Time // when it queued, for the status's oldest wait
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
// can claim a slot its slot.
func (s *scheduler) dispatchLocked() {
	if s.waiters.Len() == 0 {
		return
	}
	now := time.Now()
	var stuck map[*route]bool // routes that found nothing in this pass
	for e := s.waiters.Front(); e != nil; {
		next := e.Next()
		w := e.Value.(*waiter)
		if !stuck[w.rt] {
			if idx, ok := claimFirst(w.rt, now); ok {
				s.removeLocked(w)
				w.ready <- idx
			} else {
				if stuck == nil {
					stuck = make(map[*route]bool)
				}
				stuck[w.rt] = true
			}
		}
		e = next
	}
}

// claimNow claims for a request of a queue-less model, after letting every
// earlier waiter have its turn.
func (s *scheduler) claimNow(rt *route) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dispatchLocked()
	return claimFirst(rt, time.Now())
}

func (s *scheduler) removeLocked(w *waiter) {
	if w.elem == nil {
		return
	}
	s.waiters.Remove(w.elem)
	w.elem = nil
	s.depth[w.rt.name]--
	s.waiting.Add(-1)
}

// claimFirst claims a slot on the first non-cooling upstream of rt with room.
func claimFirst(rt *route, now time.Time) (int, bool) {
	return claimFrom(rt, 0, now, nil)
}

// claimFrom claims a slot on the first target at or after from that is not
// cooling and has room (its provider's capacity included). With a logger it
// logs skipped and accepted upstreams; the scheduler passes none, and no
// logger is also how a claim knows it runs under the scheduler's lock.
func claimFrom(rt *route, from int, now time.Time, log *zap.Logger) (int, bool) {
	for i := from; i < len(rt.targets); i++ {
		u := rt.targets[i].up
		if left := u.cooling(now); left > 0 {
			if log != nil {
				if c := log.Check(zapcore.DebugLevel, "upstream cooling, skipped"); c != nil {
					c.Write(zap.String("model", rt.name), zap.String("upstream", u.id), zap.Duration("left", left))
				}
			}
			continue
		}
		long := rt.targets[i].long
		if !long.claim() {
			if log != nil {
				if c := log.Check(zapcore.DebugLevel, "provider long-context slots full, skipped"); c != nil {
					c.Write(zap.String("model", rt.name), zap.String("upstream", u.id), zap.String("provider", u.provider))
				}
			}
			continue
		}
		if n, ok := u.tryClaim(log == nil); ok {
			if log != nil {
				if c := log.Check(zapcore.DebugLevel, "request accepted"); c != nil {
					c.Write(zap.String("model", rt.name), zap.String("upstream", u.id), zap.String("provider", u.provider),
						zap.Int64("slot", n), limitField(u.limit))
				}
			}
			return i, true
		}
		long.release()
		if log != nil && u.providerFull() {
			if c := log.Check(zapcore.DebugLevel, "provider at capacity, skipped"); c != nil {
				c.Write(zap.String("model", rt.name), zap.String("upstream", u.id), zap.String("provider", u.provider),
					zap.Int64("capacity", u.capacity))
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
		left := t.up.cooling(now)
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
		if _, ok := out[w.rt.name]; !ok {
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
// timeout passes, or the client leaves.
func (h *Handler) wait(r *http.Request, rt *route) (int, *apiError) {
	start := time.Now()
	s := sched
	s.mu.Lock()
	s.waiting.Add(1)
	s.dispatchLocked()
	if idx, ok := claimFirst(rt, start); ok {
		s.waiting.Add(-1)
		s.mu.Unlock()
		h.observeWait(rt, "admitted", 0)
		return idx, nil
	}
	// Waiting does not hide an outage: if everything is cooling and nothing
	// comes back within the wait, answer the cooling 503 now. With no
	// queue_timeout the request waits for the first cooling to end (or for
	// the client to leave), as it would for a busy slot.
	if back, all := soonestBack(rt, start); all && rt.queueTimeout > 0 && back > rt.queueTimeout {
		s.waiting.Add(-1)
		s.mu.Unlock()
		return -1, h.reject(rt)
	}
	if s.depth[rt.name] >= rt.queueSize {
		s.waiting.Add(-1)
		s.mu.Unlock()
		h.observeWait(rt, "full", 0)
		if c := h.logger.Check(zapcore.WarnLevel, "queue full"); c != nil {
			c.Write(zap.String("model", rt.name), zap.Int("queue_size", rt.queueSize))
		}
		e := errQueueFull
		return -1, &e
	}
	w := &waiter{rt: rt, ready: make(chan int, 1), since: start}
	w.elem = s.waiters.PushBack(w)
	s.depth[rt.name]++
	depth := s.depth[rt.name]
	s.mu.Unlock()
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
		case idx := <-w.ready:
			h.observeWait(rt, "admitted", time.Since(start))
			return idx, nil
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

// leave takes a waiter out of the queue. If it was admitted in the meantime,
// the slot it got is handed back (to the next waiter).
func (h *Handler) leave(w *waiter, start time.Time, result string) {
	sched.mu.Lock()
	sched.removeLocked(w)
	sched.mu.Unlock()
	select {
	case idx := <-w.ready:
		w.rt.targets[idx].long.release()
		w.rt.targets[idx].up.release()
	default:
	}
	h.observeWait(w.rt, result, time.Since(start))
	if c := h.logger.Check(zapcore.InfoLevel, "gave up waiting for a slot"); c != nil {
		c.Write(zap.String("model", w.rt.name), zap.String("reason", result), zap.Duration("waited", time.Since(start)))
	}
}

func (h *Handler) observeWait(rt *route, result string, d time.Duration) {
	h.metrics.queueWait.WithLabelValues(rt.name, result).Observe(d.Seconds())
}
