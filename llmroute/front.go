package llmroute

import (
	"fmt"
	"net/http"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// front is the kind of API endpoint a request path names. A path is the
// handler's only under an API root: a prefix ending in `/v1`
// (`/v1`, `/openai/v1`), or the handler's own mount when a path matcher
// stripped its prefix (`handle_path /llm/*` makes `/llm/chat/completions`
// arrive as `/chat/completions`). Every other path goes to the next
// handler, so the handler composes with a file server in the same site.
type front uint8

const (
	frontNone        front = iota // not the handler's: next handler
	frontUnsupported              // under an API root, no such endpoint: 404 unsupported_endpoint
	frontChat                     // POST …/chat/completions
	frontModels                   // GET …/models
	frontModel                    // GET …/models/{id}
	// The other fronts, recognised so that they answer
	// unsupported_endpoint (not the next handler) until they are served.
	frontMessages
	frontCountTokens
	frontResponses
	frontEmbeddings
	frontCompletions
)

// endpoints maps the path below the API root to its front and the methods
// it answers (the Allow header of a 405).
var endpoints = []struct {
	path  string
	front front
	allow string
}{
	{"/chat/completions", frontChat, "POST"},
	{"/models", frontModels, "GET, HEAD"},
	{"/messages", frontMessages, "POST"},
	{"/messages/count_tokens", frontCountTokens, "POST"},
	{"/responses", frontResponses, "POST"},
	{"/embeddings", frontEmbeddings, "POST"},
	{"/completions", frontCompletions, "POST"},
}

// classifyPath returns the front of a request path, the methods it allows,
// and for frontModel the model id. mounted says a path matcher stripped the
// handler's prefix, so the path itself is relative to the API root.
func classifyPath(path string, mounted bool) (f front, allow, id string) {
	rest, underV1 := apiRest(path)
	if !underV1 {
		if !mounted {
			return frontNone, "", ""
		}
		rest = path
	}
	for _, e := range endpoints {
		if rest == e.path {
			return e.front, e.allow, ""
		}
	}
	if id, ok := strings.CutPrefix(rest, "/models/"); ok && id != "" {
		return frontModel, "GET, HEAD", id
	}
	if underV1 {
		return frontUnsupported, "", ""
	}
	return frontNone, "", "" // a mount's other paths are not the API's
}

// apiRest splits off the shortest prefix of path ending in the segment
// `/v1` and returns what follows it ("" for the root itself).
func apiRest(path string) (string, bool) {
	i := strings.Index(path+"/", "/v1/")
	if i < 0 {
		return "", false
	}
	return path[min(i+3, len(path)):], true
}

// mountedPath reports whether a path matcher (handle_path, uri
// strip_prefix) rewrote the request path on the way to this handler: the
// original request Caddy keeps in the context had a longer path that ends
// in this one.
func mountedPath(r *http.Request) bool {
	orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request)
	if !ok || orig.URL == nil {
		return false
	}
	op := orig.URL.Path
	return len(op) > len(r.URL.Path) && strings.HasSuffix(op, r.URL.Path)
}

// CORS: what a preflight answer allows. Beyond the four headers
// the spec names, the preflight also allows the headers the browser asks for
// (Access-Control-Request-Headers): browser SDKs send more (openai-node its
// x-stainless-* telemetry, anthropic's SDK
// anthropic-dangerous-direct-browser-access), and a preflight that leaves
// one out makes the browser refuse the call. The origin is already vetted.
const (
	corsMethods = "POST, GET"
	corsHeaders = "authorization, content-type, x-api-key, anthropic-version"
	// corsExpose lets browser SDKs read what they read in Node: the request
	// id they surface and the Retry-After they back off by.
	corsExpose = "x-request-id, retry-after"
)

// cors applies the CORS policy to a request on an API path. It returns true
// when it answered the request itself (a preflight).
func (h *Handler) cors(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	preflight := r.Method == http.MethodOptions && origin != "" && r.Header.Get("Access-Control-Request-Method") != ""
	if !h.corsAllows(origin) {
		if preflight {
			errCORSOrigin.write(w)
			return true
		}
		return false // no CORS headers: the browser refuses to read the answer
	}
	hdr := w.Header()
	hdr.Set("Access-Control-Allow-Origin", origin)
	hdr.Add("Vary", "Origin")
	if !preflight {
		hdr.Set("Access-Control-Expose-Headers", corsExpose)
		return false
	}
	hdr.Set("Access-Control-Allow-Methods", corsMethods)
	allow := corsHeaders
	if asked := r.Header.Values("Access-Control-Request-Headers"); len(asked) > 0 {
		allow += ", " + strings.Join(asked, ", ")
	}
	hdr.Set("Access-Control-Allow-Headers", allow)
	hdr.Set("Access-Control-Max-Age", "600")
	hdr.Add("Vary", "Access-Control-Request-Method")
	hdr.Add("Vary", "Access-Control-Request-Headers")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// corsAllows reports a listed origin; "" (no Origin header) never is.
func (h *Handler) corsAllows(origin string) bool {
	if origin == "" {
		return false
	}
	if h.corsAny {
		return true
	}
	for _, o := range h.corsOrigins {
		if strings.EqualFold(o, origin) {
			return true
		}
	}
	return false
}

// provisionRequests resolves the request-side options: CORS origins, the
// rewrite bound, each provider's forward_headers, and the keys whose
// duplicates a request may not carry (the keys any of a route's
// patches write; model, stream and messages are always checked).
func (h *Handler) provisionRequests() error {
	for _, o := range h.CORS {
		o = strings.TrimSuffix(strings.TrimSpace(o), "/")
		switch {
		case o == "*":
			h.corsAny = true
		case o == "" || strings.ContainsAny(o, " \r\n,"):
			return fmt.Errorf("llm_route config: cors: %q is not an origin (scheme://host[:port] or *)", o)
		default:
			h.corsOrigins = append(h.corsOrigins, o)
		}
	}
	if h.MaxRewriteSize < 0 {
		return fmt.Errorf("llm_route config: max_rewrite_size must not be negative")
	}
	h.maxRewrite = h.MaxRewriteSize
	if h.maxRewrite == 0 {
		h.maxRewrite = defaultMaxRewrite
	}

	forward := make(map[string][]string, len(h.Providers))
	for _, p := range h.Providers {
		for _, name := range p.ForwardHeaders {
			if !validHeaderName(name) {
				return fmt.Errorf("llm_route config: provider %q: forward_headers: %q is not a valid header name", p.ID, name)
			}
			forward[p.ID] = append(forward[p.ID], http.CanonicalHeaderKey(name))
		}
	}
	for _, u := range h.upstreams {
		u.forward = forward[u.provider]
	}

	bits := map[string]uint64{}
	for _, rt := range h.routes {
		for _, t := range rt.targets {
			for _, k := range t.edit.Patch.Keys() {
				switch k {
				case "model", "stream", "messages":
					continue // always checked
				}
				bit, ok := bits[k]
				if !ok {
					bit = uint64(1) << min(len(h.watchKeys), 63)
					bits[k] = bit
					h.watchKeys = append(h.watchKeys, k)
				}
				rt.dupKeys |= bit
			}
		}
	}
	return nil
}

// defaultMaxRewrite is the default max_rewrite_size.
const defaultMaxRewrite = 16 << 20

// putRewriter returns a stream rewriter to the pool, first logging the
// events that were too big for it.
func (h *Handler) putRewriter(u *upstream, rw *transform.StreamRewriter) {
	if n := rw.Oversized(); n > 0 {
		h.warnTooBig(u, n)
	}
	putRewriter(rw)
}

// warnTooBig logs responses (or SSE events) that passed through without
// think_tags rewriting because they exceeded max_rewrite_size.
func (h *Handler) warnTooBig(u *upstream, n int) {
	if c := h.logger.Check(zapcore.WarnLevel, "response larger than max_rewrite_size, think_tags not applied"); c != nil {
		c.Write(zap.String("upstream", u.id), zap.Int64("max_rewrite_size", h.maxRewrite), zap.Int("count", n))
	}
}
