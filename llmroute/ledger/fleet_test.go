package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/keys"
	"github.com/llm-route/caddy-llm-route/llmroute/redisstate"
)

// testState is a resolved redis state block; nothing listens on its
// address, and nothing here needs it to (the client connects lazily).
func testState(prefix, password string) RedisOptions {
	return RedisOptions{Options: redisstate.Options{Address: "127.0.0.1:1", Prefix: prefix, Password: password,
		Timeout: 20 * time.Millisecond, LeaseTTL: 30 * time.Second}}
}

// closed reports whether f's client has been closed (a call on it fails
// at once with ErrClosed, not with the dial error of the absent server).
func closed(f *fleet) bool {
	return errors.Is(f.store.Ping(context.Background()), redis.ErrClosed)
}

// The fleet's lifetime across reloads: handlers with the same state block
// share one fleet; the last handler's cleanup retires it, and its client
// closes only once the requests that still hold it are done.
func TestFleetPooledByStateBlockClosedAfterItsLastRequest(t *testing.T) {
	logger := zap.NewNop()
	a := acquireFleet(testState("p1:", "s3cret"), logger)
	b := acquireFleet(testState("p1:", "s3cret"), logger) // a reload keeping the block
	other := acquireFleet(testState("p1:", "another"), logger)
	if a != b {
		t.Fatal("two handlers with the same state block got two fleets")
	}
	if other == a {
		t.Fatal("a changed password shares the old fleet")
	}
	if strings.Contains(a.poolKey, "s3cret") {
		t.Fatal("the pool key holds the password")
	}
	a.start(logger, func() {})
	b.start(logger, func() {}) // once only: the second start is a no-op

	if !a.use() { // a request of the old config, still running
		t.Fatal("use on a live fleet failed")
	}
	if _, err := fleets.Delete(a.poolKey); err != nil { // the old config's cleanup
		t.Fatal(err)
	}
	if a.retired.Load() || closed(a) {
		t.Fatal("the fleet retired while the new config still uses it")
	}
	if _, err := fleets.Delete(b.poolKey); err != nil { // the new config's cleanup (a reload onto another block)
		t.Fatal(err)
	}
	if !a.retired.Load() {
		t.Fatal("the fleet is not retired after its last handler's cleanup")
	}
	if closed(a) {
		t.Fatal("the client closed under a request that still holds it")
	}
	if !a.use() {
		t.Fatal("a retired fleet refuses a request of its config while its client is open")
	}
	a.done()
	a.done() // the last request ends
	if !closed(a) {
		t.Fatal("the client is still open after its last request")
	}
	if a.use() {
		t.Fatal("use on a closed fleet succeeded")
	}
	if closed(other) {
		t.Fatal("another state block's fleet was closed too")
	}
	if _, err := fleets.Delete(other.poolKey); err != nil {
		t.Fatal(err)
	}
	if !closed(other) {
		t.Fatal("a fleet never started and never used is not closed by its cleanup")
	}
}

// Room under state redis falls back as Reserve does: while Redis is away,
// or when a call to it fails, it checks this instance's own counts
// (on_state_error local), or refuses (reject); it reserves nothing.
func TestFleetKeysRoomFallsBack(t *testing.T) {
	f := acquireFleet(testState("room:", ""), zap.NewNop())
	defer func() { _, _ = fleets.Delete(f.poolKey) }()
	fk := &fleetKeys{f: f, local: keys.NewMemory()}
	fk.local.Acquire("k")
	now := time.Now()
	b := keys.Budget{TokensPerDay: 100}
	if _, l := fk.local.Reserve("k", now, b, keys.Amount{Tokens: 80}); l != keys.LimitNone {
		t.Fatal(l)
	}
	// healthy: the call fails (nothing listens on the address), then the fallback.
	for _, healthy := range []bool{false, true} {
		for _, tc := range []struct {
			tokens int64
			want   keys.Limit
		}{{30, keys.LimitTokensPerDay}, {20, keys.LimitNone}} {
			f.healthy.Store(healthy)
			if l := fk.Room("k", now, b, keys.Amount{Tokens: tc.tokens}); l != tc.want {
				t.Errorf("healthy=%v: room for %d with 80 of 100 reserved locally: %v, want %v", healthy, tc.tokens, l, tc.want)
			}
		}
	}
	f.healthy.Store(false)
	f.reject = true
	if l := fk.Room("k", now, b, keys.Amount{Tokens: 20}); l != keys.LimitUnavailable {
		t.Errorf("reject, Redis away: %v, want unavailable", l)
	}
	if u := fk.local.Usage("k", now); u.ReservedToken != 80 {
		t.Fatalf("reserved %d after the checks, want the one reservation of 80", u.ReservedToken)
	}
}

// The redis ledger's pin: a waiter's turn takes a use of the fleet and the
// read side of the renewal's lock with its local claim, and gives both back
// when its shared part is finished (or the pin is undone). While a renewal
// holds the write side, Pin defers the turn without blocking and holds
// nothing. Redis is away here (local accounting), so no call is made.
func TestRedisPinDeferredByRenewal(t *testing.T) {
	l := NewRedis(testState("pin:", ""), zap.NewNop(), func() {}).(*redisLedger)
	defer l.Close()
	f := l.f
	u := &Upstream{ID: "pin-u", Provider: "p", Limit: 1, Capacity: Unlimited, State: NewUpstreamState("pin-u", 1)}

	f.mu.Lock() // a renewal reads the counts
	if pinned, ok := l.Pin(); pinned || ok {
		t.Fatalf("pin during a renewal: pinned %v ok %v, want a deferred turn", pinned, ok)
	}
	if n := f.users.Load(); n != 1 {
		t.Fatalf("fleet users = %d after a deferred turn, want 1", n)
	}
	f.mu.Unlock()

	pinned, ok := l.Pin()
	if !pinned || !ok {
		t.Fatalf("pin after the renewal: pinned %v ok %v", pinned, ok)
	}
	if _, ok, _ := u.ClaimLocal(); !ok {
		t.Fatal("local claim under the pin failed")
	}
	if !l.Finish(u) {
		t.Fatal("finish refused with Redis away under on_state_error local")
	}
	if f.mu.TryLock() {
		f.mu.Unlock()
	} else {
		t.Fatal("a finished turn kept the renewal's read lock")
	}
	if n := f.users.Load(); n != 1 {
		t.Fatalf("fleet users = %d after the turn was finished, want 1", n)
	}
	if n := l.Release(u); n != 0 {
		t.Fatalf("in flight %d after the release", n)
	}

	if pinned, _ := l.Pin(); !pinned {
		t.Fatal("second pin failed")
	}
	l.Unpin() // the waiter left
	if !f.mu.TryLock() {
		t.Fatal("an undone pin kept the renewal's read lock")
	}
	f.mu.Unlock()
	if n := f.users.Load(); n != 1 {
		t.Fatalf("fleet users = %d after an undone pin, want 1", n)
	}
}
