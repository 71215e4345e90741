package ledger

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestBackoffDoublesUpToCapAndResets(t *testing.T) {
	for _, tc := range []struct {
		cap  time.Duration
		want []time.Duration
	}{
		// want in milliseconds
		{10 * time.Second, []time.Duration{1000, 2000, 4000, 8000, 10000, 10000}},
		{1500 * time.Millisecond, []time.Duration{1000, 1500, 1500}},
		{time.Minute, []time.Duration{1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000}},
	} {
		b := &Backoff{}
		b.setCap(tc.cap)
		now := t0
		for i, w := range tc.want {
			w *= time.Millisecond
			if d := b.recordFailure(now); d != w {
				t.Fatalf("cap %v: failure %d cools %v, want %v", tc.cap, i+1, d, w)
			}
			if left := b.remaining(now); left != w {
				t.Fatalf("cap %v: failure %d: remaining %v, want %v", tc.cap, i+1, left, w)
			}
			now = now.Add(w) // the next failure comes when the cooling ended
			if left := b.remaining(now); left > 0 {
				t.Fatalf("cap %v: still cooling %v after the period", tc.cap, left)
			}
		}
		b.recordSuccess(now)
		if b.streak.Load() != 0 || b.remaining(now) > 0 {
			t.Fatalf("cap %v: after success streak %d remaining %v", tc.cap, b.streak.Load(), b.remaining(now))
		}
		if d := b.recordFailure(now); d != time.Second {
			t.Fatalf("cap %v: first failure after a success cools %v, want 1s", tc.cap, d)
		}
	}
}

func TestBackoffSuccessEndsCoolingEarly(t *testing.T) {
	b := &Backoff{}
	b.setCap(time.Minute)
	for i := 0; i < 4; i++ {
		b.recordFailure(t0) // concurrent failures: 1, 2, 4, 8 s from t0
	}
	if left := b.remaining(t0); left != 8*time.Second {
		t.Fatalf("remaining %v, want 8s", left)
	}
	b.recordSuccess(t0.Add(time.Second)) // e.g. a probe
	if left := b.remaining(t0.Add(time.Second)); left > 0 {
		t.Fatalf("a success left %v of cooling", left)
	}
}

func TestRetryAfterHoldSurvivesSuccess(t *testing.T) {
	b := &Backoff{}
	b.setCap(time.Minute)
	b.holdFor(t0, 5*time.Second)
	b.recordFailure(t0)
	if left := b.remaining(t0); left != 5*time.Second {
		t.Fatalf("remaining %v, want the 5s hold", left)
	}
	if b.ProbeDue(t0.Add(2*time.Second), time.Second) {
		t.Error("a probe is due while a Retry-After hold lasts")
	}
	b.recordSuccess(t0.Add(time.Second))
	if left := b.remaining(t0.Add(time.Second)); left != 4*time.Second {
		t.Errorf("after a success during the hold: remaining %v, want 4s", left)
	}
	b.recordSuccess(t0.Add(6 * time.Second))
	if left := b.remaining(t0.Add(6 * time.Second)); left > 0 {
		t.Errorf("after the hold: remaining %v", left)
	}
}

func TestProbeDue(t *testing.T) {
	b := &Backoff{}
	b.setCap(time.Minute)
	if b.ProbeDue(t0, time.Second) {
		t.Fatal("probe due while not cooling")
	}
	for i := 0; i < 3; i++ {
		b.recordFailure(t0) // cooling 4 s
	}
	if b.ProbeDue(t0.Add(999*time.Millisecond), time.Second) {
		t.Error("probe due before a full interval after the failure")
	}
	if !b.ProbeDue(t0.Add(time.Second), time.Second) {
		t.Error("probe not due one interval after the failure")
	}
	if b.ProbeDue(t0.Add(4*time.Second), time.Second) {
		t.Error("probe due after the cooling ended")
	}
}

func TestTryClaimNeverExceedsLimit(t *testing.T) {
	const limit, workers, rounds = 3, 16, 2000
	s := &UpstreamState{id: "state-test-claim"}
	s.limit.Store(limit)
	var inside, peak, claimed atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				n, ok := s.tryClaim()
				if !ok {
					continue
				}
				if n < 1 || n > limit {
					t.Errorf("tryClaim returned slot %d of %d", n, limit)
				}
				cur := inside.Add(1)
				for {
					p := peak.Load()
					if cur <= p || peak.CompareAndSwap(p, cur) {
						break
					}
				}
				claimed.Add(1)
				inside.Add(-1)
				s.release()
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > limit {
		t.Errorf("peak %d holders, limit %d", p, limit)
	}
	if claimed.Load() == 0 {
		t.Error("nothing was ever claimed")
	}
	if n := s.inflight.Load(); n != 0 {
		t.Errorf("inflight %d after every claim was released", n)
	}
}

func TestLimitChangeAppliesToHeldSlots(t *testing.T) {
	s := &UpstreamState{id: "state-test-limit"}
	s.limit.Store(2)
	for i := 0; i < 2; i++ {
		if _, ok := s.tryClaim(); !ok {
			t.Fatalf("claim %d failed", i+1)
		}
	}
	if _, ok := s.tryClaim(); ok {
		t.Fatal("a third claim got through a limit of 2")
	}
	s.limit.Store(1) // lowered below what is held
	s.release()
	if _, ok := s.tryClaim(); ok {
		t.Fatal("claimed with 1 held and a limit of 1")
	}
	s.release()
	if n, ok := s.tryClaim(); !ok || n != 1 {
		t.Fatalf("claim after both released: %d %v", n, ok)
	}
	s.limit.Store(Unlimited)
	for i := 0; i < 100; i++ {
		if _, ok := s.tryClaim(); !ok {
			t.Fatal("unlimited upstream refused a claim")
		}
	}
}

// TestPoolStateOutlivesOneInstance is a reload at the pool level: the new
// config adopts before the old one releases, so a slot claimed under the old
// config is freed in the counter the new one uses.
func TestPoolStateOutlivesOneInstance(t *testing.T) {
	const id = "state-test-pool"
	var oldRefs, newRefs PoolRefs
	oldState, _ := oldRefs.AdoptUpstream(id)
	oldState.limit.Store(1)
	if _, ok := oldState.tryClaim(); !ok {
		t.Fatal("claim failed")
	}
	newState, fresh := newRefs.AdoptUpstream(id)
	if fresh || newState != oldState {
		t.Fatal("the new config got a different state for the same upstream id")
	}
	oldRefs.Release()
	if _, ok := newState.tryClaim(); ok {
		t.Fatal("the new config does not see the old config's slot")
	}
	oldState.release() // the old request ends
	if _, ok := newState.tryClaim(); !ok {
		t.Fatal("the slot freed by the old request is not free in the new config")
	}
	newState.release()
	newRefs.Release()
	if _, ok := upstreamPool.References(id); ok {
		t.Error("the state outlived every config that used it")
	}

	var again PoolRefs
	st, fresh := again.AdoptUpstream(id)
	if !fresh || st == oldState {
		t.Error("a new config after every user went did not get fresh state")
	}
	again.Release()
}

func TestBackoffPoolShared(t *testing.T) {
	var a, b PoolRefs
	key := BackoffKey("provider", "state-test-provider")
	ba := a.AdoptBackoff(key)
	bb := b.AdoptBackoff(key)
	if ba != bb {
		t.Fatal("two configs got different backoff states for one provider")
	}
	ba.setCap(time.Minute)
	ba.recordFailure(time.Now())
	a.Release()
	if bb.remaining(time.Now()) <= 0 {
		t.Error("cooling lost when the old config released the state")
	}
	b.Release()
}

// TestRemovedUpstreamKeepsCountingItsRequests: a config drops an upstream
// while one of its requests runs, and a later config adds the id back. The
// running request still holds its slot in the re-added upstream.
func TestRemovedUpstreamKeepsCountingItsRequests(t *testing.T) {
	const id = "state-test-removed"
	var first PoolRefs
	st, _ := first.AdoptUpstream(id)
	st.limit.Store(1)
	if _, ok := st.tryClaim(); !ok {
		t.Fatal("claim failed")
	}
	first.Release() // reload to a config without the upstream

	var readded PoolRefs
	again, _ := readded.AdoptUpstream(id)
	again.limit.Store(1)
	if _, ok := again.tryClaim(); ok {
		t.Fatal("the re-added upstream forgot the request still running on it")
	}
	st.release() // that request ends
	if _, ok := again.tryClaim(); !ok {
		t.Fatal("the slot did not come free in the re-added upstream")
	}
	again.release()
	readded.Release()

	// Once nothing runs, a re-added id starts fresh.
	var later PoolRefs
	fresh, isFresh := later.AdoptUpstream(id)
	if !isFresh || fresh.inflight.Load() != 0 {
		t.Errorf("fresh %v inflight %d", isFresh, fresh.inflight.Load())
	}
	later.Release()
}
