package integration

// Which paths the handler answers: the API paths with and without the /v1
// prefix, a JSON 404 for anything else under /v1, and for every other path
// the next handler — unless no handler answers, when the client gets the
// same 404 instead of Caddy's empty 200.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// rootPathRequests are the API requests a client whose base URL lacks /v1
// sends; each is also sent under /v1 and must be answered the same.
var rootPathRequests = []struct{ method, path, body string }{
	{http.MethodPost, "/chat/completions", chatBody("m", false)},
	{http.MethodPost, "/responses", `{"model":"m","input":"hi"}`},
	{http.MethodPost, "/messages", `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`},
	{http.MethodPost, "/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
	{http.MethodPost, "/embeddings", `{"model":"m","input":"hi"}`},
	{http.MethodPost, "/completions", `{"model":"m","prompt":"hi"}`},
	{http.MethodGet, "/models", ""},
	{http.MethodGet, "/models/m", ""},
	{http.MethodGet, "/models/nope", ""},
}

// TestAPIPathsWithoutV1: a client whose base URL has no /v1 (Codex with
// base_url http://host:port) is served at the site root exactly as under
// /v1, never with Caddy's empty 200.
func TestAPIPathsWithoutV1(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))
	for _, rq := range rootPathRequests {
		v1 := p.do(rq.method, "/v1"+rq.path, rq.body, "Content-Type", "application/json")
		v1Body := readAll(t, v1)
		root := p.do(rq.method, rq.path, rq.body, "Content-Type", "application/json")
		rootBody := readAll(t, root)
		if root.StatusCode != v1.StatusCode || rootBody == "" ||
			root.Header.Get("Content-Type") != v1.Header.Get("Content-Type") {
			t.Errorf("%s %s: %d %q (%s), want as under /v1: %d %q (%s)", rq.method, rq.path,
				root.StatusCode, rootBody, root.Header.Get("Content-Type"), v1.StatusCode, v1Body, v1.Header.Get("Content-Type"))
		}
	}
}

// TestUnknownV1PathNamesServedPaths: anything else under /v1 is the OpenAI
// 404 unsupported_endpoint, whose message tells the client what is served.
func TestUnknownV1PathNamesServedPaths(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))
	for _, path := range []string{"/v1/chat", "/v1/respones", "/openai/v1/files"} {
		msg := expectAPIError(t, p.do(http.MethodPost, path, `{"model":"m"}`), http.StatusNotFound, "unsupported_endpoint")
		for _, served := range []string{"/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/models"} {
			if !strings.Contains(msg, served) {
				t.Errorf("POST %s: message %q does not name %s", path, msg, served)
			}
		}
	}
	if n := len(up.Calls()); n != 0 {
		t.Errorf("upstream calls = %d, want 0", n)
	}
}

// TestUnansweredPathIs404: a path that is not the API's goes to the next
// handler; when none answers (Caddy would send an empty 200), the client
// gets the JSON 404 unsupported_endpoint instead.
func TestUnansweredPathIs404(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0)) // llm_route is the route's only handler
	for _, rq := range []struct{ method, path string }{
		{http.MethodGet, "/"},
		{http.MethodPost, "/"},
		{http.MethodPost, "/api/chat/completions"},
		{http.MethodGet, "/healthz"},
	} {
		expectAPIError(t, p.do(rq.method, rq.path, `{"model":"m"}`), http.StatusNotFound, "unsupported_endpoint")
	}

	// A next handler that answers keeps its answer, an explicitly empty
	// one (respond 200) included: that is fall-through the operator asked
	// for.
	for _, next := range []struct {
		handler map[string]any
		status  int
		body    string
	}{
		{obj("handler", "static_response", "status_code", 418, "body", "next handler"), 418, "next handler"},
		{obj("handler", "static_response", "status_code", 200), 200, ""},
		{obj("handler", "static_response", "body", "ok"), 200, "ok"},
	} {
		p.next = []any{next.handler}
		p.load(basicConfig(up, 0))
		resp := p.do(http.MethodGet, "/healthz", "")
		if body := readAll(t, resp); resp.StatusCode != next.status || body != next.body {
			t.Errorf("next %v: %d %q, want %d %q", next.handler, resp.StatusCode, body, next.status, next.body)
		}
	}

	// A subroute whose matchers take nothing answers nothing either.
	p.next = []any{obj("handler", "subroute", "routes", []any{obj(
		"match", []any{obj("path", []string{"/static/*"})},
		"handle", []any{obj("handler", "static_response", "body", "static")},
	)})}
	p.load(basicConfig(up, 0))
	if resp := p.do(http.MethodGet, "/static/a.css", ""); readAll(t, resp) != "static" {
		t.Error("GET /static/a.css did not reach the subroute")
	}
	expectAPIError(t, p.do(http.MethodGet, "/other", ""), http.StatusNotFound, "unsupported_endpoint")
	if n := len(up.Calls()); n != 0 {
		t.Errorf("upstream calls = %d, want 0", n)
	}
}

// TestRootNamesLeftToTheSite: at the site root the API's names may be the
// site's own pages or files, so only a request that could be an API call
// is the handler's (an endpoint's method, a model it serves); the rest goes
// to the next handler, and with none the JSON 404 names what is served.
func TestRootNamesLeftToTheSite(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))
	// No next handler: a GET of a POST endpoint is the 404 naming the paths.
	msg := expectAPIError(t, p.do(http.MethodGet, "/chat/completions", ""), http.StatusNotFound, "unsupported_endpoint")
	if !strings.Contains(msg, "POST /v1/chat/completions") {
		t.Errorf("GET /chat/completions: message %q does not say what is served", msg)
	}

	p.next = []any{obj("handler", "static_response", "status_code", 200, "body", "site page")}
	p.load(basicConfig(up, 0))
	for _, rq := range []struct{ method, path string }{
		{http.MethodGet, "/messages"},         // a page of the site
		{http.MethodGet, "/responses"},        // likewise
		{http.MethodGet, "/models/qwen.gguf"}, // a file to download, no model of the handler
		{http.MethodDelete, "/completions"},
	} {
		resp := p.do(rq.method, rq.path, "")
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK || body != "site page" {
			t.Errorf("%s %s: %d %q, want the site's own answer", rq.method, rq.path, resp.StatusCode, body)
		}
	}
	// What could be an API call still is, at the root as under /v1.
	if resp := p.do(http.MethodGet, "/models/m", ""); !strings.Contains(readAll(t, resp), `"id":"m"`) {
		t.Error("GET /models/m at the root is not the handler's model object")
	}
	resp := p.do(http.MethodPost, "/messages", `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
		"Content-Type", "application/json")
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"type":"message"`) {
		t.Errorf("POST /messages at the root: %d %q, want a Messages answer", resp.StatusCode, body)
	}
}

// TestMixedSiteExample runs examples/with-other-handlers.Caddyfile as
// written (only its addresses moved): in both sites the API is served, the
// operator's own answers (respond, redir) stay theirs, and nothing ends in
// an empty 200.
func TestMixedSiteExample(t *testing.T) {
	up := newUpstream(t, nil)
	src, err := os.ReadFile("../examples/with-other-handlers.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	adapted, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "with-other-handlers.Caddyfile"})
	if err != nil || len(warnings) > 0 {
		t.Fatalf("adapting: %v %v", err, warnings)
	}
	port, aport := freePort(t), freePort(t)
	s := strings.ReplaceAll(string(adapted), `"http://127.0.0.1:8080/v1"`, strconv.Quote(up.base()))
	var conf map[string]any
	if err := json.Unmarshal([]byte(s), &conf); err != nil {
		t.Fatal(err)
	}
	conf["admin"] = obj("listen", fmt.Sprintf("127.0.0.1:%d", aport))
	servers := conf["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)
	if len(servers) != 1 {
		t.Fatalf("the example has %d servers, want 1", len(servers))
	}
	for _, srv := range servers {
		srv := srv.(map[string]any)
		srv["listen"] = []string{fmt.Sprintf("127.0.0.1:%d", port)}
		srv["automatic_https"] = obj("disable", true)
	}
	b, _ := json.Marshal(conf)
	if err := loadCaddy(t, b); err != nil {
		t.Fatalf("loading the example: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	noRedirect := &http.Client{Transport: testClient.Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	send := func(host, method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), strings.NewReader(body))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatalf("%s %s%s: %v", method, host, path, err)
		}
		return resp.StatusCode, readAll(t, resp)
	}
	for _, tc := range []struct {
		host, method, path, body string
		status                   int
		want                     string // contained in the body
	}{
		{"llm.example.com", http.MethodPost, "/v1/chat/completions", chatBody("qwen3", false), 200, "chat.completion"},
		{"llm.example.com", http.MethodGet, "/v1/models", "", 200, `"id":"qwen3"`},
		{"llm.example.com", http.MethodPost, "/v1/nope", "{}", 404, "unsupported_endpoint"},
		{"llm.example.com", http.MethodGet, "/health", "", 200, "ok"},
		{"llm.example.com", http.MethodGet, "/", "", 404, "not an API path"},
		{"chat.example.com", http.MethodPost, "/v1/chat/completions", chatBody("qwen3", false), 200, "chat.completion"},
		{"chat.example.com", http.MethodPost, "/responses", `{"model":"qwen3","input":"hi"}`, 200, `"object":"response"`},
		{"chat.example.com", http.MethodGet, "/docs", "", http.StatusFound, ""},
		{"chat.example.com", http.MethodGet, "/elsewhere", "", 404, "not an API path"},
	} {
		status, body := send(tc.host, tc.method, tc.path, tc.body)
		if status != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s %s%s: %d %q, want %d with %q", tc.method, tc.host, tc.path, status, body, tc.status, tc.want)
		}
	}
}
