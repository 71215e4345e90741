package llmroute

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

// The status snapshot and the explain verdicts are pure reads of the live
// state: atomics, plus the short locks the state already has (a backoff's
// mutex, the scheduler's). They never claim a slot, wake a waiter or touch
// a counter, so an operator can poll them as often as they like.

// statusSnapshot is the answer of GET /llm_route/status.
type statusSnapshot struct {
	Upstreams []upstreamStatus `json:"upstreams"`
	Providers []providerStatus `json:"providers"`
	Models    []modelStatus    `json:"models"`
	// Pools is each pool with its members' placements (absent when no
	// pool is configured).
	Pools []poolStatus `json:"pools,omitempty"`
	// Keys is each client key's usage in the current UTC day and month
	// (absent when no key is configured).
	Keys []keyStatus `json:"keys,omitempty"`
	// Sessions is the number of conversations in the session registry.
	Sessions int `json:"sessions"`
	// ConfigLoadedAt is when the newest running config started (null: no
	// llm_route handler is running).
	ConfigLoadedAt *time.Time `json:"config_loaded_at"`
	// Now is the server's clock at the snapshot, so a page can count cooling
	// down without trusting the browser's clock.
	Now time.Time `json:"now"`
	// State is the state backend in use and its health.
	State ledger.Status `json:"state"`
}

type poolStatus struct {
	ID        string         `json:"id"`
	Placement string         `json:"placement"`
	Members   []memberStatus `json:"members"`
}

type memberStatus struct {
	Upstream string `json:"upstream"`
	Inflight int64  `json:"inflight"`
	Limit    *int64 `json:"limit"` // null = unlimited
	// Placements counts the requests placed on the member by reason
	// (first, least_busy, weighted, pinned, warm, cold, waited) since the
	// pool was configured as it is.
	Placements map[string]int64 `json:"placements"`
	// CachedRatio is the share of prompt tokens the member reported it
	// reused, over its answers that reported it (null: none did).
	CachedRatio *float64 `json:"cached_ratio"`
}

type upstreamStatus struct {
	ID       string `json:"id"`
	Provider string `json:"provider"`
	Model    string `json:"model"` // the real model name; "" for a draining upstream
	Inflight int64  `json:"inflight"`
	Limit    *int64 `json:"limit"` // null = unlimited
	// CoolingSeconds is how long the upstream stays out of rotation (0 =
	// available).
	CoolingSeconds float64 `json:"cooling_seconds"`
	// CoolingReason is "failure" (backoff after failed attempts),
	// "retry_after" (the upstream asked for the pause) or null.
	CoolingReason *string `json:"cooling_reason"`
	FailStreak    int64   `json:"fail_streak"`
	// LastFailure is the result class of the last failed attempt (5xx,
	// 429, net_err, timeout, ...; null: none since the process started).
	LastFailure *string `json:"last_failure"`
	// LastFailureAt is when the current or last cooling began, else when
	// the last failed attempt ended (null: never).
	LastFailureAt *time.Time `json:"last_failure_at"`
	// LastProbe is the last background probe's result ("ok", "fail") and
	// time (null: never probed).
	LastProbe *probeRecord `json:"last_probe"`
	// Probes counts the background probes sent to it since the process
	// started, by result (the llm_proxy_probe_pings_total counters).
	Probes probeCounts `json:"probes"`
	// Draining marks an upstream a reload removed that still has requests
	// in flight; it leaves the list when they end.
	Draining bool `json:"draining"`
	// FleetInflight is the in-flight count over every instance sharing the
	// redis state (absent with memory, or while Redis does not answer).
	FleetInflight *int64 `json:"fleet_inflight,omitempty"`
}

type probeRecord struct {
	Result string    `json:"result"`
	At     time.Time `json:"at"`
}

type probeCounts struct {
	OK   int64 `json:"ok"`
	Fail int64 `json:"fail"`
}

type providerStatus struct {
	ID        string   `json:"id"`
	Inflight  int64    `json:"inflight"` // sum over its upstreams
	Capacity  *int64   `json:"capacity"` // null = no provider-wide bound
	Upstreams []string `json:"upstreams"`
	// FleetInflight: as for upstreams.
	FleetInflight *int64 `json:"fleet_inflight,omitempty"`
	// Keys are the provider's key pool (its keys), by index and
	// fingerprint, never the key; absent for a provider with one key.
	Keys []providerKeyStatus `json:"keys,omitempty"`
}

type modelStatus struct {
	Name       string   `json:"name"`
	Upstreams  []string `json:"upstreams"` // in routing order
	QueueDepth int      `json:"queue_depth"`
	QueueSize  int      `json:"queue_size"` // 0 = no queue
	// OldestWaitSeconds is how long the oldest queued request has waited
	// (0: the queue is empty).
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
	// Rules are a router model's rules, in list order (absent for a plain
	// model, whose Upstreams are its own; a router's are every upstream
	// its chains may reach).
	Rules []ruleStatus `json:"rules,omitempty"`
}

// ruleStatus is one rule of a router model as configured, with the
// requests it took.
type ruleStatus struct {
	Name     string                `json:"name"`
	Priority int                   `json:"priority"`
	Effort   string                `json:"effort,omitempty"` // absent: any
	Match    map[string]StringList `json:"match,omitempty"`
	Use      []string              `json:"use"`
	Weights  []int                 `json:"weights,omitempty"`
	Shadow   *Shadow               `json:"shadow,omitempty"`
	// Requests counts the requests the rule took, every effort
	// (llm_proxy_rule_requests_total), since its series were created.
	Requests int64 `json:"requests"`
}

// ruleStatuses reads a router model's rules: the configured fields, and
// the rule counters of the compiled set (same order).
func ruleStatuses(m *Model, rs *ruleSet) []ruleStatus {
	out := make([]ruleStatus, 0, len(m.Rules))
	for i, rc := range m.Rules {
		st := ruleStatus{Name: rc.Name, Priority: rc.Priority, Effort: rc.Effort, Match: rc.Match,
			Use: rc.Use, Weights: rc.Weights, Shadow: rc.Shadow}
		if i < len(rs.rules) {
			for _, c := range rs.rules[i].counters {
				var pb dto.Metric
				if c != nil && c.Write(&pb) == nil && pb.Counter != nil {
					st.Requests += int64(pb.Counter.GetValue())
				}
			}
		}
		out = append(out, st)
	}
	return out
}

// Cooling reasons.
var (
	reasonFailure    = "failure"
	reasonRetryAfter = "retry_after"
)

// snapshot reads the status of every running llm_route handler. An id that
// several handlers (or an old and a new config) share is reported once, as
// the newest config sees it.
func snapshot(now time.Time) statusSnapshot {
	snap := statusSnapshot{
		Upstreams: []upstreamStatus{},
		Providers: []providerStatus{},
		Models:    []modelStatus{},
		Sessions:  ledger.Sessions(),
		Now:       now,
	}
	live := liveHandlers()
	if len(live) > 0 {
		t := live[0].since
		snap.ConfigLoadedAt = &t
	}
	depth := queueDepths()
	oldest := oldestWaits()
	probes := probeTotals()

	seenUp := make(map[string]bool)
	seenProv := make(map[string]int) // id → index in snap.Providers
	seenModel := make(map[string]bool)
	seenPool := make(map[string]bool)
	for _, e := range live {
		h := e.h
		for _, uc := range h.Upstreams { // config order
			u := h.table.upstreams[uc.ID]
			if u == nil || seenUp[u.ID] {
				continue
			}
			seenUp[u.ID] = true
			us := stateStatus(u.State, u.Backoff, now)
			us.Provider, us.Model = u.Provider, u.model
			us.Probes = probes[u.ID]
			snap.Upstreams = append(snap.Upstreams, us)
		}
		for _, p := range h.Providers {
			if _, ok := seenProv[p.ID]; ok {
				continue
			}
			seenProv[p.ID] = len(snap.Providers)
			ps := providerStatus{ID: p.ID, Upstreams: []string{}}
			if p.Capacity > 0 {
				ps.Capacity = new(int64(p.Capacity))
			}
			if kp := h.keyPoolOf(p.ID); kp != nil {
				ps.Keys = kp.status(now)
			}
			snap.Providers = append(snap.Providers, ps)
		}
		for _, name := range h.table.modelList {
			if seenModel[name] {
				continue
			}
			seenModel[name] = true
			rt := h.table.routes[name]
			ms := modelStatus{Name: name, Upstreams: make([]string, 0, len(rt.targets)),
				QueueDepth: depth[name], QueueSize: rt.queueSize}
			if since, ok := oldest[name]; ok {
				ms.OldestWaitSeconds = math.Round(now.Sub(since).Seconds()*1000) / 1000
			}
			for _, t := range rt.targets {
				ms.Upstreams = append(ms.Upstreams, t.up.ID)
			}
			if rt.rules != nil {
				if i := slices.IndexFunc(h.Models, func(m Model) bool { return m.Name == name }); i >= 0 {
					ms.Rules = ruleStatuses(&h.Models[i], rt.rules)
				}
			}
			snap.Models = append(snap.Models, ms)
		}
		for _, pc := range h.Pools { // config order
			if p := h.table.pools[pc.ID]; p != nil && !seenPool[p.id] {
				seenPool[p.id] = true
				snap.Pools = append(snap.Pools, p.status(h))
			}
		}
	}

	// Upstreams a reload removed, still finishing their requests.
	var gone []upstreamStatus
	ledger.EachDraining(func(s *ledger.UpstreamState) {
		if seenUp[s.ID()] || s.Inflight() <= 0 {
			return // re-adopted by a running config, or drained
		}
		us := stateStatus(s, s.Backoff(), now)
		us.Provider = s.ProviderID()
		us.Probes = probes[s.ID()]
		us.Draining = true
		gone = append(gone, us)
	})
	snap.Keys = keyStatuses(live, now)
	slices.SortFunc(gone, func(a, b upstreamStatus) int { return cmp.Compare(a.ID, b.ID) })
	snap.Upstreams = append(snap.Upstreams, gone...)

	for _, us := range snap.Upstreams {
		i, ok := seenProv[us.Provider]
		if !ok {
			// A draining upstream's provider left the config too.
			i = len(snap.Providers)
			seenProv[us.Provider] = i
			snap.Providers = append(snap.Providers, providerStatus{ID: us.Provider, Upstreams: []string{}})
		}
		snap.Providers[i].Inflight += us.Inflight
		snap.Providers[i].Upstreams = append(snap.Providers[i].Upstreams, us.ID)
	}
	top := stateLedger(live)
	snap.State = top.Status()
	addFleetUse(&snap, live, top)
	return snap
}

// stateLedger is the ledger whose backend the status names: with several
// handlers, a redis one if any runs (the newest unhealthy one first, so an
// outage is never hidden behind a healthy fleet), else memory.
func stateLedger(live []registryEntry) ledger.Ledger {
	top := ledger.NewMemory(nil) // asked only for its status and fleet use
	for _, e := range live {
		st := e.h.led.Status()
		if st.Backend != "redis" {
			continue
		}
		if !st.Healthy {
			return e.h.led
		}
		if top.Status().Backend == "memory" {
			top = e.h.led
		}
	}
	return top
}

// addFleetUse fills in the fleet-wide in-flight counts, each upstream and
// provider from the ledger of the newest handler that uses it (an upstream
// still draining, from top's): a memory handler's have none.
func addFleetUse(snap *statusSnapshot, live []registryEntry, top ledger.Ledger) {
	upOwner, provOwner := map[string]ledger.Ledger{}, map[string]ledger.Ledger{}
	for _, e := range live {
		for id := range e.h.table.upstreams {
			if _, ok := upOwner[id]; !ok {
				upOwner[id] = e.h.led
			}
		}
		for _, p := range e.h.Providers {
			if _, ok := provOwner[p.ID]; !ok {
				provOwner[p.ID] = e.h.led
			}
		}
	}
	type asked struct{ ups, provs []string }
	var order []ledger.Ledger
	byLedger := map[ledger.Ledger]*asked{}
	ask := func(l ledger.Ledger) *asked {
		if l == nil {
			l = top
		}
		a := byLedger[l]
		if a == nil {
			a = &asked{}
			byLedger[l] = a
			order = append(order, l)
		}
		return a
	}
	for _, u := range snap.Upstreams {
		a := ask(upOwner[u.ID])
		a.ups = append(a.ups, u.ID)
	}
	for _, p := range snap.Providers {
		a := ask(provOwner[p.ID])
		a.provs = append(a.provs, p.ID)
	}
	upUse, provUse := map[string]int64{}, map[string]int64{}
	for _, l := range order {
		a := byLedger[l]
		ups, provs := l.FleetUse(a.ups, a.provs)
		if ups == nil {
			continue
		}
		for _, id := range a.ups {
			upUse[id] = ups[id]
		}
		for _, id := range a.provs {
			provUse[id] = provs[id]
		}
	}
	for i := range snap.Upstreams {
		if n, ok := upUse[snap.Upstreams[i].ID]; ok {
			snap.Upstreams[i].FleetInflight = new(n)
		}
	}
	for i := range snap.Providers {
		if n, ok := provUse[snap.Providers[i].ID]; ok {
			snap.Providers[i].FleetInflight = new(n)
		}
	}
}

// stateStatus reads one upstream's pooled state; b is its backoff scope
// (nil = none).
func stateStatus(s *ledger.UpstreamState, b *ledger.Backoff, now time.Time) upstreamStatus {
	us := upstreamStatus{
		ID:         s.ID(),
		Inflight:   s.Inflight(),
		FailStreak: s.FailStreak(),
	}
	if l := s.Limit(); l != ledger.Unlimited {
		us.Limit = &l
	}
	left := s.CoolingLeft(b, now)
	// The end of any Retry-After hold: the upstream's own, or its scope's.
	held := s.HeldUntil()
	if b != nil {
		hard, last := b.HoldAndLastFailure()
		if hard.After(held) {
			held = hard
		}
		if !last.IsZero() {
			us.LastFailureAt = &last
		}
	}
	if f := s.LastFailure(); f != nil {
		us.LastFailure = &f.What
		if us.LastFailureAt == nil {
			us.LastFailureAt = &f.At
		}
	}
	if p := s.LastProbe(); p != nil {
		us.LastProbe = &probeRecord{Result: p.What, At: p.At}
	}
	if left > 0 {
		us.CoolingSeconds = math.Round(left.Seconds()*1000) / 1000
		us.CoolingReason = &reasonFailure
		// The hold is the reason when it is what ends last (a millisecond
		// of slack for the two clocks the writers read).
		if !held.Before(now.Add(left - time.Millisecond)) {
			us.CoolingReason = &reasonRetryAfter
		}
	}
	return us
}

// probeTotals reads the probe counters per upstream. Collect only reads: it
// creates no series (GetMetricWithLabelValues would).
func probeTotals() map[string]probeCounts {
	out := make(map[string]probeCounts)
	ch := make(chan prometheus.Metric, 64)
	go func() {
		getMetrics().probes.Collect(ch)
		close(ch)
	}()
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) != nil || pb.Counter == nil {
			continue
		}
		var id, result string
		for _, l := range pb.Label {
			switch l.GetName() {
			case "upstream":
				id = l.GetValue()
			case "result":
				result = l.GetValue()
			}
		}
		c := out[id]
		switch result {
		case "ok":
			c.OK += int64(pb.Counter.GetValue())
		case "fail":
			c.Fail += int64(pb.Counter.GetValue())
		}
		out[id] = c
	}
	return out
}

// queueDepths copies the scheduler's waiters per model.
func queueDepths() map[string]int {
	out := make(map[string]int)
	forEachQueue(func(model string, d int) { out[model] = d })
	return out
}

// Verdicts of GET /llm_route/explain, one per upstream of the model.
const (
	verdictAvailable = "available"
	verdictBusy      = "busy"
	verdictCooling   = "cooling"
	verdictAPI       = "api_not_served"
	verdictContext   = "context"  // context_window smaller than ?tokens
	verdictCapacity  = "capacity" // a provider-wide bound is full
)

// Reasons a context or capacity verdict gives.
const (
	reasonContextWindow = "context_window"
	reasonLongContext   = "long_context"
	reasonProviderCap   = "provider_capacity"
)

// explanation is the answer of GET /llm_route/explain.
type explanation struct {
	Model string `json:"model"`
	// API is the front explained (?api=, default chat): an upstream that
	// cannot serve it is passed over.
	API string `json:"api"`
	// Choice is the upstream a request would be sent to now (null: none is
	// available, the request would queue or get a 503).
	Choice *string `json:"choice"`
	// Outcome says what happens to a request now: "upstream" (sent to
	// choice), "queue" (waits for a slot), "busy", "cooling" or
	// "api_not_served" (a 503), "context" (no upstream is large enough:
	// a 400), "model_not_allowed" (a 403 for the client key given).
	Outcome string `json:"outcome"`
	// Tokens echoes ?tokens=N (null if not given): the request's size
	// (prompt plus max_tokens). An upstream whose context_window is
	// smaller gets the "context" verdict; above the handler's
	// long_context_threshold, an upstream whose provider has no long slot
	// free gets "capacity" (reason long_context).
	Tokens     *int64 `json:"tokens"`
	QueueDepth int    `json:"queue_depth"`
	QueueSize  int    `json:"queue_size"`
	// Affinity is a short hash of the request's affinity key (session=,
	// the session headers or body of a POSTed request, or its history),
	// when a pool step needed one; never the key itself.
	Affinity  string            `json:"affinity,omitempty"`
	Upstreams []upstreamVerdict `json:"upstreams"`
	// Rule is, for a router model, the rule a request would match and its
	// chain (the upstreams above are that chain's).
	Rule *ruleExplanation `json:"rule,omitempty"`
}

// outcomeNotAllowed: the client key given (attr=key=ID) may not use the
// router model, or no model of the matching rule's chain (a 403).
const outcomeNotAllowed = "model_not_allowed"

// placementVerdict is a pool member's place in the request's placement.
type placementVerdict struct {
	Pool string `json:"pool"`
	// Rank is 1 for the member tried first within its pool step.
	Rank   int    `json:"rank"`
	Reason string `json:"reason"`
}

type upstreamVerdict struct {
	ID      string `json:"id"`
	Verdict string `json:"verdict"`
	// Reason refines a context or capacity verdict: "context_window",
	// "long_context" or "provider_capacity".
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail"`
	// Placement is set for a pool member.
	Placement *placementVerdict `json:"placement,omitempty"`
}

// explain walks the model's upstreams in order the way admission does
// (claimFrom), without claiming: the first that is neither cooling nor full
// is the choice.
func explain(rt *route, a api, tokens *int64, in *placeInput) explanation {
	now := in.now
	ex := explanation{Model: rt.name, API: a.String(), Tokens: tokens, QueueSize: rt.queueSize,
		Upstreams: make([]upstreamVerdict, 0, len(rt.targets))}
	ex.QueueDepth = queueDepths()[rt.name]
	allCooling, allContext, served := true, len(rt.targets) > 0, 0
	long := tokens != nil && rt.sizes.threshold > 0 && *tokens > int64(rt.sizes.threshold)
	// Pool members in a placement made now for the request described.
	pl := placeRequest(rt, in)
	defer donePlacing(pl)
	if pl != nil && pl.hasKey {
		ex.Affinity = shortHash(pl.reqKey)
	}
	var rank [maxPlaced]int // members placed so far per chain step
	for _, i := range rt.orderFor(pl) {
		u := rt.targets[i].up
		v := upstreamVerdict{ID: u.ID}
		if t := &rt.targets[i]; pl != nil && t.pool != nil && t.step < maxPlaced {
			rank[t.step]++
			v.Placement = &placementVerdict{Pool: t.pool.id, Rank: rank[t.step], Reason: pl.reason[t.base].String()}
		}
		if u.apis.canServe(a) {
			served++
		}
		if tokens != nil && u.window > 0 && int64(u.window) < *tokens && u.apis.canServe(a) {
			v.Verdict, v.Reason = verdictContext, reasonContextWindow
			v.Detail = "context too small: window " + strconv.Itoa(u.window) + " < " + strconv.FormatInt(*tokens, 10) + " tokens"
			ex.Upstreams = append(ex.Upstreams, v)
			continue
		}
		if u.apis.canServe(a) {
			allContext = false
		}
		inflight, limit := u.State.Inflight(), u.State.Limit()
		switch left := u.Cooling(now); {
		case !u.apis.canServe(a):
			v.Verdict = verdictAPI
			v.Detail = "does not serve " + a.String()
		case left > 0:
			st := stateStatus(u.State, u.Backoff, now)
			v.Verdict = verdictCooling
			v.Detail = "cooling " + strconv.Itoa(int(math.Ceil(left.Seconds()))) + "s (" + *st.CoolingReason + ")"
		case inflight >= limit:
			allCooling = false
			v.Verdict = verdictBusy
			v.Detail = "busy " + slots(inflight, limit)
		case long && u.Long.Full():
			allCooling = false
			v.Verdict, v.Reason = verdictCapacity, reasonLongContext
			v.Detail = "long-context slots of provider " + u.Provider + " full, " +
				slots(u.Long.Inflight(), u.Long.Limit())
		case u.ProviderFull():
			allCooling = false
			v.Verdict, v.Reason = verdictCapacity, reasonProviderCap
			v.Detail = "provider " + u.Provider + " at capacity " + slots(u.Prov.Inflight(), u.Capacity)
		default:
			allCooling = false
			v.Verdict = verdictAvailable
			if ex.Choice == nil {
				id := u.ID
				ex.Choice = &id
				v.Detail = "would take it, " + slots(inflight, limit)
				if !u.apis.has(a) {
					v.Detail += ", translated to chat"
				}
			} else {
				v.Detail = "free " + slots(inflight, limit) + ", not reached"
			}
		}
		ex.Upstreams = append(ex.Upstreams, v)
	}
	// The same order of decisions as admit and wait.
	back, _ := soonestBack(rt, now)
	queueRoom := rt.queueSize > ex.QueueDepth
	switch {
	case served == 0:
		ex.Outcome = verdictAPI // the 503 no_upstream_for_api
	case ex.Choice != nil:
		ex.Outcome = "upstream"
	case allContext:
		ex.Outcome = verdictContext // a 400 context_length_exceeded
	case allCooling && (rt.queueSize == 0 || rt.queueTimeout > 0 && back > rt.queueTimeout):
		// Without a queue, or when the cooling outlasts queue_timeout,
		// waiting would not hide an outage: the cooling 503. Without a
		// queue_timeout a request waits for the cooling to end (or is
		// refused as queue full), like one waiting for a busy slot.
		ex.Outcome = verdictCooling
	case queueRoom:
		ex.Outcome = "queue"
	default:
		ex.Outcome = verdictBusy
	}
	return ex
}

// slots renders "in use/limit" ("3/∞" when unlimited).
func slots(inflight, limit int64) string {
	l := "∞"
	if limit != ledger.Unlimited {
		l = strconv.FormatInt(limit, 10)
	}
	return strconv.FormatInt(inflight, 10) + "/" + l + " slots in use"
}
