package placement

import (
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"
)

// Member is one pool member's load view, filled by the caller for each
// decision from the ledger's atomics.
type Member struct {
	// ID is the member's stable hash (HashString of its upstream id); sticky
	// ranks by it, so a member keeps its keys whatever its position.
	ID uint64
	// InFlight is the member's requests in flight.
	InFlight int64
	// Limit is its slot limit; 0, a negative value or math.MaxInt64 means
	// none.
	Limit int64
	// Weight is its sticky weight; 0 means 1.
	Weight uint32
	// Cooling is true while the member is cooling down (backoff or hold).
	Cooling bool
}

func (m *Member) limited() bool { return m.Limit > 0 && m.Limit != math.MaxInt64 }

// Busy reports whether every slot of the member is taken.
func (m *Member) Busy() bool { return m.limited() && m.InFlight >= m.Limit }

// load is in-flight ÷ limit, or in-flight without a limit.
func (m *Member) load() float64 {
	if m.limited() {
		return float64(m.InFlight) / float64(m.Limit)
	}
	return float64(m.InFlight)
}

// class orders what can be claimed now before busy before cooling.
func (m *Member) class() int {
	switch {
	case m.Cooling:
		return 2
	case m.Busy():
		return 1
	}
	return 0
}

// Policy is a pool's placement policy.
type Policy uint8

// The policies; the zero value is least_busy, the default.
const (
	LeastBusy Policy = iota
	First
	Sticky
	CacheAware
)

var policyNames = [...]string{LeastBusy: "least_busy", First: "first", Sticky: "sticky", CacheAware: "cache_aware"}

func (p Policy) String() string {
	if int(p) < len(policyNames) {
		return policyNames[p]
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// ParsePolicy returns the policy named s ("" is least_busy).
func ParsePolicy(s string) (Policy, error) {
	if s == "" {
		return LeastBusy, nil
	}
	for p, n := range policyNames {
		if n == s {
			return Policy(p), nil
		}
	}
	return 0, fmt.Errorf("unknown placement %q (want first, least_busy, sticky or cache_aware)", s)
}

// Kind is why a member holds its position.
type Kind uint8

// The reasons.
const (
	KindNone      Kind = iota
	KindFirst          // the pool's list order
	KindLeastBusy      // ascending load
	KindWeighted       // sticky's weighted rendezvous rank
	KindPinned         // the member that served the affinity key last
	KindWarm           // the member with the longest prefix of the prompt
	KindCold           // first-ranked because the warm or pinned member is busy or cooling
)

var kindNames = [...]string{"", "first", "least_busy", "weighted", "pinned", "warm", "cold"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Reason is one position's reason; Fraction is the share of the prompt
// the member's index holds, for KindWarm.
type Reason struct {
	Kind     Kind
	Fraction float32
}

// AppendText appends the reason as headers show it ("warm 0.87",
// "least_busy"), allocation-free into b.
func (r Reason) AppendText(b []byte) []byte {
	b = append(b, r.Kind.String()...)
	if r.Kind == KindWarm {
		b = append(b, ' ')
		b = strconv.AppendFloat(b, float64(r.Fraction), 'f', 2, 32)
	}
	return b
}

func (r Reason) String() string { return string(r.AppendText(nil)) }

// Request is what a decision knows of the request.
type Request struct {
	// Key is the affinity key's hash (HashString); HasKey says there is one.
	// sticky ranks by Key whatever HasKey says (the caller always has one:
	// at worst the prompt's prefix-hash session); cache_aware looks up a
	// pin only when HasKey.
	Key    uint64
	HasKey bool
	// Chain is the prompt's chain of block hashes (Chain), for cache_aware.
	Chain []uint64
	// Now is the decision's time, for the index's ageing.
	Now time.Time
	// Peek ranks without moving least_busy's rotation (an explanation
	// of what the next request would get, not a decision).
	Peek bool
}

// Decision tells the caller about cache_aware's warm choice.
type Decision struct {
	// Member is the index of the pinned or warm member, -1 when none.
	Member int
	// Reason is that member's reason (pinned, or warm with its fraction).
	Reason Reason
	// Matched is the blocks of the chain the index says the member holds
	// (what Correct later compares with what the member reports).
	Matched int
	// First is true when that member ranks first (it is free and not
	// cooling); when false and the member is busy but not cooling, the
	// caller may wait for it up to affinity_wait.
	First bool
}

// Pool is one pool's placement: its policy and the state that outlives a
// decision (the round-robin counter, the prefix index). Safe for
// concurrent use.
type Pool struct {
	Policy Policy
	// Threshold is cache_aware's cache_threshold: the share of the prompt
	// (0–1) the longest prefix must cover to choose its member.
	Threshold float64
	// Index is the prefix index and pins, for cache_aware; nil skips both.
	Index *Index

	rr atomic.Uint64
}

// maxStack members are ranked without allocating; a larger pool allocates
// its sticky scores.
const maxStack = 64

// Rank fills order (indexes into ms, most preferred first) and reasons
// (aligned with order) for one request; both must be at least len(ms)
// long. It
// returns cache_aware's warm choice (Member -1 for other policies).
func (p *Pool) Rank(ms []Member, req Request, order []int, reasons []Reason) Decision {
	n := len(ms)
	d := Decision{Member: -1}
	if n == 0 {
		return d // an empty pool: nothing to rank (and no round-robin modulo 0)
	}
	order, reasons = order[:n], reasons[:n]
	switch p.Policy {
	case First:
		for i := range order {
			order[i], reasons[i] = i, Reason{Kind: KindFirst}
		}
	case Sticky:
		p.sticky(ms, req.Key, order, reasons)
	case CacheAware:
		d = p.cacheAware(ms, req, order, reasons)
		// The warm member leads; the rest follow least busy, then all
		// are partitioned by what can be claimed now.
		partition(ms, order, reasons)
		if d.Member >= 0 {
			d.First = order[0] == d.Member
			if !d.First {
				reasons[0] = Reason{Kind: KindCold}
			}
		}
		return d
	default:
		p.leastBusy(ms, order, reasons, -1, req.Peek)
	}
	partition(ms, order, reasons)
	return d
}

// leastBusy fills order with ascending load, ties round-robin; skip (when
// ≥ 0) is left out and order is filled from its start with the others;
// peek leaves the rotation where it is.
func (p *Pool) leastBusy(ms []Member, order []int, reasons []Reason, skip int, peek bool) {
	n := len(ms)
	turn := p.rr.Load() + 1
	if !peek {
		turn = p.rr.Add(1)
	}
	start := int(turn % uint64(n))
	k := 0
	for i := range n {
		if i == skip {
			continue
		}
		order[k], reasons[k] = i, Reason{Kind: KindLeastBusy}
		k++
	}
	o := order[:k]
	// rot is a member's place in this decision's rotation, breaking ties.
	rot := func(i int) int { return (i - start + n) % n }
	for i := 1; i < len(o); i++ {
		for j := i; j > 0; j-- {
			a, b := o[j-1], o[j]
			la, lb := ms[a].load(), ms[b].load()
			if la < lb || la == lb && rot(a) < rot(b) {
				break
			}
			o[j-1], o[j] = b, a
		}
	}
}

func (p *Pool) sticky(ms []Member, key uint64, order []int, reasons []Reason) {
	var buf [maxStack]float64
	score := buf[:0]
	if len(ms) > maxStack {
		score = make([]float64, 0, len(ms))
	}
	for i := range ms {
		score = append(score, rendezvous(key, &ms[i]))
		order[i], reasons[i] = i, Reason{Kind: KindWeighted}
	}
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && score[order[j]] > score[order[j-1]]; j-- {
			order[j-1], order[j] = order[j], order[j-1]
		}
	}
}

// rendezvous is a member's weighted highest-random-weight score for key:
// -w / ln(u), u in (0,1) from the mixed (key, member) hash. The member
// with the highest score wins; a member of weight w wins w/Σw of keys.
func rendezvous(key uint64, m *Member) float64 {
	w := float64(m.Weight)
	if m.Weight == 0 {
		w = 1
	}
	h := mix(key ^ mix(m.ID))
	u := (float64(h>>11) + 0.5) / (1 << 53) // (0,1), never 0 or 1
	return -w / math.Log(u)
}

// cacheAware: the pinned member, else the warm one, else least busy. A
// new session (a key with no pin) goes warm only to a member that holds
// at most one session more than the least-pinned claimable one, and
// otherwise to the least busy member with the fewest sessions: a prefix
// every member will soon hold (a shared system prompt) must not gather
// every new session on the first member that served one, while each
// session's own turns stay where its history is.
func (p *Pool) cacheAware(ms []Member, req Request, order []int, reasons []Reason) Decision {
	d := Decision{Member: -1}
	n := len(ms)
	x := p.Index
	if x == nil {
		p.leastBusy(ms, order, reasons, -1, req.Peek)
		return d
	}
	var sbuf [maxStack]int
	sessions := sbuf[:0]
	if n > maxStack {
		sessions = make([]int, 0, n)
	}
	sessions = sessions[:n]
	x.Sessions(sessions)
	if req.HasKey {
		if m, ok := x.Pinned(req.Key, req.Now); ok && m < n {
			d.Member, d.Reason = m, Reason{Kind: KindPinned}
			d.Matched = x.matchedOne(m, req.Chain, req.Now)
		}
	}
	if d.Member < 0 && len(req.Chain) > 0 {
		var buf [maxStack]int
		matched := buf[:0]
		if n > maxStack {
			matched = make([]int, 0, n)
		}
		matched = matched[:n]
		x.Matches(req.Chain, req.Now, matched)
		best := -1
		for i, m := range matched {
			if m == 0 {
				continue
			}
			if best < 0 || m > matched[best] || m == matched[best] && less(ms, sessions, i, best) {
				best = i
			}
		}
		if best >= 0 {
			f := float64(matched[best]) / float64(len(req.Chain))
			if f >= p.Threshold && !(req.HasKey && crowded(ms, sessions, best)) {
				d.Member, d.Matched = best, matched[best]
				d.Reason = Reason{Kind: KindWarm, Fraction: float32(f)}
			}
		}
	}
	if d.Member < 0 {
		p.leastBusy(ms, order, reasons, -1, req.Peek)
		bySessions(ms, sessions, order)
		return d
	}
	order[0], reasons[0] = d.Member, d.Reason
	p.leastBusy(ms, order[1:], reasons[1:], d.Member, req.Peek)
	return d
}

// less orders two members for cache_aware: lower load, then fewer sessions.
func less(ms []Member, sessions []int, a, b int) bool {
	la, lb := ms[a].load(), ms[b].load()
	return la < lb || la == lb && sessions[a] < sessions[b]
}

// crowded: member m holds two sessions or more than the least-pinned
// member that can take a request (not cooling).
func crowded(ms []Member, sessions []int, m int) bool {
	for i := range ms {
		if !ms[i].Cooling && sessions[i]+1 < sessions[m] {
			return true
		}
	}
	return false
}

// bySessions reorders a least-busy order so that, among members of equal
// load, fewer sessions come first (stable: the round-robin still breaks
// the remaining ties).
func bySessions(ms []Member, sessions []int, order []int) {
	for i := 1; i < len(order); i++ {
		for j := i; j > 0; j-- {
			a, b := order[j-1], order[j]
			if ms[a].load() != ms[b].load() || sessions[a] <= sessions[b] {
				break
			}
			order[j-1], order[j] = b, a
		}
	}
}

// partition moves the members that can be claimed now before the busy
// ones before the cooling ones, keeping the policy's order in each class
// (an insertion sort: stable, allocation-free, and pools are small).
func partition(ms []Member, order []int, reasons []Reason) {
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && ms[order[j]].class() < ms[order[j-1]].class(); j-- {
			order[j-1], order[j] = order[j], order[j-1]
			reasons[j-1], reasons[j] = reasons[j], reasons[j-1]
		}
	}
}

// Choose returns the index of the id with the highest weighted rendezvous
// score for key: each key picks one id, with the share of keys an id gets
// proportional to its weight, and raising one weight only moves keys onto
// that id. Unlike a pool member's, weight 0 is never chosen. It returns -1
// when every weight is 0. ids and weights are aligned.
func Choose(key uint64, ids []uint64, weights []uint32) int {
	best, bestScore := -1, 0.0
	for i, id := range ids {
		if weights[i] == 0 {
			continue
		}
		if s := rendezvous(key, &Member{ID: id, Weight: weights[i]}); best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	return best
}
