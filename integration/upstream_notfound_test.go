package integration

// An upstream's 404 or 405 on an API path is the operator's mistake (a
// provider url without /v1, a model name the server does not know), not
// the client's: the request fails over, the upstream backs off, the log
// says at ERROR what was tried and what to check, and the client never
// sees the upstream's "404 page not found". At start-up a background probe
// of each provider's path warns about the same mistake before any client
// meets it.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// ollamaLike is a server that, like Ollama's router, serves only its /v1
// paths and answers any other path with a plain-text 404 page; a model it
// does not have is a JSON 404 naming it.
func ollamaLike(t *testing.T, models ...string) *httptest.Server {
	t.Helper()
	known := map[string]bool{}
	for _, m := range models {
		known[m] = true
	}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"object":"list","data":[]}`)
		case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
			var req struct {
				Model string `json:"model"`
			}
			_ = json.NewDecoder(r.Body).Decode(&req)
			if !known[req.Model] {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprintf(w, `{"error":{"message":"model %q not found, try pulling it first","type":"api_error","param":null,"code":null}}`, req.Model)
				return
			}
			completion("from ollama")(w, r)
		default:
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, "404 page not found")
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func TestUpstreamNotFoundFailsOver(t *testing.T) {
	bad := ollamaLike(t, "qwen3")
	good := newUpstream(t, completion("from the cloud"))
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "gpu", "url", bad.URL, "backoff", "30s"), // no /v1
			obj("id", "cloud", "url", good.base(), "key", "sk-test-secret-cloud"),
		},
		[]map[string]any{
			obj("id", "gpu-qwen", "provider", "gpu", "model", "qwen3"),
			obj("id", "cloud-qwen", "provider", "cloud", "model", "qwen/qwen3"),
		},
		[]map[string]any{obj("name", "qwen", "upstreams", []string{"gpu-qwen", "cloud-qwen"})},
	))

	// The start-up probe warns, in the background, before any request.
	eventually(t, 10*time.Second, "the start-up warning", func() bool {
		return len(p.logEntries("provider url may be wrong")) > 0
	})
	warned := p.logEntries("provider url may be wrong")
	if len(warned) != 1 || warned[0]["level"] != "warn" || warned[0]["provider"] != "gpu" ||
		!strings.Contains(fmt.Sprint(warned[0]["hint"]), "does the provider url end in /v1?") ||
		warned[0]["url"] != bad.URL+"/models" {
		t.Errorf("start-up warnings: %v", warned)
	}

	resp := p.chat(chatBody("qwen", false))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "from the cloud") {
		t.Fatalf("status %d body %s, want the cloud's answer", resp.StatusCode, body)
	}
	if c := p.upstreamGauge("cooling_seconds", "gpu-qwen", "gpu"); c <= 0 {
		t.Error("the upstream that answered 404 is not cooling")
	}
	logged := p.logEntries("upstream has no such endpoint")
	if len(logged) != 1 {
		t.Fatalf("ERROR entries = %d, want 1: %s", len(logged), p.logs())
	}
	e := logged[0]
	if e["level"] != "error" || e["upstream"] != "gpu-qwen" || e["status"] != float64(404) ||
		e["url"] != bad.URL+"/chat/completions" ||
		!strings.Contains(fmt.Sprint(e["hint"]), "does the provider url end in /v1?") {
		t.Errorf("log entry %v: want ERROR with the URL tried and the /v1 hint", e)
	}
}

func TestUpstreamNotFoundNothingLeft(t *testing.T) {
	bad := ollamaLike(t, "qwen3")
	noPost := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "405 method not allowed", http.StatusMethodNotAllowed) // a static file server
	}))
	t.Cleanup(noPost.Close)
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "gpu", "url", bad.URL),
			obj("id", "ollama", "url", bad.URL+"/v1"),
			obj("id", "web", "url", noPost.URL+"/v1"),
		},
		[]map[string]any{
			obj("id", "gpu-qwen", "provider", "gpu", "model", "qwen3"),
			obj("id", "ollama-typo", "provider", "ollama", "model", "qwen3:32b"),
			obj("id", "web-qwen", "provider", "web", "model", "qwen3"),
		},
		[]map[string]any{
			obj("name", "path", "upstreams", []string{"gpu-qwen", "web-qwen"}),
			obj("name", "typo", "upstreams", []string{"ollama-typo"}),
		},
	))

	// Nothing left: the proxy's own 502, never the upstream's 404 page.
	for _, model := range []string{"path", "typo"} {
		resp := p.chat(chatBody(model, false))
		if resp.Header.Get("Retry-After") != "" {
			t.Errorf("%s: Retry-After on a configuration error", model)
		}
		msg := expectAPIError(t, resp, http.StatusBadGateway, "upstream_not_found")
		if strings.Contains(msg, "page not found") || strings.Contains(msg, "pulling") {
			t.Errorf("%s: the upstream's body reached the client: %s", model, msg)
		}
	}
	if got := p.requests("path", "web-qwen", "web", "4xx"); got != 1 {
		t.Errorf("the 405 counted %v times as 4xx", got)
	}
	// The hint follows what the upstream said: a model it does not know.
	var typo map[string]any
	for _, e := range p.logEntries("upstream has no such endpoint") {
		if e["upstream"] == "ollama-typo" {
			typo = e
		}
	}
	if hint := fmt.Sprint(typo["hint"]); !strings.Contains(hint, `"qwen3:32b"`) || strings.Contains(hint, "/v1?") {
		t.Errorf("hint for an unknown model: %q", hint)
	}
	if body := fmt.Sprint(typo["body"]); !strings.Contains(body, "try pulling it first") {
		t.Errorf("logged body %q: want the upstream's words", body)
	}
}

// TestStartupProbeUnreachable: a provider that is simply off (a local GPU
// server not started) is one INFO line at start-up, not a warning.
func TestStartupProbeUnreachable(t *testing.T) {
	good := newUpstream(t, nil)
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "off", "url", closedURL(t)), obj("id", "on", "url", good.base(), "key", "sk-test-secret-on")},
		[]map[string]any{obj("id", "u-off", "provider", "off", "model", "x"), obj("id", "u-on", "provider", "on", "model", "x")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"u-off", "u-on"})},
	))
	eventually(t, 10*time.Second, "both providers checked", func() bool {
		return len(p.logEntries("provider not reachable at start-up")) > 0 &&
			len(p.logEntries("provider path checked")) > 0
	})
	off := p.logEntries("provider not reachable at start-up")
	if len(off) != 1 || off[0]["level"] != "info" || off[0]["provider"] != "off" {
		t.Errorf("entries for the provider that is off: %v", off)
	}
	if n := len(p.logEntries("provider url may be wrong")); n != 0 {
		t.Errorf("%d path warnings for providers whose path is right", n)
	}
	lists := good.ModelLists()
	if len(lists) != 1 || lists[0].Path != "/v1/models" || len(good.Calls()) != 0 {
		t.Fatalf("the check sent %v and %d other calls, want one GET /v1/models", lists, len(good.Calls()))
	}
	if got := lists[0].Header.Get("Authorization"); got != "Bearer sk-test-secret-on" {
		t.Errorf("the probe's Authorization = %q, want the provider's key", got)
	}
	if strings.Contains(p.logs(), "sk-test-secret") {
		t.Error("a key reached the log")
	}
}
