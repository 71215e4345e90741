package keys

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestGCRABurstThenRate(t *testing.T) {
	m := NewMemory()
	m.Acquire("k")
	r := Rate{PerMinute: 60, Burst: 3} // one a second, three at once
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for i := 0; i < 3; i++ {
		if ok, _ := m.Allow("k", now, r); !ok {
			t.Fatalf("burst request %d refused", i)
		}
	}
	ok, wait := m.Allow("k", now, r)
	if ok || wait != time.Second {
		t.Fatalf("4th at once: ok=%v wait=%v, want refused for 1s", ok, wait)
	}
	// A refusal does not push the schedule: after 1 s exactly one more.
	now = now.Add(time.Second)
	if ok, _ := m.Allow("k", now, r); !ok {
		t.Fatal("refused after the interval")
	}
	if ok, _ := m.Allow("k", now, r); ok {
		t.Fatal("two admitted after one interval")
	}
	// Idle time earns back the burst, never more.
	now = now.Add(time.Hour)
	n := 0
	for i := 0; i < 10; i++ {
		if ok, _ := m.Allow("k", now, r); ok {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("after an idle hour %d admitted at once, want the burst 3", n)
	}
}

func TestGCRADefaultBurstIsOne(t *testing.T) {
	m := NewMemory()
	m.Acquire("k")
	now := time.Unix(1000, 0)
	r := Rate{PerMinute: 6}
	if ok, _ := m.Allow("k", now, r); !ok {
		t.Fatal("first refused")
	}
	if ok, wait := m.Allow("k", now, r); ok || wait != 10*time.Second {
		t.Fatalf("second: ok=%v wait=%v, want refused 10s", ok, wait)
	}
}

func TestReserveConcurrentNeverOvershoots(t *testing.T) {
	m := NewMemory()
	m.Acquire("k")
	b := Budget{SpendPerDay: 10 * 1000, TokensPerDay: 1 << 40}
	now := time.Now()
	var ok atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, l := m.Reserve("k", now, b, Amount{Tokens: 1, Spend: 1000}); l == LimitNone {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 10 {
		t.Fatalf("%d reservations admitted, want 10", ok.Load())
	}
	u := m.Usage("k", now)
	if u.ReservedSpend != 10*1000 {
		t.Fatalf("reserved %d", u.ReservedSpend)
	}
}

func TestSettleReleasesAndCharges(t *testing.T) {
	m := NewMemory()
	m.Acquire("k")
	b := Budget{TokensPerDay: 100}
	now := time.Date(2026, 3, 31, 23, 0, 0, 0, time.UTC)
	h, l := m.Reserve("k", now, b, Amount{Tokens: 80})
	if l != LimitNone {
		t.Fatal(l)
	}
	if _, l := m.Reserve("k", now, b, Amount{Tokens: 30}); l != LimitTokensPerDay {
		t.Fatalf("second reservation: %v, want tokens_per_day", l)
	}
	m.Settle(h, Amount{Tokens: 20}, now)
	if u := m.Usage("k", now); u.TokensToday != 20 || u.ReservedToken != 0 {
		t.Fatalf("after settle %+v", u)
	}
	if _, l := m.Reserve("k", now, b, Amount{Tokens: 80}); l != LimitNone {
		t.Fatalf("room freed by the settlement refused: %v", l)
	}
	// A new UTC day starts from zero; a new month resets the month.
	next := now.Add(2 * time.Hour)
	if u := m.Usage("k", next); u.TokensToday != 0 || u.ReservedToken != 0 {
		t.Fatalf("next day %+v", u)
	}
	if UntilReset(LimitSpendPerDay, now) != time.Hour {
		t.Fatalf("day reset in %v", UntilReset(LimitSpendPerDay, now))
	}
	if UntilReset(LimitSpendPerMonth, now) != time.Hour {
		t.Fatalf("month reset in %v", UntilReset(LimitSpendPerMonth, now))
	}
}

func TestExhaustedBudgetRefusesZero(t *testing.T) {
	m := NewMemory()
	m.Acquire("k")
	b := Budget{SpendPerMonth: 5}
	now := time.Now()
	h, _ := m.Reserve("k", now, b, Amount{Spend: 5})
	m.Settle(h, Amount{Spend: 5}, now)
	if _, l := m.Reserve("k", now, b, Amount{}); l != LimitSpendPerMonth {
		t.Fatalf("used-up budget: %v", l)
	}
}

func TestReleaseDropsAccount(t *testing.T) {
	m := NewMemory()
	m.Acquire("k")
	m.Acquire("k") // a second config during a reload
	now := time.Now()
	h, _ := m.Reserve("k", now, Budget{TokensPerDay: 10}, Amount{Tokens: 4})
	m.Settle(h, Amount{Tokens: 4}, now)
	m.Release("k")
	if u := m.Usage("k", now); u.TokensToday != 4 {
		t.Fatalf("counters lost while a config still names the key: %+v", u)
	}
	m.Release("k")
	if u := m.Usage("k", now); u.TokensToday != 0 {
		t.Fatalf("account kept after the last release: %+v", u)
	}
	m.Release("k") // extra releases are harmless
}

func BenchmarkAllowReserveSettle(b *testing.B) {
	m := NewMemory()
	m.Acquire("k")
	r := Rate{PerMinute: 1 << 40, Burst: 1 << 20}
	bud := Budget{SpendPerDay: 1 << 60}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		m.Allow("k", now, r)
		h, _ := m.Reserve("k", now, bud, Amount{Tokens: 10, Spend: 10})
		m.Settle(h, Amount{Tokens: 5, Spend: 5}, now)
	}
}

// Room answers what Reserve would, and reserves nothing.
func TestRoomChecksWithoutReserving(t *testing.T) {
	m := NewMemory()
	m.Acquire("k")
	b := Budget{TokensPerDay: 100, SpendPerDay: 50}
	now := time.Date(2026, 3, 31, 12, 0, 0, 0, time.UTC)
	for range 3 { // each would fit alone: nothing is held between them
		if l := m.Room("k", now, b, Amount{Tokens: 80}); l != LimitNone {
			t.Fatalf("room for 80 of 100: %v", l)
		}
	}
	if u := m.Usage("k", now); u.ReservedToken != 0 || u.ReservedSpend != 0 {
		t.Fatalf("Room reserved: %+v", u)
	}
	if _, l := m.Reserve("k", now, b, Amount{Tokens: 80, Spend: 10}); l != LimitNone {
		t.Fatal(l)
	}
	for _, tc := range []struct {
		a    Amount
		want Limit
	}{
		{Amount{Tokens: 30}, LimitTokensPerDay},
		{Amount{Tokens: 20}, LimitNone},
		{Amount{Spend: 41}, LimitSpendPerDay},
		{Amount{Spend: 40}, LimitNone},
	} {
		if l := m.Room("k", now, b, tc.a); l != tc.want {
			t.Errorf("room for %+v after 80 tokens and 10 spend reserved: %v, want %v", tc.a, l, tc.want)
		}
		if _, l := m.Reserve("k", now, b, tc.a); l != tc.want {
			t.Fatalf("Reserve disagrees with Room for %+v: %v", tc.a, l)
		} else if l == LimitNone {
			m.Settle(Hold{ID: "k", Day: Day(now), Month: Month(now), Reserved: tc.a}, Amount{}, now)
		}
	}
	if u := m.Usage("k", now); u.ReservedToken != 80 || u.ReservedSpend != 10 {
		t.Fatalf("after the checks %+v, want the one reservation", u)
	}
}

// A snapshot holds the settled use (not the reservations) in the current
// periods; restored into a new account it counts on, but only for the
// periods that are still current: on the next day the month's spend comes
// back and the day's does not, in the next month neither does.
func TestSnapshotRestoreCurrentPeriodsOnly(t *testing.T) {
	m := NewMemory()
	m.Acquire("k")
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	h, _ := m.Reserve("k", now, Budget{TokensPerDay: 1000}, Amount{Tokens: 500, Spend: 50})
	m.Settle(h, Amount{Tokens: 100, Spend: 10}, now)
	m.Record("k", Amount{Tokens: 20, Spend: 2}, now)
	if _, l := m.Reserve("k", now, Budget{TokensPerDay: 1000}, Amount{Tokens: 300}); l != LimitNone {
		t.Fatal(l)
	}
	snap, n := m.Snapshot(now)
	want := Saved{Day: Day(now), Month: Month(now), TokensToday: 120, SpendToday: 12, SpendMonth: 12}
	if len(snap) != 1 || snap["k"] != want || n != 2 || m.Changes() != 2 {
		t.Fatalf("snapshot %+v after %d changes, want {k: %+v} after 2", snap, n, want)
	}
	for _, tc := range []struct {
		at   time.Time
		want Usage
	}{
		{now.Add(time.Hour), Usage{TokensToday: 120, SpendToday: 12, SpendMonth: 12}}, // the same day
		{now.Add(24 * time.Hour), Usage{SpendMonth: 12}},                              // the next day: the month's spend only
		{time.Date(2026, 4, 1, 0, 0, 1, 0, time.UTC), Usage{}},                        // the next month: nothing
		{time.Date(2027, 3, 10, 12, 0, 0, 0, time.UTC), Usage{}},                      // the same date a year later
	} {
		r := NewMemory()
		if !r.Acquire("k") {
			t.Fatal("a new account was not reported created")
		}
		r.Restore("k", snap["k"], tc.at)
		if u := r.Usage("k", tc.at); u != tc.want {
			t.Errorf("restored at %v: %+v, want %+v", tc.at, u, tc.want)
		}
		if r.Acquire("k") {
			t.Fatal("a second Acquire reported the account created")
		}
	}
}
