package keys

import (
	"sync"
	"sync/atomic"
	"time"
)

// Memory is the embedded Store: one account per key id in this process,
// each behind its own mutex (an operation on a key is one critical
// section, which is the atomicity Store promises). Accounts are reference
// counted by the configs that name the id (Acquire/Release), so a reload
// that keeps an id keeps its counters, and an id no config names any more
// is forgotten once the last of them is cleaned up.
type Memory struct {
	accounts sync.Map // id → *account

	mu   sync.Mutex
	refs map[string]int

	// changes counts the settlements that added use, so that a saver of
	// the usage (Snapshot) can tell whether there is anything new.
	changes atomic.Uint64
}

// NewMemory returns an empty store.
func NewMemory() *Memory { return &Memory{refs: make(map[string]int)} }

type account struct {
	mu sync.Mutex

	tat int64 // GCRA theoretical arrival time, unix nanos

	day, month int64 // the periods the counters below are of
	// used: settled; res: reserved by running requests.
	usedTokens, resTokens int64 // today
	usedDay, resDay       NanoUSD
	usedMonth, resMonth   NanoUSD
}

// Acquire marks id as used by one more config and creates its account on
// first use, which it reports: only a new account may be given a saved
// usage (Restore), one a running config uses counts on.
func (m *Memory) Acquire(id string) (created bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refs[id] == 0 {
		m.accounts.LoadOrStore(id, new(account))
		created = true
	}
	m.refs[id]++
	return created
}

// Release marks id as no longer used by one config; the account is dropped
// when no config uses it. Requests still holding reservations on it settle
// into nothing, harmlessly.
func (m *Memory) Release(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch n := m.refs[id]; {
	case n <= 0:
		return
	case n == 1:
		delete(m.refs, id)
		m.accounts.Delete(id)
	default:
		m.refs[id] = n - 1
	}
}

// lookup returns the account of id, or nil when no config names it.
func (m *Memory) lookup(id string) *account {
	if a, ok := m.accounts.Load(id); ok {
		return a.(*account)
	}
	return nil
}

// roll moves the counters to the periods of now, dropping those of a past
// day or month (reservations included: a request reserved yesterday is
// settled into today's counters, see Settle).
func (a *account) roll(now time.Time) {
	if d := Day(now); d > a.day {
		a.day, a.usedTokens, a.resTokens, a.usedDay, a.resDay = d, 0, 0, 0, 0
	}
	if mo := Month(now); mo > a.month {
		a.month, a.usedMonth, a.resMonth = mo, 0, 0
	}
}

// Allow implements Store.
func (m *Memory) Allow(id string, now time.Time, r Rate) (bool, time.Duration) {
	if r.PerMinute <= 0 {
		return true, 0
	}
	a := m.lookup(id)
	if a == nil {
		return true, 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	tat, ok, wait := gcra(a.tat, now.UnixNano(), r)
	a.tat = tat
	return ok, wait
}

// Reserve implements Store.
func (m *Memory) Reserve(id string, now time.Time, b Budget, amt Amount) (Hold, Limit) {
	a := m.lookup(id)
	if a == nil || b.Empty() {
		return Hold{}, LimitNone
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.roll(now)
	if l := a.crossed(b, amt); l != LimitNone {
		return Hold{}, l
	}
	a.resTokens += amt.Tokens
	a.resDay += amt.Spend
	a.resMonth += amt.Spend
	return Hold{ID: id, Day: a.day, Month: a.month, Reserved: amt}, LimitNone
}

// Room implements Store.
func (m *Memory) Room(id string, now time.Time, b Budget, amt Amount) Limit {
	a := m.lookup(id)
	if a == nil || b.Empty() {
		return LimitNone
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.roll(now)
	return a.crossed(b, amt)
}

// crossed names the first limit of b that adding amt to the account's use
// and reservations would cross (a.mu held, periods rolled).
func (a *account) crossed(b Budget, amt Amount) Limit {
	switch {
	case over(b.TokensPerDay, a.usedTokens+a.resTokens, amt.Tokens):
		return LimitTokensPerDay
	case over(b.SpendPerDay, a.usedDay+a.resDay, amt.Spend):
		return LimitSpendPerDay
	case over(b.SpendPerMonth, a.usedMonth+a.resMonth, amt.Spend):
		return LimitSpendPerMonth
	}
	return LimitNone
}

// over reports whether adding more to have crosses limit (0 = no limit). A
// budget already used up refuses even a request that adds nothing.
func over(limit, have, more int64) bool {
	if limit <= 0 {
		return false
	}
	return have+more > limit || have >= limit
}

// Settle implements Store.
func (m *Memory) Settle(h Hold, actual Amount, now time.Time) {
	if h.ID == "" {
		return
	}
	a := m.lookup(h.ID)
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.roll(now)
	if h.Day == a.day {
		a.resTokens -= h.Reserved.Tokens
		a.resDay -= h.Reserved.Spend
	}
	if h.Month == a.month {
		a.resMonth -= h.Reserved.Spend
	}
	if actual != (Amount{}) {
		m.changes.Add(1)
	}
	a.add(actual)
}

// Record implements Store.
func (m *Memory) Record(id string, actual Amount, now time.Time) {
	if actual == (Amount{}) {
		return
	}
	a := m.lookup(id)
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.roll(now)
	a.add(actual)
	m.changes.Add(1)
}

// add counts actual as used (a.mu held, periods rolled).
func (a *account) add(actual Amount) {
	a.usedTokens += actual.Tokens
	a.usedDay += actual.Spend
	a.usedMonth += actual.Spend
}

// Usage implements Store.
func (m *Memory) Usage(id string, now time.Time) Usage {
	a := m.lookup(id)
	if a == nil {
		return Usage{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.roll(now)
	return Usage{TokensToday: a.usedTokens, SpendToday: a.usedDay, SpendMonth: a.usedMonth,
		ReservedToken: a.resTokens, ReservedSpend: a.resDay}
}

// Saved is a key's settled use as it is kept across restarts: the UTC
// day and month it was counted in (as Day and Month give them) and the
// amounts. Reservations are not kept: the requests that held them are gone.
type Saved struct {
	Day, Month  int64
	TokensToday int64
	SpendToday  NanoUSD
	SpendMonth  NanoUSD
}

// Snapshot returns the settled use of every account that has some in the
// periods of now, and the count of settlements so far (Changes).
func (m *Memory) Snapshot(now time.Time) (map[string]Saved, uint64) {
	n := m.changes.Load() // before the reads: a later change is saved next time
	out := make(map[string]Saved)
	m.accounts.Range(func(k, v any) bool {
		a := v.(*account)
		a.mu.Lock()
		a.roll(now)
		s := Saved{Day: a.day, Month: a.month, TokensToday: a.usedTokens, SpendToday: a.usedDay, SpendMonth: a.usedMonth}
		a.mu.Unlock()
		if s.TokensToday != 0 || s.SpendToday != 0 || s.SpendMonth != 0 {
			out[k.(string)] = s
		}
		return true
	})
	return out, n
}

// Changes counts the settlements that added use so far.
func (m *Memory) Changes() uint64 { return m.changes.Load() }

// Restore gives the account of id the use s it had before a restart, as
// far as s is of the periods of now: a past day's use does not come back
// as today's (nor a past month's as this month's). It replaces what the
// account has used; call it only for an account Acquire has just created.
func (m *Memory) Restore(id string, s Saved, now time.Time) {
	a := m.lookup(id)
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.roll(now)
	if s.Day == a.day {
		a.usedTokens, a.usedDay = s.TokensToday, s.SpendToday
	}
	if s.Month == a.month {
		a.usedMonth = s.SpendMonth
	}
}

var _ Store = (*Memory)(nil)
