package llmroute

// Unit tests of the scheduler (queue.go): arrival order across models, the
// slot claimed for the oldest waiter before it wakes, and waiters that
// leave. Each test uses its own model and upstream names: the scheduler is
// process-wide.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

// schedUpstream is an upstream outside Caddy with the given slot limit.
func schedUpstream(id string, limit int64) *upstream {
	return &upstream{Upstream: ledger.Upstream{ID: id, Provider: "p", Limit: limit, State: ledger.NewUpstreamState(id, limit)},
		led: ledger.NewMemory(sched.dispatch)}
}

// schedRoute is a model over the given upstreams with a queue.
func schedRoute(name string, queue int, timeout time.Duration, ups ...*upstream) *route {
	rt := &route{name: name, queueSize: queue, queueTimeout: timeout}
	for _, u := range ups {
		rt.targets = append(rt.targets, target{up: u})
	}
	return rt
}

func schedHandler() *Handler { return &Handler{logger: zap.NewNop(), metrics: getMetrics()} }

// waitResult is what one queued request got.
type waitResult struct {
	who string
	idx int
	err *apiError
}

// enqueue starts a request of rt that waits in the queue and blocks until it
// is queued (depth of its model is depth); its result arrives on out.
func enqueue(t *testing.T, h *Handler, ctx context.Context, rt *route, who string, depth int, out chan<- waitResult) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil).WithContext(ctx)
	go func() {
		idx, err := h.wait(r, rt, nil)
		out <- waitResult{who, idx, err}
	}()
	waitFor(t, who+" queued", func() bool { return queueDepth(rt.name) == depth })
}

func queueDepth(model string) int {
	sched.mu.Lock()
	defer sched.mu.Unlock()
	return sched.depth[model]
}

// waitFor polls cond with a deadline generous enough for a loaded machine.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// next returns the next result, failing after a generous deadline.
func next(t *testing.T, ch <-chan waitResult) waitResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter was admitted")
	}
	return waitResult{}
}

// nothingYet checks that no further waiter was admitted.
func nothingYet(t *testing.T, ch <-chan waitResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s was admitted without a free slot (idx %d, err %v)", r.who, r.idx, r.err)
	case <-time.After(20 * time.Millisecond):
	}
}

func TestSchedulerArrivalOrderAcrossModels(t *testing.T) {
	h := schedHandler()
	shared := schedUpstream("sched-order-u", 1)
	a := schedRoute("sched-order-a", 10, 0, shared)
	b := schedRoute("sched-order-b", 10, 0, shared)
	if _, ok, _ := shared.ClaimLocal(); !ok {
		t.Fatal("the only slot is taken")
	}
	out := make(chan waitResult, 4)
	ctx := context.Background()
	enqueue(t, h, ctx, b, "b1", 1, out)
	enqueue(t, h, ctx, a, "a1", 1, out)
	enqueue(t, h, ctx, b, "b2", 2, out)
	enqueue(t, h, ctx, a, "a2", 2, out)
	nothingYet(t, out)

	// Each freed slot goes to the earliest waiter of either model.
	for _, want := range []string{"b1", "a1", "b2", "a2"} {
		shared.release()
		got := next(t, out)
		if got.who != want || got.err != nil || got.idx != 0 {
			t.Fatalf("admitted %s (idx %d, err %v), want %s", got.who, got.idx, got.err, want)
		}
		nothingYet(t, out)
	}
	shared.release()
	if n := shared.State.Inflight(); n != 0 {
		t.Errorf("inflight = %d after every waiter finished, want 0", n)
	}
	if d := queueDepth("sched-order-a") + queueDepth("sched-order-b"); d != 0 {
		t.Errorf("queue depth %d after every waiter left", d)
	}
}

func TestSchedulerClaimsTheSlotForTheOldestWaiter(t *testing.T) {
	h := schedHandler()
	u := schedUpstream("sched-claim-u", 1)
	queued := schedRoute("sched-claim-q", 10, 0, u)
	noQueue := schedRoute("sched-claim-n", 0, 0, u)
	u.ClaimLocal()
	out := make(chan waitResult, 1)
	enqueue(t, h, context.Background(), queued, "waiter", 1, out)

	// The release hands the slot over before it returns: the slot is taken
	// (for the waiter) before the waiter even runs, so nobody can barge in.
	u.release()
	if n := u.State.Inflight(); n != 1 {
		t.Fatalf("inflight = %d right after the release, want 1 (claimed for the waiter)", n)
	}
	if _, ok, _ := u.ClaimLocal(); ok {
		t.Fatal("a newcomer took the slot freed for the waiter")
	}
	// A queue-less request arriving now is refused, not served first.
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	if idx, err := h.admit(r, noQueue, nil); err == nil {
		t.Fatalf("a newcomer was admitted (idx %d) while the slot was the waiter's", idx)
	}
	if got := next(t, out); got.who != "waiter" || got.err != nil {
		t.Fatalf("waiter: idx %d err %v", got.idx, got.err)
	}
	u.release()

	// With a free slot and nobody waiting, admission is immediate.
	idx, err := h.admit(r, noQueue, nil)
	if err != nil || idx != 0 {
		t.Fatalf("admit with a free slot: idx %d err %v", idx, err)
	}
	u.release()
}

func TestSchedulerSecondUpstreamAndStuckModels(t *testing.T) {
	// A waiter of a model whose upstreams are all busy must not hold up a
	// later waiter of another model whose upstream frees.
	h := schedHandler()
	busy := schedUpstream("sched-stuck-busy", 1)
	other := schedUpstream("sched-stuck-other", 1)
	stuck := schedRoute("sched-stuck-s", 10, 0, busy)
	free := schedRoute("sched-stuck-f", 10, 0, busy, other)
	busy.ClaimLocal()
	other.ClaimLocal()
	out := make(chan waitResult, 2)
	enqueue(t, h, context.Background(), stuck, "stuck", 1, out)
	enqueue(t, h, context.Background(), free, "free", 1, out)
	other.release()
	if got := next(t, out); got.who != "free" || got.idx != 1 {
		t.Fatalf("admitted %s at idx %d, want free at idx 1 (its second upstream)", got.who, got.idx)
	}
	nothingYet(t, out)
	busy.release()
	if got := next(t, out); got.who != "stuck" || got.idx != 0 {
		t.Fatalf("admitted %s at idx %d, want stuck at idx 0", got.who, got.idx)
	}
	busy.release()
	other.release()
}

func TestSchedulerWaiterThatLeaves(t *testing.T) {
	h := schedHandler()
	u := schedUpstream("sched-leave-u", 1)
	rt := schedRoute("sched-leave", 10, 0, u)
	u.ClaimLocal()

	t.Run("client gone", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan waitResult, 1)
		enqueue(t, h, ctx, rt, "cancelled", 1, out)
		cancel()
		if got := next(t, out); got.err != errClientGone {
			t.Fatalf("a cancelled waiter got idx %d err %v, want errClientGone", got.idx, got.err)
		}
		if d := queueDepth(rt.name); d != 0 {
			t.Errorf("queue depth %d after the waiter left", d)
		}
		if w := sched.waiting.Load(); w != 0 {
			t.Errorf("scheduler still counts %d waiters", w)
		}
	})

	t.Run("queue timeout", func(t *testing.T) {
		timed := schedRoute("sched-leave-timeout", 10, 30*time.Millisecond, u)
		out := make(chan waitResult, 1)
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		go func() {
			idx, err := h.wait(r, timed, nil)
			out <- waitResult{"timed", idx, err}
		}()
		got := next(t, out)
		if got.err == nil || got.err.code != errQueueTimeout.code {
			t.Fatalf("got idx %d err %v, want the queue timeout", got.idx, got.err)
		}
		if d := queueDepth(timed.name); d != 0 {
			t.Errorf("queue depth %d after the timeout", d)
		}
	})

	t.Run("queue full", func(t *testing.T) {
		small := schedRoute("sched-leave-full", 1, 0, u)
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan waitResult, 2)
		enqueue(t, h, ctx, small, "first", 1, out)
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		if _, err := h.wait(r, small, nil); err == nil || err.code != errQueueFull.code {
			t.Fatalf("second waiter of a queue of one: err %v, want queue full", err)
		}
		cancel()
		if got := next(t, out); got.err != errClientGone {
			t.Fatalf("first: err %v", got.err)
		}
	})

	// A waiter that is admitted while it leaves hands the slot on: whichever
	// wins the race, no slot is lost and none is counted twice.
	t.Run("admitted while leaving", func(t *testing.T) {
		for i := 0; i < 200; i++ {
			ctx, cancel := context.WithCancel(context.Background())
			out := make(chan waitResult, 1)
			enqueue(t, h, ctx, rt, "racer", 1, out)
			go u.release()
			cancel()
			got := next(t, out)
			if got.err == nil {
				u.release() // it was admitted: its request would end now
			} else if got.err != errClientGone {
				t.Fatalf("racer: err %v", got.err)
			}
			waitFor(t, "the slot back with nobody holding it", func() bool { return u.State.Inflight() == 0 })
			u.ClaimLocal() // taken again for the next round
		}
	})
	u.release()
	if n := u.State.Inflight(); n != 0 {
		t.Errorf("inflight = %d at the end, want 0", n)
	}
}

// TestSchedulerTurnDeferredByRenewal: under the redis state a waiter's
// turn takes the fleet's read lock with its local claim (the claim in
// Redis is finished in the waiter's goroutine, outside the scheduler's
// lock). While a renewal holds the write lock, a pass claims nothing and
// never blocks; the renewal's dispatch then gives the waiter its turn, and
// a request of a model without a queue that arrived meanwhile waits for
// its turn instead of being refused. The ledger here counts in this
// process and pins as a redis fleet whose Redis is away does (renewing),
// so no call is made.
func TestSchedulerTurnDeferredByRenewal(t *testing.T) {
	f := &renewingLedger{Ledger: ledger.NewMemory(sched.dispatch)}
	f.users.Store(1)
	onFleet := f

	h := schedHandler()
	u := schedUpstream("sched-renew-u", 1)
	free := schedUpstream("sched-renew-free", 1)
	u.led, free.led = onFleet, onFleet
	queued := schedRoute("sched-renew-q", 4, 0, u)
	noQueue := schedRoute("sched-renew-n", 0, 0, free)
	u.ClaimLocal()
	out := make(chan waitResult, 2)
	enqueue(t, h, context.Background(), queued, "waiter", 1, out)

	// A model of a memory handler, queued behind the redis one's waiter.
	mem := schedUpstream("sched-renew-mem", 1)
	memQueued := schedRoute("sched-renew-mem", 4, 0, mem)
	mem.ClaimLocal()
	memOut := make(chan waitResult, 1)
	enqueue(t, h, context.Background(), memQueued, "memory waiter", 1, memOut)

	f.mu.Lock() // a renewal reads the counts
	locked := make(chan struct{})
	go func() { defer close(locked); u.ReleaseLocal(); sched.dispatch() }() // the local part of a release
	select {
	case <-locked:
	case <-time.After(10 * time.Second):
		t.Fatal("a release blocked on the renewal's lock")
	}
	// The renewal defers the redis model's turn only: the memory model's
	// waiter behind it takes the slot its handler frees.
	mem.release()
	if r := next(t, memOut); r.err != nil || r.idx != 0 {
		t.Fatalf("memory waiter behind a deferred turn: idx %d err %v", r.idx, r.err)
	}
	mem.release()
	go func() {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		idx, err := h.admit(r, noQueue, nil)
		out <- waitResult{"no-queue", idx, err}
	}()
	waitFor(t, "the queue-less request in line", func() bool { return sched.waiting.Load() == 2 })
	nothingYet(t, out)
	if n := u.State.Inflight() + free.State.Inflight(); n != 0 {
		t.Fatalf("%d slots claimed during the renewal", n)
	}
	f.mu.Unlock()
	sched.dispatch() // what renewSlots does once it lets go

	got := map[string]waitResult{}
	for range 2 {
		r := next(t, out)
		got[r.who] = r
	}
	if r := got["waiter"]; r.err != nil || r.idx != 0 {
		t.Fatalf("waiter: idx %d err %v", r.idx, r.err)
	}
	if r := got["no-queue"]; r.err != nil || r.idx != 0 {
		t.Fatalf("queue-less request refused during the renewal: idx %d err %v", r.idx, r.err)
	}
	u.release()
	free.release()
	if n := f.users.Load(); n != 1 {
		t.Errorf("fleet users = %d after both turns ended, want 1 (a grant kept its use)", n)
	}
	if !f.mu.TryLock() {
		t.Fatal("a grant kept the fleet's read lock")
	}
	f.mu.Unlock()
}

// renewingLedger is a memory ledger that pins as the redis ledger does
// (llmroute/ledger): a claim holds the read side of a renewal's lock and a
// use of the fleet until its shared part is finished, and a pin fails
// while a renewal (the test) holds the write side.
type renewingLedger struct {
	ledger.Ledger
	mu    sync.RWMutex
	users atomic.Int64
}

func (l *renewingLedger) Claim(u *ledger.Upstream) (int64, bool, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return u.ClaimLocal()
}

func (l *renewingLedger) Pin() (pinned, ok bool) {
	l.users.Add(1)
	if !l.mu.TryRLock() {
		l.users.Add(-1)
		return false, false
	}
	return true, true
}

func (l *renewingLedger) Finish(*ledger.Upstream) bool { l.Unpin(); return true }

func (l *renewingLedger) Unpin() {
	l.mu.RUnlock()
	l.users.Add(-1)
}
