package llmroute

import (
	"cmp"
	"errors"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/keys"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// defaultOutputReserve is the output a request without max_tokens is
// assumed to produce when its worst case is reserved.
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

// cost prices a usage: cached input is inside input.
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
	// noOutput: a request that generates nothing (embeddings), whose
	// worst case is its input.
	noOutput bool
	hold     keys.Hold
	// rt is the request's route restricted to the upstreams its budget
	// had room for when it was admitted (the route itself when all had).
	rt *route
	pl *placing // the request's placement order
	// end ends the request's hold on a shared key store (Ledger.KeepKeys).
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

// admitKey runs the key's checks for a generation request to rt, in the
// documented order after authentication: model allowed (403), request rate (429
// rate_limit_exceeded), then whether the budget leaves room for the worst
// case on at least one of the model's upstreams (429 insufficient_quota).
// The request then goes only to the upstreams its budget has room for
// (kr.rt): a busy upstream it fits is waited for like any other, rather
// than the request being refused because a dearer one it does not fit was
// free. The reservation itself is taken per attempt (reserveAttempt). A
// refusal is written and reported as nil.
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
	kr := &keyReq{h: h, k: k, model: rt.name, noOutput: !frontCodecs[f].generates(), rt: rt}
	if k.budget.Empty() {
		return kr
	}
	kr.input = estimateInput(body)
	kr.output = transform.MaxTokens(body)
	fit, limit := h.budgetFit(kr, rt, now)
	if fit == nil {
		h.refuseKey(w, r, f, k, rt.name, h.errNoRoom(kr, rt, limit, now))
		return nil
	}
	kr.rt = fit
	kr.end = h.led.KeepKeys()
	return kr
}

// budgetFit returns rt restricted to the upstreams whose worst case the
// key's budget has room for now (rt itself when all fit), or nil and the
// limit the cheapest would cross. It checks, not reserves: nothing is
// held while the request waits for a slot, so no concurrent reservation
// is refused for it. The worst cases differ only in price (the tokens are
// the same everywhere), so a budget with room for one has room for every
// cheaper one: the dearest is checked first (one call when all fit, the
// common case), then the others from the cheapest up.
func (h *Handler) budgetFit(kr *keyReq, rt *route, now time.Time) (*route, keys.Limit) {
	costs := make([]keys.Amount, len(rt.targets))
	for i := range rt.targets {
		costs[i] = kr.worstCase(rt.targets[i].up)
	}
	distinct := slices.Clone(costs)
	slices.SortFunc(distinct, func(a, b keys.Amount) int { return cmp.Compare(a.Spend, b.Spend) })
	distinct = slices.Compact(distinct)
	room := func(a keys.Amount) keys.Limit { return h.keyStore.Room(kr.k.id, now, kr.k.budget, a) }
	last := len(distinct) - 1
	limit := room(distinct[last])
	if limit == keys.LimitNone {
		return rt, keys.LimitNone
	}
	var most keys.NanoUSD = -1 // the dearest worst case with room
	for _, a := range distinct[:last] {
		if l := room(a); l != keys.LimitNone {
			if most < 0 {
				limit = l
			}
			break
		}
		most = a.Spend
	}
	if most < 0 {
		return nil, limit
	}
	sub := *rt
	sub.targets = nil
	sub.budgetOf = rt
	for i, t := range rt.targets {
		if costs[i].Spend <= most {
			sub.targets = append(sub.targets, t)
		}
	}
	return &sub, keys.LimitNone
}

// reserveAttempt reserves the worst case of an attempt at rt.targets[idx],
// whose slot the caller holds. When the budget has no room for it (a
// concurrent request of the key reserved in the meantime), the slot is
// given back and the next upstream of the model is claimed instead, so a
// cheaper one further down may serve. It returns the index
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
			c.Write(zap.String("key", kr.k.id), zap.String("upstream", u.ID), zap.Stringer("limit", limit))
		}
		rt.targets[idx].up.led.ReleaseLong(rt.targets[idx].long)
		u.release()
		next, ok := h.claimNext(rt, kr.pl, idx)
		if !ok {
			kr.hold = keys.Hold{}
			e := h.errNoRoom(kr, rt, limit, now)
			kr.served(e.code)
			return -1, &e
		}
		idx = next
	}
}

// errNoRoom is the 429 for a request whose worst case the budget has no
// room for on any upstream of rt. It says what did not fit, so that a
// client with nothing spent is not told its budget is used up: the worst
// case on the cheapest upstream (its tokens and prices), what is left of
// the limit it crossed, and the max_tokens that would fit when a lower
// one would.
func (h *Handler) errNoRoom(kr *keyReq, rt *route, limit keys.Limit, now time.Time) apiError {
	e := errOverBudget(limit, keys.UntilReset(limit, now))
	if limit == keys.LimitUnavailable || len(rt.targets) == 0 {
		return e
	}
	u := rt.targets[0].up
	for _, t := range rt.targets[1:] {
		if kr.worstCase(t.up).Spend < kr.worstCase(u).Spend {
			u = t.up
		}
	}
	e.message = kr.noRoom(u, limit, h.keyStore.Usage(kr.k.id, now))
	return e
}

// maxTokensMember is how many tokens, by estimateInput, a max_tokens
// member adds to a body that has none (`,"max_tokens":` and ten digits),
// so that the max_tokens the refusal suggests fits once it is sent.
const maxTokensMember = 8

// noRoom words a budget refusal: e.g. `this API key's spend_per_day budget
// has no room for this request: its worst case on upstream "cloud" is
// $0.081995 (15 prompt tokens at $5/M and 4096 output tokens at $20/M; the
// request sets no max_tokens), and $0.05 of the $0.05 spend_per_day is
// left; a max_tokens of at most 2494 would fit`.
func (kr *keyReq) noRoom(u *upstream, limit keys.Limit, us keys.Usage) string {
	a := kr.worstCase(u)
	out := a.Tokens - kr.input
	var b strings.Builder
	b.WriteString("this API key's " + limit.String() + " budget has no room for this request: its worst case on upstream ")
	b.WriteString(strconv.Quote(u.ID) + " is ")
	prompt := strconv.FormatInt(kr.input, 10) + " prompt tokens"
	output := strconv.FormatInt(out, 10) + " output tokens"
	if limit == keys.LimitTokensPerDay {
		b.WriteString(strconv.FormatInt(a.Tokens, 10) + " tokens (" + prompt + " and " + output)
	} else {
		b.WriteString(usd(a.Spend) + " (" + prompt + " at " + perMillion(u.price.input) + " and " + output +
			" at " + perMillion(u.price.output))
	}
	if !kr.noOutput && kr.output <= 0 {
		b.WriteString("; the request sets no max_tokens")
	}
	b.WriteString("), and ")
	bud := kr.k.budget
	switch limit {
	case keys.LimitTokensPerDay:
		b.WriteString(strconv.FormatInt(max(bud.TokensPerDay-us.TokensToday-us.ReservedToken, 0), 10) + " of the " +
			strconv.FormatInt(bud.TokensPerDay, 10) + " tokens_per_day")
	case keys.LimitSpendPerDay:
		b.WriteString(usd(max(bud.SpendPerDay-us.SpendToday-us.ReservedSpend, 0)) + " of the " + usd(bud.SpendPerDay) + " spend_per_day")
	case keys.LimitSpendPerMonth:
		b.WriteString(usd(max(bud.SpendPerMonth-us.SpendMonth-us.ReservedSpend, 0)) + " of the " + usd(bud.SpendPerMonth) + " spend_per_month")
	}
	b.WriteString(" is left")
	if us.ReservedToken > 0 || us.ReservedSpend > 0 {
		b.WriteString(" (running requests hold part of it until they end)")
	}
	if n := kr.fittingOutput(u, us); !kr.noOutput && n > 0 && n < out {
		b.WriteString("; a max_tokens of at most " + strconv.FormatInt(n, 10) + " would fit")
	}
	return b.String()
}

// fittingOutput is the largest max_tokens whose worst case at u stays
// within every limit of the key's budget given its usage us (0: none).
func (kr *keyReq) fittingOutput(u *upstream, us keys.Usage) int64 {
	in := kr.input
	if kr.output <= 0 {
		in += maxTokensMember
	}
	bud := kr.k.budget
	best := int64(math.MaxInt64)
	if bud.TokensPerDay > 0 {
		best = min(best, bud.TokensPerDay-us.TokensToday-us.ReservedToken-in)
	}
	spendLeft := func(limit, used keys.NanoUSD) {
		if limit <= 0 {
			return
		}
		left := float64(limit-used-us.ReservedSpend) - float64(in)*u.price.input
		switch {
		case left < 0:
			best = 0
		case u.price.output > 0:
			best = min(best, int64(left/u.price.output))
		}
	}
	spendLeft(bud.SpendPerDay, us.SpendToday)
	spendLeft(bud.SpendPerMonth, us.SpendMonth)
	return max(best, 0)
}

// usd renders nano-USD as dollars with up to six decimals.
func usd(n keys.NanoUSD) string {
	s := strconv.FormatFloat(float64(n)/1e9, 'f', 6, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return "$" + s
}

// perMillion renders a compiled price (nano-USD per token) as USD per
// million tokens.
func perMillion(p float64) string {
	return "$" + strconv.FormatFloat(p/1000, 'f', -1, 64) + "/M"
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
	now := time.Now().UnixNano()
	kr.k.hist.add(now, 2, actual.Spend)
	kr.k.hist.add(now, 3, actual.Tokens)
	if res.out != outFailover {
		kr.served(res.result)
		if res.result == resultOK {
			kr.k.hist.add(now, 0, 1)
		} else {
			kr.k.hist.add(now, 1, 1)
		}
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

// keyMetrics are the per-key series. Like the other
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
