package llmroute

import (
	"context"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llm-route/caddy-llm-route/llmroute/keys"
	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler routes OpenAI-compatible chat completion requests to upstream
// models by its own slot accounting, fails over and backs off when an upstream
// breaks, patches request bodies and rewrites responses.
//
// It serves the API paths (`POST …/chat/completions`, `…/responses`,
// `…/messages`, `…/embeddings`, `…/completions`, `GET …/models`) under any
// prefix ending in `/v1` and at the site root; every other request is
// passed to the next handler, so it composes with the rest of a Caddy
// route. A request no later handler answers gets a JSON 404 rather than
// an empty 200.
//
// Errors the handler produces itself are written as OpenAI-shaped JSON
// (`{"error":{"message","type","code"}}`) rather than returned to Caddy's
// error routes, because OpenAI SDKs read that body.
//
// Placeholders set on every routed request:
//
// | Placeholder | Description |
// |---|---|
// | `{http.llm_route.model}` | the model name the client asked for |
// | `{http.llm_route.upstream}` | the upstream id that served the request |
// | `{http.llm_route.provider}` | the provider id of that upstream |
// | `{http.llm_route.attempts}` | how many upstreams were tried |
// | `{http.llm_route.key}` | the id of the client key the request used (keys only) |
type Handler struct {
	// Providers are the backends (base URL + key).
	Providers []Provider `json:"providers,omitempty"`

	// Upstreams are real models at providers, each with a slot limit.
	Upstreams []Upstream `json:"upstreams,omitempty"`

	// Pools are sets of equivalent upstreams a model names as one step,
	// each with a placement policy. Default: none.
	Pools []Pool `json:"pools,omitempty"`

	// Models are the client-visible model names, each an ordered list of
	// upstreams and pools.
	Models []Model `json:"models,omitempty"`

	// RequestTimeout bounds one whole upstream exchange, streaming included.
	// Default 5m; 0 disables.
	RequestTimeout *Duration `json:"request_timeout,omitempty"`

	// MaxRequestBody is the largest request body accepted, in bytes; larger
	// bodies get 413. Default 32 MiB.
	MaxRequestBody int64 `json:"max_request_body,omitempty"`

	// QueueSize is how many requests per model may wait for a slot when every
	// upstream of the model is busy. Default 0: answer 503 at once. A model's
	// own queue_size overrides it.
	QueueSize int `json:"queue_size,omitempty"`

	// QueueTimeout is the longest a request waits in the queue. Default 30s;
	// 0 waits until the client goes away.
	QueueTimeout *Duration `json:"queue_timeout,omitempty"`

	// RetryAfterMax bounds how long an upstream's `Retry-After` may cool it.
	// Default 5m.
	RetryAfterMax *Duration `json:"retry_after_max,omitempty"`

	// HeartbeatInterval is how long a stream may be silent, after its first
	// byte reached the client, before the proxy sends an SSE comment
	// (`: keepalive`) so idle timeouts along the way do not cut it.
	// Default 15s; 0 disables. Streams of the Gemini front get none: the
	// Google SDKs fail on a comment line.
	HeartbeatInterval *Duration `json:"heartbeat_interval,omitempty"`

	// CORS lists the browser origins allowed to call the API paths, e.g.
	// `["https://app.example.com"]`; `["*"]` allows any origin. A listed
	// origin gets `Access-Control-Allow-Origin` echoing it (with
	// `Vary: Origin`) and its preflight `OPTIONS` is answered 204; an origin
	// not listed gets no CORS headers and its preflight 403. Default: none
	// (no CORS headers; `OPTIONS` on an API path is 405).
	CORS []string `json:"cors,omitempty"`

	// MaxRewriteSize bounds what think_tags rewriting buffers: a non-stream
	// body, or one SSE event of a stream. Anything larger passes through
	// unrewritten, with a warning in the log. It also bounds a non-stream
	// chat answer translated for a Messages or Responses client: a larger
	// one is refused with a 502 `response_too_large` in that API's shape
	// (streams are translated event by event and are not bounded by it).
	// Default 16 MiB.
	MaxRewriteSize int64 `json:"max_rewrite_size,omitempty"`
	// ClientWriteTimeout bounds each write to the client: a client that
	// takes no bytes for this long is treated as gone, its attempt ends as
	// `cancelled` and its slot is freed; the upstream is not blamed. On
	// HTTP/1 a stream's deadline is renewed when less than half of it is
	// left, not at every event, so a stuck write is cut after between half
	// and all of this time.
	// request_timeout bounds time blocked on the client as well.
	// Default 30s; 0 disables (request_timeout still applies).
	ClientWriteTimeout *Duration `json:"client_write_timeout,omitempty"`
	// RouteHeaders adds `X-LLM-Route-Upstream` (the upstream id that
	// answered) and `X-LLM-Route-Attempts` to routed answers,
	// `X-LLM-Route-Placement` (policy and reason) when a pool member
	// answered, and `X-LLM-Route-Skipped` (why each upstream was passed
	// over) to the proxy's own 503s. Default true; false removes them.
	RouteHeaders *bool `json:"route_headers,omitempty"`
	// Keys are the client keys. Default: none, and the API is
	// open to anyone who reaches it. With any key configured, every API
	// request needs one: a missing or unknown key is 401, a model outside
	// the key's models 403, a key over its rate or budget 429.
	Keys []ClientKey `json:"keys,omitempty"`
	// LongContextThreshold (estimated prompt tokens) marks a request as
	// long-context: above it, the request holds one of its provider's
	// long_context_capacity slots as well as a normal slot, and an upstream
	// whose provider has none free is passed over (next upstream, or the
	// queue). Default 0: no request is long-context.
	LongContextThreshold int `json:"long_context_threshold,omitempty"`
	// State is where slot, capacity and backoff accounting lives:
	// `{"backend":"memory"}` (the default: this process only) or
	// `{"backend":"redis",…}`, shared by every instance using the same
	// Redis and prefix.
	State *StateConfig `json:"state,omitempty"`

	ctx       caddy.Context
	logger    *zap.Logger
	metrics   *routeMetrics
	refs      ledger.PoolRefs
	transport *http.Transport // the default for providers without a transport module

	events     *caddyevents.App // of this handler's config; nil in a bare context
	generation *generation      // the config's metric series

	// table is the route table this config compiled (route.go): read
	// only after Provision.
	table routeTable

	requestTimeout time.Duration
	retryAfterMax  time.Duration
	heartbeat      time.Duration
	clientWrite    time.Duration
	maxBody        int64
	maxRewrite     int64
	routeHeaders   bool

	// ownKeyHdrs are the providers' client_key_header names, canonical,
	// each once: taken out of every request (keypool.go).
	ownKeyHdrs []string

	corsAny     bool     // cors lists "*"
	corsOrigins []string // the other listed origins
	watchKeys   []string // top-level keys checked for duplicates (transform.ParseRequestKeys)

	keys     map[[32]byte]*clientKey // by SHA-256 of the secret; nil = no keys configured
	keyIDs   []string                // accounts this instance acquired in the process's key store (ledger.LocalKeys)
	keyStore keys.Store              // its ledger's
	// The rings of the last minutes (history.go): the references this
	// instance holds in the pool of histories, and the models' and keys'
	// rings by name (upstreams, pools and keys also carry theirs).
	histKeys  []string
	modelHist map[string]*history
	keyHist   map[string]*history
	// usageStorage is where the keys' usage is saved (keyusage.go); nil
	// when it is not (state redis, or no keys).
	usageStorage usageStorage

	// shadowSem holds a token per running shadow copy (shadow.go); nil
	// when no rule has a shadow.
	shadowSem chan struct{}

	stopProber chan struct{}
	proberDone chan struct{}

	pathChecks     chan struct{}      // closed when the start-up path checks end (pathcheck.go)
	stopPathChecks context.CancelFunc // cancels them

	// led is where this handler counts and remembers (llmroute/ledger):
	// memory, or a redis fleet in front of it.
	led ledger.Ledger

	// loadedFrom is the JSON this handler was decoded from, for the plan
	// of a config change (plan.go).
	loadedFrom []byte
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_route",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
