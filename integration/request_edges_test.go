package integration

// Issue 10 items 6–14: duplicate keys, the client header allow-list,
// response hop-by-hop headers, request_body's 413, Retry-After on every 503,
// upstream 401/403, which paths are the handler's, CORS, and think rewriting
// of large stream events.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// loadServer loads the handler with extra fields on the HTTP server object
// (e.g. trusted_proxies) and the given handlers before and after it.
func (p *proxy) loadServer(handler map[string]any, server map[string]any, before ...any) {
	p.t.Helper()
	h := map[string]any{"handler": "llm_route"}
	for k, v := range handler {
		h[k] = v
	}
	handle := append(append(before, h), p.next...)
	var cfg map[string]any
	if err := json.Unmarshal(p.configRoutes([]any{map[string]any{"handle": handle}}), &cfg); err != nil {
		p.t.Fatal(err)
	}
	srv := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["srv0"].(map[string]any)
	for k, v := range server {
		srv[k] = v
	}
	b, _ := json.Marshal(cfg)
	if err := loadCaddy(p.t, b); err != nil {
		p.t.Fatalf("loading config: %v", err)
	}
}

// do sends a request to the proxy.
func (p *proxy) do(method, path, body string, hdr ...string) *http.Response {
	p.t.Helper()
	req, err := http.NewRequest(method, p.URL+path, strings.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		p.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// TestDuplicateKeys (item 6): a repeated top-level key the proxy reads
// (model, stream, messages) or a route's patch writes is a 400
// duplicate_key, before any upstream is called; other duplicates pass.
func TestDuplicateKeys(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "p", "url", up.base())},
		[]map[string]any{obj("id", "u", "provider", "p", "model", "real")},
		[]map[string]any{
			obj("name", "cheap", "upstreams", []string{"u"}, "patch", obj("temperature", 0)),
			obj("name", "other", "upstreams", []string{"u"}, "patch", obj("top_p", 1)),
		},
	))
	for _, body := range []string{
		`{"model":"gpt-4-32k","model":"cheap","messages":[]}`,
		`{"model":"cheap","mod\u0065l":"cheap","messages":[]}`,
		`{"model":"cheap","stream":false,"messages":[],"stream":true}`,
		`{"model":"cheap","messages":[{"role":"user","content":"a"}],"messages":[]}`,
		`{"model":"cheap","temperature":2,"messages":[],"temperature":1}`,
	} {
		expectAPIError(t, p.chat(body), http.StatusBadRequest, "duplicate_key")
	}
	if n := len(up.Calls()); n != 0 {
		t.Fatalf("a rejected body reached the upstream (%d calls)", n)
	}
	// Duplicates of keys neither read nor written by this route pass as
	// they are (top_p is patched only on the other model).
	for _, body := range []string{
		`{"model":"cheap","top_p":1,"messages":[],"top_p":0.5}`,
		`{"model":"other","temperature":2,"messages":[],"temperature":1}`,
	} {
		if resp := p.chat(body); resp.StatusCode != 200 {
			t.Errorf("%s: status %d: %s", body, resp.StatusCode, readAll(t, resp))
		} else {
			resp.Body.Close()
		}
	}
}

// TestClientHeaderAllowList (item 7): only allow-listed client headers and
// the provider's forward_headers reach the upstream; X-Forwarded-* are the
// proxy's own unless the peer is a trusted proxy.
func TestClientHeaderAllowList(t *testing.T) {
	up := newUpstream(t, nil)
	handler := cfg(
		[]map[string]any{obj("id", "p", "url", up.base(), "key", "sk-test-secret-h", "forward_headers", []string{"x-trace-id"})},
		[]map[string]any{obj("id", "u", "provider", "p", "model", "real")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"u"})},
	)
	p := startProxy(t, handler)
	send := func() http.Header {
		t.Helper()
		n := len(up.Calls())
		resp := p.chat(chatBody("m", false),
			"User-Agent", "OpenAI/Python 1.99.0",
			"Accept", "application/json",
			"OpenAI-Beta", "assistants=v2",
			"Anthropic-Version", "2023-06-01",
			"Anthropic-Beta", "tools-2024",
			"X-Stainless-Lang", "python",
			"X-Stainless-Retry-Count", "0",
			"X-Trace-Id", "trace-1",
			"OpenAI-Organization", "org-client",
			"OpenAI-Project", "proj-client",
			"X-Goog-Api-Key", "client-goog",
			"X-Auth-Token", "client-token",
			"Cookie", "client-cookie=1",
			"Forwarded", "for=6.6.6.6",
			"X-Real-Ip", "6.6.6.6",
			"X-Forwarded-For", "6.6.6.6",
			"X-Forwarded-Proto", "https",
			"X-Forwarded-Host", "evil.example",
			"X-Unknown", "client-other",
		)
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		calls := up.Calls()
		if len(calls) != n+1 {
			t.Fatalf("upstream calls = %d, want %d", len(calls), n+1)
		}
		return calls[n].Header
	}

	h := send()
	for k, want := range map[string]string{
		"User-Agent": "OpenAI/Python 1.99.0", "Accept": "application/json", "Openai-Beta": "assistants=v2",
		"Anthropic-Version": "2023-06-01", "Anthropic-Beta": "tools-2024", "X-Stainless-Lang": "python",
		"X-Stainless-Retry-Count": "0", "X-Trace-Id": "trace-1", "Authorization": "Bearer sk-test-secret-h",
		"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "X-Forwarded-Host": p.URL[len("http://"):],
	} {
		if got := h.Values(k); len(got) != 1 || got[0] != want {
			t.Errorf("upstream %s = %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"Openai-Organization", "Openai-Project", "X-Goog-Api-Key", "X-Auth-Token", "Cookie",
		"Forwarded", "X-Real-Ip", "X-Unknown"} {
		if v, ok := h[k]; ok {
			t.Errorf("client header %s reached the upstream: %q", k, v)
		}
	}

	// Behind a trusted proxy (the server's trusted_proxies), the client's
	// forwarding headers are kept, with the peer appended to the chain.
	p.loadServer(handler, map[string]any{"trusted_proxies": map[string]any{"source": "static", "ranges": []string{"127.0.0.1/32"}}})
	h = send()
	for k, want := range map[string]string{
		"X-Forwarded-For": "6.6.6.6, 127.0.0.1", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "evil.example",
	} {
		if got := h.Values(k); len(got) != 1 || got[0] != want {
			t.Errorf("trusted peer: upstream %s = %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"Forwarded", "X-Real-Ip", "Openai-Organization"} {
		if v, ok := h[k]; ok {
			t.Errorf("trusted peer: client header %s reached the upstream: %q", k, v)
		}
	}
}

// TestResponseHopHeaders (item 8): the upstream's hop-by-hop headers,
// Alt-Svc included, never reach the client, and Caddy's own Alt-Svc stays.
func TestResponseHopHeaders(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Alt-Svc", `h3=":9999"; ma=86400`)
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "hop value")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Proxy-Authenticate", "Basic")
		completion("hi")(w, r)
	})
	p := startProxy(t, basicConfig(up, 0))
	p.loadServer(basicConfig(up, 0), nil, obj("handler", "headers",
		"response", obj("set", map[string][]string{"Alt-Svc": {`h3=":443"; ma=2592000`}})))
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got := resp.Header.Values("Alt-Svc"); len(got) != 1 || got[0] != `h3=":443"; ma=2592000` {
		t.Errorf("Alt-Svc = %q, want only Caddy's own", got)
	}
	for _, k := range []string{"X-Hop", "Keep-Alive", "Proxy-Authenticate"} {
		if v := resp.Header.Values(k); len(v) != 0 {
			t.Errorf("hop-by-hop %s reached the client: %q", k, v)
		}
	}
	if got := resp.Header.Get("X-Request-Id"); got != "req-123" {
		t.Errorf("X-Request-Id = %q, want the upstream's", got)
	}
}

// TestBodyTooLarge413 (item 9): a body cut by Caddy's request_body max_size
// is a 413 naming that limit; the handler's own bound names its own.
func TestBodyTooLarge413(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))
	p.loadServer(basicConfig(up, 0), nil, obj("handler", "request_body", "max_size", 100))
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 300) + `"}]}`
	// No Content-Length (chunked): the cut happens while the handler reads.
	req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/chat/completions", io.MultiReader(strings.NewReader(big)))
	req.ContentLength = -1
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if msg := expectAPIError(t, resp, http.StatusRequestEntityTooLarge, "request_too_large"); !strings.Contains(msg, "100 bytes") {
		t.Errorf("413 message %q does not state the 100-byte limit", msg)
	}

	h := basicConfig(up, 0)
	h["max_request_body"] = 200
	p.load(h)
	if msg := expectAPIError(t, p.chat(big), http.StatusRequestEntityTooLarge, "request_too_large"); !strings.Contains(msg, "200 bytes") {
		t.Errorf("413 message %q does not state the 200-byte limit", msg)
	}
	if n := len(up.Calls()); n != 0 {
		t.Errorf("upstream calls = %d", n)
	}
}

// TestRetryAfterOnEvery503 (item 10): the request whose own attempt got
// 429 Retry-After: 15 already carries Retry-After; busy and a full queue
// say 1.
func TestRetryAfterOnEvery503(t *testing.T) {
	t.Run("own attempt got Retry-After", func(t *testing.T) {
		up := newUpstream(t, status(http.StatusTooManyRequests, "Retry-After", "15"))
		p := startProxy(t, basicConfig(up, 0))
		resp := p.chat(chatBody("m", false))
		ra := resp.Header.Get("Retry-After")
		expectAPIError(t, resp, http.StatusServiceUnavailable, "all_upstreams_failed")
		if n, err := strconv.Atoi(ra); err != nil || n < 10 || n > 15 {
			t.Errorf("Retry-After = %q, want the upstream's 15 s (counting down)", ra)
		}
	})
	t.Run("failed without cooling", func(t *testing.T) {
		up := newUpstream(t, status(http.StatusInternalServerError))
		p := startProxy(t, basicConfig(up, 0))
		resp := p.chat(chatBody("m", false))
		ra := resp.Header.Get("Retry-After")
		expectAPIError(t, resp, http.StatusServiceUnavailable, "all_upstreams_failed")
		if ra != "1" {
			t.Errorf("Retry-After = %q, want 1", ra)
		}
	})
	t.Run("busy and queue full", func(t *testing.T) {
		g := newGate()
		up := newUpstream(t, g.handler(completion("ok")))
		defer g.open()
		h := basicConfig(up, 1)
		p := startProxy(t, h)
		held := p.goChat(context.Background(), chatBody("m", false))
		g.waitArrivals(t, 1)
		resp := p.chat(chatBody("m", false))
		ra := resp.Header.Get("Retry-After")
		expectAPIError(t, resp, http.StatusServiceUnavailable, "all_upstreams_busy")
		if ra != "1" {
			t.Errorf("busy: Retry-After = %q, want 1", ra)
		}
		g.open()
		await(t, held)

		g2 := newGate()
		up.setHandler(g2.handler(completion("ok")))
		defer g2.open()
		h["queue_size"] = 1
		p.load(h)
		held = p.goChat(context.Background(), chatBody("m", false))
		g2.waitArrivals(t, 1)
		waiter := p.goChat(context.Background(), chatBody("m", false))
		eventually(t, 10*time.Second, "a waiter in the queue", func() bool {
			return p.metric("llm_proxy_queue_depth", "model", "m") == 1
		})
		resp = p.chat(chatBody("m", false))
		ra = resp.Header.Get("Retry-After")
		expectAPIError(t, resp, http.StatusServiceUnavailable, "queue_full")
		if ra != "1" {
			t.Errorf("queue full: Retry-After = %q, want 1", ra)
		}
		g2.open()
		await(t, held)
		await(t, waiter)
	})
}

// TestUpstreamAuthErrors (item 11): 401/403 fail over and back off with
// result auth_err; when every failure was one, the client gets 502
// upstream_auth_error, and the upstream's body only reaches the log,
// redacted.
func TestUpstreamAuthErrors(t *testing.T) {
	const leaked = "sk-proj-LEAKED0123456789abcdef"
	refuse := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"error":{"message":"Incorrect API key provided: %s. Account acme-billing.","code":"invalid_api_key"}}`, leaked)
		}
	}
	a := newUpstream(t, refuse(http.StatusUnauthorized))
	b := newUpstream(t, refuse(http.StatusForbidden))
	c := newUpstream(t, nil)
	handler := func(second string) map[string]any {
		return cfg(
			[]map[string]any{
				obj("id", "pa", "url", a.base(), "key", "sk-test-secret-a", "backoff", "30s"),
				obj("id", "pb", "url", b.base(), "key", "sk-test-secret-b", "backoff", "30s"),
				obj("id", "pc", "url", c.base()),
			},
			[]map[string]any{
				obj("id", "ua", "provider", "pa", "model", "x"),
				obj("id", "ub", "provider", "pb", "model", "x"),
				obj("id", "uc", "provider", "pc", "model", "x"),
			},
			[]map[string]any{obj("name", "m", "upstreams", []string{"ua", second})},
		)
	}
	p := startProxy(t, handler("ub"))
	resp := p.chat(chatBody("m", false))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, `"code":"upstream_auth_error"`) {
		t.Fatalf("status %d body %s, want 502 upstream_auth_error", resp.StatusCode, body)
	}
	if strings.Contains(body, "acme") || strings.Contains(body, "LEAKED") {
		t.Errorf("the upstream's body reached the client: %s", body)
	}
	for _, u := range []string{"ua", "ub"} {
		prov := "p" + u[1:]
		if got := p.requests("m", u, prov, "auth_err"); got != 1 {
			t.Errorf("%s: auth_err counted %v times", u, got)
		}
		if c := p.upstreamGauge("cooling_seconds", u, prov); c <= 0 {
			t.Errorf("%s: not cooling after a refusal", u)
		}
	}
	logged := p.logEntries("upstream refused the provider key")
	if len(logged) != 2 {
		t.Fatalf("refusal log entries = %d, want 2", len(logged))
	}
	if msg, _ := logged[0]["body"].(string); !strings.Contains(msg, "Incorrect API key") || strings.Contains(msg, "LEAKED") {
		t.Errorf("logged body %q: want the upstream's text with the key redacted", msg)
	}
	if strings.Contains(p.logs(), "LEAKED") || strings.Contains(p.logs(), "sk-test-secret") {
		t.Error("a key reached the log")
	}

	// A refusal followed by a working upstream is served (failover).
	p.load(handler("uc"))
	a.setHandler(refuse(http.StatusUnauthorized))
	caddyCooling := p.upstreamGauge("cooling_seconds", "ua", "pa")
	resp = p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Errorf("with a working second upstream: status %d: %s (ua cooling %v)", resp.StatusCode, body, caddyCooling)
	}

	// Mixed failures: not every one was 401/403, so 503 all failed.
	c.setHandler(status(http.StatusInternalServerError))
	p.load(handler("uc"))
	fresh := newUpstream(t, refuse(http.StatusUnauthorized))
	h := handler("uc")
	h["providers"].([]map[string]any)[0]["url"] = fresh.base()
	h["providers"].([]map[string]any)[0]["id"] = "pa2"
	h["upstreams"].([]map[string]any)[0]["provider"] = "pa2"
	h["upstreams"].([]map[string]any)[0]["id"] = "ua2"
	h["models"].([]map[string]any)[0]["upstreams"] = []string{"ua2", "uc"}
	p.load(h)
	expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_failed")
}

// TestAPIPaths (item 12): API paths under a /v1 root, or under the
// handler's own mount, are the handler's; unknown ones under /v1 are a
// JSON 404 unsupported_endpoint; wrong methods are 405.
func TestAPIPaths(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))
	p.next = []any{obj("handler", "static_response", "status_code", 418, "body", "next handler")}
	p.load(basicConfig(up, 0))

	// The other fronts (/v1/messages, /v1/responses, …) are served: see fronts_test.go.
	for _, path := range []string{"/v1/foo", "/v1/", "/openai/v1/nope", "/v1/messages/nope"} {
		expectAPIError(t, p.do(http.MethodPost, path, `{"model":"m"}`), http.StatusNotFound, "unsupported_endpoint")
	}
	resp := p.do(http.MethodPost, "/openai/v1/chat/completions", chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "chat.completion") {
		t.Errorf("POST /openai/v1/chat/completions: %d %s", resp.StatusCode, body)
	}
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodGet, "/v1/chat/completions", "POST"},
		{http.MethodPost, "/v1/models", "GET, HEAD"},
		{http.MethodDelete, "/v1/models/m", "GET, HEAD"},
		{http.MethodOptions, "/v1/chat/completions", "POST"}, // no cors configured
	} {
		resp := p.do(tc.method, tc.path, "")
		if got := resp.Header.Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow = %q, want %q", tc.method, tc.path, got, tc.allow)
		}
		expectAPIError(t, resp, http.StatusMethodNotAllowed, "method_not_allowed")
	}

	// Mounted with handle_path /llm/*: the stripped paths are the API's,
	// the mount's other paths go on.
	if err := p.loadRoutes([]any{obj(
		"match", []any{obj("path", []string{"/llm/*"})},
		"handle", []any{
			obj("handler", "rewrite", "strip_path_prefix", "/llm"),
			obj("handler", "llm_route", "providers", basicConfig(up, 0)["providers"],
				"upstreams", basicConfig(up, 0)["upstreams"], "models", basicConfig(up, 0)["models"]),
			obj("handler", "static_response", "status_code", 418, "body", "next handler"),
		},
	)}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/llm/chat/completions", "/llm/v1/chat/completions"} {
		resp := p.do(http.MethodPost, path, chatBody("m", false))
		if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "chat.completion") {
			t.Errorf("POST %s: %d %s", path, resp.StatusCode, body)
		}
	}
	if resp := p.do(http.MethodGet, "/llm/models", ""); !strings.Contains(readAll(t, resp), `"object":"list"`) {
		t.Error("GET /llm/models is not the model list")
	}
	if resp := p.do(http.MethodGet, "/llm/index.html", ""); readAll(t, resp) != "next handler" {
		t.Error("GET /llm/index.html did not go to the next handler")
	}
}

// TestCORS (item 13): a listed origin's preflight is answered 204 with the
// allowed methods and headers, and its requests carry
// Access-Control-Allow-Origin; another origin gets no CORS headers and a
// 403 preflight.
func TestCORS(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*") // the upstream's policy is not ours
		w.Header().Set("Vary", "Accept-Encoding")
		completion("hi")(w, r)
	})
	h := basicConfig(up, 0)
	h["cors"] = []string{"https://app.example"}
	p := startProxy(t, h)

	resp := p.do(http.MethodOptions, "/v1/chat/completions", "", "Origin", "https://app.example",
		"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "x-stainless-os, openai-beta")
	readAll(t, resp)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("preflight status %d, want 204", resp.StatusCode)
	}
	want := map[string]string{
		"Access-Control-Allow-Origin":  "https://app.example",
		"Access-Control-Allow-Methods": "POST, GET",
	}
	for k, v := range want {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("preflight %s = %q, want %q", k, got, v)
		}
	}
	allowHdr := strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers"))
	for _, k := range []string{"authorization", "content-type", "x-api-key", "anthropic-version", "x-stainless-os", "openai-beta"} {
		if !strings.Contains(allowHdr, k) {
			t.Errorf("Access-Control-Allow-Headers %q lacks %s", allowHdr, k)
		}
	}
	if !strings.Contains(strings.Join(resp.Header.Values("Vary"), ","), "Origin") {
		t.Errorf("preflight Vary = %q, want Origin", resp.Header.Values("Vary"))
	}

	resp = p.do(http.MethodPost, "/v1/chat/completions", chatBody("m", false), "Origin", "https://app.example",
		"Content-Type", "application/json")
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("POST: %d %s", resp.StatusCode, body)
	}
	if got := resp.Header.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "https://app.example" {
		t.Errorf("POST Access-Control-Allow-Origin = %q, want the origin only", got)
	}
	if vary := strings.Join(resp.Header.Values("Vary"), ","); !strings.Contains(vary, "Origin") || !strings.Contains(vary, "Accept-Encoding") {
		t.Errorf("POST Vary = %q, want the upstream's and Origin", vary)
	}

	// An origin not listed: no CORS headers, preflight 403.
	resp = p.do(http.MethodOptions, "/v1/chat/completions", "", "Origin", "https://evil.example",
		"Access-Control-Request-Method", "POST")
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Error("an unlisted origin got Access-Control-Allow-Origin")
	}
	expectAPIError(t, resp, http.StatusForbidden, "cors_origin_not_allowed")
	resp = p.do(http.MethodGet, "/v1/models", "", "Origin", "https://evil.example")
	readAll(t, resp)
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Error("GET from an unlisted origin got Access-Control-Allow-Origin")
	}

	// "*" allows any origin, echoing it.
	h["cors"] = []string{"*"}
	p.load(h)
	resp = p.do(http.MethodOptions, "/v1/models", "", "Origin", "http://localhost:5173", "Access-Control-Request-Method", "GET")
	readAll(t, resp)
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "http://localhost:5173" {
		t.Errorf("cors *: preflight %d, Allow-Origin %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}
}

// TestThinkRewriteLargeEvent (item 14): one SSE event of 2 MiB is rewritten
// under the default max_rewrite_size (the old 1 MiB bound let its <think>
// through); above a configured bound it passes raw with a warning.
func TestThinkRewriteLargeEvent(t *testing.T) {
	text := strings.Repeat("z", 2<<20)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		writeStream(w, []string{
			`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"x","choices":[{"index":0,"delta":{"content":"<think>why</think>` + text + `"},"finish_reason":null}]}` + "\n\n",
			"data: [DONE]\n\n",
		}, 0)
	})
	h := basicConfig(up, 0)
	h["providers"].([]any)[0].(map[string]any)["think_tags"] = "split"
	p := startProxy(t, h)
	check := func(wantRewritten bool) {
		t.Helper()
		resp := p.chat(chatBody("m", true))
		events := readSSEBig(t, resp)
		if len(events) != 2 {
			t.Fatalf("events = %d", len(events))
		}
		rewritten := !strings.Contains(events[0], "<think>") && strings.Contains(events[0], `"reasoning_content":"why"`)
		if rewritten != wantRewritten {
			t.Errorf("rewritten = %v, want %v (event starts %.100q)", rewritten, wantRewritten, events[0])
		}
	}
	check(true)
	if n := len(p.logEntries("response larger than max_rewrite_size, think_tags not applied")); n != 0 {
		t.Errorf("warnings = %d, want none", n)
	}
	h["max_rewrite_size"] = 1 << 20
	p.load(h)
	check(false)
	eventually(t, 5*time.Second, "the warning log", func() bool {
		return len(p.logEntries("response larger than max_rewrite_size, think_tags not applied")) == 1
	})
}

// readSSEBig reads data payloads of any size.
func readSSEBig(t testing.TB, resp *http.Response) []string {
	t.Helper()
	body := readAll(t, resp)
	var out []string
	for _, ev := range strings.Split(body, "\n\n") {
		if d, ok := strings.CutPrefix(ev, "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}
