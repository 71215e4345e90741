package llmroute

import (
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/keys"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// defaultOutputReserve is the output a request without max_tokens is
// assumed to produce when its worst case is reserved (SPEC §16).
const defaultOutputReserve = 4096

// prices are an upstream's prices in nano-USD per token (USD per million
// tokens × 1000); all zero for an upstream without prices.
type prices struct {
	input, output, cached float64
}

func compilePrices(u Upstream) prices {
	p := prices{input: u.PriceInput * 1000, output: u.PriceOutput * 1000, cached: u.PriceCachedInput * 1000}
	if u.PriceCachedInput == 0 {
		// No cache discount given: cached input costs what input costs.
		p.cached = p.input
	}
	return p
}

// cost prices a usage: cached input is inside input (SPEC §16).
func (p prices) cost(input, cached, output int64) keys.NanoUSD {
	cached = min(cached, input)
	return keys.NanoUSD(math.Ceil(float64(input-cached)*p.input + float64(cached)*p.cached + float64(output)*p.output))
}

// keyReq is a request made with a client key: the key, its worst-case
// size and the reservation of the running attempt.
type keyReq struct {
	h      *Handler
	k      *clientKey
	model  string
	input  int64 // estimated prompt tokens
	output int64 // max_tokens, 0 when the request sets none
	// noOutput: an embeddings request, whose worst case is its input.
	noOutput bool
	hold     keys.Hold
	// end ends the request's hold on a shared key store (fleetkeys.go).
	end func()
}

// worstCase is the reservation of an attempt at u: the estimated input
// plus max_tokens (else the default reserve) of output, priced at u.
func (kr *keyReq) worstCase(u *upstream) keys.Amount {
	out := kr.output
	switch {
	case kr.noOutput:
		out = 0
	case out <= 0:
		out = defaultOutputReserve
	}
	return keys.Amount{Tokens: kr.input + out, Spend: u.price.cost(kr.input, 0, out)}
}

// estimateInput is a cheap upper-leaning estimate of a body's prompt
// tokens: a token per four bytes of the JSON body (the usual figure for
// English text, and JSON's keys and quotes only add bytes).
func estimateInput(body []byte) int64 { return int64(len(body)+3) / 4 }

// admitKey runs the key's checks for a generation request to rt, in SPEC
// §16's order after authentication: model allowed (403), request rate (429
// rate_limit_exceeded), then whether the budget leaves room for the
// cheapest of the model's upstreams (429 insufficient_quota). The
// reservation itself is taken per attempt (reserveAttempt). A refusal is
// written and reported as nil.
func (h *Handler) admitKey(w http.ResponseWriter, r *http.Request, f front, k *clientKey, rt *route, body []byte) *keyReq {
	if !k.allows(rt.name) {
		h.refuseKey(w, r, f, k, rt.name, errModelNotAllowed(rt.name))
		return nil
	}
	now := time.Now()
	if ok, wait := h.keyStore.Allow(k.id, now, k.rate); !ok {
		h.refuseKey(w, r, f, k, rt.name, errRateLimited(wait))
		return nil
	}
	kr := &keyReq{h: h, k: k, model: rt.name, noOutput: f == frontEmbeddings}
	if k.budget.Empty() {
		return kr
	}
	kr.input = estimateInput(body)
	kr.output = transform.MaxTokens(body)
	cheapest := kr.worstCase(rt.targets[0].up)
	for _, t := range rt.targets[1:] {
		if c := kr.worstCase(t.up); c.Spend < cheapest.Spend {
			cheapest = c
		}
	}
	// Checked, not reserved: it refuses before the request takes a slot or
	// waits in a queue it could only leave with a 429, and holds nothing
	// that a concurrent request's reservation could be refused for.
	if limit := h.keyStore.Room(k.id, now, k.budget, cheapest); limit != keys.LimitNone {
		h.refuseKey(w, r, f, k, rt.name, errOverBudget(limit, keys.UntilReset(limit, now)))
		return nil
	}
	if fk, ok := h.keyStore.(*fleetKeys); ok {
		kr.end = fk.begin()
	}
	return kr
}

// reserveAttempt reserves the worst case of an attempt at rt.targets[idx],
// whose slot the caller holds. When the budget has no room for it, the slot
// is given back and the next upstream of the model is claimed instead, so
// a cheaper one further down may serve (SPEC §16). It returns the index
// reserved on, or the refusal to answer when none is left.
func (h *Handler) reserveAttempt(kr *keyReq, rt *route, idx int) (int, *apiError) {
	if kr.k.budget.Empty() {
		return idx, nil
	}
	var limit keys.Limit
	for {
		u := rt.targets[idx].up
		now := time.Now()
		kr.hold, limit = h.keyStore.Reserve(kr.k.id, now, kr.k.budget, kr.worstCase(u))
		if limit == keys.LimitNone {
			return idx, nil
		}
		if c := h.logger.Check(zapcore.DebugLevel, "budget has no room on upstream"); c != nil {
			c.Write(zap.String("key", kr.k.id), zap.String("upstream", u.id), zap.Stringer("limit", limit))
		}
		rt.targets[idx].long.release()
		u.release()
		next, ok := h.claimNext(rt, idx+1)
		if !ok {
			kr.hold = keys.Hold{}
			e := errOverBudget(limit, keys.UntilReset(limit, now))
			kr.served(e.code)
			return -1, &e
		}
		idx = next
	}
}

// settleAttempt settles the attempt's reservation to the usage the
// upstream reported, priced at t's upstream, and counts the key's tokens
// and spend. An answer that reported no usage keeps its worst case
// charged when it succeeded (nothing says it cost less) and is released
// when it failed or was cancelled before its usage arrived.
func (h *Handler) settleAttempt(kr *keyReq, t *target, res attemptResult) {
	u := t.up
	var actual keys.Amount
	if us := res.usage; us.Seen {
		actual = keys.Amount{Tokens: us.Input + us.Output, Spend: u.price.cost(us.Input, us.CachedInput, us.Output)}
		for i, n := range [...]int64{us.Input, us.Output, us.CachedInput, us.Reasoning} { // tokenTypes' order
			if n > 0 {
				kr.k.tokens[i].Add(float64(n))
			}
		}
	} else if res.result == resultOK {
		actual = kr.hold.Reserved
	}
	if actual.Spend > 0 {
		kr.k.spend.Add(float64(actual.Spend) / 1e9)
	}
	if kr.hold.ID != "" {
		h.keyStore.Settle(kr.hold, actual, time.Now())
	} else { // a key without a budget reserved nothing; its use still counts
		h.keyStore.Record(kr.k.id, actual, time.Now())
	}
	kr.hold = keys.Hold{}
	if res.out != outFailover {
		kr.served(res.result)
	}
}

// release ends the request: it gives back a reservation no settlement
// ended (the attempt panicked, an aborted stream, so nothing is charged),
// then its hold on a shared key store.
func (kr *keyReq) release() {
	if kr.hold.ID != "" {
		kr.h.keyStore.Settle(kr.hold, keys.Amount{}, time.Now())
		kr.hold = keys.Hold{}
	}
	if kr.end != nil {
		kr.end()
		kr.end = nil
	}
}

// keyServed counts a request of the key that reached an upstream, by its
// final result.
func (kr *keyReq) served(result string) {
	keyMetrics.requests.WithLabelValues(kr.k.id, kr.model, result).Inc()
}

// tokenTypes are the type labels of llm_proxy_key_tokens_total.
var tokenTypes = [4]string{"input", "output", "cached_input", "reasoning"}

// keyMetrics are the per-key series (SPEC §16). Like the other
// collectors they are process-wide, so counters survive reloads.
var keyMetrics = struct {
	requests *prometheus.CounterVec
	tokens   *prometheus.CounterVec
	spend    *prometheus.CounterVec
}{
	requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llm_proxy_key_requests_total",
		Help: "Requests made with a client key, by model and result: an attempt result (ok, 4xx, 5xx, …) for requests sent upstream, or the refusal (model_not_allowed, rate_limit_exceeded, insufficient_quota).",
	}, []string{"key", "model", "result"}),
	tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llm_proxy_key_tokens_total",
		Help: "Tokens the upstreams reported for a client key's requests. type: input, output, cached_input, reasoning.",
	}, []string{"key", "type"}),
	spend: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llm_proxy_key_spend_usd_total",
		Help: "Spend charged to a client key, in USD, priced with the upstreams' price_* fields.",
	}, []string{"key"}),
}

// metricsForKeys registers the key collectors in the config's registry.
func (h *Handler) metricsForKeys() error {
	reg := h.ctx.GetMetricsRegistry()
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{keyMetrics.requests, keyMetrics.tokens, keyMetrics.spend} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// pruneKeySeries drops the series of keys no loaded config names (live),
// as pruneSeries does for models and upstreams; kept keys keep counting.
func pruneKeySeries(live map[string]bool) {
	keep := func(l prometheus.Labels) bool { return live[l["key"]] }
	deleteSeries(keyMetrics.requests, keep)
	deleteSeries(keyMetrics.tokens, keep)
	deleteSeries(keyMetrics.spend, keep)
}
