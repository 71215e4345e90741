package llmroute

import (
	"encoding/json"
	"net/http"
	"strconv"
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
	errUnsupported  = apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "unsupported_endpoint", message: "this endpoint is not supported by the proxy"}
	errCORSOrigin   = apiError{status: http.StatusForbidden, typ: "invalid_request_error", code: "cors_origin_not_allowed", message: "the request's Origin is not allowed by the proxy's cors setting"}
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
