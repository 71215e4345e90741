package llmroute

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// front is the kind of API endpoint a request path names. The API paths
// are the handler's under an API root: a prefix ending in `/v1` (`/v1`,
// `/openai/v1`) or the site root itself, so a client whose base URL lacks
// `/v1` is served too, as is a handler mounted with a path matcher that
// strips its prefix (`handle_path /llm/*` makes `/llm/chat/completions`
// arrive as `/chat/completions`). Anything else under `/v1` is an unknown
// endpoint; every other path goes to the next handler, so the handler
// composes with a file server in the same site.
type front uint8

const (
	frontNone        front = iota // not the handler's: next handler
	frontUnsupported              // under /v1, no such endpoint: 404 unsupported_endpoint
	frontChat                     // POST …/chat/completions
	frontModels                   // GET …/models
	frontModel                    // GET …/models/{id}
	frontMessages
	frontCountTokens
	frontResponses
	frontEmbeddings
	frontCompletions
	frontGemini            // POST …/v1beta/models/{model}:generateContent, :streamGenerateContent
	frontGeminiCount       // POST …/v1beta/models/{model}:countTokens
	frontGeminiModels      // GET …/v1beta/models, …/v1beta/models/{model}
	frontGeminiUnsupported // under /v1beta, no such endpoint: 404 in Google's shape
	numFronts
)

// frontCodecs is the codec of each front: the API it speaks, and the shape
// of its refusals. count_tokens is Messages'; the model lists and the
// paths that are no endpoint answer in OpenAI's shape (chat's).
var frontCodecs = [numFronts]codec{
	frontNone:        chatCodec{},
	frontUnsupported: chatCodec{},
	frontChat:        chatCodec{},
	frontModels:      chatCodec{},
	frontModel:       chatCodec{},
	frontMessages:    messagesCodec{},
	frontCountTokens: messagesCodec{},
	frontResponses:   responsesCodec{},
	frontEmbeddings:  embeddingsCodec{},
	frontCompletions: completionsCodec{},
	// The Gemini paths answer in Google's shape, the model list included.
	frontGemini:            geminiCodec{},
	frontGeminiCount:       geminiCodec{},
	frontGeminiModels:      geminiCodec{},
	frontGeminiUnsupported: geminiCodec{},
}

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
// for frontModel and the Gemini fronts the model id, and whether the path
// sits at the site root (or a mount) rather than under a `/v1` root.
func classifyPath(path string) (f front, allow, id string, root bool) {
	if f, allow, id, ok := classifyGemini(path); ok {
		return f, allow, id, false
	}
	rest, underV1 := apiRest(path)
	if !underV1 {
		rest = path // the site root (or a mount) is an API root too
	}
	for _, e := range endpoints {
		if rest == e.path {
			return e.front, e.allow, "", !underV1
		}
	}
	if id, ok := strings.CutPrefix(rest, "/models/"); ok && id != "" {
		return frontModel, "GET, HEAD", id, !underV1
	}
	if underV1 {
		return frontUnsupported, "", "", false
	}
	return frontNone, "", "", true // the site's other paths are not the API's
}

// claimsAtRoot reports whether an API path at the site root is this
// handler's request. Under `/v1` every such path is; at the root the same
// names may be a site's own pages or files (`/messages`, `/models/x.gguf`),
// so only a request that could be an API call is taken: one of the
// endpoint's methods (or a CORS preflight), and for `/models/{id}` a model
// this handler serves. The rest goes to the next handler.
func (h *Handler) claimsAtRoot(r *http.Request, f front, allow, id string) bool {
	if !methodAllowed(allow, r.Method) && r.Method != http.MethodOptions {
		return false
	}
	return f != frontModel || h.table.routes[id] != nil
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

// answeredWriter wraps the response writer of a request passed to the next
// handler, to learn whether any handler answered it. Writing a status, a
// body, a flush or a hijack counts; a handler chain that returns having
// done none of these would leave Caddy's empty 200.
type answeredWriter struct {
	caddyhttp.ResponseWriterWrapper
	answered bool
}

func (w *answeredWriter) WriteHeader(status int) {
	w.answered = true
	w.ResponseWriter.WriteHeader(status)
}

func (w *answeredWriter) Write(b []byte) (int, error) {
	w.answered = true
	return w.ResponseWriter.Write(b)
}

// ReadFrom is how io.Copy (a file server) writes a body.
func (w *answeredWriter) ReadFrom(r io.Reader) (int64, error) {
	w.answered = true
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError and Hijack are found by http.ResponseController before it
// unwraps, so a flush or a hijack is seen here too.
func (w *answeredWriter) FlushError() error {
	w.answered = true
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *answeredWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.answered = true
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// serveNext passes a request that is not the API's to the next handler.
// When no handler answers it, the client gets the 404 unsupported_endpoint
// rather than an empty 200 it would take for an answer; an operator who
// wants an empty answer says so (`respond 200`), which counts as one.
func (h *Handler) serveNext(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	aw := &answeredWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
	err := next.ServeHTTP(aw, r)
	if err != nil || aw.answered {
		return err
	}
	setRequestID(w, r)
	h.refuse(w, r, frontNone, errUnsupported)
	return nil
}

// CORS: what a preflight answer allows. Beyond the headers the
// fronts' clients send (Google's SDKs their key and x-goog-api-client),
// the preflight also allows the headers the browser asks for
// (Access-Control-Request-Headers): browser SDKs send more (openai-node its
// x-stainless-* telemetry, anthropic's SDK
// anthropic-dangerous-direct-browser-access), and a preflight that leaves
// one out makes the browser refuse the call. The origin is already vetted.
const (
	corsMethods = "POST, GET"
	corsHeaders = "authorization, content-type, x-api-key, anthropic-version, x-goog-api-key, x-goog-api-client"
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
			h.refuse(w, r, frontNone, errCORSOrigin)
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

	// A client_key_header carries a caller's key: it is taken out of every
	// request (takeOwnKeys) and never forwarded, whatever forward_headers says.
	h.ownKeyHdrs = nil
	for _, p := range h.Providers {
		if name := http.CanonicalHeaderKey(p.ClientKeyHeader); name != "" && !slices.Contains(h.ownKeyHdrs, name) {
			h.ownKeyHdrs = append(h.ownKeyHdrs, name)
		}
	}
	forward := make(map[string][]string, len(h.Providers))
	for _, p := range h.Providers {
		for _, name := range p.ForwardHeaders {
			if !validHeaderName(name) {
				return fmt.Errorf("llm_route config: provider %q: forward_headers: %q is not a valid header name", p.ID, name)
			}
			if canon := http.CanonicalHeaderKey(name); !slices.Contains(h.ownKeyHdrs, canon) {
				forward[p.ID] = append(forward[p.ID], canon)
			}
		}
	}
	for _, u := range h.table.upstreams {
		u.forward = forward[u.Provider]
	}

	bits := map[string]uint64{}
	for _, rt := range h.table.routes {
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
		c.Write(zap.String("upstream", u.ID), zap.Int64("max_rewrite_size", h.maxRewrite), zap.Int("count", n))
	}
}

// keyErrorFront is the front whose error shape a refusal takes: the
// model list asked the Anthropic way answers Anthropic's shape.
func keyErrorFront(r *http.Request, f front) front {
	if (f == frontModels || f == frontModel) && r.Header.Get("Anthropic-Version") != "" {
		return frontMessages
	}
	return f
}
