package llmroute

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Latency buckets for LLM traffic, in seconds. Time to first token spans a
// cached short prompt (tens of ms) to a long prefill on a busy GPU (a
// minute); whole requests run to many minutes of generation.
var (
	ttftBuckets     = []float64{.05, .1, .25, .5, 1, 2, 4, 8, 15, 30, 60}
	durationBuckets = []float64{.1, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	// Overhead is the proxy's own time: reading and parsing the body,
	// picking an upstream, rewriting the request. Sub-millisecond normally.
	overheadBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .1}
)

// visibilityMetrics are the per-request series: tokens, TTFT, duration and
// the proxy's overhead.
type visibilityMetrics struct {
	tokens   *prometheus.CounterVec
	ttft     *prometheus.HistogramVec
	duration *prometheus.HistogramVec
	overhead prometheus.Histogram
}

func newVisibilityMetrics() visibilityMetrics {
	return visibilityMetrics{
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llm_proxy_tokens_total",
			Help: "Tokens the upstreams reported in their usage. type: input, output, cached_input, reasoning.",
		}, []string{"model", "upstream", "provider", "type"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llm_proxy_time_to_first_token_seconds",
			Help:    "From the request's arrival to the first response body byte written to the client.",
			Buckets: ttftBuckets,
		}, []string{"model", "upstream", "provider"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llm_proxy_request_duration_seconds",
			Help:    "From the request's arrival to the end of its answer, labelled with the upstream that answered and its result.",
			Buckets: durationBuckets,
		}, []string{"model", "upstream", "provider", "result"}),
		overhead: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "llm_proxy_overhead_seconds",
			Help:    "The proxy's own time from the request's arrival to sending it upstream (first attempt), queue wait excluded.",
			Buckets: overheadBuckets,
		}),
	}
}

func (v *visibilityMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{v.tokens, v.ttft, v.duration, v.overhead}
}

// prune drops the series of model/upstream/provider triples no loaded
// config has (see pruneSeries).
func (v *visibilityMetrics) prune(live liveSeries) {
	keep := func(l prometheus.Labels) bool {
		return live.targets[[3]string{l["model"], l["upstream"], l["provider"]}]
	}
	deleteSeries(v.tokens, keep)
	deleteSeries(v.ttft, keep)
	deleteSeries(v.duration, keep)
}

// targetSeries are one (model, upstream) pair's per-request series.
type targetSeries struct {
	tokens   [4]prometheus.Counter // input, output, cached_input, reasoning
	ttft     prometheus.Observer
	duration map[string]prometheus.Observer // by result
}

// bind looks the pair's series up once, at provision.
func (v *visibilityMetrics) bind(model, upstream, provider string) targetSeries {
	s := targetSeries{
		ttft:     v.ttft.WithLabelValues(model, upstream, provider),
		duration: make(map[string]prometheus.Observer, len(allResults)),
	}
	for i, typ := range [...]string{"input", "output", "cached_input", "reasoning"} {
		s.tokens[i] = v.tokens.WithLabelValues(model, upstream, provider, typ)
	}
	for _, res := range allResults {
		s.duration[res] = v.duration.WithLabelValues(model, upstream, provider, res)
	}
	return s
}

// observeRequest records the answered request: tokens, TTFT, duration.
func (h *Handler) observeRequest(t *target, res attemptResult, arrival time.Time) {
	s := &t.series
	if res.usage.Seen {
		for i, n := range [...]int64{res.usage.Input, res.usage.Output, res.usage.CachedInput, res.usage.Reasoning} {
			if n > 0 {
				s.tokens[i].Add(float64(n))
			}
		}
	}
	if !res.firstByte.IsZero() {
		s.ttft.Observe(res.firstByte.Sub(arrival).Seconds())
	}
	now := time.Now()
	if o := s.duration[res.result]; o != nil {
		o.Observe(now.Sub(arrival).Seconds())
	}
	ttft := time.Duration(-1)
	if !res.firstByte.IsZero() {
		ttft = res.firstByte.Sub(arrival)
	}
	var output int64
	if res.usage.Seen {
		output = res.usage.Output
	}
	t.recordAnswer(now.UnixNano(), ttft, output)
}

// observeOverhead records the first attempt's time from arrival to the
// upstream send, minus the queue wait.
func (h *Handler) observeOverhead(res attemptResult, arrival time.Time, queued time.Duration) {
	if res.sent.IsZero() {
		return
	}
	h.metrics.vis.overhead.Observe(max(res.sent.Sub(arrival)-queued, 0).Seconds())
}

// ttftField is the log's time to first token; zero when no byte reached the
// client.
func ttftField(res attemptResult, arrival time.Time) zap.Field {
	if res.firstByte.IsZero() {
		return zap.Duration("ttft", 0)
	}
	return zap.Duration("ttft", res.firstByte.Sub(arrival))
}
