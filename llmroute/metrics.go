package llmroute

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	state     stateCollector
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
		}
	})
	return metrics
}

// register adds the collectors to a config's registry; a collector already
// there (a second handler in the same config) is fine.
func (m *routeMetrics) register(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.probes, m.queueWait, m.state} {
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

func (stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	upstreamPool.Range(func(_, v any) bool {
		s := v.(*upstreamState)
		p := s.providerID()
		ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(s.inflight.Load()), s.id, p)
		ch <- prometheus.MustNewConstMetric(failStreakDesc, prometheus.GaugeValue, float64(s.failStreak.Load()), s.id, p)
		cooling := max(s.coolingLeft(s.backoff.Load(), now), 0).Seconds()
		ch <- prometheus.MustNewConstMetric(coolingDesc, prometheus.GaugeValue, cooling, s.id, p)
		return true
	})
	forEachQueue(func(model string, depth int) {
		ch <- prometheus.MustNewConstMetric(queueDepthDesc, prometheus.GaugeValue, float64(depth), model)
	})
}
