package llmroute

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

// The metric names are those of the original llm-proxy, so existing
// dashboards keep working. The collectors are package-level and registered
// into each config's registry, so counters continue across reloads and a
// second handler instance in the same config does not panic.
var (
	metricsOnce sync.Once
	metrics     *routeMetrics
)

type routeMetrics struct {
	requests  *prometheus.CounterVec
	probes    *prometheus.CounterVec
	queueWait *prometheus.HistogramVec
	resumes   *prometheus.CounterVec // resume.go
	repeats   *prometheus.CounterVec // repeat.go
	refusals  *prometheus.CounterVec // errors.go
	// placements counts pool members' placements by reason (place.go).
	placements *prometheus.CounterVec
	// shadows counts shadow copies by shadow model and result (shadow.go).
	shadows *prometheus.CounterVec
	// rules counts router model requests by rule and effort (rules.go).
	rules *prometheus.CounterVec
	// judge counts router models' judge questions by result (judge.go).
	judge *prometheus.CounterVec
	// keyRequests counts exchanges sent with a provider pool key, by
	// the key's index and how the provider took it (keypool.go).
	keyRequests *prometheus.CounterVec
	byReason    map[string]prometheus.Counter
	state       stateCollector
	vis         visibilityMetrics // usage.go
}

func getMetrics() *routeMetrics {
	metricsOnce.Do(func() {
		metrics = &routeMetrics{
			requests: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "llm_proxy_requests_total",
				Help: "Chat completion attempts by outcome; every failover attempt counts. result: ok, 4xx, 429, 402, 5xx, net_err, timeout, cancelled.",
			}, []string{"model", "upstream", "provider", "result"}),
			probes: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "llm_proxy_probe_pings_total",
				Help: "Background probes of cooling upstreams. result: ok (back in the pool) or fail.",
			}, []string{"upstream", "provider", "result"}),
			queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Name:    "llm_proxy_queue_wait_seconds",
				Help:    "Time requests spent waiting for a slot. result: admitted, timeout, full, cancelled.",
				Buckets: []float64{0, .005, .025, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
			}, []string{"model", "result"}),
			resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "llm_proxy_stream_resumes_total",
				Help: "Broken streams of models with resume on, by how the continuation ended. result: ok, diverged, failed.",
			}, []string{"model", "result"}),
			repeats: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "llm_proxy_repeat_guard_total",
				Help: "Loops the repeat guard caught, by the upstream whose answer looped. result: recovered (the answer went on elsewhere), cut (it ended there with finish reason length).",
			}, []string{"model", "upstream", "result"}),
			refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "llm_proxy_rejected_total",
				Help: "Requests the proxy refused itself, by reason: invalid_api_key, model_not_allowed, rate_limited, budget, unknown_model, bad_request, too_large, context_too_long, unsupported_endpoint, method, cors, api_not_served, busy, cooling, queue_full, queue_timeout, all_failed, upstream_auth, upstream_not_found, other.",
			}, []string{"reason"}),
			placements: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "llm_proxy_placements_total",
				Help: "Requests sent to a pool member, by why it was chosen. reason: first, least_busy, weighted, pinned, warm, cold, waited.",
			}, []string{"pool", "upstream", "reason"}),
			rules: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "llm_proxy_rule_requests_total",
				Help: "Requests to router models, by the rule that took them and the request's effort (low, medium, high); refused ones included.",
			}, []string{"model", "rule", "effort"}),
			shadows: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "llm_proxy_shadow_requests_total",
				Help: "Shadow copies of router model requests, by the shadow model and result: an attempt result (ok, 4xx, 5xx, timeout, cancelled, …), or not sent: busy (no slot free at once, or a client waiting), dropped (too many copies running), skipped (the model cannot take the request).",
			}, []string{"model", "result"}),
			judge: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "llm_proxy_judge_total",
				Help: "Questions to router models' judges (experimental), by result: low, medium, high (the answer, taken); late, error, unparsable (medium instead); busy (no slot free at once, not asked), empty (no user text, not asked), cancelled (the client left).",
			}, []string{"model", "result"}),
			keyRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "llm_proxy_provider_key_requests_total",
				Help: "Requests sent with a key of a provider's key pool, by provider, key (its index in keys, never the key) and result: ok (the provider took the key), auth, quota, rate (it refused the key, which cools), failed (the exchange failed for another reason).",
			}, []string{"provider", "key", "result"}),
			vis: newVisibilityMetrics(),
		}
		// Every reason's series exists from the start (at 0), so that a
		// rate over it is defined before the first refusal.
		metrics.byReason = make(map[string]prometheus.Counter)
		for _, reason := range refusalReasons {
			metrics.byReason[reason] = metrics.refusals.WithLabelValues(reason)
		}
		metrics.byReason["other"] = metrics.refusals.WithLabelValues("other")
	})
	return metrics
}

// rejected is the llm_proxy_rejected_total series of a reason.
func (m *routeMetrics) rejected(reason string) prometheus.Counter {
	if c := m.byReason[reason]; c != nil {
		return c
	}
	return m.refusals.WithLabelValues(reason)
}

// register adds the collectors to a config's registry; a collector already
// there (a second handler in the same config) is fine.
func (m *routeMetrics) register(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range append([]prometheus.Collector{m.requests, m.probes, m.queueWait, m.resumes, m.repeats, m.refusals, m.placements, m.rules, m.shadows, m.judge, m.keyRequests, m.state}, append(ledger.Collectors(), m.vis.collectors()...)...) {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// stateCollector reports gauges straight from the pooled state at scrape
// time, so they can never drift from the accounting (old-config streams that
// end after a reload included).
type stateCollector struct{}

var (
	inflightDesc = prometheus.NewDesc("llm_proxy_upstream_inflight",
		"Slots of the upstream in use right now.", []string{"upstream", "provider"}, nil)
	failStreakDesc = prometheus.NewDesc("llm_proxy_upstream_fail_streak",
		"Consecutive failed attempts on the upstream.", []string{"upstream", "provider"}, nil)
	coolingDesc = prometheus.NewDesc("llm_proxy_upstream_cooling_seconds",
		"Seconds until the upstream leaves backoff (0 = available).", []string{"upstream", "provider"}, nil)
	queueDepthDesc = prometheus.NewDesc("llm_proxy_queue_depth",
		"Requests waiting for a slot.", []string{"model"}, nil)
)

func (stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inflightDesc
	ch <- failStreakDesc
	ch <- coolingDesc
	ch <- queueDepthDesc
}

// Collect reports every upstream of a loaded config and every upstream that
// a reload removed while requests still run on it (until the last ends, when
// release drops it from draining), then the queue depths.
func (stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	ledger.EachUpstream(func(s *ledger.UpstreamState) {
		p, id := s.ProviderID(), s.ID()
		ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(s.Inflight()), id, p)
		ch <- prometheus.MustNewConstMetric(failStreakDesc, prometheus.GaugeValue, float64(s.FailStreak()), id, p)
		cooling := max(s.CoolingLeft(s.Backoff(), now), 0).Seconds()
		ch <- prometheus.MustNewConstMetric(coolingDesc, prometheus.GaugeValue, cooling, id, p)
	})

	// Waiters of a model no config has any more still show until they
	// leave; a model without waiters shows while a running config queues it.
	depths := make(map[string]int)
	forEachQueue(func(model string, depth int) { depths[model] = depth })
	if queued := liveQueues.Load(); queued != nil {
		for model := range *queued {
			if _, ok := depths[model]; !ok {
				depths[model] = 0
			}
		}
		for model, depth := range depths {
			if depth == 0 && !(*queued)[model] {
				delete(depths, model)
			}
		}
	}
	for model, depth := range depths {
		ch <- prometheus.MustNewConstMetric(queueDepthDesc, prometheus.GaugeValue, float64(depth), model)
	}
}

// ---- which series a loaded config has ----

// A config's handlers join one generation (keyed by the config's events
// app, one per loaded config). When the config has started, the series of
// models and upstreams that none of its handlers has are deleted: a reload
// that renames or removes them leaves no stale series. A config that never
// starts (a failed load, `caddy validate`) deletes, when it is cleaned up,
// the series it created while provisioning that the running config does not
// have, so it changes nothing.
type generation struct {
	handlers map[*Handler]bool
	started  bool
}

var generations = struct {
	mu       sync.Mutex
	byConfig map[any]*generation
	current  *generation // the last config that started
}{byConfig: make(map[any]*generation)}

// liveQueues is the set of model names that the running config gives a
// queue, for llm_proxy_queue_depth (nil before any config started).
var liveQueues atomic.Pointer[map[string]bool]

// joinGeneration adds h to the generation of its config.
func joinGeneration(config any, h *Handler) *generation {
	generations.mu.Lock()
	defer generations.mu.Unlock()
	g := generations.byConfig[config]
	if g == nil {
		g = &generation{handlers: make(map[*Handler]bool)}
		generations.byConfig[config] = g
	}
	g.handlers[h] = true
	return g
}

// startGeneration makes g the running config and drops every series it
// does not have. Each handler's started hook calls it; the repeats find
// nothing more to drop.
func startGeneration(g *generation) {
	generations.mu.Lock()
	defer generations.mu.Unlock()
	g.started = true
	generations.current = g
	pruneSeries(g)
}

// leaveGeneration removes a cleaned-up handler. If its config never
// started, the series its provisioning created go again; if it was the
// running config and nothing replaced it (Caddy stopped), every series goes.
func leaveGeneration(h *Handler) {
	g := h.generation
	if g == nil {
		return
	}
	h.generation = nil
	generations.mu.Lock()
	defer generations.mu.Unlock()
	delete(g.handlers, h)
	if len(g.handlers) == 0 {
		delete(generations.byConfig, h.events)
	}
	switch {
	case !g.started:
		pruneSeries(generations.current)
	case g == generations.current && len(g.handlers) == 0:
		generations.current = nil
		pruneSeries(nil)
	}
}

// liveSeries are the label sets of one generation.
type liveSeries struct {
	targets   map[[3]string]bool // model, upstream, provider
	upstreams map[[2]string]bool // upstream, provider
	models    map[string]bool
	queued    map[string]bool    // models with a queue
	keys      map[string]bool    // client key ids
	members   map[[2]string]bool // pool, upstream
	rules     map[[2]string]bool // router model, rule
	shadows   map[string]bool    // shadow models
	judged    map[string]bool    // router models with a judge
	provKeys  map[[2]string]bool // provider, index of a pool key
}

func seriesOf(g *generation) liveSeries {
	s := liveSeries{
		targets:   make(map[[3]string]bool),
		upstreams: make(map[[2]string]bool),
		models:    make(map[string]bool),
		queued:    make(map[string]bool),
		keys:      make(map[string]bool),
		members:   make(map[[2]string]bool),
		rules:     make(map[[2]string]bool),
		shadows:   make(map[string]bool),
		judged:    make(map[string]bool),
		provKeys:  make(map[[2]string]bool),
	}
	if g == nil {
		return s
	}
	for h := range g.handlers {
		for _, k := range h.Keys {
			s.keys[k.ID] = true
		}
		for _, p := range h.table.pools {
			for _, m := range p.members {
				s.members[[2]string{p.id, m}] = true
			}
		}
		for _, u := range h.table.upstreams {
			s.upstreams[[2]string{u.ID, u.Provider}] = true
			if u.keys != nil {
				for _, k := range u.keys.keys {
					s.provKeys[[2]string{u.Provider, k.label}] = true
				}
			}
		}
		for _, rt := range h.table.routes {
			if rt.rules != nil {
				for _, ru := range rt.rules.rules {
					s.rules[[2]string{rt.name, ru.name}] = true
					if ru.shadowSend != nil {
						s.shadows[ru.shadowSend.model] = true
					}
				}
				if rt.rules.judging != nil {
					s.judged[rt.name] = true
				}
			}
			s.models[rt.name] = true
			if rt.queueSize > 0 {
				s.queued[rt.name] = true
			}
			for _, t := range rt.targets {
				s.targets[[3]string{rt.name, t.up.ID, t.up.Provider}] = true
			}
		}
	}
	return s
}

// pruneSeries deletes the counter and histogram series of label sets that g
// (nil = no config) does not have, and publishes its queued models. Called
// with generations.mu held, on a reload only: never on the request path.
func pruneSeries(g *generation) {
	live := seriesOf(g)
	liveQueues.Store(&live.queued)
	m := getMetrics()
	deleteSeries(m.requests, func(l prometheus.Labels) bool {
		return live.targets[[3]string{l["model"], l["upstream"], l["provider"]}]
	})
	deleteSeries(m.probes, func(l prometheus.Labels) bool {
		return live.upstreams[[2]string{l["upstream"], l["provider"]}]
	})
	deleteSeries(m.queueWait, func(l prometheus.Labels) bool {
		return live.models[l["model"]]
	})
	deleteSeries(m.placements, func(l prometheus.Labels) bool {
		return live.members[[2]string{l["pool"], l["upstream"]}]
	})
	deleteSeries(m.rules, func(l prometheus.Labels) bool {
		return live.rules[[2]string{l["model"], l["rule"]}]
	})
	deleteSeries(m.shadows, func(l prometheus.Labels) bool {
		return live.shadows[l["model"]]
	})
	deleteSeries(m.judge, func(l prometheus.Labels) bool {
		return live.judged[l["model"]]
	})
	deleteSeries(m.keyRequests, func(l prometheus.Labels) bool {
		return live.provKeys[[2]string{l["provider"], l["key"]}]
	})
	m.vis.prune(live)
	pruneKeySeries(live.keys)
}

// labelledVec is what CounterVec and HistogramVec have in common.
type labelledVec interface {
	prometheus.Collector
	Delete(prometheus.Labels) bool
}

// deleteSeries deletes every series of vec whose labels keep rejects. The
// series are read first and deleted after: Delete takes the lock that
// Collect holds.
func deleteSeries(vec labelledVec, keep func(prometheus.Labels) bool) {
	ch := make(chan prometheus.Metric, 64)
	go func() {
		vec.Collect(ch)
		close(ch)
	}()
	var drop []prometheus.Labels
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) != nil {
			continue
		}
		l := make(prometheus.Labels, len(pb.GetLabel()))
		for _, lp := range pb.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if !keep(l) {
			drop = append(drop, l)
		}
	}
	for _, l := range drop {
		vec.Delete(l)
	}
}
