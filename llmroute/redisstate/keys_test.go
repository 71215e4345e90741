package redisstate

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/keys"
)

// 200 concurrent reservations, over two instances' handles, against a
// budget sized for 10: exactly 10 hold, and settling them leaves the used
// amount and no reservation.
func TestKeyReserveConcurrentExactlyTheBudget(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	a, b := open(addr, "a", time.Second), open(addr, "b", time.Second)
	defer a.Close()
	defer b.Close()
	now := time.Now()
	budget := keys.Budget{TokensPerDay: 1000, SpendPerDay: keys.USD(1), SpendPerMonth: keys.USD(5)}
	each := keys.Amount{Tokens: 100, Spend: keys.USD(0.05)}

	var held atomic.Int64
	var mu sync.Mutex
	var holds []keys.Hold
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			h, limit, err := s.KeyReserve(ctx, "k", now, budget, each)
			if err != nil {
				t.Error(err)
				return
			}
			switch limit {
			case keys.LimitNone:
				held.Add(1)
				mu.Lock()
				holds = append(holds, h)
				mu.Unlock()
			case keys.LimitTokensPerDay:
			default:
				t.Errorf("limit %v, want tokens_per_day (the first crossed)", limit)
			}
		}()
	}
	wg.Wait()
	if n := held.Load(); n != 10 {
		t.Fatalf("%d reservations held, want exactly 10", n)
	}
	u, err := a.KeyUsage(ctx, "k", now)
	if err != nil || u.ReservedToken != 1000 || u.ReservedSpend != keys.USD(0.5) || u.TokensToday != 0 {
		t.Fatalf("usage = %+v, %v; want 1000 tokens and $0.50 reserved", u, err)
	}
	for _, h := range holds {
		if !h.Shared || h.Day != keys.Day(now) || h.Month != keys.Month(now) {
			t.Fatalf("hold %+v: want shared, in the periods of now", h)
		}
		if err := b.KeySettle(ctx, h, keys.Amount{Tokens: 40, Spend: keys.USD(0.01)}, now); err != nil {
			t.Fatal(err)
		}
	}
	u, err = b.KeyUsage(ctx, "k", now)
	want := keys.Usage{TokensToday: 400, SpendToday: keys.USD(0.1), SpendMonth: keys.USD(0.1)}
	if err != nil || u != want {
		t.Fatalf("usage after settling = %+v, %v; want %+v", u, err, want)
	}
	// A spend limit is checked as well, and a zero amount on a spent budget is refused.
	if _, limit, _ := a.KeyReserve(ctx, "k2", now, keys.Budget{SpendPerDay: 10}, keys.Amount{Spend: 11}); limit != keys.LimitSpendPerDay {
		t.Fatalf("over spend_per_day: %v", limit)
	}
	h, _, _ := a.KeyReserve(ctx, "k2", now, keys.Budget{SpendPerMonth: 10}, keys.Amount{Spend: 10})
	if err := a.KeySettle(ctx, h, keys.Amount{Spend: 10}, now); err != nil {
		t.Fatal(err)
	}
	if _, limit, _ := a.KeyReserve(ctx, "k2", now, keys.Budget{SpendPerMonth: 10}, keys.Amount{}); limit != keys.LimitSpendPerMonth {
		t.Fatalf("zero amount on a used-up month: %v, want spend_per_month", limit)
	}
}

// The period hashes expire by themselves; a hold of yesterday settles into
// today without touching today's reservations.
func TestKeyPeriodsExpireAndRoll(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	s := open(addr, "a", time.Second)
	defer s.Close()
	yesterday := time.Date(2026, 3, 31, 23, 59, 0, 0, time.UTC)
	today := yesterday.Add(2 * time.Minute) // another day and another month
	h, limit, err := s.KeyReserve(ctx, "k", yesterday, keys.Budget{TokensPerDay: 100}, keys.Amount{Tokens: 60})
	if err != nil || limit != keys.LimitNone {
		t.Fatal(limit, err)
	}
	if _, limit, _ := s.KeyReserve(ctx, "k", today, keys.Budget{TokensPerDay: 100}, keys.Amount{Tokens: 60}); limit != keys.LimitNone {
		t.Fatalf("today's budget is fresh, got %v", limit)
	}
	if err := s.KeySettle(ctx, h, keys.Amount{Tokens: 5}, today); err != nil {
		t.Fatal(err)
	}
	u, _ := s.KeyUsage(ctx, "k", today)
	if u.TokensToday != 5 || u.ReservedToken != 60 {
		t.Fatalf("today = %+v, want 5 used and today's 60 still reserved", u)
	}
	c := s.c
	for _, k := range s.keyPeriods("k", keys.Day(today), keys.Month(today)) {
		ttl, err := c.TTL(ctx, k).Result()
		if err != nil || ttl <= 0 || ttl > 32*24*time.Hour {
			t.Fatalf("%s ttl = %v, %v; want a bounded expiry", k, ttl, err)
		}
	}
}

// GCRA on the server's clock, shared by two handles: a burst of 5, then
// refused with the wait until the next emission.
func TestKeyAllowSharedBurst(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	a, b := open(addr, "a", time.Second), open(addr, "b", time.Second)
	defer a.Close()
	defer b.Close()
	r := keys.Rate{PerMinute: 1, Burst: 5}
	for i := range 5 {
		s := a
		if i%2 == 1 {
			s = b
		}
		if ok, _, err := s.KeyAllow(ctx, "k", r); !ok || err != nil {
			t.Fatalf("request %d of the burst refused: %v", i+1, err)
		}
	}
	ok, wait, err := b.KeyAllow(ctx, "k", r)
	if ok || err != nil || wait < 50*time.Second || wait > time.Minute {
		t.Fatalf("6th: ok=%v wait=%v err=%v; want refused for about a minute", ok, wait, err)
	}
	if ok, _, _ := a.KeyAllow(ctx, "other", r); !ok {
		t.Fatal("another key is not limited by this one")
	}
	ttl, err := a.c.PTTL(ctx, a.keyRate("k")).Result()
	if err != nil || ttl <= 0 || ttl > 6*time.Minute {
		t.Fatalf("rate key ttl = %v, %v; want it to expire by itself", ttl, err)
	}
}

// A reservation is a lease: one never settled (its instance died, its
// settlement was lost) leaves the budget within lease_ttl, while one whose
// Store renews it stays; a late settlement of the lapsed one adds its use
// without taking the reservation off a second time.
func TestKeyReservationLeaseLapsesUnlessRenewed(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	const ttl = 400 * time.Millisecond
	dead, live := open(addr, "dead", ttl), open(addr, "live", ttl)
	defer dead.Close()
	defer live.Close()
	now := time.Now()
	budget := keys.Budget{TokensPerDay: 1000, SpendPerDay: keys.USD(1)}
	lost, limit, err := dead.KeyReserve(ctx, "k", now, budget, keys.Amount{Tokens: 600, Spend: keys.USD(0.5)})
	if err != nil || limit != keys.LimitNone || lost.Lease == "" {
		t.Fatalf("first reservation: %+v %v %v", lost, limit, err)
	}
	kept, limit, err := live.KeyReserve(ctx, "k", now, budget, keys.Amount{Tokens: 300, Spend: keys.USD(0.25)})
	if err != nil || limit != keys.LimitNone {
		t.Fatalf("second reservation: %v %v", limit, err)
	}
	if _, limit, _ := live.KeyReserve(ctx, "k", now, budget, keys.Amount{Tokens: 600}); limit != keys.LimitTokensPerDay {
		t.Fatalf("while both are held, 600 more tokens: %v, want tokens_per_day", limit)
	}
	if dead.KeyLeases() != 1 || live.KeyLeases() != 1 {
		t.Fatalf("leases held: dead %d, live %d; want 1 each", dead.KeyLeases(), live.KeyLeases())
	}

	// Only live renews (dead stands for an instance that is gone). Poll
	// past three lease lifetimes, renewing every third of one.
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		if err := live.RenewKeyLeases(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(ttl / 3)
	}
	u, err := live.KeyUsage(ctx, "k", now)
	if err != nil || u.ReservedToken != 300 || u.ReservedSpend != keys.USD(0.25) {
		t.Fatalf("after the lapse: %+v %v; want only the renewed 300 tokens / $0.25 reserved", u, err)
	}
	if _, limit, _ := live.KeyReserve(ctx, "k", now, budget, keys.Amount{Tokens: 600}); limit != keys.LimitNone {
		t.Fatalf("600 tokens once the lost reservation lapsed: %v, want reserved", limit)
	}

	// The lapsed hold settles late: its use counts, its reservation is not
	// taken off again (that would go negative).
	if err := dead.KeySettle(ctx, lost, keys.Amount{Tokens: 50, Spend: keys.USD(0.01)}, now); err != nil {
		t.Fatal(err)
	}
	if err := live.KeySettle(ctx, kept, keys.Amount{Tokens: 20}, now); err != nil {
		t.Fatal(err)
	}
	u, err = live.KeyUsage(ctx, "k", now)
	if err != nil || u.TokensToday != 70 || u.SpendToday != keys.USD(0.01) || u.ReservedToken != 600 || u.ReservedSpend != 0 {
		t.Fatalf("after settling: %+v %v; want 70 tokens / $0.01 used and the last 600 tokens reserved", u, err)
	}
	if dead.KeyLeases() != 0 || live.KeyLeases() != 1 {
		t.Fatalf("leases held after settling: dead %d, live %d; want 0 and 1", dead.KeyLeases(), live.KeyLeases())
	}
	holds := live.keyAccounts("k", keys.Day(now), keys.Month(now))[2]
	if n, err := live.c.ZCard(ctx, holds).Result(); err != nil || n != 1 {
		t.Fatalf("holds set has %d members (%v), want the one unsettled", n, err)
	}
	if ttl, err := live.c.TTL(ctx, holds).Result(); err != nil || ttl <= 0 || ttl > 3*24*time.Hour {
		t.Fatalf("holds set ttl = %v, %v; want a bounded expiry", ttl, err)
	}
}

// KeyRoom answers what KeyReserve would, across instances, and holds
// nothing: checks running alongside a reservation of the whole budget
// never make it fail.
func TestKeyRoomChecksWithoutReserving(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	a, b := open(addr, "a", time.Minute), open(addr, "b", time.Minute)
	defer a.Close()
	defer b.Close()
	now := time.Now()
	budget := keys.Budget{TokensPerDay: 100}
	whole := keys.Amount{Tokens: 100}

	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l, err := b.KeyRoom(ctx, "k", now, budget, whole); err != nil || (l != keys.LimitNone && l != keys.LimitTokensPerDay) {
				t.Errorf("room: %v %v", l, err)
			}
		}()
	}
	h, l, err := a.KeyReserve(ctx, "k", now, budget, whole)
	wg.Wait()
	if err != nil || l != keys.LimitNone {
		t.Fatalf("reserving the whole budget beside 50 checks: %v %v", l, err)
	}
	if l, err := b.KeyRoom(ctx, "k", now, budget, keys.Amount{Tokens: 1}); err != nil || l != keys.LimitTokensPerDay {
		t.Fatalf("room for 1 more on the other instance: %v %v, want tokens_per_day", l, err)
	}
	if err := a.KeySettle(ctx, h, keys.Amount{Tokens: 30}, now); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tokens int64
		want   keys.Limit
	}{{70, keys.LimitNone}, {71, keys.LimitTokensPerDay}} {
		if l, err := b.KeyRoom(ctx, "k", now, budget, keys.Amount{Tokens: tc.tokens}); err != nil || l != tc.want {
			t.Errorf("room for %d after 30 used: %v %v, want %v", tc.tokens, l, err, tc.want)
		}
	}
	if u, err := a.KeyUsage(ctx, "k", now); err != nil || u.TokensToday != 30 || u.ReservedToken != 0 {
		t.Fatalf("usage after the checks %+v %v: want 30 used, nothing reserved", u, err)
	}
	if n := b.KeyLeases(); n != 0 {
		t.Fatalf("the checking instance holds %d leases", n)
	}
}

// A settlement is applied once per reservation: one sent again because its
// reply was lost (Redis applied it, the caller timed out) is a no-op, and
// so is a third send; another reservation of the same amounts still
// counts, and so does a late settlement of a lapsed lease.
func TestKeySettleTwiceChargesOnce(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	s := open(addr, "a", time.Minute)
	defer s.Close()
	now := time.Now()
	budget := keys.Budget{TokensPerDay: 1000, SpendPerDay: keys.USD(1), SpendPerMonth: keys.USD(5)}
	each := keys.Amount{Tokens: 100, Spend: keys.USD(0.05)}
	used := keys.Amount{Tokens: 40, Spend: keys.USD(0.01)}

	h, limit, err := s.KeyReserve(ctx, "k", now, budget, each)
	if err != nil || limit != keys.LimitNone {
		t.Fatal(limit, err)
	}
	for range 3 {
		if err := s.KeySettle(ctx, h, used, now); err != nil {
			t.Fatal(err)
		}
	}
	u, err := s.KeyUsage(ctx, "k", now)
	want := keys.Usage{TokensToday: 40, SpendToday: keys.USD(0.01), SpendMonth: keys.USD(0.01)}
	if err != nil || u != want {
		t.Fatalf("after settling one reservation three times: %+v, %v; want it charged once: %+v", u, err, want)
	}

	h2, limit, err := s.KeyReserve(ctx, "k", now, budget, each)
	if err != nil || limit != keys.LimitNone {
		t.Fatal(limit, err)
	}
	if err := s.KeySettle(ctx, h2, used, now); err != nil {
		t.Fatal(err)
	}
	if u, _ := s.KeyUsage(ctx, "k", now); u.TokensToday != 80 || u.ReservedToken != 0 {
		t.Fatalf("a second reservation of the same amounts: %+v, want 80 tokens used, none reserved", u)
	}
}

// A real lost reply: Redis is busy (a long script on another connection)
// when the settlement is sent, the caller's timeout passes, and Redis
// applies the settlement afterwards, answering nobody. The caller sees an
// error and sends it again, as fleetKeys does with each renewal: the
// reservation is charged once.
func TestKeySettleReplyLostThenResent(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	s := Open(Options{Address: addr, Prefix: "x:", Timeout: 200 * time.Millisecond, LeaseTTL: time.Minute}, "a")
	defer s.Close()
	now := time.Now()
	h, limit, err := s.KeyReserve(ctx, "k", now, keys.Budget{TokensPerDay: 1000}, keys.Amount{Tokens: 100})
	if err != nil || limit != keys.LimitNone {
		t.Fatal(limit, err)
	}
	// Load the settle script first: a script Redis does not know yet is
	// refused (NOSCRIPT) rather than applied late.
	warm, _, _ := s.KeyReserve(ctx, "warm", now, keys.Budget{TokensPerDay: 1000}, keys.Amount{Tokens: 1})
	if err := s.KeySettle(ctx, warm, keys.Amount{}, now); err != nil {
		t.Fatal(err)
	}
	busy := open(addr, "busy", time.Minute)
	defer busy.Close()
	started := make(chan struct{})
	go func() {
		close(started)
		// Keeps Redis from reading anything else for 1 s.
		_ = busy.c.Eval(ctx, `local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + 1000000
repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop
return 1`, nil).Err()
	}()
	<-started
	time.Sleep(100 * time.Millisecond) // the script is running
	if err := s.KeySettle(ctx, h, keys.Amount{Tokens: 40}, now); err == nil {
		t.Fatal("the settlement was answered while Redis was busy; the test lost its premise")
	}
	var u keys.Usage
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if u, err = s.KeyUsage(ctx, "k", now); err == nil && u.TokensToday != 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if u.TokensToday != 40 || u.ReservedToken != 0 {
		t.Fatalf("after the busy spell: %+v, want the unanswered settlement applied (40 used, nothing reserved)", u)
	}
	if err := s.KeySettle(ctx, h, keys.Amount{Tokens: 40}, now); err != nil {
		t.Fatal(err)
	}
	if u, err := s.KeyUsage(ctx, "k", now); err != nil || u.TokensToday != 40 {
		t.Fatalf("after sending the settlement again: %+v, %v; want 40 tokens used (charged once)", u, err)
	}
}
