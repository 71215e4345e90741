package llmroute

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// apiError is an error the proxy answers itself, in the OpenAI error shape
// (`{"error":{"message","type","param","code"}}`). Messages are fixed texts written
// here: never a transport error string, never a key.
type apiError struct {
	status     int
	typ        string
	code       string
	message    string
	retryAfter int // seconds; 0 = no Retry-After header
}

// Error codes the proxy produces; `code` in the error object.
var (
	errBadJSON      = apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_json", message: "request body is not a valid JSON object"}
	errNoModel      = apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "missing_model", message: "request body has no \"model\" string"}
	errReadBody     = apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "body_read_error", message: "could not read the request body"}
	errDuplicateKey = apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "duplicate_key", message: "request body repeats a top-level key the proxy reads or writes (model, stream, messages or a patched key)"}
	// Every 503 carries Retry-After: busy and a full queue say
	// 1 s, cooling and failures say when the first upstream comes back.
	errAllBusy      = apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "all_upstreams_busy", message: "all upstreams busy", retryAfter: 1}
	errAllFailed    = apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "all_upstreams_failed", message: "all upstreams failed", retryAfter: 1}
	errQueueFull    = apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "queue_full", message: "queue full", retryAfter: 1}
	errUpstreamAuth = apiError{status: http.StatusBadGateway, typ: "server_error", code: "upstream_auth_error", message: "every upstream refused the proxy's credentials (401/403); see the proxy log"}
	// The upstreams lack the endpoint or the model (404/405): the proxy's
	// configuration is wrong, which a retry cannot fix, so 502 and no
	// Retry-After, like upstream_auth_error.
	errUpstreamNotFound = apiError{status: http.StatusBadGateway, typ: "server_error", code: "upstream_not_found", message: "every upstream answered 404/405: the proxy's provider url or upstream model name is wrong; see the proxy log"}
	errUnsupported      = apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "unsupported_endpoint", message: "no such endpoint; this proxy serves POST /v1/chat/completions, /v1/responses, /v1/messages, /v1/messages/count_tokens, /v1/embeddings, /v1/completions and GET /v1/models, /v1/models/{id} (each also without the /v1 prefix), and the Gemini API under /v1beta"}
	errCORSOrigin       = apiError{status: http.StatusForbidden, typ: "invalid_request_error", code: "cors_origin_not_allowed", message: "the request's Origin is not allowed by the proxy's cors setting"}
	// errNoRule cannot happen: validation gives every effort a catch-all
	// rule. Should it, the client gets a clear 500, never a panic.
	errNoRule       = apiError{status: http.StatusInternalServerError, typ: "server_error", code: "no_rule", message: "no rule of the router model matched the request"}
	errQueueTimeout = apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "queue_timeout", message: "timed out waiting for a slot", retryAfter: 1}
)

// errUnknownModel is the 404 for a model the config does not name.
func errUnknownModel(name string) apiError {
	return apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found",
		message: "model " + strconv.Quote(name) + " does not exist"}
}

// errTooLarge is the 413 for a body over limit bytes; the message states the
// limit so that a client knows how much to cut.
func errTooLarge(limit int64) apiError {
	return apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "request_too_large",
		message: "request body is larger than the limit of " + strconv.FormatInt(limit, 10) + " bytes"}
}

// errMethod is the 405 for a known API path asked with the wrong method.
func errMethod(allow string) apiError {
	return apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error", code: "method_not_allowed",
		message: "use " + allow + " on this endpoint"}
}

// errAllCooling is the 503 when every upstream of the model is in backoff;
// Retry-After says when the first one comes back.
func errAllCooling(seconds int) apiError {
	return apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "all_upstreams_cooling",
		message: "all upstreams cooling, retry in " + strconv.Itoa(seconds) + "s", retryAfter: seconds}
}

// write sends the error as the whole response.
func (e apiError) write(w http.ResponseWriter) {
	body := make([]byte, 0, 128+len(e.message))
	body = append(body, `{"error":{"message":`...)
	body = appendJSONString(body, e.message)
	body = append(body, `,"type":`...)
	body = appendJSONString(body, e.typ)
	// OpenAI's error objects always carry param; SDKs may read it.
	body = append(body, `,"param":null,"code":`...)
	body = appendJSONString(body, e.code)
	body = append(body, `}}`+"\n"...)
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	if e.retryAfter > 0 {
		hdr.Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	writeJSON(w, e.status, body)
}

// writeJSON sends a whole JSON response. A failed write means the client
// left; there is nobody to report it to.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return append(dst, b...)
}

// refuse answers a request the proxy turns away itself, in the front's
// shape. Every refusal passes here exactly once, so each leaves one trace:
// an INFO log line with its reason and the client key's id (never the
// secret; none before the key is known) and one count in
// llm_proxy_rejected_total{reason}. fields add what the caller knows (the
// model).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, f front, e apiError, fields ...zap.Field) {
	h.noteRefusal(r, refusalReason(e.code), e.code, e.status, e.retryAfter, fields...)
	e.writeAs(w, f)
}

// noteRefusal logs and counts a refusal (refuse; a translator's own 400
// comes here directly).
func (h *Handler) noteRefusal(r *http.Request, reason, code string, status, retryAfter int, fields ...zap.Field) {
	h.metrics.rejected(reason).Inc()
	c := h.logger.Check(zapcore.InfoLevel, "request refused")
	if c == nil {
		return
	}
	all := make([]zap.Field, 0, 7+len(fields))
	all = append(all, zap.String("reason", reason), zap.String("code", code), zap.Int("status", status),
		zap.String("method", r.Method), zap.String("path", r.URL.Path))
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		if id, ok := repl.Get("http.llm_route.key"); ok {
			if s, ok := id.(string); ok {
				all = append(all, zap.String("key", s))
			}
		}
	}
	if retryAfter > 0 {
		all = append(all, zap.Int("retry_after", retryAfter))
	}
	c.Write(append(all, fields...)...)
}

// clientModel logs a model name the client sent, which no config bounds:
// a long one is cut so that it cannot bloat the log.
func clientModel(name string) zap.Field {
	const max = 200
	if len(name) > max {
		name = name[:max] + "…"
	}
	return zap.String("model", name)
}

// refusalReasons maps the error codes of the proxy's refusals to the
// reason label of llm_proxy_rejected_total: short, stable words, several
// codes to one where a dashboard need not tell them apart.
var refusalReasons = map[string]string{
	"invalid_api_key":         "invalid_api_key",
	"model_not_allowed":       "model_not_allowed",
	"rate_limit_exceeded":     "rate_limited",
	"insufficient_quota":      "budget",
	"model_not_found":         "unknown_model",
	"invalid_json":            "bad_request",
	"missing_model":           "bad_request",
	"duplicate_key":           "bad_request",
	"body_read_error":         "bad_request",
	"request_too_large":       "too_large",
	"context_length_exceeded": "context_too_long",
	"unsupported_endpoint":    "unsupported_endpoint",
	"method_not_allowed":      "method",
	"cors_origin_not_allowed": "cors",
	"no_upstream_for_api":     "api_not_served",
	"stream_needs_sse":        "bad_request",
	"all_upstreams_busy":      "busy",
	"all_upstreams_cooling":   "cooling",
	"queue_full":              "queue_full",
	"queue_timeout":           "queue_timeout",
	"all_upstreams_failed":    "all_failed",
	"upstream_auth_error":     "upstream_auth",
	"upstream_not_found":      "upstream_not_found",
}

// refusalReason is the reason label of an error code; "other" for a code
// the table does not know, so the label set stays bounded.
func refusalReason(code string) string {
	if r, ok := refusalReasons[code]; ok {
		return r
	}
	return "other"
}
