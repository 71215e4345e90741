package llmroute

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// hopHeaders are the hop-by-hop headers of Caddy's reverse_proxy
// (reverseproxy.go), one list for both directions. Alt-Svc is among them: an
// upstream's alternative services are not this server's, and copying it
// would replace the Alt-Svc Caddy itself advertises (HTTP/3).
var hopHeaders = []string{"Alt-Svc", "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// Header values every upstream request carries, built once. An outgoing
// request's header map is only read from here on (by the transport), so its
// slices can be shared; none of them is ever put on a response, where Caddy's
// header handler may rewrite values in place.
var (
	jsonContentType  = []string{"application/json"}
	identityEncoding = []string{"identity"}
	protoHTTP        = []string{"http"}
	protoHTTPS       = []string{"https"}
)

// headerValue is one static provider header, its value as a header slice.
type headerValue struct {
	name string // canonical
	vals []string
}

// buildHeaderValues fills authValue and headerValues from auth and headers.
func (u *upstream) buildHeaderValues() {
	u.authValue = nil
	if u.auth != "" {
		u.authValue = []string{u.auth}
	}
	u.headerValues = u.headerValues[:0]
	for _, kv := range u.headers {
		u.headerValues = append(u.headerValues, headerValue{name: kv[0], vals: []string{kv[1]}})
	}
}

// upstreamRequest builds the outgoing request: the allow-listed client
// headers (see forwardable), the forwarding headers, the provider's key and
// static headers, and the session header. r is nil for a probe, which
// forwards nothing of a client.
//
// auth is the key header's value the call chose (call.takeKey), nil for none.
func (h *Handler) upstreamRequest(ctx context.Context, r *http.Request, u *upstream, auth []string, dst *url.URL, out []byte, body io.ReadCloser) *http.Request {
	var hdr http.Header
	if r == nil {
		hdr = make(http.Header, 4)
	} else {
		hdr = make(http.Header, len(r.Header)+4)
		conn := r.Header["Connection"]
		for k, vv := range r.Header {
			if !u.forwardable(k) || conn != nil && listed(conn, k) {
				continue
			}
			hdr[k] = vv // read-only from here on: sharing the slices is safe
		}
		setForwarded(hdr, r)
	}
	if u.think != transform.ThinkOff {
		// The response is rewritten, so it must come uncompressed.
		hdr["Accept-Encoding"] = identityEncoding
	}
	hdr["Content-Type"] = jsonContentType
	if auth != nil {
		hdr[u.authHdr] = auth
	}
	for _, kv := range u.headerValues {
		hdr[kv.name] = kv.vals
	}
	req := http.Request{
		Method:        http.MethodPost,
		URL:           dst,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        hdr,
		Body:          body,
		ContentLength: int64(len(out)),
		Host:          dst.Host,
	}
	return req.WithContext(ctx) // one allocation: req itself stays on the stack
}

// forwardable reports whether a client request header (canonical name) may
// go upstream. It is an allow-list: content negotiation, the
// client's identity and the API-version selectors SDKs send, plus the
// provider's forward_headers. Everything else stays behind — credentials
// (Authorization, X-Api-Key, X-Goog-Api-Key, X-Auth-Token, cookies), billing
// selectors (OpenAI-Organization, OpenAI-Project) and client-made
// forwarding headers (Forwarded, X-Real-Ip, X-Forwarded-*; the proxy sets
// its own) — so a client can never choose what the operator's key pays for.
func (u *upstream) forwardable(k string) bool {
	switch k {
	case "Accept", "Accept-Encoding", "Accept-Language", "Accept-Charset",
		"User-Agent", "Openai-Beta", "Anthropic-Version", "Anthropic-Beta":
		return true
	}
	if strings.HasPrefix(k, "X-Stainless-") {
		return true // the SDKs' own telemetry: language, retry count, timeout
	}
	for _, f := range u.forward {
		if f == k {
			return true
		}
	}
	return false
}

// setForwarded sets X-Forwarded-For, -Proto and -Host as Caddy's
// reverse_proxy does (addForwardedHeaders): the client's own values are kept
// only when the peer is one of the server's trusted_proxies; otherwise the
// proxy states what it saw itself.
func setForwarded(hdr http.Header, r *http.Request) {
	trusted, _ := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool)
	clientIP := ""
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		clientIP, _, _ = strings.Cut(host, "%") // an IPv6 zone is not part of the address
	}
	// The two per-request values share one allocation; each slice is capped
	// at its own element so an append can never write into the other.
	vals := new([2]string)
	prior := strings.Join(r.Header["X-Forwarded-For"], ", ")
	switch {
	case trusted && prior != "" && clientIP != "":
		vals[0] = prior + ", " + clientIP
	case trusted && prior != "":
		vals[0] = prior
	default:
		vals[0] = clientIP
	}
	if vals[0] != "" {
		hdr["X-Forwarded-For"] = vals[0:1:1]
	}
	proto := protoHTTP
	if r.TLS != nil {
		proto = protoHTTPS
	}
	if vv := r.Header["X-Forwarded-Proto"]; trusted && len(vv) > 0 && vv[len(vv)-1] != "" {
		proto = vv[len(vv)-1:] // the client's slice, only ever read
	}
	hdr["X-Forwarded-Proto"] = proto
	vals[1] = r.Host
	if v := lastValue(r.Header, "X-Forwarded-Host"); trusted && v != "" {
		vals[1] = v
	}
	if vals[1] != "" {
		hdr["X-Forwarded-Host"] = vals[1:2:2]
	}
}

// lastValue is the last value of a header, or "".
func lastValue(hdr http.Header, k string) string {
	if vv := hdr[k]; len(vv) > 0 {
		return vv[len(vv)-1]
	}
	return ""
}

// listed reports whether a Connection header's values name k: such a
// header is hop-by-hop for this message (RFC 9110 §7.6.1).
func listed(conn []string, k string) bool {
	for _, v := range conn {
		for v != "" {
			var tok string
			tok, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(tok), k) {
				return true
			}
		}
	}
	return false
}

// writeResponseHeader copies the upstream's status and headers, minus
// hop-by-hop ones, onto what Caddy and earlier handlers already set. Headers
// the proxy owns (its CORS answer) are not replaced by the upstream's.
func (h *Handler) writeResponseHeader(w http.ResponseWriter, resp *http.Response, u *upstream, translated bool) {
	dst := w.Header()
	cors := dst["Access-Control-Allow-Origin"] != nil
	conn := resp.Header["Connection"]
	for k, vv := range resp.Header {
		if isHopHeader(k) || conn != nil && listed(conn, k) || cors && strings.HasPrefix(k, "Access-Control-") {
			continue
		}
		if k == "Vary" && cors {
			dst[k] = append(append([]string(nil), vv...), dst[k]...)
			continue
		}
		dst[k] = vv
	}
	if translated || u.think != transform.ThinkOff && resp.StatusCode < 300 {
		// The body may change length.
		delete(dst, "Content-Length")
	}
	if translated && !isEventStream(resp) {
		dst.Set("Content-Type", "application/json")
	}
	w.WriteHeader(resp.StatusCode)
}

// isHopHeader reports one of hopHeaders (canonical name).
func isHopHeader(k string) bool {
	for _, hop := range hopHeaders {
		if hop == k {
			return true
		}
	}
	return false
}
