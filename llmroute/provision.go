package llmroute

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/placement"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
	"github.com/llm-route/caddy-llm-route/llmroute/wire/anthropic"
	"github.com/llm-route/caddy-llm-route/llmroute/wire/gemini"
)

// Defaults of the provider, upstream and handler options.
const (
	defaultRequestTimeout    = 5 * time.Minute
	defaultMaxRequestBody    = 32 << 20
	defaultFirstByteTimeout  = 30 * time.Second
	defaultStreamIdleTimeout = 30 * time.Second
	defaultProbeInterval     = time.Second
	defaultQueueTimeout      = 30 * time.Second
	defaultRetryAfterMax     = 5 * time.Minute
	defaultHeartbeat         = 15 * time.Second
	defaultClientWrite       = 30 * time.Second
)

// Provision resolves the config, adopts shared state and starts the prober.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.ctx = ctx
	h.logger = ctx.Logger()
	h.metrics = getMetrics()
	if err := h.metrics.register(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	h.joinConfig(ctx)
	if err := validateConfig(h.Providers, h.Upstreams, h.Pools, h.Models); err != nil {
		return err
	}
	if h.MaxRequestBody < 0 {
		return fmt.Errorf("llm_route config: max_request_body must not be negative")
	}
	if h.QueueSize < 0 {
		return fmt.Errorf("llm_route config: queue_size must not be negative")
	}
	h.requestTimeout = durationOr(defaultRequestTimeout, h.RequestTimeout)
	h.maxBody = h.MaxRequestBody
	if h.maxBody == 0 {
		h.maxBody = defaultMaxRequestBody
	}
	h.retryAfterMax = durationOr(defaultRetryAfterMax, h.RetryAfterMax)
	h.heartbeat = durationOr(defaultHeartbeat, h.HeartbeatInterval)
	h.clientWrite = durationOr(defaultClientWrite, h.ClientWriteTimeout)
	h.routeHeaders = h.RouteHeaders == nil || *h.RouteHeaders

	providers := make(map[string]*Provider, len(h.Providers))
	for i := range h.Providers {
		providers[h.Providers[i].ID] = &h.Providers[i]
	}
	repl := caddy.NewReplacer()
	if err := h.provisionState(repl); err != nil {
		return err
	}
	h.transport = newTransport()
	conns := make(map[string]*providerConn, len(h.Providers))
	providerPatches := make(map[string]*transform.Patch, len(h.Providers))
	for i := range h.Providers {
		p := &h.Providers[i]
		patch, err := transform.CompilePatch(p.Patch)
		if err != nil {
			return fmt.Errorf("llm_route config: provider %q: patch: %v", p.ID, err)
		}
		providerPatches[p.ID] = patch
		if conns[p.ID], err = h.connectProvider(ctx, p, repl); err != nil {
			return err
		}
	}

	h.table.upstreams = make(map[string]*upstream, len(h.Upstreams))
	backoffs := make(map[string]*ledger.Backoff)
	provStates := make(map[string]*ledger.ProviderState, len(h.Providers))
	provFresh := make(map[string]bool, len(h.Providers))
	for _, uc := range h.Upstreams {
		p := providers[uc.Provider]
		u, err := h.compileUpstream(uc, p, conns[p.ID], providerPatches[p.ID])
		if err != nil {
			return err
		}
		var fresh bool
		u.led = h.led
		u.State, fresh = h.refs.AdoptUpstream(u.ID)
		u.Capacity = ledger.Unlimited
		if p.Capacity > 0 {
			u.Capacity = int64(p.Capacity)
		}
		if _, ok := provStates[p.ID]; !ok {
			provStates[p.ID], provFresh[p.ID] = h.refs.AdoptProvider(p.ID)
		}
		u.Prov = provStates[p.ID]
		if provFresh[p.ID] {
			u.Prov.SetCapacity(u.Capacity) // nobody else uses it yet
		}
		if u.backoffScope != "" {
			scopeID := u.ID
			if u.backoffScope == "provider" {
				scopeID = u.Provider
			}
			key := ledger.BackoffKey(u.backoffScope, scopeID)
			b, ok := backoffs[key]
			if !ok {
				b = h.refs.AdoptBackoff(key)
				backoffs[key] = b
			}
			u.Backoff = b
		}
		if fresh {
			u.Apply(u.backoffCap) // nobody else uses it yet
		}
		h.table.upstreams[u.ID] = u
	}

	h.table.pools = h.compilePools(h.Pools)
	h.table.routes = make(map[string]*route, len(h.Models))
	for _, m := range h.Models {
		rt, err := h.compileRoute(m)
		if err != nil {
			return err
		}
		h.table.routes[rt.name] = rt
		h.table.modelList = append(h.table.modelList, rt.name)
		if len(m.Rules) > 0 {
			h.table.routers = true // compiled once the plain models are (compileRules)
			continue
		}
		for a := range numAPIs {
			if sub := rt.servingAPI(a); sub != nil {
				if h.table.apiRoutes[a] == nil {
					h.table.apiRoutes[a] = make(map[string]*route)
				}
				h.table.apiRoutes[a][rt.name] = sub
			}
		}
	}
	if h.LongContextThreshold < 0 {
		return fmt.Errorf("llm_route config: long_context_threshold must not be negative")
	}
	for _, rt := range h.table.routes {
		rt.prepareFit(h.LongContextThreshold)
	}
	for _, byName := range h.table.apiRoutes {
		for _, rt := range byName {
			rt.prepareFit(h.LongContextThreshold)
		}
	}
	if err := h.provisionRequests(); err != nil {
		return err
	}
	if err := h.compileRules(); err != nil {
		return err
	}
	h.table.created = time.Now().Unix()
	h.table.modelsBody = modelsListBody(h.table.modelList, h.table.created)
	h.table.anthropicModels = anthropic.ModelsBody(h.table.modelList, time.Unix(h.table.created, 0))
	h.table.geminiModels = gemini.ModelsBody(h.table.modelList)
	if err := h.provisionKeys(); err != nil {
		return err
	}

	h.logSummary()

	h.applySharedWhenStarted()

	h.stopProber = make(chan struct{})
	h.proberDone = make(chan struct{})
	go h.runProber()
	return nil
}

// providerConn is how one provider is reached: the resolved key and
// headers, and the transport.
type providerConn struct {
	auth      string // the key header's value, or "" for none
	authHdr   string // its name
	authPfx   string // "Bearer " for bearer auth
	keys      *keyPool
	ownHdr    string // client_key_header, canonical
	headers   [][2]string
	transport http.RoundTripper
}

// connectProvider resolves a provider's key and headers (placeholders
// included) and loads its transport module, if it has one.
func (h *Handler) connectProvider(ctx caddy.Context, p *Provider, repl *caddy.Replacer) (*providerConn, error) {
	where := fmt.Sprintf("llm_route config: provider %q", p.ID)
	ah := authHeaders[p.Auth]
	c := &providerConn{transport: h.transport, authHdr: ah.name}
	if ah.bearer {
		c.authPfx = "Bearer "
	}
	if p.ClientKeyHeader != "" {
		c.ownHdr = http.CanonicalHeaderKey(p.ClientKeyHeader)
	}
	var err error
	if c.keys, err = h.compileKeyPool(p, func(s string) string { return resolveSecret(repl, s) }, ah.bearer); err != nil {
		return nil, err
	}
	key := resolveSecret(repl, p.Key)
	switch {
	case key != "":
		if !transform.ValidHeaderValue(key) {
			return nil, fmt.Errorf("%s: key contains a line break or another control character", where)
		}
		c.auth = key
		if ah.bearer {
			c.auth = "Bearer " + key
		}
	case p.Key != "":
		// `key {env.TYPO}`: most likely a mistake, and the upstream's 401s
		// would be the first sign of it.
		h.logger.Warn("provider key resolves to empty; requests go without an Authorization header",
			zap.String("provider", p.ID))
	}
	names := make([]string, 0, len(p.Headers))
	for name := range p.Headers {
		names = append(names, name)
	}
	sort.Strings(names) // the first error named is always the same one
	for _, name := range names {
		val := repl.ReplaceAll(p.Headers[name], "")
		if !transform.ValidHeaderValue(val) {
			// Sent as is, it would fail every request as a connection error.
			return nil, fmt.Errorf("%s: header %q: value contains a line break or another control character", where, name)
		}
		c.headers = append(c.headers, [2]string{http.CanonicalHeaderKey(name), val})
	}
	if p.TransportRaw != nil {
		mod, err := ctx.LoadModule(p, "TransportRaw")
		if err != nil {
			return nil, fmt.Errorf("%s: loading transport: %v", where, err)
		}
		rt, ok := mod.(http.RoundTripper)
		if !ok {
			return nil, fmt.Errorf("%s: transport module %T is not an HTTP transport", where, mod)
		}
		if tt, ok := rt.(interface{ TLSEnabled() bool }); ok && tt.TLSEnabled() && strings.HasPrefix(p.URL, "http://") {
			return nil, fmt.Errorf("%s: the transport is configured for TLS but the url is http://", where)
		}
		c.transport = rt
	}
	return c, nil
}

// compileUpstream resolves one upstream's effective settings.
func (h *Handler) compileUpstream(uc Upstream, p *Provider, conn *providerConn, providerPatch *transform.Patch) (*upstream, error) {
	where := fmt.Sprintf("llm_route config: upstream %q", uc.ID)
	u := &upstream{
		Upstream:    ledger.Upstream{ID: uc.ID, Provider: p.ID},
		idAny:       uc.ID,
		providerAny: p.ID,
		model:       uc.Model,
		base:        strings.TrimSuffix(p.URL, "/"),
		url:         strings.TrimSuffix(p.URL, "/") + "/chat/completions",
		auth:        conn.auth,
		authHdr:     conn.authHdr,
		authPrefix:  conn.authPfx,
		keys:        conn.keys,
		ownKeyHdr:   conn.ownHdr,
		keepBill:    p.KeepBillingHeader,
		headers:     conn.headers,
		transport:   conn.transport,
		sessionHdr:  http.CanonicalHeaderKey(p.SessionHeader),
		reasoning:   p.ReasoningField,
		emptyOK:     p.ReasoningEmptyOK,
		price:       compilePrices(uc),
		hist:        h.adoptHistory("upstream/"+uc.ID, hFields),
	}
	target, err := url.Parse(u.url)
	if err != nil {
		return nil, fmt.Errorf("%s: url: %q is not a valid URL", where, redactURL(u.url))
	}
	u.target = target
	u.buildHeaderValues()
	if u.keys != nil {
		for i := range u.keys.keys {
			u.Keys = append(u.Keys, u.keys.keys[i].state) // their cooldowns are shared (state redis)
		}
	}
	base := strings.TrimSuffix(p.URL, "/")
	for ep, path := range endpointPaths {
		if u.urls[ep], err = url.Parse(base + path); err != nil {
			return nil, fmt.Errorf("%s: url: %q is not a valid URL", where, redactURL(base+path))
		}
	}
	// Gemini's paths name the upstream's model.
	gm := geminiModelURL(base, u.model)
	for _, g := range geminiURLs {
		if u.urls[g.ep], err = url.Parse(gm + g.suffix); err != nil {
			return nil, fmt.Errorf("%s: url: %q is not a valid URL", where, redactURL(gm+g.suffix))
		}
	}
	apis := uc.APIs
	if len(apis) == 0 {
		apis = p.APIs
	}
	if u.apis, err = parseAPIs(apis); err != nil {
		return nil, fmt.Errorf("%s: apis: %v", where, err)
	}

	u.Limit = ledger.Unlimited
	switch {
	case uc.MaxConcurrency > 0:
		u.Limit = int64(uc.MaxConcurrency)
	case p.MaxConcurrency > 0:
		u.Limit = int64(p.MaxConcurrency)
	}

	mode := uc.ThinkTags
	if mode == "" {
		mode = p.ThinkTags
	}
	think, known := transform.ParseThinkMode(string(mode))
	if !known {
		h.logger.Warn("unknown think_tags value, treating it as off",
			zap.String("upstream", uc.ID), zap.String("think_tags", string(mode)))
	}
	u.think = think

	u.firstByte = durationOr(defaultFirstByteTimeout, uc.FirstByteTimeout, p.FirstByteTimeout)
	u.streamIdle = durationOr(defaultStreamIdleTimeout, uc.StreamIdleTimeout, p.StreamIdleTimeout)
	u.probeInterval = durationOr(defaultProbeInterval, uc.ProbeInterval, p.ProbeInterval)
	u.retries = p.Retries
	if uc.Retries != nil {
		u.retries = *uc.Retries
	}
	u.retryWait = durationOr(0, uc.RetryAfterWait, p.RetryAfterWait)
	u.window = uc.ContextWindow
	if p.LongContextCapacity > 0 {
		u.LongCap = int64(p.LongContextCapacity)
		u.Long = h.refs.AdoptLong(p.ID, u.LongCap)
	}
	u.prefill = uc.Prefill == nil || *uc.Prefill
	switch {
	case uc.Backoff != nil:
		u.backoffScope, u.backoffCap = "upstream", time.Duration(*uc.Backoff)
	case p.Backoff != nil:
		u.backoffScope, u.backoffCap = "provider", time.Duration(*p.Backoff)
	}
	if u.backoffScope != "" && u.backoffCap <= 0 {
		u.backoffScope = "" // a zero cap means no backoff
	}

	upPatch, err := transform.CompilePatch(uc.Patch)
	if err != nil {
		return nil, fmt.Errorf("%s: patch: %v", where, err)
	}
	u.basePatch = providerPatch.Then(upPatch)
	pr := probeFor(u.apis)
	probeEdit := transform.RequestEdit{Model: u.model, Patch: u.basePatch}
	if pr.a == apiGemini {
		probeEdit.Model = "" // in the URL
	}
	probe, err := transform.RewriteRequest(nil, pr.body, &probeEdit)
	if err != nil {
		return nil, fmt.Errorf("%s: building the probe request: %v", where, err)
	}
	u.probeBody, u.probeEP = probe, pr.ep
	return u, nil
}

// probeRequest is the tiny request ("2+2=?", max_tokens 4, streamed) sent to cooling upstreams.
var probeRequest = []byte(`{"model":"","messages":[{"role":"user","content":"2+2=?"}],"max_tokens":4,"stream":true}`)

// probes are the probe request in each wire API, in the order one is chosen:
// an upstream that does not serve chat is probed in an API it serves, at
// that API's path (the patches apply: they are in the upstream's format).
// Responses asks for 16 tokens, OpenAI's least max_output_tokens.
var probes = []probeSpec{
	{apiChat, epChat, probeRequest},
	{apiMessages, epMessages, []byte(`{"model":"","max_tokens":4,"messages":[{"role":"user","content":"2+2=?"}],"stream":true}`)},
	{apiResponses, epResponses, []byte(`{"model":"","input":"2+2=?","max_output_tokens":16,"stream":true}`)},
	{apiGemini, epGeminiStream, []byte(`{"contents":[{"role":"user","parts":[{"text":"2+2=?"}]}],"generationConfig":{"maxOutputTokens":4}}`)},
	{apiCompletions, epCompletions, []byte(`{"model":"","prompt":"2+2=","max_tokens":4,"stream":true}`)},
	{apiEmbeddings, epEmbeddings, []byte(`{"model":"","input":"2+2=?"}`)},
}

// probeSpec is the probe of one API: its body and endpoint.
type probeSpec struct {
	a    api
	ep   endpoint
	body []byte
}

// probeFor picks the probe for an upstream serving apis.
func probeFor(apis apiSet) probeSpec {
	for _, p := range probes {
		if apis.has(p.a) {
			return p
		}
	}
	return probes[0] // parseAPIs never yields an empty set
}

// compileRoute precomputes the request edit of every (model, upstream) pair.
func (h *Handler) compileRoute(m Model) (*route, error) {
	modelPatch, err := transform.CompilePatch(m.Patch)
	if err != nil {
		return nil, fmt.Errorf("llm_route config: model %q: patch: %v", m.Name, err)
	}
	rt := &route{name: m.Name, nameAny: m.Name, queueSize: h.QueueSize, resume: m.Resume == "on", guard: compileRepeat(m)}
	if m.QueueSize != nil {
		rt.queueSize = *m.QueueSize
	}
	rt.queueTimeout = durationOr(defaultQueueTimeout, m.QueueTimeout, h.QueueTimeout)
	mhist := h.modelHist[m.Name]
	if mhist == nil {
		if h.modelHist == nil {
			h.modelHist = make(map[string]*history)
		}
		mhist = h.adoptHistory("model/"+m.Name, hFields)
		h.modelHist[m.Name] = mhist
	}
	for _, ct := range h.chainUpstreams(m.Upstreams) {
		u := ct.u
		counters := make(map[string]prometheus.Counter, len(allResults))
		for _, res := range allResults {
			counters[res] = h.metrics.requests.WithLabelValues(m.Name, u.ID, u.Provider, res)
		}
		rt.targets = append(rt.targets, target{up: u, counters: counters, series: h.metrics.vis.bind(m.Name, u.ID, u.Provider), edit: transform.RequestEdit{
			Model:            u.model,
			Patch:            u.basePatch.Then(modelPatch),
			ReasoningField:   u.reasoning,
			ReasoningEmptyOK: u.emptyOK,
		}, pool: ct.pool, step: ct.step, base: len(rt.targets), member: ct.member, memberID: placement.HashString(u.ID), weight: ct.weight,
			model: m.Name, mhist: mhist})
	}
	return rt, nil
}

// chainTarget is one upstream of a model's expanded chain.
type chainTarget struct {
	u      *upstream
	pool   *pool // nil: named directly
	step   int
	member int // its place in the pool
	weight uint32
}

// chainUpstreams expands a model's chain, upstream and pool ids, into its
// upstreams: a pool's members in the pool's list order (a request reorders
// them by placement). An upstream the chain reaches twice (in two pools,
// or in a pool and named directly) is tried once, at its first place: its
// slots and backoff are one anyway.
func (h *Handler) chainUpstreams(ids []string) []chainTarget {
	var out []chainTarget
	add := func(ct chainTarget) {
		for _, o := range out {
			if o.u == ct.u {
				return
			}
		}
		out = append(out, ct)
	}
	for step, id := range ids {
		if p := h.table.pools[id]; p != nil {
			pc := h.Pools[slices.IndexFunc(h.Pools, func(pc Pool) bool { return pc.ID == id })]
			for i, m := range pc.Upstreams {
				w := uint32(1)
				if len(pc.Weights) == len(pc.Upstreams) {
					w = uint32(pc.Weights[i])
				}
				add(chainTarget{u: h.table.upstreams[m], pool: p, step: step, member: i, weight: w})
			}
			continue
		}
		add(chainTarget{u: h.table.upstreams[id], step: step, weight: 1})
	}
	return out
}

// dollarVar matches the original proxy's ${NAME} references.
var dollarVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// resolveSecret expands {env.NAME}, {file./path} and ${NAME} in a key.
func resolveSecret(repl *caddy.Replacer, s string) string {
	if s == "" {
		return ""
	}
	s = dollarVar.ReplaceAllStringFunc(s, func(m string) string {
		return os.Getenv(m[2 : len(m)-1])
	})
	return strings.TrimSpace(repl.ReplaceAll(s, ""))
}

// newTransport returns the upstream HTTP client transport, sized for LLM
// traffic: many long-lived concurrent requests to few hosts, so the idle pool
// per host is large and nothing is re-dialled under load. Compression is left
// to the client and upstream (bodies pass through as they come). The
// connection buffers keep Go's 4 KiB (as reverse_proxy): bodies larger than
// that go around them, and 32 KiB ones cost 56 KiB per idle or busy
// connection for no measured gain.
func newTransport() *http.Transport {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          0, // no global cap
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       2 * time.Minute,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
}

// Validate is read-only; the config was checked while provisioning, where
// the messages can name the offending entry.
func (h *Handler) Validate() error { return nil }

// Cleanup stops the prober, closes idle upstream connections and releases
// this instance's references to the shared state. Requests still running on
// an old instance keep working: they hold pointers to the shared state.
func (h *Handler) Cleanup() error {
	unregisterHandler(h)
	if h.proberDone != nil {
		close(h.stopProber)
		<-h.proberDone
	}
	h.stopChecks()
	h.stopShadows()
	if h.transport != nil {
		h.transport.CloseIdleConnections()
	}
	h.refs.Release()
	h.releasePools()
	h.releaseKeys()
	h.releaseHistories()
	h.releaseState()
	leaveGeneration(h)
	return nil
}

// logSummary writes the start-up summary: counts and effective settings,
// never keys. Durations are written with their unit ("30s"), 0 as "off"
// where 0 disables the timer.
func (h *Handler) logSummary() {
	ups := make([]zap.Field, 0, len(h.table.upstreams))
	for _, uc := range h.Upstreams {
		u := h.table.upstreams[uc.ID]
		backoff := "off"
		if u.backoffScope != "" {
			backoff = u.backoffScope + ":" + Duration(u.backoffCap).String()
		}
		ups = append(ups, zap.Dict(u.ID,
			zap.String("provider", u.Provider),
			zap.String("url", redactURL(u.url)),
			zap.String("model", u.model),
			limitField(u.Limit),
			zap.String("think_tags", u.think.String()),
			zap.String("backoff", backoff),
			timerField("first_byte_timeout", u.firstByte),
			timerField("stream_idle_timeout", u.streamIdle),
			timerField("probe_interval", u.probeInterval),
			zap.Bool("auth", u.auth != ""),
			zap.Bool("custom_transport", u.transport != h.transport),
		))
	}
	h.logger.Info("llm_route configured",
		zap.Int("providers", len(h.Providers)),
		zap.Int("upstreams", len(h.Upstreams)),
		zap.Int("models", len(h.Models)),
		timerField("request_timeout", h.requestTimeout),
		timerField("client_write_timeout", h.clientWrite),
		zap.Int64("max_request_body", h.maxBody),
		zap.Dict("effective", ups...),
	)
}

// limitField logs a slot limit the same way everywhere: "unlimited" (never
// the sentinel 9223372036854775807) or the number, always as a string so
// that log pipelines see one type for the field.
func limitField(limit int64) zap.Field {
	if limit == ledger.Unlimited {
		return zap.String("limit", "unlimited")
	}
	return zap.String("limit", strconv.FormatInt(limit, 10))
}

// timerField logs a duration setting with its unit, "off" when 0 disables it.
func timerField(name string, d time.Duration) zap.Field {
	if d == 0 {
		return zap.String(name, "off")
	}
	return zap.String(name, Duration(d).String())
}

// applySharedWhenStarted applies this config's limits to the shared state
// once the config is actually running: Caddy provisions configs that it then
// throws away (a failed load, a validation), and those must not change the
// limits the running config enforces. A raised limit may admit waiting
// requests at once.
func (h *Handler) applySharedWhenStarted() {
	apply := func() {
		for _, u := range h.table.upstreams {
			u.Apply(u.backoffCap)
		}
		registerHandler(h) // the admin API reports running configs only
		h.startState()
		sched.dispatch()
		h.startPathChecks()
	}
	if h.events == nil {
		apply() // no config to wait for (a bare test context)
		return
	}
	gen := h.generation
	started := func() {
		apply()
		startGeneration(gen)
	}
	if err := h.events.On("started", startedHook{started}); err != nil {
		started()
	}
}

// joinConfig finds the config this handler belongs to by its events app
// (one per loaded config) and joins that config's metric generation. A bare
// caddy.NewContext (unit tests, benchmarks) has no config, and ctx.App
// would dereference the missing one.
func (h *Handler) joinConfig(ctx caddy.Context) {
	if ctx.Module() == nil {
		return
	}
	app, err := ctx.App("events")
	if ev, ok := app.(*caddyevents.App); err == nil && ok {
		h.events = ev
		h.generation = joinGeneration(ev, h)
	}
}

// startedHook runs a function on Caddy's "started" event. It is a struct
// with no exported fields so that the events app can log it as JSON.
type startedHook struct{ apply func() }

// Handle satisfies caddyevents.Handler.
func (h startedHook) Handle(context.Context, caddy.Event) error {
	h.apply()
	return nil
}
