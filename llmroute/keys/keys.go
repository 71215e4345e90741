// Package keys holds the accounting behind client keys: a GCRA
// request rate per key, and token and spend budgets over UTC days and
// months that concurrency cannot overshoot, because every request reserves
// its worst case before it is sent and settles to what it really used
// afterwards.
//
// The request path sees only Store. Memory is the embedded implementation;
// a shared backend (Redis) implements the same methods, each
// as one atomic server-side step, and plugs in without touching the
// request path. Amounts are integers (tokens, nano-USD) so that a backend
// can add and compare them atomically without floating point.
package keys

import "time"

// NanoUSD is an amount of money in billionths of a US dollar. Prices are
// per million tokens, so a token at $p/M costs p·1000 nano-USD: an integer
// for every price with at most three decimals below a micro-dollar.
type NanoUSD = int64

// USD converts dollars to NanoUSD, rounding to the nearest.
func USD(d float64) NanoUSD {
	if d >= 0 {
		return NanoUSD(d*1e9 + 0.5)
	}
	return NanoUSD(d*1e9 - 0.5)
}

// Rate is a GCRA request rate: PerMinute requests a minute on average,
// Burst of them at once. PerMinute 0 means no rate limit.
type Rate struct {
	PerMinute int64
	Burst     int64 // at least 1; 0 is taken as 1
}

// Budget is what a key may use per period; a zero field is no limit.
type Budget struct {
	TokensPerDay  int64
	SpendPerDay   NanoUSD
	SpendPerMonth NanoUSD
}

// Empty reports a budget without any limit.
func (b Budget) Empty() bool { return b == Budget{} }

// Amount is a quantity charged to a key: tokens and money.
type Amount struct {
	Tokens int64
	Spend  NanoUSD
}

// Limit names the budget a reservation would cross.
type Limit uint8

const (
	LimitNone Limit = iota
	LimitTokensPerDay
	LimitSpendPerDay
	LimitSpendPerMonth
	// LimitUnavailable: the shared backend did not answer and its fallback
	// is to refuse (on_state_error reject).
	LimitUnavailable
)

func (l Limit) String() string {
	switch l {
	case LimitTokensPerDay:
		return "tokens_per_day"
	case LimitSpendPerDay:
		return "spend_per_day"
	case LimitSpendPerMonth:
		return "spend_per_month"
	case LimitUnavailable:
		return "unavailable"
	}
	return "none"
}

// Hold is one reservation: what was reserved, for which key and in which
// periods, so that Settle finds it again even across a reload or a period
// boundary. The zero Hold reserves nothing; settling it is a no-op.
type Hold struct {
	ID       string
	Day      int64 // the UTC day (days since the epoch) it was reserved in
	Month    int64 // the UTC month (year*12 + month-1)
	Reserved Amount
	// Shared: reserved in the shared backend (Redis), so settled there too,
	// not in a fallback that never saw it.
	Shared bool
	// Lease names a shared reservation in its backend, where it lapses
	// unless renewed: one whose settlement is lost does not stay reserved.
	Lease string
}

// Usage is a key's accounting in the current periods: what was settled
// (Used) and what running requests hold (Reserved).
type Usage struct {
	TokensToday   int64
	SpendToday    NanoUSD
	SpendMonth    NanoUSD
	ReservedToken int64
	ReservedSpend NanoUSD
}

// Store is the state behind client keys. Every method is one atomic step
// on the key's state: a concurrent caller sees it either before or after,
// never half-way, so that N parallel Reserve calls against a budget sized
// for k admit at most k, whatever the interleaving. Implementations must be
// safe for concurrent use and must not block for long (a shared backend
// bounds each call and answers from its fallback).
//
// Keys are addressed by their id (never by the secret). State of an id
// outlives configs: a reload that keeps an id keeps its counters, whatever
// its new limits; limits are passed with each call, not stored.
type Store interface {
	// Allow is the GCRA check of one request at now: it either admits it
	// (and records its arrival) or leaves the state as it was and says how
	// long until a request would be admitted.
	Allow(id string, now time.Time, r Rate) (ok bool, retryAfter time.Duration)

	// Reserve adds a to the key's reservations in the periods of now if
	// used + reserved + a stays within every limit of b; otherwise it
	// changes nothing and names the first limit crossed. A zero a with an
	// exhausted budget is refused too (a budget at its limit serves no
	// more requests).
	Reserve(id string, now time.Time, b Budget, a Amount) (Hold, Limit)

	// Room is the check of Reserve without the reservation: the first
	// limit of b that reserving a in the periods of now would cross, or
	// LimitNone. It changes no count, so a check made before a request
	// takes a slot never refuses a concurrent reservation.
	Room(id string, now time.Time, b Budget, a Amount) Limit

	// Settle ends a reservation: the hold leaves the reservations and
	// actual is added to what the key used (in the hold's periods while
	// they last, else in those of now). Settling with a zero actual is a
	// release. Settling the zero Hold does nothing.
	Settle(h Hold, actual Amount, now time.Time)

	// Record adds actual to the use of key id in the periods of now, for
	// a request that reserved nothing (a key without a budget): its usage
	// shows as a budgeted key's does.
	Record(id string, actual Amount, now time.Time)

	// Usage reads the key's accounting in the periods of now.
	Usage(id string, now time.Time) Usage
}

// Day is the UTC day of t, as days since the Unix epoch.
func Day(t time.Time) int64 { return t.Unix() / 86400 }

// Month is the UTC month of t, as year*12 + month-1.
func Month(t time.Time) int64 {
	u := t.UTC()
	return int64(u.Year())*12 + int64(u.Month()) - 1
}

// UntilReset is how long from now until the period of limit l starts
// again: the next UTC midnight for daily limits, the first of the next
// month for monthly ones.
func UntilReset(l Limit, now time.Time) time.Duration {
	u := now.UTC()
	var next time.Time
	if l == LimitSpendPerMonth {
		next = time.Date(u.Year(), u.Month()+1, 1, 0, 0, 0, 0, time.UTC)
	} else {
		next = time.Date(u.Year(), u.Month(), u.Day()+1, 0, 0, 0, 0, time.UTC)
	}
	return next.Sub(u)
}
