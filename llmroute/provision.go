package llmroute

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// Defaults of SPEC §1/§3 and the handler options.
const (
	defaultRequestTimeout    = 5 * time.Minute
	defaultMaxRequestBody    = 32 << 20
	defaultFirstByteTimeout  = 30 * time.Second
	defaultStreamIdleTimeout = 60 * time.Second
	defaultProbeInterval     = time.Second
	defaultQueueTimeout      = 30 * time.Second
	defaultRetryAfterMax     = 5 * time.Minute
	defaultHeartbeat         = 15 * time.Second
)

// upstream is one upstream with every setting resolved once at provision
// time (most specific wins: upstream → provider → default) and its shared
// state adopted from the pools.
type upstream struct {
	id, provider, model string
	idAny, providerAny  any // id and provider boxed once, for placeholders

	url        string   // provider URL + /chat/completions
	target     *url.URL // url, parsed once
	auth       string   // "Bearer <key>", or "" for no Authorization header
	headers    [][2]string
	sessionHdr string

	limit         int64 // unlimited when none is configured
	think         transform.ThinkMode
	firstByte     time.Duration // 0 = disabled
	streamIdle    time.Duration // 0 = disabled
	probeInterval time.Duration // 0 = disabled
	backoffScope  string        // "upstream", "provider" or "" (none)
	backoffCap    time.Duration

	state   *upstreamState
	backoff *backoffState // nil when backoff is off

	basePatch *transform.Patch // provider patch then upstream patch
	probeBody []byte           // SPEC §3 probe, patches applied
	reasoning string
	emptyOK   bool
}

// cooling returns how long the upstream is still out of rotation.
func (u *upstream) cooling(now time.Time) time.Duration {
	return u.state.coolingLeft(u.backoff, now)
}

// target is one entry of a model's upstream list with the request edit for
// that (model, upstream) pair precomputed.
type target struct {
	up   *upstream
	edit transform.RequestEdit
	// counters are this pair's llm_proxy_requests_total series, one per
	// result, looked up once instead of hashing labels per request.
	counters map[string]prometheus.Counter
}

// route is a client-visible model, compiled.
type route struct {
	name         string
	nameAny      any // name boxed once, for placeholders
	targets      []target
	queueSize    int
	queueTimeout time.Duration // 0 = until the client goes away
}

// Provision resolves the config, adopts shared state and starts the prober.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.ctx = ctx
	h.logger = ctx.Logger()
	h.metrics = getMetrics()
	if err := h.metrics.register(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	if err := validateConfig(h.Providers, h.Upstreams, h.Models); err != nil {
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

	providers := make(map[string]*Provider, len(h.Providers))
	for i := range h.Providers {
		providers[h.Providers[i].ID] = &h.Providers[i]
	}
	repl := caddy.NewReplacer()
	providerPatches := make(map[string]*transform.Patch, len(h.Providers))
	for _, p := range h.Providers {
		patch, err := transform.CompilePatch(p.Patch)
		if err != nil {
			return fmt.Errorf("llm_route config: provider %q: patch: %v", p.ID, err)
		}
		providerPatches[p.ID] = patch
	}

	h.upstreams = make(map[string]*upstream, len(h.Upstreams))
	backoffs := make(map[string]*backoffState)
	for _, uc := range h.Upstreams {
		p := providers[uc.Provider]
		u, err := h.compileUpstream(uc, p, providerPatches[p.ID], repl)
		if err != nil {
			return err
		}
		var fresh bool
		u.state, fresh = h.refs.adoptUpstream(u.id)
		if u.backoffScope != "" {
			scopeID := u.id
			if u.backoffScope == "provider" {
				scopeID = u.provider
			}
			key := backoffKey(u.backoffScope, scopeID)
			b, ok := backoffs[key]
			if !ok {
				b = h.refs.adoptBackoff(key)
				backoffs[key] = b
			}
			u.backoff = b
		}
		if fresh {
			u.applyShared() // nobody else uses it yet
		}
		h.upstreams[u.id] = u
	}

	h.routes = make(map[string]*route, len(h.Models))
	for _, m := range h.Models {
		rt, err := h.compileRoute(m)
		if err != nil {
			return err
		}
		h.routes[rt.name] = rt
		h.modelList = append(h.modelList, rt.name)
	}
	h.created = time.Now().Unix()
	h.modelsBody = modelsListBody(h.modelList, h.created)

	h.transport = newTransport()
	h.logSummary()

	h.applySharedWhenStarted(ctx)

	h.stopProber = make(chan struct{})
	h.proberDone = make(chan struct{})
	go h.runProber()
	return nil
}

// compileUpstream resolves one upstream's effective settings.
func (h *Handler) compileUpstream(uc Upstream, p *Provider, providerPatch *transform.Patch, repl *caddy.Replacer) (*upstream, error) {
	where := fmt.Sprintf("llm_route config: upstream %q", uc.ID)
	u := &upstream{
		id:          uc.ID,
		idAny:       uc.ID,
		provider:    p.ID,
		providerAny: p.ID,
		model:       uc.Model,
		url:         strings.TrimSuffix(p.URL, "/") + "/chat/completions",
		sessionHdr:  http.CanonicalHeaderKey(p.SessionHeader),
		reasoning:   p.ReasoningField,
		emptyOK:     p.ReasoningEmptyOK,
	}
	target, err := url.Parse(u.url)
	if err != nil {
		return nil, fmt.Errorf("%s: url: %q is not a valid URL", where, redactURL(u.url))
	}
	u.target = target
	key := resolveSecret(repl, p.Key)
	if key != "" {
		if strings.ContainsAny(key, "\r\n") {
			return nil, fmt.Errorf("llm_route config: provider %q: key contains a line break", p.ID)
		}
		u.auth = "Bearer " + key
	}
	for name, val := range p.Headers {
		u.headers = append(u.headers, [2]string{http.CanonicalHeaderKey(name), repl.ReplaceAll(val, "")})
	}

	u.limit = unlimited
	switch {
	case uc.MaxConcurrency > 0:
		u.limit = int64(uc.MaxConcurrency)
	case p.MaxConcurrency > 0:
		u.limit = int64(p.MaxConcurrency)
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
	probe, err := transform.RewriteRequest(nil, probeRequest, &transform.RequestEdit{Model: u.model, Patch: u.basePatch})
	if err != nil {
		return nil, fmt.Errorf("%s: building the probe request: %v", where, err)
	}
	u.probeBody = probe
	return u, nil
}

// probeRequest is the tiny request of SPEC §3 sent to cooling upstreams.
var probeRequest = []byte(`{"model":"","messages":[{"role":"user","content":"2+2=?"}],"max_tokens":4,"stream":true}`)

// compileRoute precomputes the request edit of every (model, upstream) pair.
func (h *Handler) compileRoute(m Model) (*route, error) {
	modelPatch, err := transform.CompilePatch(m.Patch)
	if err != nil {
		return nil, fmt.Errorf("llm_route config: model %q: patch: %v", m.Name, err)
	}
	rt := &route{name: m.Name, nameAny: m.Name, queueSize: h.QueueSize}
	if m.QueueSize != nil {
		rt.queueSize = *m.QueueSize
	}
	rt.queueTimeout = durationOr(defaultQueueTimeout, m.QueueTimeout, h.QueueTimeout)
	for _, id := range m.Upstreams {
		u := h.upstreams[id]
		counters := make(map[string]prometheus.Counter, len(allResults))
		for _, res := range allResults {
			counters[res] = h.metrics.requests.WithLabelValues(m.Name, u.id, u.provider, res)
		}
		rt.targets = append(rt.targets, target{up: u, counters: counters, edit: transform.RequestEdit{
			Model:            u.model,
			Patch:            u.basePatch.Then(modelPatch),
			ReasoningField:   u.reasoning,
			ReasoningEmptyOK: u.emptyOK,
		}})
	}
	return rt, nil
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
// to the client and upstream (bodies pass through as they come).
func newTransport() *http.Transport {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          0, // no global cap
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       2 * time.Minute,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		ReadBufferSize:        32 << 10,
		WriteBufferSize:       32 << 10,
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
	if h.transport != nil {
		h.transport.CloseIdleConnections()
	}
	h.refs.release()
	return nil
}

// logSummary writes the start-up summary: counts and effective settings,
// never keys.
func (h *Handler) logSummary() {
	ups := make([]zap.Field, 0, len(h.upstreams))
	for _, uc := range h.Upstreams {
		u := h.upstreams[uc.ID]
		limit := "unlimited"
		if u.limit != unlimited {
			limit = fmt.Sprint(u.limit)
		}
		backoff := "off"
		if u.backoffScope != "" {
			backoff = u.backoffScope + ":" + Duration(u.backoffCap).String()
		}
		ups = append(ups, zap.Dict(u.id,
			zap.String("provider", u.provider),
			zap.String("url", redactURL(u.url)),
			zap.String("model", u.model),
			zap.String("limit", limit),
			zap.String("think_tags", u.think.String()),
			zap.String("backoff", backoff),
			zap.Duration("first_byte_timeout", u.firstByte),
			zap.Duration("stream_idle_timeout", u.streamIdle),
			zap.Duration("probe_interval", u.probeInterval),
			zap.Bool("auth", u.auth != ""),
		))
	}
	h.logger.Info("llm_route configured",
		zap.Int("providers", len(h.Providers)),
		zap.Int("upstreams", len(h.Upstreams)),
		zap.Int("models", len(h.Models)),
		zap.Duration("request_timeout", h.requestTimeout),
		zap.Int64("max_request_body", h.maxBody),
		zap.Dict("effective", ups...),
	)
}

// attemptContext bounds one upstream exchange by request_timeout.
func (h *Handler) attemptContext(parent context.Context) (context.Context, context.CancelFunc) {
	if h.requestTimeout > 0 {
		return context.WithTimeout(parent, h.requestTimeout)
	}
	return context.WithCancel(parent)
}

// applyShared writes this config's view of an upstream into the shared
// state: slot limit, metric label, backoff scope and cap.
func (u *upstream) applyShared() {
	u.state.limit.Store(u.limit)
	u.state.provider.Store(&u.provider)
	u.state.backoff.Store(u.backoff)
	if u.backoff != nil {
		u.backoff.setCap(u.backoffCap)
	}
}

// applySharedWhenStarted applies this config's limits to the shared state
// once the config is actually running: Caddy provisions configs that it then
// throws away (a failed load, a validation), and those must not change the
// limits the running config enforces. A raised limit may admit waiting
// requests at once.
func (h *Handler) applySharedWhenStarted(ctx caddy.Context) {
	apply := func() {
		for _, u := range h.upstreams {
			u.applyShared()
		}
		registerHandler(h) // the admin API reports running configs only
		sched.dispatch()
	}
	if ctx.Module() == nil {
		// A bare caddy.NewContext (unit tests, benchmarks): it has no config,
		// and ctx.App would dereference the missing one.
		apply()
		return
	}
	app, err := ctx.App("events")
	if ev, ok := app.(*caddyevents.App); err == nil && ok {
		if err := ev.On("started", startedHook{apply}); err == nil {
			return
		}
	}
	apply() // no event bus (e.g. a bare test context): apply now
}

// startedHook runs a function on Caddy's "started" event. It is a struct
// with no exported fields so that the events app can log it as JSON.
type startedHook struct{ apply func() }

// Handle satisfies caddyevents.Handler.
func (h startedHook) Handle(context.Context, caddy.Event) error {
	h.apply()
	return nil
}
