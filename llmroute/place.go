package llmroute

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/placement"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// Pools: a model's chain step that names a pool expands, at provision, to
// the pool's members as targets (contiguous in the route, each knowing its
// step, pool and place in the pool). Per request, each pool step's members
// are ranked once by the pool's placement policy (placement.Pool.Rank over
// the members' in-flight counts, limits and cooling, and for cache_aware
// the prompt's block chain and the affinity key); non-pool steps keep
// their list order. The ranks are carried with the request
// (frontReq.place, and a queued waiter's own), so a failover goes on after
// the failed target's position in this request's order, and a waiter is
// served by the first member, in its own order, that frees up.
//
// A placement is recorded when a member is sent the request (sent: the
// member's prompt index, the key's pin, the reason's counters) and
// corrected when its answer says what it reused (served).

// maxPlaced is the longest route a request ranks; a longer one keeps its
// list order (a pool that large is not a fleet this router is meant for).
const maxPlaced = 64

// maxPoolSteps is the pool steps of one route a request ranks with their
// own affinity; further ones rank like least_busy would with no key.
const maxPoolSteps = 4

// kindWaited is the reason of a member reached by waiting for it
// (affinity_wait), after placement's own kinds.
const kindWaited = placement.KindCold + 1

// reasonNames are the reasons as labels, by kind (kindWaited last).
var reasonNames = [kindWaited + 1]string{"", "first", "least_busy", "weighted", "pinned", "warm", "cold", "waited"}

// pool is one configured pool, compiled.
type pool struct {
	id          string
	policy      placement.Policy
	members     []string // upstream ids, the pool's order
	memberIDs   []uint64 // placement.HashString of each
	place       placement.Pool
	keyless     placement.Pool // sticky without an affinity key: least busy
	affinityKey string         // placeholder expression; "" for none
	wait, ttl   time.Duration
	state       *poolState
	stateKey    string // its key in poolStates
	// counters are llm_proxy_placements_total by member and reason kind.
	counters [][kindWaited + 1]prometheus.Counter
	// hist is the pool's ring of the last minutes (history.go).
	hist *history
}

// poolState is what a pool learns and outlives a reload that keeps the
// pool as it was (same id, members and policy): the prefix index and pins
// of cache_aware, and each member's placements and reported cache reuse.
type poolState struct {
	index   *placement.Index // nil unless cache_aware
	members []memberStats
}

func (*poolState) Destruct() error { return nil }

type memberStats struct {
	placed [kindWaited + 1]atomic.Int64
	// prompt and cached are the prompt tokens of the answers that reported
	// a cached count, and that count: the realised cached ratio.
	prompt, cached atomic.Int64
}

var poolStates = caddy.NewUsagePool()

// compilePools compiles the handler's pools, adopting the pooled state of
// each (released at Cleanup by releasePools).
func (h *Handler) compilePools(pcs []Pool) map[string]*pool {
	if len(pcs) == 0 {
		return nil
	}
	out := make(map[string]*pool, len(pcs))
	for _, pc := range pcs {
		policy, _ := placement.ParsePolicy(pc.Placement) // validated
		threshold := 0.5
		if pc.CacheThreshold != nil {
			threshold = *pc.CacheThreshold
		}
		p := &pool{id: pc.ID, policy: policy, members: pc.Upstreams, affinityKey: pc.AffinityKey,
			wait: durationOr(0, pc.AffinityWait), ttl: durationOr(time.Hour, pc.AffinityTTL),
			place:   placement.Pool{Policy: policy, Threshold: threshold},
			keyless: placement.Pool{Policy: placement.LeastBusy},
			hist:    h.adoptHistory("pool/"+pc.ID, pFields)}
		for _, m := range pc.Upstreams {
			p.memberIDs = append(p.memberIDs, placement.HashString(m))
			var cs [kindWaited + 1]prometheus.Counter
			for k := placement.KindFirst; k <= kindWaited; k++ {
				cs[k] = h.metrics.placements.WithLabelValues(pc.ID, m, reasonNames[k])
			}
			p.counters = append(p.counters, cs)
		}
		p.stateKey = strings.Join(append([]string{pc.ID, policy.String(), p.ttl.String()}, pc.Upstreams...), "\x00")
		v, _, _ := poolStates.LoadOrNew(p.stateKey, func() (caddy.Destructor, error) {
			st := &poolState{members: make([]memberStats, len(pc.Upstreams))}
			if policy == placement.CacheAware {
				st.index = placement.NewIndex(len(pc.Upstreams), 0, p.ttl)
			}
			return st, nil
		})
		p.state = v.(*poolState)
		p.place.Index = p.state.index
		if policy == placement.CacheAware {
			for _, m := range pc.Upstreams {
				h.table.upstreams[m].timings = true
			}
		}
		out[pc.ID] = p
	}
	return out
}

// releasePools gives back the pooled state of h's pools.
func (h *Handler) releasePools() {
	for _, p := range h.table.pools {
		_, _ = poolStates.Delete(p.stateKey)
	}
}

// position is member id's place in the pool, -1 when not a member.
func (p *pool) position(id string) int {
	for i, m := range p.members {
		if m == id {
			return i
		}
	}
	return -1
}

// promptShape says where a request of one API keeps its prompt and the
// client's own affinity key (codec.prompt).
type promptShape struct {
	// parts are the top-level members whose values are the prompt, in the
	// order they are hashed ("" unused).
	parts [3]string
	// key is the path of the string member that is the client's affinity
	// key: one top-level member, or a member of a top-level object.
	key [2]string
}

// spans names the members the request parse notes for sh
// (transform.ParseRequestKeys): the prompt's, then the key's top-level one.
func (sh *promptShape) spans() transform.Spans {
	return transform.Spans{Names: [8]string{sh.parts[0], sh.parts[1], sh.parts[2], sh.key[0]}}
}

// read returns the raw values of the prompt's members (nil when absent)
// and the affinity key's string interior (nil when absent), from the
// spans the request's parse noted: only a nested key's object is scanned.
func (sh *promptShape) read(body []byte, sp *transform.Spans) (parts [3][]byte, key []byte) {
	value := func(i int) []byte {
		if sp.At[i][1] == 0 {
			return nil
		}
		return body[sp.At[i][0]:sp.At[i][1]]
	}
	for i := range parts {
		parts[i] = value(i)
	}
	v := value(3)
	if sh.key[1] != "" && len(v) > 0 && v[0] == '{' {
		obj := v
		v = nil
		it := jsonscan.IterObject(obj, 0, false)
		var m jsonscan.Member
		for it.Next(&m) {
			if jsonscan.KeyIs(obj, &m, sh.key[1]) {
				v = obj[m.Vs:m.Ve]
			}
		}
	} else if sh.key[1] != "" {
		v = nil
	}
	if len(v) > 2 && v[0] == '"' {
		key = v[1 : len(v)-1]
	}
	return parts, key
}

// placeInput is what a placement knows of the request.
type placeInput struct {
	r    *http.Request   // nil: explain without a request
	repl *caddy.Replacer // for a pool's affinity_key
	body []byte          // the client's body (nil: none)
	// spans are where the request's parse found the codec's prompt
	// members (codec.prompt().spans()), when parsed. A value, not a
	// pointer: the input stays on its caller's stack.
	spans  transform.Spans
	parsed bool
	codec  codec         // the front's, for the prompt and session
	led    ledger.Ledger // the handler's: shared pins, the session registry
	key    string        // an affinity key given outright (explain's session=)
	now    time.Time
	// explain: rank without moving any rotation (status.go's explain)
	explain bool
}

// stepPlace is one pool step's placement for a request.
type stepPlace struct {
	pool    *pool
	step    int
	key     uint64 // the affinity key's hash, when hasKey
	hasKey  bool
	warm    int // base of the pinned or warm member's target, -1 for none
	matched int // the blocks the index said the warm member holds
	wait    bool
}

// placing is one request's placement: each target's rank inside its pool
// step and its reason (by the target's index in the model's full route,
// which every variant of the route keeps), the order last computed from
// it, and what sent and served need.
type placing struct {
	rank   [maxPlaced]uint8
	reason [maxPlaced]placement.Reason
	rt     *route // the route order is for
	order  [maxPlaced]int
	steps  [maxPoolSteps]stepPlace
	nsteps int
	// The request's prompt, read once: its members, its chain (kept
	// between requests for its capacity), the key the client gave.
	read    bool
	parts   [3][]byte
	bodyKey []byte
	chain   []uint64
	chained bool
	// reqKey is the request's own affinity key, found once (keyDone).
	reqKey          uint64
	hasKey, keyDone bool
	// waited is how long the request waited for its warm member.
	waited time.Duration
	// placed is the X-LLM-Route-Placement of the target last sent (its
	// base in placedAt), for the completion log.
	placed   string
	placedAt int
}

var placings = sync.Pool{New: func() any { return new(placing) }}

func (pl *placing) reset() {
	chain := pl.chain[:0]
	*pl = placing{}
	pl.chain = chain
}

// placeRequest ranks rt's pool steps for one request; nil when rt has no
// pool step (its list order is the order). The caller puts a non-nil
// result back with donePlacing when the request is done.
func placeRequest(rt *route, in *placeInput) *placing {
	pooled := false
	for i := range rt.targets {
		if rt.targets[i].base >= maxPlaced {
			return nil
		}
		pooled = pooled || rt.targets[i].pool != nil
	}
	if !pooled {
		return nil
	}
	if in.now.IsZero() {
		in.now = time.Now() // only a pooled route reads the clock
	}
	pl := placings.Get().(*placing)
	pl.reset()
	n := len(rt.targets)
	for lo := 0; lo < n; {
		hi := lo + 1
		for hi < n && rt.targets[hi].step == rt.targets[lo].step {
			hi++
		}
		if p := rt.targets[lo].pool; p != nil {
			pl.placeStep(rt.targets[lo:hi], p, in)
		} else {
			for i := lo; i < hi; i++ {
				pl.rank[rt.targets[i].base], pl.reason[rt.targets[i].base] = 0, placement.Reason{}
			}
		}
		lo = hi
	}
	return pl
}

// placeStep ranks one pool step's targets. The pool's members are ranked
// by their place in the pool (the index's and the pins' member numbers);
// a member the route does not reach at this step (it came earlier in the
// chain) ranks as cooling and is left out of the order.
func (pl *placing) placeStep(ts []target, p *pool, in *placeInput) {
	k := len(p.members)
	var ms [maxPlaced]placement.Member
	var at [maxPlaced]int // pool position → index in ts, -1 none
	for j := range k {
		ms[j] = placement.Member{ID: p.memberIDs[j], Limit: 1, Weight: 1, Cooling: true}
		at[j] = -1
	}
	for i := range ts {
		t := &ts[i]
		ms[t.member] = placement.Member{ID: t.memberID, InFlight: t.up.State.Inflight(), Limit: t.up.Limit,
			Weight: t.weight, Cooling: t.up.Cooling(in.now) > 0}
		at[t.member] = i
	}
	var sp *stepPlace
	if pl.nsteps < maxPoolSteps {
		sp = &pl.steps[pl.nsteps]
		pl.nsteps++
		*sp = stepPlace{pool: p, step: ts[0].step, warm: -1}
	}
	req := placement.Request{Now: in.now, Peek: in.explain}
	pp := &p.place
	if sp != nil && (p.policy == placement.Sticky || p.policy == placement.CacheAware) {
		sp.key, sp.hasKey = pl.keyFor(p, in)
		req.Key, req.HasKey = sp.key, sp.hasKey
	}
	if p.policy == placement.Sticky && !req.HasKey || p.policy == placement.CacheAware && sp == nil {
		pp = &p.keyless
	}
	if pp.Policy == placement.CacheAware {
		req.Chain = pl.chainOf(in)
		if req.HasKey && in.led != nil {
			// Under the redis state the fleet's pin is the newest word on
			// where the session's cache is.
			if m := p.position(in.led.Affinity(p.id, req.Key)); m >= 0 {
				p.state.index.Pin(req.Key, m, in.now)
			}
		}
	}
	var order [maxPlaced]int
	var reasons [maxPlaced]placement.Reason
	d := pp.Rank(ms[:k], req, order[:k], reasons[:k])
	r := uint8(0)
	for j, m := range order[:k] {
		if at[m] < 0 {
			continue
		}
		b := ts[at[m]].base
		pl.rank[b], pl.reason[b] = r, reasons[j]
		r++
	}
	if sp != nil && d.Member >= 0 && at[d.Member] >= 0 {
		sp.warm, sp.matched = ts[at[d.Member]].base, d.Matched
		// Busy, not cooling: worth waiting for up to affinity_wait.
		sp.wait = !d.First && !ms[d.Member].Cooling && p.wait > 0
		if !d.First {
			// Its own reason, should it be reached after all.
			pl.reason[sp.warm] = d.Reason
		}
	}
}

// keyFor is the request's affinity key for p, the first present: the
// pool's affinity_key when it evaluates non-empty, else the request's own
// (requestKey, found once for every pool).
func (pl *placing) keyFor(p *pool, in *placeInput) (uint64, bool) {
	if p.affinityKey != "" && in.repl != nil {
		if v := in.repl.ReplaceAll(p.affinityKey, ""); v != "" {
			return placement.HashString(v), true
		}
	}
	if !pl.keyDone {
		pl.keyDone = true
		if k := pl.requestKey(in); k != "" {
			pl.reqKey, pl.hasKey = placement.HashString(k), true
		}
	}
	return pl.reqKey, pl.hasKey
}

// requestKey is the request's own affinity key: one given outright, the
// client's session headers, the body's key (prompt_cache_key,
// metadata.user_id), else the session id of the conversation's history
// (the prefix hash of the upstream session header, whether or not a
// provider sends it).
func (pl *placing) requestKey(in *placeInput) string {
	if in.key != "" {
		return in.key
	}
	if in.r != nil {
		if s := clientSession(in.r); s != "" {
			return s
		}
		if v := in.r.Header.Get("X-Session-Id"); v != "" {
			return v
		}
	}
	if in.codec == nil || in.body == nil {
		return ""
	}
	pl.readPrompt(in)
	if len(pl.bodyKey) > 0 {
		return string(pl.bodyKey)
	}
	if in.led == nil {
		return ""
	}
	return in.codec.sessionID(in.led, in.body, in.body, nil)
}

func (pl *placing) readPrompt(in *placeInput) {
	if pl.read || in.codec == nil {
		return
	}
	pl.read = true
	sh := in.codec.prompt()
	if !in.parsed {
		in.spans = sh.spans()
		if _, _, _, err := transform.ParseRequestKeys(in.body, nil, &in.spans); err != nil {
			return
		}
		in.parsed = true
	}
	pl.parts, pl.bodyKey = sh.read(in.body, &in.spans)
}

// chainOf is the prompt's block chain, hashed once per request.
func (pl *placing) chainOf(in *placeInput) []uint64 {
	if !pl.chained {
		pl.chained = true
		pl.readPrompt(in)
		pl.chain = placement.ChainParts(pl.chain[:0], pl.parts[0], pl.parts[1], pl.parts[2])
	}
	return pl.chain
}

// donePlacing returns a request's placing for reuse.
func donePlacing(pl *placing) {
	if pl != nil {
		placings.Put(pl)
	}
}

// stepOf is the placement of t's pool step, nil when t is in none (or
// past maxPoolSteps).
func (pl *placing) stepOf(t *target) *stepPlace {
	if pl == nil || t.pool == nil {
		return nil
	}
	for i := range pl.steps[:pl.nsteps] {
		if pl.steps[i].step == t.step {
			return &pl.steps[i]
		}
	}
	return nil
}

// warmTarget is the index in rt of the first pool step's member worth
// waiting for (its pinned or warm member, busy), with the wait; -1 when
// there is none or rt does not reach it.
func (pl *placing) warmTarget(rt *route) (int, time.Duration) {
	if pl == nil {
		return -1, 0
	}
	for _, sp := range pl.steps[:pl.nsteps] {
		if !sp.wait {
			continue
		}
		for i := range rt.targets {
			if rt.targets[i].base == sp.warm {
				return i, sp.pool.wait
			}
		}
	}
	return -1, 0
}

// sent records that the request goes to t (placed by pl): its reason's
// counters, the member's prompt index and the key's pin; and it sets
// X-LLM-Route-Placement in hdr (nil: route headers off), or removes it for
// a target outside any pool.
func (pl *placing) sent(hdr http.Header, t *target, now time.Time) {
	sp := pl.stepOf(t)
	if sp == nil {
		if hdr != nil {
			delete(hdr, hdrRoutePlacement)
		}
		return
	}
	p := sp.pool
	reason := pl.reason[t.base]
	kind := reason.Kind
	if pl.waited > 0 && t.base == sp.warm {
		kind = kindWaited
	}
	if kind != 0 {
		p.counters[t.member][kind].Inc()
		p.state.members[t.member].placed[kind].Add(1)
		p.hist.add(now.UnixNano(), int(kind), 1)
	}
	pl.placed, pl.placedAt = placementHeader(p.policy, reason, kind, pl.waited), t.base
	if hdr != nil {
		hdr[hdrRoutePlacement] = []string{pl.placed}
	}
	if p.policy != placement.CacheAware {
		return
	}
	x := p.state.index
	x.Record(t.member, pl.chain, now)
	if sp.hasKey {
		x.Pin(sp.key, t.member, now)
	}
}

// logged is what the completion log says of t's placement: the
// placement and the affinity key's short hash ("" outside a pool).
func (pl *placing) logged(t *target) (placed, affinity string) {
	sp := pl.stepOf(t)
	if sp == nil || pl.placedAt != t.base || pl.placed == "" {
		return "", ""
	}
	if sp.hasKey {
		affinity = shortHash(sp.key)
	}
	return pl.placed, affinity
}

// placementHeader is X-LLM-Route-Placement's value: the policy and the
// reason ("cache_aware warm 0.93", "cache_aware waited 1.2").
func placementHeader(policy placement.Policy, r placement.Reason, kind placement.Kind, waited time.Duration) string {
	var buf [48]byte
	b := append(buf[:0], policy.String()...)
	b = append(b, ' ')
	if kind == kindWaited {
		b = append(b, "waited "...)
		b = strconv.AppendFloat(b, waited.Seconds(), 'f', 1, 64)
	} else {
		b = r.AppendText(b)
	}
	return string(b)
}

// served notes what t's answer reported it reused: the member's realised
// cached ratio, and for cache_aware the correction of its index. A member
// that reused less than half of what its index predicted loses the
// predicted blocks it did not hold, and the key's pin to it (its cache
// does not keep this session: the next turn is placed afresh). Under the
// redis state the pin is shared.
func (pl *placing) served(t *target, us transform.Usage, led ledger.Ledger) {
	sp := pl.stepOf(t)
	if sp == nil {
		return
	}
	p := sp.pool
	if us.CacheReported && us.Input > 0 {
		st := &p.state.members[t.member]
		st.prompt.Add(us.Input)
		st.cached.Add(min(us.CachedInput, us.Input))
		now := time.Now().UnixNano()
		p.hist.add(now, pPrompt, us.Input)
		p.hist.add(now, pCached, min(us.CachedInput, us.Input))
	}
	if p.policy != placement.CacheAware {
		return
	}
	member := t.up.ID
	if us.CacheReported && t.base == sp.warm && sp.matched > 0 && len(pl.chain) > 0 && us.Input > 0 {
		predicted := int64(sp.matched) * us.Input / int64(len(pl.chain))
		if us.CachedInput*2 < predicted {
			x := p.state.index
			x.Correct(t.member, pl.chain, sp.matched, int(us.CachedInput), int(us.Input))
			if sp.hasKey {
				x.Unpin(sp.key, t.member)
			}
			member = ""
		}
	}
	if sp.hasKey && led != nil {
		led.SetAffinity(p.id, sp.key, member, p.ttl)
	}
}

// orderFor is the order in which this request tries rt's targets: the
// chain's steps in order, a pool step's members by this request's rank.
// Without a placing (no pool step) it is the list order.
func (rt *route) orderFor(pl *placing) []int {
	n := len(rt.targets)
	if pl == nil || n > maxPlaced {
		return rt.order()
	}
	o := pl.order[:n]
	if pl.rt == rt {
		return o
	}
	for i := range o {
		o[i] = i
	}
	// Targets are in chain order already: sorting by (step, rank) only
	// reorders inside each pool step. Insertion sort: n is small.
	for i := 1; i < n; i++ {
		for j := i; j > 0; j-- {
			a, b := &rt.targets[o[j-1]], &rt.targets[o[j]]
			if a.step < b.step || a.step == b.step && pl.rank[a.base] <= pl.rank[b.base] {
				break
			}
			o[j-1], o[j] = o[j], o[j-1]
		}
	}
	pl.rt = rt
	return o
}

// shortHash is what logs and answers show of an affinity key: 8 hex
// digits of its hash, enough to tell sessions apart, never the key.
func shortHash(h uint64) string {
	const digits = "0123456789abcdef"
	var b [8]byte
	for i := range b {
		b[i] = digits[h>>(60-4*i)&0xf]
	}
	return string(b[:])
}

// status is the pool's part of GET /llm_route/status.
func (p *pool) status(h *Handler) poolStatus {
	ps := poolStatus{ID: p.id, Placement: p.policy.String(), Members: make([]memberStatus, 0, len(p.members))}
	for i, id := range p.members {
		u := h.table.upstreams[id]
		st := &p.state.members[i]
		ms := memberStatus{Upstream: id, Inflight: u.State.Inflight(), Placements: map[string]int64{}}
		if l := u.State.Limit(); l != ledger.Unlimited {
			ms.Limit = &l
		}
		for k := placement.KindFirst; k <= kindWaited; k++ {
			if n := st.placed[k].Load(); n > 0 {
				ms.Placements[reasonNames[k]] = n
			}
		}
		if prompt := st.prompt.Load(); prompt > 0 {
			ms.CachedRatio = new(math.Round(float64(st.cached.Load())/float64(prompt)*1000) / 1000)
		}
		ps.Members = append(ps.Members, ms)
	}
	return ps
}
