package integration

// Issue #2: what the upstream receives (body, auth) and what the client gets
// back (stream bytes, errors, model list, headers), through a real Caddy.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// workedExample is the config of the reference's "Пример сборки тела":
// provider → upstream → model patches, and a fallback upstream at another
// provider with patch layers of its own.
func workedExample(routerai, local *fakeUpstream) map[string]any {
	return cfg(
		[]map[string]any{
			obj("id", "routerai", "url", routerai.base(), "key", "sk-test-secret-routerai",
				"patch", obj("provider", obj("allow_fallbacks", false))),
			obj("id", "local", "url", local.base(),
				"patch", obj("options", obj("num_ctx", 8192))),
		},
		[]map[string]any{
			obj("id", "routerai-gpt4o", "provider", "routerai", "model", "gpt-4o",
				"patch", obj("provider", obj("ignore", []string{"deepseek"}))),
			obj("id", "local-qwen", "provider", "local", "model", "qwen2.5-72b-instruct",
				"patch", obj("top_k", 20)),
		},
		[]map[string]any{
			obj("name", "my-gpt", "upstreams", []string{"routerai-gpt4o", "local-qwen"},
				"patch", obj("reasoning", obj("enabled", false))),
		},
	)
}

const workedClientBody = `{"model":"my-gpt","messages":[{"role":"user","content":"привет"}],"temperature":0.7}`

func TestBodyWorkedExample(t *testing.T) {
	routerai := newUpstream(t, nil)
	local := newUpstream(t, nil)
	p := startProxy(t, workedExample(routerai, local))

	resp := p.chat(workedClientBody)
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	calls := routerai.Calls()
	if len(calls) != 1 || len(local.Calls()) != 0 {
		t.Fatalf("calls: routerai %d, local %d; want 1, 0", len(calls), len(local.Calls()))
	}
	// The reference's "Итоговое тело", key order kept: client keys first,
	// then what the patches add, provider merged from two layers.
	want := `{"model":"gpt-4o","messages":[{"role":"user","content":"привет"}],"temperature":0.7,` +
		`"provider":{"allow_fallbacks":false,"ignore":["deepseek"]},"reasoning":{"enabled":false}}`
	if got := string(calls[0].Body); got != want {
		t.Errorf("upstream body\n got %s\nwant %s", got, want)
	}
	if calls[0].Path != "/v1/chat/completions" {
		t.Errorf("path = %s", calls[0].Path)
	}
}

func TestBodyFallbackGetsOnlyItsOwnPatches(t *testing.T) {
	routerai := newUpstream(t, status(http.StatusInternalServerError))
	local := newUpstream(t, nil)
	p := startProxy(t, workedExample(routerai, local))

	resp := p.chat(workedClientBody)
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if len(routerai.Calls()) != 1 {
		t.Fatalf("routerai calls = %d, want 1", len(routerai.Calls()))
	}
	calls := local.Calls()
	if len(calls) != 1 {
		t.Fatalf("local calls = %d, want 1", len(calls))
	}
	// No provider.* from routerai's layers; local's own layers and the
	// model patch are there.
	want := `{"model":"qwen2.5-72b-instruct","messages":[{"role":"user","content":"привет"}],"temperature":0.7,` +
		`"options":{"num_ctx":8192},"top_k":20,"reasoning":{"enabled":false}}`
	if got := string(calls[0].Body); got != want {
		t.Errorf("fallback body\n got %s\nwant %s", got, want)
	}
}

func TestBodyWithoutPatchesIsTheClientsExceptModel(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))

	// Whitespace, key order, escapes and number spellings must survive.
	client := "{\n  \"messages\" : [ {\"role\":\"user\", \"content\":\"caf\\u00e9 \\\"q\\\" \\n\"} ],\n" +
		"  \"model\":   \"m\" ,\n  \"temperature\": 1.50, \"max_tokens\":1e3, \"extra\": {\"a\":[1, 2 ,null]}\n}\n"
	want := strings.Replace(client, `"m" ,`, `"real-model" ,`, 1)
	if want == client {
		t.Fatal("test bug: replacement did not apply")
	}
	resp := p.chat(client)
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	calls := up.Calls()
	if len(calls) != 1 {
		t.Fatalf("calls = %d", len(calls))
	}
	if got := string(calls[0].Body); got != want {
		t.Errorf("upstream body\n got %q\nwant %q", got, want)
	}
	if ct := calls[0].Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("upstream Content-Type = %q", ct)
	}
}

func TestAuthHeaders(t *testing.T) {
	keyed := newUpstream(t, nil)
	open := newUpstream(t, nil)
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "pk", "url", keyed.base(), "key", "sk-test-secret-keyed", "forward_headers", []string{"x-custom-client"}),
			obj("id", "po", "url", open.base(), "key", "", "forward_headers", []string{"X-Custom-Client"}),
		},
		[]map[string]any{
			obj("id", "uk", "provider", "pk", "model", "k-model"),
			obj("id", "uo", "provider", "po", "model", "o-model"),
		},
		[]map[string]any{
			obj("name", "keyed", "upstreams", []string{"uk"}),
			obj("name", "open", "upstreams", []string{"uo"}),
		},
	))
	clientHdr := []string{
		"Authorization", "Bearer client-key",
		"Proxy-Authorization", "Basic Y2xpZW50OnB3",
		"Cookie", "session=client-cookie",
		"X-Api-Key", "client-x-api-key",
		"Api-Key", "client-api-key",
		"X-Custom-Client", "kept",
	}
	for _, model := range []string{"keyed", "open"} {
		resp := p.chat(chatBody(model, false), clientHdr...)
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", model, resp.StatusCode, body)
		}
	}
	check := func(name string, up *fakeUpstream, wantAuth []string) {
		t.Helper()
		calls := up.Calls()
		if len(calls) != 1 {
			t.Fatalf("%s: calls = %d", name, len(calls))
		}
		h := calls[0].Header
		if got := h.Values("Authorization"); !reflect.DeepEqual(got, wantAuth) {
			t.Errorf("%s: Authorization = %q, want %q", name, got, wantAuth)
		}
		for _, k := range []string{"Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key"} {
			if v, ok := h[k]; ok {
				t.Errorf("%s: client's %s reached the upstream: %q", name, k, v)
			}
		}
		for k, vv := range h {
			for _, v := range vv {
				if strings.Contains(v, "client-") && k != "X-Custom-Client" {
					t.Errorf("%s: client credential in upstream header %s: %q", name, k, v)
				}
			}
		}
		// A header the provider's forward_headers names goes through: the
		// absence above is filtering.
		if got := h.Get("X-Custom-Client"); got != "kept" {
			t.Errorf("%s: X-Custom-Client = %q, want kept", name, got)
		}
	}
	check("keyed", keyed, []string{"Bearer sk-test-secret-keyed"})
	check("open", open, nil)
	if strings.Contains(p.logs(), "sk-test-secret-keyed") {
		t.Error("the provider key appears in the log")
	}
}

func TestKeyFromEnvironment(t *testing.T) {
	t.Setenv("LLMROUTE_IT_KEY_BRACE", "sk-env-brace")
	t.Setenv("LLMROUTE_IT_KEY_DOLLAR", "sk-env-dollar")
	a := newUpstream(t, nil)
	b := newUpstream(t, nil)
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "pa", "url", a.base(), "key", "{env.LLMROUTE_IT_KEY_BRACE}"),
			obj("id", "pb", "url", b.base(), "key", "${LLMROUTE_IT_KEY_DOLLAR}"),
		},
		[]map[string]any{
			obj("id", "ua", "provider", "pa", "model", "x"),
			obj("id", "ub", "provider", "pb", "model", "y"),
		},
		[]map[string]any{
			obj("name", "a", "upstreams", []string{"ua"}),
			obj("name", "b", "upstreams", []string{"ub"}),
		},
	))
	for _, m := range []string{"a", "b"} {
		resp := p.chat(chatBody(m, false))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", m, resp.StatusCode, body)
		}
	}
	if got := a.Calls()[0].Header.Get("Authorization"); got != "Bearer sk-env-brace" {
		t.Errorf("{env.NAME} key: Authorization = %q", got)
	}
	if got := b.Calls()[0].Header.Get("Authorization"); got != "Bearer sk-env-dollar" {
		t.Errorf("${NAME} key: Authorization = %q", got)
	}
	logs := p.logs()
	if strings.Contains(logs, "sk-env-brace") || strings.Contains(logs, "sk-env-dollar") {
		t.Error("a resolved key appears in the log")
	}
}

// oddStream is SSE as real providers frame it, and then some: CRLF and CR
// line endings, comments, multi-line data, id/retry/event fields, an event
// split across writes.
var oddStream = []string{
	": OPENROUTER PROCESSING\n\n",
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"real-model\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\r\n\r\n",
	"event: message\nid: 7\nretry: 1000\ndata: {\"id\":\"c1\",\"choices\":[{\"index\":0,\n",
	"data: \"delta\":{\"content\":\"lo\"}}]}\n\n",
	"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" <think>x</think>\"}}]}\r\r",
	":\n\n",
	"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
	"data: [DONE]\n\n",
}

func TestStreamPassesThroughByteForByte(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req-stream-1")
		writeStream(w, oddStream, 0)
	})
	p := startProxy(t, basicConfig(up, 0))
	resp := p.chat(chatBody("m", true))
	got := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	if want := strings.Join(oddStream, ""); got != want {
		t.Errorf("client stream differs from what the upstream wrote\n got %q\nwant %q", got, want)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
	if id := resp.Header.Get("X-Request-Id"); id != "req-stream-1" {
		t.Errorf("X-Request-Id = %q", id)
	}
}

func TestStreamIsIncremental(t *testing.T) {
	ev1 := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first\"}}]}\n\n"
	ev2 := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"second\"}}]}\n\ndata: [DONE]\n\n"
	next := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, ev1)
		http.NewResponseController(w).Flush()
		select { // event 2 only after the client has read event 1
		case <-next:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, ev2)
	})
	conf := basicConfig(up, 0)
	conf["heartbeat_interval"] = "0s" // no keepalive flush to hide buffering
	p := startProxy(t, conf)

	// The response headers too must come before event 2: the whole request
	// runs under the deadline.
	var resp *http.Response
	first := make(chan string, 1)
	go func() {
		r, err := p.post(context.Background(), chatBody("m", true))
		if err != nil {
			first <- "error: " + err.Error()
			return
		}
		resp = r
		buf := make([]byte, len(ev1))
		n, _ := io.ReadFull(resp.Body, buf)
		first <- string(buf[:n])
	}()
	select {
	case got := <-first:
		if got != ev1 {
			close(next)
			t.Fatalf("first event = %q, want %q", got, ev1)
		}
	case <-time.After(10 * time.Second):
		close(next)
		t.Fatal("event 1 did not reach the client before the upstream sent event 2: the stream is buffered")
	}
	defer resp.Body.Close()
	close(next)
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if string(rest) != ev2 {
		t.Errorf("rest = %q, want %q", rest, ev2)
	}
}

func TestResponsePassesThrough(t *testing.T) {
	const upstreamBody = `{"id":"chatcmpl-9","object":"chat.completion","created":1,"model":"real-model-2026-01-01",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-abc-123")
		w.Header().Set("Openai-Processing-Ms", "42")
		w.Header().Set("Connection", "X-Hop-Only")
		w.Header().Set("X-Hop-Only", "must-not-pass")
		io.WriteString(w, upstreamBody)
	})
	p := startProxy(t, basicConfig(up, 0))
	resp := p.chat(chatBody("m", false))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	// The model is left as the upstream sent it: no rewriting to "m".
	if body != upstreamBody {
		t.Errorf("body\n got %s\nwant %s", body, upstreamBody)
	}
	if got := resp.Header.Get("X-Request-Id"); got != "req-abc-123" {
		t.Errorf("X-Request-Id = %q, want req-abc-123", got)
	}
	if got := resp.Header.Get("Openai-Processing-Ms"); got != "42" {
		t.Errorf("Openai-Processing-Ms = %q", got)
	}
	if got := resp.Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q", got)
	}
	if got := resp.Header.Get("X-Hop-Only"); got != "" {
		t.Errorf("a header the upstream named in Connection reached the client: %q", got)
	}
}

func TestStreamModelLeftAsUpstreamSent(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))
	resp := p.chat(chatBody("m", true))
	events := readSSE(t, resp.Body)
	resp.Body.Close()
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events = %q", events)
	}
	for _, ev := range events[:len(events)-1] {
		var chunk struct{ Model string }
		if err := json.Unmarshal([]byte(ev), &chunk); err != nil {
			t.Fatalf("bad chunk %q: %v", ev, err)
		}
		if chunk.Model != "real-model" {
			t.Errorf("chunk model = %q, want real-model", chunk.Model)
		}
	}
}

func TestProxyErrors(t *testing.T) {
	up := newUpstream(t, nil)
	conf := basicConfig(up, 0)
	conf["max_request_body"] = 1024
	p := startProxy(t, conf)

	for _, tc := range []struct {
		name, body, code string
		status           int
	}{
		{"not json", `not json`, "invalid_json", 400},
		{"truncated", `{"model":"m",`, "invalid_json", 400},
		{"array", `[{"model":"m"}]`, "invalid_json", 400},
		{"trailing garbage", `{"model":"m"} x`, "invalid_json", 400},
		{"no model", `{"messages":[]}`, "missing_model", 400},
		{"number model", `{"model":42}`, "missing_model", 400},
		{"null model", `{"model":null}`, "missing_model", 400},
		{"object model", `{"model":{"name":"m"}}`, "missing_model", 400},
		{"unknown model", `{"model":"no-such-model"}`, "model_not_found", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := expectAPIError(t, p.chat(tc.body), tc.status, tc.code)
			if tc.code == "model_not_found" && !strings.Contains(msg, "no-such-model") {
				t.Errorf("message %q does not name the model", msg)
			}
		})
	}
	if n := len(up.Calls()); n != 0 {
		t.Errorf("rejected requests reached the upstream: %d calls", n)
	}

	// Body size: exactly the limit passes, one byte more is 413, announced
	// by Content-Length or discovered while reading a chunked body.
	sized := func(n int) string {
		pre, post := `{"model":"m","messages":[{"role":"user","content":"`, `"}]}`
		return pre + strings.Repeat("a", n-len(pre)-len(post)) + post
	}
	resp := p.chat(sized(1024))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("a body of exactly max_request_body: status %d: %s", resp.StatusCode, body)
	}
	expectAPIError(t, p.chat(sized(1025)), http.StatusRequestEntityTooLarge, "request_too_large")

	req, err := http.NewRequest(http.MethodPost, p.URL+"/v1/chat/completions",
		io.MultiReader(strings.NewReader(sized(4000)))) // unknown length: chunked
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = -1
	req.TransferEncoding = []string{"chunked"}
	cresp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	expectAPIError(t, cresp, http.StatusRequestEntityTooLarge, "request_too_large")
	if n := len(up.Calls()); n != 1 {
		t.Errorf("upstream calls = %d, want 1 (only the body at the limit)", n)
	}

	// Wrong method on the chat path.
	gresp := p.get("/v1/chat/completions")
	expectAPIError(t, gresp, http.StatusMethodNotAllowed, "method_not_allowed")
}

func TestModelsEndpoint(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "p1", "url", up.base())},
		[]map[string]any{obj("id", "u1", "provider", "p1", "model", "x")},
		[]map[string]any{
			obj("name", "zeta", "upstreams", []string{"u1"}),
			obj("name", "alpha/v2", "upstreams", []string{"u1"}),
			obj("name", "mid", "upstreams", []string{"u1"}),
		},
	))
	resp := p.get("/v1/models")
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, Content-Type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if list.Object != "list" || len(list.Data) != 3 {
		t.Fatalf("list = %s", body)
	}
	for i, want := range []string{"zeta", "alpha/v2", "mid"} { // config order
		d := list.Data[i]
		if d.ID != want || d.Object != "model" || d.Created <= 0 || d.OwnedBy == "" {
			t.Errorf("data[%d] = %+v, want id %q object model", i, d, want)
		}
	}

	one := p.get("/v1/models/mid")
	ob := readAll(t, one)
	var m map[string]any
	if err := json.Unmarshal([]byte(ob), &m); err != nil || one.StatusCode != 200 {
		t.Fatalf("status %d: %s", one.StatusCode, ob)
	}
	if m["id"] != "mid" || m["object"] != "model" {
		t.Errorf("model object = %s", ob)
	}
	slashed := p.get("/v1/models/alpha/v2")
	if sb := readAll(t, slashed); slashed.StatusCode != 200 || !strings.Contains(sb, `"id":"alpha/v2"`) {
		t.Errorf("a model name with a slash: status %d: %s", slashed.StatusCode, sb)
	}
	expectAPIError(t, p.get("/v1/models/nope"), http.StatusNotFound, "model_not_found")
	if len(up.Calls()) != 0 {
		t.Error("the model list called the upstream")
	}
}

func TestOtherPathsFallThrough(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))
	p.next = []any{obj("handler", "static_response", "status_code", 418, "body", "next handler")}
	p.load(basicConfig(up, 0))

	// Only paths under an API root ending in /v1 are the handler's;
	// the rest, API-looking or not, belong to the next handler.
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/healthz"},
		{http.MethodGet, "/"},
		{http.MethodPost, "/"},
		{http.MethodGet, "/assets/models/car.glb"},
		{http.MethodGet, "/static/3d/models"},
		{http.MethodPost, "/chat/completions"},
		{http.MethodPost, "/api/chat/completions"},
		{http.MethodGet, "/v1x/models"},
	} {
		req, _ := http.NewRequest(tc.method, p.URL+tc.path, strings.NewReader(`{"model":"m"}`))
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != 418 || body != "next handler" {
			t.Errorf("%s %s: status %d body %q, want the next handler's 418", tc.method, tc.path, resp.StatusCode, body)
		}
	}
	// The handler's own paths are still its own.
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "chat.completion") {
		t.Errorf("chat: status %d body %s", resp.StatusCode, body)
	}
	if resp := p.get("/v1/models"); readAll(t, resp) == "next handler" {
		t.Error("GET /v1/models fell through")
	}
	if n := len(up.Calls()); n != 1 {
		t.Errorf("upstream calls = %d, want 1", n)
	}
}

func TestConfigErrorsNameTheEntry(t *testing.T) {
	up := newUpstream(t, nil)
	good := basicConfig(up, 1)
	p := startProxy(t, good)

	prov := func(kv ...any) map[string]any { return obj(append([]any{"id", "p1", "url", up.base()}, kv...)...) }
	ups := func(kv ...any) map[string]any {
		return obj(append([]any{"id", "u1", "provider", "p1", "model", "x"}, kv...)...)
	}
	model := func(kv ...any) map[string]any {
		return obj(append([]any{"name", "m", "upstreams", []string{"u1"}}, kv...)...)
	}
	L := func(m ...map[string]any) []map[string]any { return m }

	for _, tc := range []struct {
		name string
		conf map[string]any
		want []string
	}{
		{"duplicate provider", cfg(L(prov(), prov()), L(ups()), L(model())), []string{`provider "p1"`, "duplicate"}},
		{"duplicate upstream", cfg(L(prov()), L(ups(), ups()), L(model())), []string{`upstream "u1"`, "duplicate"}},
		{"duplicate model", cfg(L(prov()), L(ups()), L(model(), model())), []string{`model "m"`, "duplicate"}},
		{"unknown provider", cfg(L(prov()), L(ups("provider", "ghost-provider")), L(model())),
			[]string{`upstream "u1"`, `"ghost-provider"`}},
		{"unknown upstream", cfg(L(prov()), L(ups()), L(model("upstreams", []string{"u1", "ghost-upstream"}))),
			[]string{`model "m"`, `"ghost-upstream"`}},
		{"model without upstreams", cfg(L(prov()), L(ups()), L(model("upstreams", []string{}))),
			[]string{`model "m"`, "upstream"}},
		{"bad url", cfg(L(prov("url", "ftp//not a url")), L(ups()), L(model())), []string{`provider "p1"`, "url"}},
		{"url with credentials", cfg(L(prov("url", "http://admin:sk-test-secret-url@127.0.0.1:1/v1?x=1")), L(ups()), L(model())),
			[]string{`provider "p1"`, "url"}},
		{"negative provider limit", cfg(L(prov("max_concurrency", -1)), L(ups()), L(model())),
			[]string{`provider "p1"`, "max_concurrency"}},
		{"negative upstream limit", cfg(L(prov()), L(ups("max_concurrency", -2)), L(model())),
			[]string{`upstream "u1"`, "max_concurrency"}},
		{"negative max_request_body", cfg(L(prov()), L(ups()), L(model()), "max_request_body", -1),
			[]string{"max_request_body"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := p.loadErr(tc.conf)
			if err == nil {
				t.Fatal("config loaded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %s: %v", w, err)
				}
			}
			if strings.Contains(err.Error(), "sk-test-secret") {
				t.Errorf("error leaks a secret: %v", err)
			}
		})
	}
	// A key that would inject a header: refused, named, not echoed. The
	// upstream adopted before the failure must not outlive the failed load.
	t.Setenv("LLMROUTE_IT_BAD_KEY", "sk-test-secret-bad\r\nX-Injected: 1")
	err := p.loadErr(cfg(
		L(obj("id", "p-ok", "url", up.base()), prov("key", "{env.LLMROUTE_IT_BAD_KEY}")),
		L(obj("id", "leak-u", "provider", "p-ok", "model", "x"), ups()),
		L(model()),
	))
	if err == nil || !strings.Contains(err.Error(), `provider "p1"`) || strings.Contains(err.Error(), "sk-test-secret") {
		t.Errorf("key with a line break: error %v, want one naming provider p1 without the key", err)
	}
	if strings.Contains(p.metrics(), `upstream="leak-u"`) {
		t.Error("the state of an upstream of a config that failed to provision outlived it")
	}

	// The running config survived every failed load.
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("after failed loads: status %d: %s", resp.StatusCode, body)
	}
}
