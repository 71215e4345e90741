package llmroute

import (
	"context"
	"io"
	"net/http"
	"strings"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// hopHeaders are hop-by-hop headers (RFC 9110 §7.6.1) and framing headers
// that the transport sets itself.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Te", "Trailer",
	"Transfer-Encoding", "Upgrade", "Content-Length", "Host", "Expect"}

// upstreamRequest builds the outgoing request: the client's headers minus
// credentials and hop-by-hop ones, the provider's key and static headers,
// and the session header.
func (h *Handler) upstreamRequest(ctx context.Context, r *http.Request, u *upstream, out []byte, body io.ReadCloser) *http.Request {
	hdr := make(http.Header, len(r.Header)+4)
	for k, vv := range r.Header {
		if !forwardable(k) {
			continue
		}
		hdr[k] = vv // read-only from here on: sharing the slices is safe
	}
	for _, name := range r.Header["Connection"] {
		for _, f := range splitComma(name) {
			delete(hdr, http.CanonicalHeaderKey(f))
		}
	}
	if u.think != transform.ThinkOff {
		// The response is rewritten, so it must come uncompressed.
		hdr.Set("Accept-Encoding", "identity")
	}
	hdr.Set("Content-Type", "application/json")
	if u.auth != "" {
		hdr["Authorization"] = []string{u.auth}
	}
	for _, kv := range u.headers {
		hdr.Set(kv[0], kv[1])
	}
	if u.sessionHdr != "" {
		hdr.Set(u.sessionHdr, sessions.ID(out))
	}
	req := http.Request{
		Method:        http.MethodPost,
		URL:           u.target,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        hdr,
		Body:          body,
		ContentLength: int64(len(out)),
		Host:          u.target.Host,
	}
	return req.WithContext(ctx) // one allocation: req itself stays on the stack
}

// forwardable reports whether a client request header may go upstream:
// not a credential, not hop-by-hop.
func forwardable(k string) bool {
	switch k {
	case "Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key",
		"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Te", "Trailer",
		"Transfer-Encoding", "Upgrade", "Content-Length", "Host", "Expect":
		return false
	}
	return true
}

func splitComma(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// writeResponseHeader copies the upstream's status and headers, minus
// hop-by-hop ones.
func (h *Handler) writeResponseHeader(w http.ResponseWriter, resp *http.Response, u *upstream, t *target) {
	dst := w.Header()
	for k, vv := range resp.Header {
		dst[k] = vv
	}
	for _, name := range resp.Header.Values("Connection") {
		for _, f := range splitComma(name) {
			dst.Del(f)
		}
	}
	for _, k := range hopHeaders {
		if k != "Content-Length" {
			delete(dst, k)
		}
	}
	if u.think != transform.ThinkOff && resp.StatusCode < 300 {
		// The body may change length.
		delete(dst, "Content-Length")
	}
	w.WriteHeader(resp.StatusCode)
}
