package llmroute

import (
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// The route table: what one config compiles its providers, upstreams and
// models into, once, at provision. It is plain data the request path
// reads; provisioning builds it (provision.go) and nothing on the request
// path calls back into provisioning. The live counts an upstream carries
// (slots, backoff) are pointers into the shared state (llmroute/ledger),
// which outlives the table.

// routeTable is one config's compiled routing.
type routeTable struct {
	upstreams map[string]*upstream
	pools     map[string]*pool
	routes    map[string]*route
	// apiRoutes[api] are the models' routes restricted to the upstreams
	// that can serve api (apiSet.canServe): a chat request never goes to
	// a messages-only upstream, nor an embeddings request to a chat-only
	// one. A route all of whose upstreams can is the route itself; a model
	// with none is absent.
	apiRoutes [numAPIs]map[string]*route
	// routers: some model is a router model (rules.go); without one, a
	// request reads no rule members and tries no effort suffix.
	routers         bool
	anthropicModels []byte // GET …/models with anthropic-version, pre-encoded
	geminiModels    []byte // GET …/v1beta/models, pre-encoded
	modelList       []string
	modelsBody      []byte
	created         int64
}

// upstream is one upstream with every setting resolved once at provision
// time (most specific wins: upstream → provider → default) and its shared
// state adopted from the pools.
type upstream struct {
	// Upstream is what the ledger counts: ids, limit and capacity, and
	// the pooled state (slots, provider capacity, backoff, long-context
	// slots) the upstream claims in.
	ledger.Upstream

	model              string
	idAny, providerAny any      // id and provider boxed once, for placeholders
	hist               *history // the last minutes' traffic (history.go)
	// timings: a member of a cache_aware pool, whose answers are read for
	// llama.cpp's timings too (the cache it reused).
	timings bool
	// keysGoneUntil (unix nanos) is when the pool exhaustion that
	// counted as this upstream's failure ends (keysGone).
	keysGoneUntil atomic.Int64

	base       string                 // the provider URL, no trailing slash
	url        string                 // provider URL + /chat/completions
	target     *url.URL               // url, parsed once
	auth       string                 // the key header's value ("Bearer <key>" for bearer), or "" for none
	authHdr    string                 // the key header's canonical name (provider auth)
	authPrefix string                 // what goes before a key in authHdr ("Bearer " for bearer)
	keys       *keyPool               // the provider's key pool (keypool.go); nil: auth alone
	ownKeyHdr  string                 // the provider's client_key_header, canonical; "" for none
	urls       [numEndpoints]*url.URL // provider URL + each endpoint path, parsed once
	apis       apiSet                 // the APIs served natively
	keepBill   bool                   // provider keep_billing_header
	headers    [][2]string
	forward    []string          // provider forward_headers, canonical
	transport  http.RoundTripper // the provider's transport module, else the handler's default
	sessionHdr string

	// authValue and headerValues are auth and headers as header values,
	// built once: upstream requests share them (nothing on the way to the
	// transport mutates a request header's slice in place).
	authValue    []string
	headerValues []headerValue

	think         transform.ThinkMode
	firstByte     time.Duration // 0 = disabled
	streamIdle    time.Duration // 0 = disabled
	probeInterval time.Duration // 0 = disabled
	backoffScope  string        // "upstream", "provider" or "" (none)
	backoffCap    time.Duration
	retries       int           // same-upstream retries of a 5xx or connection error
	retryWait     time.Duration // longest Retry-After waited out in place; 0 = never
	window        int           // context window in tokens; 0 = unchecked

	// led is the ledger of the handler that compiled the upstream: its
	// claims, releases, backoff and holds go there (llmroute/ledger).
	led   ledger.Ledger
	price prices // for client keys' budgets (budget.go)

	basePatch *transform.Patch // provider patch then upstream patch
	probeBody []byte           // the probe request, patches applied
	probeEP   endpoint         // where the probe goes: chat, else an API the upstream serves
	reasoning string
	emptyOK   bool
	prefill   bool // takes an assistant prefill (resume.go)
}

// tryClaim takes a slot on the upstream and a unit of its provider's
// capacity, both or neither, through its handler's ledger: in this process
// and, with the redis state, fleet-wide. forQueue tells that the claim is a
// waiter's turn, whose rollback must not wake the queue (it would hand the
// same turn out again).
func (u *upstream) tryClaim(forQueue bool) (int64, bool) {
	n, ok, wake := u.led.Claim(&u.Upstream)
	if wake && !forQueue {
		sched.dispatch() // a waiter that saw our transient slot may take it
	}
	return n, ok
}

// release frees the upstream slot and the provider unit claimed with it
// through its handler's ledger (fleet-wide first, with the redis state),
// which then wakes the queue once: a waiter may have been held by either.
func (u *upstream) release() int64 { return u.led.Release(&u.Upstream) }

// target is one entry of a model's upstream list with the request edit for
// that (model, upstream) pair precomputed.
type target struct {
	up   *upstream
	edit transform.RequestEdit
	// counters are this pair's llm_proxy_requests_total series, one per
	// result, looked up once instead of hashing labels per request.
	counters map[string]prometheus.Counter
	// long is the provider's long-context slot counter, set in the long
	// variants of a route (fitRoutes) only: a claim takes one of these too.
	long *ledger.LongSlots
	// series are the pair's tokens, TTFT and duration series (usage.go),
	// bound the same way; bound series also keep a request that ends on a
	// removed upstream from bringing its pruned series back.
	series targetSeries
	// pool is the pool of the chain step the target belongs to, nil for
	// an upstream named directly; step is that step's position in the
	// model's chain and base the target's index in the model's full
	// route (route variants copy targets, so both hold in every variant).
	pool       *pool
	step, base int
	member     int    // its place in the pool (the pool's member numbers)
	memberID   uint64 // placement.HashString of the upstream id
	weight     uint32 // the member's sticky weight in its pool
	// model is the model the target belongs to: in a router model's
	// chain, the used model (the completion log's chain_model).
	model string
	// mhist is model's ring of the last minutes (history.go).
	mhist *history
}

// ledger returns the ledger the route's upstreams count in (all of one
// handler, so the first one's); nil for a route without upstreams.
func (rt *route) ledger() ledger.Ledger {
	if len(rt.targets) == 0 {
		return nil
	}
	return rt.targets[0].up.led
}

// route is a client-visible model, compiled.
type route struct {
	name         string
	nameAny      any // name boxed once, for placeholders
	targets      []target
	queueSize    int
	queueTimeout time.Duration // 0 = until the client goes away
	dupKeys      uint64        // bits of the handler's watched keys this route reads or writes
	sizes        fitRoutes     // variants per request size (context windows, long context)
	resume       bool          // continue a broken stream on another upstream (resume.go)
	guard        *repeatConf   // the repeat guard, nil when off (repeat.go)
	// budgetOf is, in a route restricted to the upstreams a client key's
	// budget has room for (budget.go), the route it was cut from.
	budgetOf *route
	// rules make the route a router model's (rules.go): a request goes to
	// the chain its rule picks; targets are then the union of the chains.
	// nil for a plain model.
	rules *ruleSet
}

// order is the configured list order of a route's targets, as indexes
// into rt.targets: the order of a route without pool steps. A request
// walks orderFor (place.go), which ranks pool steps per request.
func (rt *route) order() []int {
	n := len(rt.targets)
	if n <= len(listOrder) {
		return listOrder[:n]
	}
	o := make([]int, n)
	for i := range o {
		o[i] = i
	}
	return o
}

// listOrder is 0…63: the configured order of any route that short,
// shared so that ordering allocates nothing.
var listOrder = func() (o [64]int) {
	for i := range o {
		o[i] = i
	}
	return o
}()
