package integration

// Every answer the proxy refuses a request with leaves one trace: an INFO
// log line "request refused" with its reason and the client key's id
// (never a secret), and one count in llm_proxy_rejected_total{reason}.

import (
	"net/http"
	"strings"
	"testing"
)

// refusals returns the "request refused" log entries.
func (p *proxy) refusals() []map[string]any { return p.logEntries("request refused") }

// rejected returns llm_proxy_rejected_total for a reason.
func (p *proxy) rejected(reason string) float64 {
	p.t.Helper()
	return p.metric("llm_proxy_rejected_total", "reason", reason)
}

func TestRefusalsAreLoggedAndCounted(t *testing.T) {
	up := newUpstream(t, nil)
	conf := cfg(
		[]map[string]any{obj("id", "p1", "url", up.base(), "key", "sk-test-secret-provider")},
		[]map[string]any{obj("id", "u1", "provider", "p1", "model", "real")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"u1"}), obj("name", "other", "upstreams", []string{"u1"})},
		"keys", []map[string]any{obj("id", "team", "secret", "sk-test-secret-team", "models", []string{"m"})},
		"max_request_body", 1024,
	)
	p := startProxy(t, conf)
	const wrong = "sk-test-secret-WRONG-guess"
	team := []string{"Authorization", "Bearer sk-test-secret-team"}

	cases := []struct {
		name, path, body string
		hdr              []string
		status           int
		code, reason     string
		key, model       string // expected in the log entry ("" = absent)
	}{
		{"bad key", "/v1/chat/completions", chatBody("m", false), []string{"Authorization", "Bearer " + wrong},
			401, "invalid_api_key", "invalid_api_key", "", ""},
		{"no key", "/v1/chat/completions", chatBody("m", false), nil, 401, "invalid_api_key", "invalid_api_key", "", ""},
		{"unknown model", "/v1/chat/completions", chatBody("nope", false), team, 404, "model_not_found", "unknown_model", "team", "nope"},
		{"model not allowed", "/v1/chat/completions", chatBody("other", false), team, 403, "model_not_allowed", "model_not_allowed", "team", "other"},
		{"bad json", "/v1/chat/completions", `{"model":`, team, 400, "invalid_json", "bad_request", "team", ""},
		{"too large", "/v1/chat/completions", `{"model":"m","pad":"` + strings.Repeat("x", 2048) + `"}`, team, 413, "request_too_large", "too_large", "team", ""},
		{"unknown endpoint", "/v1/nope", "{}", team, 404, "unsupported_endpoint", "unsupported_endpoint", "", ""},
	}
	for i, tc := range cases {
		before := p.rejected(tc.reason)
		req, _ := http.NewRequest(http.MethodPost, p.URL+tc.path, strings.NewReader(tc.body))
		for j := 0; j+1 < len(tc.hdr); j += 2 {
			req.Header.Set(tc.hdr[j], tc.hdr[j+1])
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		expectAPIError(t, resp, tc.status, tc.code)
		if got := p.rejected(tc.reason) - before; got != 1 {
			t.Errorf("%s: llm_proxy_rejected_total{reason=%q} rose by %v, want 1", tc.name, tc.reason, got)
		}
		entries := p.refusals()
		if len(entries) != i+1 {
			t.Fatalf("%s: %d refusal log entries after %d refusals", tc.name, len(entries), i+1)
		}
		e := entries[i]
		if e["level"] != "info" || e["reason"] != tc.reason || e["status"] != float64(tc.status) {
			t.Errorf("%s: entry %v, want info with reason %s and status %d", tc.name, e, tc.reason, tc.status)
		}
		if key, _ := e["key"].(string); key != tc.key {
			t.Errorf("%s: entry key %q, want %q", tc.name, key, tc.key)
		}
		if model, _ := e["model"].(string); model != tc.model {
			t.Errorf("%s: entry model %q, want %q", tc.name, model, tc.model)
		}
	}
	if logs := p.logs(); strings.Contains(logs, "sk-test-secret") {
		t.Error("a secret reached the log")
	}
	if n := len(up.Calls()); n != 0 {
		t.Errorf("upstream calls = %d, want 0", n)
	}
}

// TestRefusalsWithoutKeys: the proxy's own 503s and a fall-through 404 are
// refusals too, each counted once.
func TestRefusalsWithoutKeys(t *testing.T) {
	g := newGate()
	defer g.open()
	up := newUpstream(t, g.handler(completion("ok")))
	p := startProxy(t, basicConfig(up, 1))
	// The counters are process-wide: they go on across reloads.
	busy0, unsupported0 := p.rejected("busy"), p.rejected("unsupported_endpoint")
	held := p.goChat(t.Context(), chatBody("m", false))
	g.waitArrivals(t, 1)
	expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")
	g.open()
	await(t, held)
	expectAPIError(t, p.get("/favicon.ico"), http.StatusNotFound, "unsupported_endpoint")
	if got := p.rejected("busy") - busy0; got != 1 {
		t.Errorf("busy counted %v times", got)
	}
	if got := p.rejected("unsupported_endpoint") - unsupported0; got != 1 {
		t.Errorf("unsupported_endpoint counted %v times", got)
	}
	var reasons []string
	for _, e := range p.refusals() {
		reasons = append(reasons, e["reason"].(string))
	}
	if strings.Join(reasons, ",") != "busy,unsupported_endpoint" {
		t.Errorf("refusal log reasons %v", reasons)
	}
}
