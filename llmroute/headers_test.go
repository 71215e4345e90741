package llmroute

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// TestUpstreamRequestHeaders: the allow-list, forward_headers, Connection-
// listed headers, the provider's own headers and the forwarding headers.
func TestUpstreamRequestHeaders(t *testing.T) {
	target, _ := url.Parse("http://up.example/v1/chat/completions")
	u := &upstream{target: target, auth: "Bearer sk-op", authHdr: "Authorization", forward: []string{"X-Trace-Id"},
		headers: [][2]string{{"X-Title", "router"}}}
	u.buildHeaderValues()
	r := httptest.NewRequest(http.MethodPost, "http://proxy.example/v1/chat/completions", nil)
	r.RemoteAddr = "[fe80::1%eth0]:5555"
	for k, v := range map[string]string{
		"Accept": "text/event-stream", "Accept-Encoding": "gzip", "Accept-Language": "de", "User-Agent": "sdk/1",
		"Openai-Beta": "x", "Anthropic-Version": "2023-06-01", "Anthropic-Beta": "b", "X-Stainless-Os": "Linux",
		"X-Trace-Id": "t1", "Authorization": "Bearer client", "X-Api-Key": "client", "Api-Key": "client",
		"Openai-Organization": "org", "Openai-Project": "proj", "X-Goog-Api-Key": "g", "X-Auth-Token": "a",
		"Cookie": "c=1", "Forwarded": "for=1.2.3.4", "X-Real-Ip": "1.2.3.4", "X-Forwarded-For": "1.2.3.4",
		"X-Forwarded-Proto": "https", "X-Forwarded-Host": "evil", "Proxy-Authorization": "p", "Te": "trailers",
		"Upgrade": "h2c", "Keep-Alive": "1", "X-Custom": "no",
	} {
		r.Header.Set(k, v)
	}
	r.Header.Set("Connection", "keep-alive, Accept-Language")
	h := &Handler{}
	got := h.upstreamRequest(context.Background(), r, u, u.authValue, u.target, []byte("{}"), http.NoBody).Header
	want := http.Header{
		"Accept": {"text/event-stream"}, "Accept-Encoding": {"gzip"}, "User-Agent": {"sdk/1"},
		"Openai-Beta": {"x"}, "Anthropic-Version": {"2023-06-01"}, "Anthropic-Beta": {"b"},
		"X-Stainless-Os": {"Linux"}, "X-Trace-Id": {"t1"}, "Authorization": {"Bearer sk-op"},
		"Content-Type": {"application/json"}, "X-Title": {"router"},
		"X-Forwarded-For": {"fe80::1"}, "X-Forwarded-Proto": {"http"}, "X-Forwarded-Host": {"proxy.example"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("upstream headers\n got %v\nwant %v", got, want)
	}
}

// TestSetForwarded: the client's chain is kept only behind a trusted peer.
func TestSetForwarded(t *testing.T) {
	for _, tc := range []struct {
		trusted         bool
		tls             bool
		xff, proto, hst string
		want            http.Header
	}{
		{false, false, "", "", "", http.Header{"X-Forwarded-For": {"10.0.0.9"}, "X-Forwarded-Proto": {"http"}, "X-Forwarded-Host": {"api.example"}}},
		{false, true, "6.6.6.6", "http", "evil", http.Header{"X-Forwarded-For": {"10.0.0.9"}, "X-Forwarded-Proto": {"https"}, "X-Forwarded-Host": {"api.example"}}},
		{true, false, "1.1.1.1, 2.2.2.2", "https", "front.example", http.Header{"X-Forwarded-For": {"1.1.1.1, 2.2.2.2, 10.0.0.9"}, "X-Forwarded-Proto": {"https"}, "X-Forwarded-Host": {"front.example"}}},
		{true, false, "", "", "", http.Header{"X-Forwarded-For": {"10.0.0.9"}, "X-Forwarded-Proto": {"http"}, "X-Forwarded-Host": {"api.example"}}},
	} {
		r := httptest.NewRequest(http.MethodPost, "http://api.example/v1/chat/completions", nil)
		r.RemoteAddr = "10.0.0.9:1234"
		if tc.tls {
			r.TLS = &tls.ConnectionState{}
		}
		for k, v := range map[string]string{"X-Forwarded-For": tc.xff, "X-Forwarded-Proto": tc.proto, "X-Forwarded-Host": tc.hst} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		vars := map[string]any{caddyhttp.TrustedProxyVarKey: tc.trusted}
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, vars))
		got := http.Header{}
		setForwarded(got, r)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("trusted=%v tls=%v: got %v, want %v", tc.trusted, tc.tls, got, tc.want)
		}
	}
}

// TestWriteResponseHeader: hop-by-hop headers (Alt-Svc included) and
// Connection-listed ones stay behind without deleting what Caddy set, the
// proxy's CORS answer wins, and Content-Length goes only when rewriting.
func TestWriteResponseHeader(t *testing.T) {
	resp := &http.Response{StatusCode: 200, Header: http.Header{
		"Alt-Svc": {"h3=\":1\""}, "Connection": {"X-Hop"}, "X-Hop": {"1"}, "Keep-Alive": {"t"},
		"Transfer-Encoding": {"chunked"}, "Upgrade": {"x"}, "Proxy-Authenticate": {"b"}, "Trailer": {"x"},
		"X-Request-Id": {"r1"}, "Content-Length": {"10"}, "Content-Type": {"application/json"},
		"Access-Control-Allow-Origin": {"*"}, "Vary": {"Accept-Encoding"},
	}}
	for _, tc := range []struct {
		name    string
		think   string
		cors    bool
		wantLen bool
	}{{"plain", "off", false, true}, {"rewriting", "split", false, false}, {"cors", "off", true, true}} {
		w := httptest.NewRecorder()
		w.Header().Set("Alt-Svc", "h3=\":443\"")
		w.Header().Set("X-Hop", "caddy's own")
		if tc.cors {
			w.Header().Set("Access-Control-Allow-Origin", "https://app.example")
			w.Header().Set("Vary", "Origin")
		}
		u := &upstream{}
		u.think, _ = transform.ParseThinkMode(tc.think)
		(&Handler{}).writeResponseHeader(w, resp, u, false)
		h := w.Header()
		if got := h.Values("Alt-Svc"); !reflect.DeepEqual(got, []string{"h3=\":443\""}) {
			t.Errorf("%s: Alt-Svc = %q", tc.name, got)
		}
		if h.Get("X-Hop") != "caddy's own" {
			t.Errorf("%s: X-Hop = %q, want Caddy's own left alone", tc.name, h.Get("X-Hop"))
		}
		for _, k := range []string{"Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Proxy-Authenticate", "Trailer"} {
			if v, ok := h[k]; ok {
				t.Errorf("%s: %s copied: %q", tc.name, k, v)
			}
		}
		if h.Get("X-Request-Id") != "r1" || h.Get("Content-Type") != "application/json" {
			t.Errorf("%s: end-to-end headers lost: %v", tc.name, h)
		}
		if _, ok := h["Content-Length"]; ok != tc.wantLen {
			t.Errorf("%s: Content-Length present = %v, want %v", tc.name, ok, tc.wantLen)
		}
		wantACAO, wantVary := "*", []string{"Accept-Encoding"}
		if tc.cors {
			wantACAO, wantVary = "https://app.example", []string{"Accept-Encoding", "Origin"}
		}
		if got := h.Get("Access-Control-Allow-Origin"); got != wantACAO {
			t.Errorf("%s: Access-Control-Allow-Origin = %q, want %q", tc.name, got, wantACAO)
		}
		if got := h.Values("Vary"); !reflect.DeepEqual(got, wantVary) {
			t.Errorf("%s: Vary = %q, want %q", tc.name, got, wantVary)
		}
	}
}
