package llmroute

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// apiError is an error the proxy answers itself, in the OpenAI error shape
// (`{"error":{"message","type","code"}}`). Messages are fixed texts written
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
	errTooLarge     = apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "request_too_large", message: "request body is larger than the proxy accepts"}
	errReadBody     = apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "body_read_error", message: "could not read the request body"}
	errAllBusy      = apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "all_upstreams_busy", message: "all upstreams busy"}
	errAllFailed    = apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "all_upstreams_failed", message: "all upstreams failed"}
	errQueueFull    = apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "queue_full", message: "queue full"}
	errQueueTimeout = apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "queue_timeout", message: "timed out waiting for a slot", retryAfter: 1}
)

// errUnknownModel is the 404 for a model the config does not name.
func errUnknownModel(name string) apiError {
	return apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found",
		message: "model " + strconv.Quote(name) + " does not exist"}
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
	body = append(body, `,"code":`...)
	body = appendJSONString(body, e.code)
	body = append(body, "}}\n"...)
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
