package integration

// The Gemini front driven by Google's own Go SDK (google.golang.org/genai)
// against a fake that behaves like Google's Gemini API (its paths, its
// `data: {…}\r\n\r\n` stream framing, finishReason and usageMetadata on the
// last event, its error shape and 401), and against chat upstreams.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genai"
)

// geminiProviderKey is the operator's Google key; the fake refuses any
// other.
const geminiProviderKey = "goog-provider-key-1"

// googleError writes an error the way Google's API does.
func googleError(w http.ResponseWriter, code int, status, message string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"error":{"code":%d,"message":%q,"status":%q}}`, code, message, status)
}

// geminiUsage is what the fake reports: 20 prompt tokens (8 cached), 4
// candidate tokens and 2 thought tokens (6 output).
const geminiUsage = `{"promptTokenCount":20,"candidatesTokenCount":4,"totalTokenCount":26,"cachedContentTokenCount":8,"thoughtsTokenCount":2,"promptTokensDetails":[{"modality":"TEXT","tokenCount":20}]}`

// geminiEvents are a native stream of text, one event per word, each
// framed as Google frames them; the last carries finishReason and the full
// usage, the others a partial one.
func geminiEvents(text string) []string {
	words := strings.SplitAfter(text, " ")
	var evs []string
	for i, w := range words {
		tail := `"index":0}],"usageMetadata":{"promptTokenCount":20,"totalTokenCount":20}`
		if i == len(words)-1 {
			tail = `"finishReason":"STOP","index":0}],"usageMetadata":` + geminiUsage
		}
		evs = append(evs, fmt.Sprintf(`data: {"candidates":[{"content":{"parts":[{"text":%q}],"role":"model"},%s,"modelVersion":"real-model","responseId":"resp-native-1"}`+"\r\n\r\n", w, tail))
	}
	return evs
}

// geminiAnswer is the non-stream answer for text.
func geminiAnswer(text string) string {
	return fmt.Sprintf(`{"candidates":[{"content":{"parts":[{"text":%q}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":%s,"modelVersion":"real-model","responseId":"resp-native-1"}`, text, geminiUsage)
}

// nativeGemini answers Google's Gemini API for the model real-model:
// generateContent, streamGenerateContent (alt=sse only, as SSE),
// countTokens (42); 401 in Google's shape unless X-Goog-Api-Key is the
// provider key, 404 for another model, 400 for a key in the query (the
// proxy never sends one: the client's must not leak there).
func nativeGemini(text string) http.HandlerFunc {
	return nativeGeminiStream(text, func(w http.ResponseWriter, _ *http.Request, evs []string) { writeStream(w, evs, 0) })
}

// nativeGeminiStream is nativeGemini with the stream's events written by
// send.
func nativeGeminiStream(text string, send func(w http.ResponseWriter, r *http.Request, evs []string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Goog-Api-Key") != geminiProviderKey {
			googleError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "API key not valid. Please pass a valid API key.")
			return
		}
		if hasQueryKey(r.URL.RawQuery) {
			googleError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "a key in the query reached the upstream")
			return
		}
		rest, ok := strings.CutPrefix(r.URL.Path, "/v1beta/models/")
		c := strings.LastIndexByte(rest, ':')
		if !ok || c < 0 || rest[:c] != "real-model" {
			googleError(w, http.StatusNotFound, "NOT_FOUND", "models/"+rest+" is not found for API version v1beta")
			return
		}
		switch rest[c+1:] {
		case "countTokens":
			w.Header().Set("Content-Type", "application/json; charset=UTF-8")
			io.WriteString(w, `{"totalTokens":42,"promptTokensDetails":[{"modality":"TEXT","tokenCount":42}]}`)
		case "generateContent":
			w.Header().Set("Content-Type", "application/json; charset=UTF-8")
			io.WriteString(w, geminiAnswer(text))
		case "streamGenerateContent":
			if r.URL.Query().Get("alt") != "sse" {
				googleError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "this fake streams only with alt=sse")
				return
			}
			send(w, r, geminiEvents(text))
		default:
			googleError(w, http.StatusNotFound, "NOT_FOUND", "no such method")
		}
	}
}

func hasQueryKey(raw string) bool {
	q, _ := url.ParseQuery(raw)
	_, ok := q["key"]
	return ok
}

// geminiConfig: model m served by the listed fakes in order; native ones
// speak only Google's Gemini API (url …/v1beta, the key in
// x-goog-api-key), the others only chat.
func geminiConfig(ups []*fakeUpstream, native []bool) map[string]any {
	var providers, upstreams []any
	var ids []string
	for i, up := range ups {
		p := obj("id", fmt.Sprintf("p%d", i+1), "url", up.base(), "key", fmt.Sprintf("sk-test-secret-%d", i+1))
		if native[i] {
			p["url"], p["key"], p["apis"], p["auth"] = up.URL+"/v1beta", geminiProviderKey, []string{"gemini"}, "x-goog-api-key"
		}
		providers = append(providers, p)
		id := fmt.Sprintf("u%d", i+1)
		upstreams = append(upstreams, obj("id", id, "provider", p["id"], "model", "real-model"))
		ids = append(ids, id)
	}
	return map[string]any{"providers": providers, "upstreams": upstreams,
		"models": []any{obj("name", "m", "upstreams", ids)}}
}

// geminiClient is the SDK pointed at the proxy, as Gemini CLI points it
// (GOOGLE_GEMINI_BASE_URL without the version; v1beta).
func geminiClient(t *testing.T, p *proxy, key string) *genai.Client {
	t.Helper()
	c, err := genai.NewClient(context.Background(), &genai.ClientConfig{APIKey: key, Backend: genai.BackendGeminiAPI,
		HTTPClient: testClient, HTTPOptions: genai.HTTPOptions{BaseURL: p.URL, APIVersion: "v1beta"}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// geminiStream collects a GenerateContentStream: its chunks and the first
// error.
func geminiStream(c *genai.Client, model, text string) ([]*genai.GenerateContentResponse, error) {
	var chunks []*genai.GenerateContentResponse
	for res, err := range c.Models.GenerateContentStream(context.Background(), model, genai.Text(text), nil) {
		if err != nil {
			return chunks, err
		}
		chunks = append(chunks, res)
	}
	return chunks, nil
}

// streamText joins the text of the chunks.
func streamText(chunks []*genai.GenerateContentResponse) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString(c.Text())
	}
	return b.String()
}

// postGemini sends a raw request to a Gemini path of the proxy.
func (p *proxy) postGemini(t *testing.T, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// googleErrorBody is Google's error shape.
type googleErrorBody struct {
	Error struct {
		Code    int
		Message string
		Status  string
		Details []struct {
			Type       string `json:"@type"`
			Reason     string
			Domain     string
			RetryDelay string
		}
	}
}

// expectGoogleError checks a whole response is an error in Google's shape
// with the status, its name, and the proxy's code as ErrorInfo's reason
// (when reason is not ""); it returns the body.
func expectGoogleError(t *testing.T, resp *http.Response, status int, name, reason string) googleErrorBody {
	t.Helper()
	raw := readAll(t, resp)
	var e googleErrorBody
	if resp.StatusCode != status || json.Unmarshal([]byte(raw), &e) != nil || e.Error.Code != status || e.Error.Status != name || e.Error.Message == "" {
		t.Fatalf("status %d body %s; want %d %s in Google's shape", resp.StatusCode, raw, status, name)
	}
	if reason != "" && geminiReason(e) != reason {
		t.Fatalf("body %s: ErrorInfo reason %q, want %q", raw, geminiReason(e), reason)
	}
	return e
}

func geminiReason(e googleErrorBody) string {
	for _, d := range e.Error.Details {
		if d.Type == "type.googleapis.com/google.rpc.ErrorInfo" {
			return d.Reason
		}
	}
	return ""
}

// expectSDKError checks err is the SDK's APIError with code and status.
func expectSDKError(t *testing.T, what string, err error, code int, status string) genai.APIError {
	t.Helper()
	var apiErr genai.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != code || apiErr.Status != status || apiErr.Message == "" {
		t.Fatalf("%s: err = %v, want an APIError %d %s", what, err, code, status)
	}
	return apiErr
}

// TestGeminiFrontNative: a native Gemini upstream gets the body as sent
// (no model member added, the provider's patch merged) at its own model's
// URL, with the provider's key in x-goog-api-key and never the client's;
// the answer passes byte for byte; the SDK reads it, and its usage counts.
func TestGeminiFrontNative(t *testing.T) {
	up := newUpstream(t, nativeGemini("hello world"))
	cfg := geminiConfig([]*fakeUpstream{up}, []bool{true})
	cfg["providers"].([]any)[0].(map[string]any)["patch"] = obj("generationConfig", obj("temperature", 0.2))
	p := startProxy(t, cfg)

	body := `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"temperature":1,"maxOutputTokens":64}}`
	resp := p.postGemini(t, "/v1beta/models/m:generateContent", body, "X-Goog-Api-Key", "client-key")
	if got := readAll(t, resp); resp.StatusCode != 200 || got != geminiAnswer("hello world") {
		t.Fatalf("answer %d %s", resp.StatusCode, got)
	}
	calls := up.Calls()
	if len(calls) != 1 || calls[0].Path != "/v1beta/models/real-model:generateContent" {
		t.Fatalf("upstream calls %+v", calls)
	}
	want := `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"temperature":0.2,"maxOutputTokens":64}}`
	if string(calls[0].Body) != want {
		t.Fatalf("upstream body\n got %s\nwant %s", calls[0].Body, want)
	}
	if h := calls[0].Header; h.Get("X-Goog-Api-Key") != geminiProviderKey || h.Get("Authorization") != "" {
		t.Fatalf("upstream headers %v", h)
	}

	c := geminiClient(t, p, "client-key")
	res, err := c.Models.GenerateContent(context.Background(), "m", genai.Text("hi"),
		&genai.GenerateContentConfig{SystemInstruction: genai.NewContentFromText("be brief", genai.RoleUser)})
	if err != nil {
		t.Fatalf("GenerateContent: %v", err)
	}
	if res.Text() != "hello world" || res.Candidates[0].FinishReason != genai.FinishReasonStop || res.ModelVersion != "real-model" ||
		res.UsageMetadata == nil || res.UsageMetadata.PromptTokenCount != 20 || res.UsageMetadata.ThoughtsTokenCount != 2 {
		t.Fatalf("response %+v", res)
	}
	calls = up.Calls()
	var sent map[string]json.RawMessage
	if err := json.Unmarshal(calls[1].Body, &sent); err != nil || sent["model"] != nil || sent["contents"] == nil || sent["systemInstruction"] == nil {
		t.Fatalf("upstream body of the SDK's request %s", calls[1].Body)
	}
	for _, call := range calls {
		for name, vals := range call.Header {
			if strings.Contains(strings.Join(vals, ","), "client-key") {
				t.Fatalf("the client's key reached the upstream in %s", name)
			}
		}
	}
	// Both answers' usageMetadata: 20 prompt tokens (8 cached), 4 + 2
	// thought tokens of output.
	eventually(t, 5*time.Second, "tokens counted", func() bool {
		return p.metric("llm_proxy_tokens_total", "model", "m", "upstream", "u1", "provider", "p1", "type", "output") == 12
	})
	for typ, n := range map[string]float64{"input": 40, "cached_input": 16, "reasoning": 4} {
		if got := p.metric("llm_proxy_tokens_total", "model", "m", "upstream", "u1", "provider", "p1", "type", typ); got != n {
			t.Errorf("tokens %s = %v, want %v", typ, got, n)
		}
	}
	if logs := p.logEntries("request completed"); len(logs) == 0 || logs[len(logs)-1]["api"] != "gemini" || logs[len(logs)-1]["mode"] != "native" {
		t.Fatalf("completion log = %v", logs)
	}
}

// TestGeminiNativeStream: the SDK reads a native stream through the proxy:
// every chunk, the last with finishReason and usage, no error after it
// (the finishReason is the stream's end); on the wire every event is one
// `data:` line framed `\r\n\r\n`. Without alt=sse the proxy refuses, in
// Google's shape.
func TestGeminiNativeStream(t *testing.T) {
	up := newUpstream(t, nativeGemini("hello big world"))
	p := startProxy(t, geminiConfig([]*fakeUpstream{up}, []bool{true}))
	c := geminiClient(t, p, "client-key")
	chunks, err := geminiStream(c, "m", "hi")
	if err != nil {
		t.Fatalf("stream: %v (after %d chunks)", err, len(chunks))
	}
	last := chunks[len(chunks)-1]
	if len(chunks) != 3 || streamText(chunks) != "hello big world" || last.Candidates[0].FinishReason != genai.FinishReasonStop ||
		last.UsageMetadata == nil || last.UsageMetadata.CandidatesTokenCount != 4 {
		t.Fatalf("%d chunks, text %q, last %+v", len(chunks), streamText(chunks), last)
	}
	if calls := up.Calls(); len(calls) != 1 || calls[0].Path != "/v1beta/models/real-model:streamGenerateContent" {
		t.Fatalf("upstream calls %+v", calls)
	}
	eventually(t, 5*time.Second, "tokens counted", func() bool {
		return p.metric("llm_proxy_tokens_total", "model", "m", "upstream", "u1", "provider", "p1", "type", "output") == 6
	})

	resp := p.postGemini(t, "/v1beta/models/m:streamGenerateContent?alt=sse", `{"contents":[{"parts":[{"text":"hi"}]}]}`)
	raw := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || raw != strings.Join(geminiEvents("hello big world"), "") {
		t.Fatalf("raw stream %d %q", resp.StatusCode, raw)
	}

	resp = p.postGemini(t, "/v1beta/models/m:streamGenerateContent", `{"contents":[{"parts":[{"text":"hi"}]}]}`)
	expectGoogleError(t, resp, 400, "INVALID_ARGUMENT", "stream_needs_sse")
	if n := len(up.Calls()); n != 2 {
		t.Fatalf("%d upstream calls, want 2", n)
	}
}

// TestGeminiStreamNoHeartbeat: the Google SDKs fail on an SSE comment
// line, so a Gemini stream, native or translated, gets no keepalive even
// when heartbeats are on and the upstream pauses for several heartbeat
// periods.
func TestGeminiStreamNoHeartbeat(t *testing.T) {
	up := newUpstream(t, nativeGeminiStream("slow but whole", func(w http.ResponseWriter, _ *http.Request, evs []string) {
		writeStream(w, evs, 700*time.Millisecond)
	}))
	chatUp := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		writeStream(w, sseChunks("slow chat"), 500*time.Millisecond)
	})
	cfg := withModel(geminiConfig([]*fakeUpstream{up, chatUp}, []bool{true, false}), "m", "u1", "t", "u2")
	cfg["heartbeat_interval"] = "100ms"
	p := startProxy(t, cfg)
	for _, tc := range []struct{ model, want string }{{"t", "slow chat"}, {"m", "slow but whole"}} {
		chunks, err := geminiStream(geminiClient(t, p, "k"), tc.model, "hi")
		if err != nil || streamText(chunks) != tc.want {
			t.Fatalf("%s: stream %q, %v", tc.model, streamText(chunks), err)
		}
	}
	resp := p.postGemini(t, "/v1beta/models/m:streamGenerateContent?alt=sse", `{"contents":[{"parts":[{"text":"hi"}]}]}`)
	if raw := readAll(t, resp); raw != strings.Join(geminiEvents("slow but whole"), "") {
		t.Fatalf("raw stream %q", raw)
	}
}

// TestGeminiNativeStreamBreak: a native stream that breaks after bytes
// reached the client (reset, or a clean end without finishReason) ends
// with an error event in Google's framing, which the SDK reports as an
// APIError; a stream whose finishReason arrived is whole whatever follows.
func TestGeminiNativeStreamBreak(t *testing.T) {
	evs := geminiEvents("one two three")
	cases := []struct {
		name   string
		send   func(w http.ResponseWriter, r *http.Request)
		broken bool
	}{
		{"reset", func(w http.ResponseWriter, r *http.Request) { writeStream(w, evs[:2], 0); resetsConnection(w, r) }, true},
		{"clean end, no finishReason", func(w http.ResponseWriter, r *http.Request) { writeStream(w, evs[:2], 0) }, true},
		{"reset after finishReason", func(w http.ResponseWriter, r *http.Request) { writeStream(w, evs, 0); resetsConnection(w, r) }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, nativeGeminiStream("", func(w http.ResponseWriter, r *http.Request, _ []string) { tc.send(w, r) }))
			p := startProxy(t, geminiConfig([]*fakeUpstream{up}, []bool{true}))
			chunks, err := geminiStream(geminiClient(t, p, "k"), "m", "hi")
			if !tc.broken {
				if err != nil || streamText(chunks) != "one two three" {
					t.Fatalf("stream %q: %v", streamText(chunks), err)
				}
				return
			}
			if streamText(chunks) != "one two " {
				t.Fatalf("text before the break %q", streamText(chunks))
			}
			e := expectSDKError(t, "broken stream", err, 503, "UNAVAILABLE")
			if !strings.Contains(e.Message, "interrupted") {
				t.Fatalf("error %+v", e)
			}
		})
	}
}

// TestGeminiCountTokens: a native upstream counts (no slot needed: it
// answers while the only slot is held); a model with only chat upstreams
// is estimated, and says so, without asking them.
func TestGeminiCountTokens(t *testing.T) {
	g := newGate()
	native := newUpstream(t, nil)
	native.setHandler(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, ":generateContent") {
			g.handler(nativeGemini("late"))(w, r)
			return
		}
		nativeGemini("x")(w, r)
	})
	chatUp := newUpstream(t, completion("x"))
	cfg := withModel(geminiConfig([]*fakeUpstream{native, chatUp}, []bool{true, false}), "m", "u1", "t", "u2")
	cfg["upstreams"].([]any)[0].(map[string]any)["max_concurrency"] = 1
	p := startProxy(t, cfg)
	c := geminiClient(t, p, "k")
	done := make(chan error, 1)
	go func() {
		_, err := c.Models.GenerateContent(context.Background(), "m", genai.Text("hold the slot"), nil)
		done <- err
	}()
	g.waitArrivals(t, 1)
	res, err := c.Models.CountTokens(context.Background(), "m", genai.Text("hello there"), nil)
	if err != nil || res.TotalTokens != 42 {
		t.Fatalf("count %+v %v", res, err)
	}
	var counted bool
	for _, call := range native.Calls() {
		counted = counted || call.Path == "/v1beta/models/real-model:countTokens"
	}
	if !counted {
		t.Fatalf("native calls %+v", native.Calls())
	}
	g.open()
	if err := <-done; err != nil {
		t.Fatalf("held request: %v", err)
	}

	res, err = c.Models.CountTokens(context.Background(), "t", genai.Text("hello there, how are you today?"), nil)
	if err != nil || res.TotalTokens <= 0 || res.SDKHTTPResponse == nil || res.SDKHTTPResponse.Headers.Get("X-LLM-Route-Estimate") != "true" {
		t.Fatalf("estimate %+v %v", res, err)
	}
	if n := len(chatUp.Calls()); n != 0 {
		t.Fatalf("a chat-only upstream was asked to count (%d calls)", n)
	}
	resp := p.postGemini(t, "/v1beta/models/t:countTokens", `{"contents":[`)
	expectGoogleError(t, resp, 400, "INVALID_ARGUMENT", "invalid_json")
	resp = p.postGemini(t, "/v1beta/models/nope:countTokens", `{"contents":[]}`)
	expectGoogleError(t, resp, 404, "NOT_FOUND", "model_not_found")
}

// TestGeminiModels: the model list and one model, as the SDK reads them;
// an unknown model is Google's 404; a client key with a models list sees
// only its models, and is refused another.
func TestGeminiModels(t *testing.T) {
	up := newUpstream(t, nativeGemini("x"))
	p := startProxy(t, withModel(geminiConfig([]*fakeUpstream{up}, []bool{true}), "m", "u1", "t", "u1"))
	c := geminiClient(t, p, "k")
	page, err := c.Models.List(context.Background(), nil)
	if err != nil || len(page.Items) != 2 || page.Items[0].Name != "models/m" || page.Items[1].Name != "models/t" {
		t.Fatalf("list %+v %v", page.Items, err)
	}
	if acts := page.Items[0].SupportedActions; len(acts) == 0 || acts[0] != "generateContent" {
		t.Fatalf("supported actions %v", acts)
	}
	m, err := c.Models.Get(context.Background(), "m", nil)
	if err != nil || m.Name != "models/m" {
		t.Fatalf("get %+v %v", m, err)
	}
	_, err = c.Models.Get(context.Background(), "nope", nil)
	expectSDKError(t, "unknown model", err, 404, "NOT_FOUND")
	// Google's SDKs with API version v1 list at /v1/models: the key
	// header makes it Google's list.
	resp := p.get("/v1/models")
	if body := readAll(t, resp); !strings.Contains(body, `"object":"list"`) {
		t.Fatalf("OpenAI list %s", body)
	}
	req, _ := http.NewRequest(http.MethodGet, p.URL+"/v1/models", nil)
	req.Header.Set("X-Goog-Api-Key", "k")
	resp, err = testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); !strings.Contains(body, `"models/m"`) {
		t.Fatalf("Google list at /v1 %s", body)
	}

	t.Setenv("LLMR_TEAM_KEY", secretTeam)
	cfg := withModel(geminiConfig([]*fakeUpstream{up}, []bool{true}), "m", "u1", "t", "u1")
	cfg["keys"] = []any{obj("id", "team", "secret", "{env.LLMR_TEAM_KEY}", "models", []string{"m"})}
	p.load(cfg)
	c = geminiClient(t, p, secretTeam)
	page, err = c.Models.List(context.Background(), nil)
	if err != nil || len(page.Items) != 1 || page.Items[0].Name != "models/m" {
		t.Fatalf("key's list %+v %v", page.Items, err)
	}
	_, err = c.Models.Get(context.Background(), "t", nil)
	expectSDKError(t, "model outside the key's list", err, 403, "PERMISSION_DENIED")
}

// TestGeminiErrors: the proxy's own refusals on the Gemini paths, in
// Google's shape as the SDK parses it: unknown model, busy (with Google's
// RetryInfo beside Retry-After), an unknown path, a body that is not JSON.
func TestGeminiErrors(t *testing.T) {
	g := newGate()
	up := newUpstream(t, g.handler(nativeGemini("late")))
	cfg := geminiConfig([]*fakeUpstream{up}, []bool{true})
	cfg["upstreams"].([]any)[0].(map[string]any)["max_concurrency"] = 1
	p := startProxy(t, cfg)
	c := geminiClient(t, p, "k")

	_, err := c.Models.GenerateContent(context.Background(), "nope", genai.Text("hi"), nil)
	expectSDKError(t, "unknown model", err, 404, "NOT_FOUND")
	_, err = geminiStream(c, "nope", "hi")
	expectSDKError(t, "unknown model, stream", err, 404, "NOT_FOUND")

	done := make(chan error, 1)
	go func() {
		_, err := c.Models.GenerateContent(context.Background(), "m", genai.Text("hold the slot"), nil)
		done <- err
	}()
	g.waitArrivals(t, 1)
	_, err = c.Models.GenerateContent(context.Background(), "m", genai.Text("hi"), nil)
	e := expectSDKError(t, "busy", err, 503, "UNAVAILABLE")
	var retry bool
	for _, d := range e.Details {
		retry = retry || d["@type"] == "type.googleapis.com/google.rpc.RetryInfo" && d["retryDelay"] == "1s"
	}
	if !retry {
		t.Fatalf("busy details %v", e.Details)
	}
	resp := p.postGemini(t, "/v1beta/models/m:generateContent", `{"contents":[{"parts":[{"text":"hi"}]}]}`)
	if resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	expectGoogleError(t, resp, 503, "UNAVAILABLE", "all_upstreams_busy")
	g.open()
	if err := <-done; err != nil {
		t.Fatalf("held request: %v", err)
	}

	expectGoogleError(t, p.postGemini(t, "/v1beta/foo", `{}`), 404, "NOT_FOUND", "unsupported_endpoint")
	expectGoogleError(t, p.postGemini(t, "/v1beta/models/m:generateContent", `{"contents":`), 400, "INVALID_ARGUMENT", "invalid_json")
	expectGoogleError(t, p.postGemini(t, "/v1beta/models/m:embedContent", `{}`), 405, "UNIMPLEMENTED", "method_not_allowed")

	cfg["max_request_body"] = 64
	p.load(cfg)
	big := `{"contents":[{"parts":[{"text":"` + strings.Repeat("x", 100) + `"}]}]}`
	expectGoogleError(t, p.postGemini(t, "/v1beta/models/m:generateContent", big), 413, "INVALID_ARGUMENT", "request_too_large")
}

// TestGeminiClientKey: with client keys configured, the Google key is one
// (x-goog-api-key or ?key=): missing 401, another model 403, over the rate
// 429, all in Google's shape; and neither the header nor the query
// parameter ever reaches an upstream, a log (with the log filters the docs
// give for Caddy's access log) or an answer.
func TestGeminiClientKey(t *testing.T) {
	t.Setenv("LLMR_TEAM_KEY", secretTeam)
	t.Setenv("LLMR_SLOW_KEY", secretSlow)
	up := newUpstream(t, nativeGemini("hello"))
	chatUp := newUpstream(t, completion("hello from chat"))
	cfg := geminiConfig([]*fakeUpstream{up, chatUp}, []bool{true, false})
	cfg["models"] = []any{obj("name", "m", "upstreams", []string{"u1"}), obj("name", "t", "upstreams", []string{"u2"}),
		obj("name", "other", "upstreams", []string{"u1"})}
	cfg["keys"] = []any{
		obj("id", "team", "secret", "{env.LLMR_TEAM_KEY}", "models", []string{"m", "t"}),
		obj("id", "slow", "secret", "{env.LLMR_SLOW_KEY}", "rpm", 1),
	}
	p := startProxy(t, cfg)
	// The access log on, filtered as the docs say.
	var full map[string]any
	if err := json.Unmarshal(p.config(cfg), &full); err != nil {
		t.Fatal(err)
	}
	full["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["srv0"].(map[string]any)["logs"] = map[string]any{}
	full["logging"].(map[string]any)["logs"].(map[string]any)["default"].(map[string]any)["encoder"] = map[string]any{
		"format": "filter", "fields": map[string]any{
			"request>headers>X-Goog-Api-Key": map[string]any{"filter": "delete"},
			"request>uri":                    map[string]any{"filter": "query", "actions": []any{map[string]any{"type": "delete", "parameter": "key"}}},
		}}
	b, _ := json.Marshal(full)
	if err := loadCaddy(t, b); err != nil {
		t.Fatal(err)
	}
	const gen = `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`
	var answers []string
	keep := func(resp *http.Response) *http.Response {
		for k, v := range resp.Header {
			answers = append(answers, k+": "+strings.Join(v, ","))
		}
		return resp
	}

	// Served by the SDK's header, and by the query parameter, natively and
	// translated.
	for model, want := range map[string]string{"m": "hello", "t": "hello from chat"} {
		res, err := geminiClient(t, p, secretTeam).Models.GenerateContent(context.Background(), model, genai.Text("hi"), nil)
		if err != nil || res.Text() != want {
			t.Fatalf("%s with x-goog-api-key: %+v %v", model, res, err)
		}
	}
	for _, path := range []string{"/v1beta/models/m:generateContent?key=" + secretTeam, "/v1beta/models/m:streamGenerateContent?key=" + secretTeam + "&alt=sse",
		"/v1beta/models/t:generateContent?key=" + secretTeam, "/v1beta/models/t:streamGenerateContent?alt=sse&key=" + secretTeam} {
		resp := keep(p.postGemini(t, path, gen))
		body := readAll(t, resp)
		answers = append(answers, body)
		if resp.StatusCode != 200 || !strings.Contains(body, "hello") {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
	}

	// Refusals, each in Google's shape.
	expectGoogleError(t, keep(p.postGemini(t, "/v1beta/models/m:generateContent", gen)), 401, "UNAUTHENTICATED", "invalid_api_key")
	expectGoogleError(t, keep(p.postGemini(t, "/v1beta/models/m:generateContent?key=nope", gen)), 401, "UNAUTHENTICATED", "invalid_api_key")
	_, err := geminiClient(t, p, secretTeam+"x").Models.GenerateContent(context.Background(), "m", genai.Text("hi"), nil)
	expectSDKError(t, "unknown key", err, 401, "UNAUTHENTICATED")
	_, err = geminiClient(t, p, secretTeam).Models.GenerateContent(context.Background(), "other", genai.Text("hi"), nil)
	expectSDKError(t, "model outside the key's list", err, 403, "PERMISSION_DENIED")
	expectGoogleError(t, keep(p.postGemini(t, "/v1beta/models/other:countTokens?key="+secretTeam, gen)), 403, "PERMISSION_DENIED", "model_not_allowed")
	slow := geminiClient(t, p, secretSlow)
	_, err = slow.Models.GenerateContent(context.Background(), "m", genai.Text("hi"), nil)
	if err == nil {
		_, err = slow.Models.GenerateContent(context.Background(), "m", genai.Text("hi"), nil)
	}
	e := expectSDKError(t, "over the rate", err, 429, "RESOURCE_EXHAUSTED")
	var retry bool
	for _, d := range e.Details {
		retry = retry || d["@type"] == "type.googleapis.com/google.rpc.RetryInfo"
	}
	if !retry {
		t.Fatalf("rate limit details %v", e.Details)
	}

	calls := append(up.Calls(), chatUp.Calls()...)
	if len(up.Calls()) < 3 || len(chatUp.Calls()) < 3 {
		t.Fatalf("upstream calls: native %d, chat %d", len(up.Calls()), len(chatUp.Calls()))
	}
	var upstream strings.Builder
	for _, c := range calls {
		fmt.Fprintf(&upstream, "%s %v %s\n", c.Path, c.Header, c.Body)
	}
	logs := p.logs()
	if !strings.Contains(logs, `"llm_route_key":"team"`) || !strings.Contains(logs, `streamGenerateContent?alt=sse`) {
		t.Fatal("the access log is not on: the check below would prove nothing")
	}
	for where, text := range map[string]string{"upstream": upstream.String(), "logs": logs, "answers": strings.Join(answers, "\n"), "metrics": p.metrics()} {
		for _, s := range []string{secretTeam, secretSlow, "5ecret"} {
			if strings.Contains(text, s) {
				t.Errorf("%s contains a client secret (%s)", where, s)
			}
		}
	}
}

// TestGeminiContextLengthFailover: Google's refusal of a prompt too long
// for the model (400 INVALID_ARGUMENT "… exceeds the maximum number of
// tokens allowed …") hands the request on to the next upstream without
// blaming the first.
func TestGeminiContextLengthFailover(t *testing.T) {
	small := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		googleError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).")
	})
	big := newUpstream(t, nativeGemini("fits here"))
	p := startProxy(t, geminiConfig([]*fakeUpstream{small, big}, []bool{true, true}))
	res, err := geminiClient(t, p, "k").Models.GenerateContent(context.Background(), "m", genai.Text("a long prompt"), nil)
	if err != nil || res.Text() != "fits here" {
		t.Fatalf("answer %+v %v", res, err)
	}
	if len(small.Calls()) != 1 || len(big.Calls()) != 1 {
		t.Fatalf("calls small %d big %d", len(small.Calls()), len(big.Calls()))
	}
	if s := p.upstreamGauge("fail_streak", "u1", "p1"); s != 0 {
		t.Fatalf("the too-small upstream was blamed: fail_streak %v", s)
	}
}

// TestGeminiFailoverNativeToTranslated: the native Gemini upstream answers
// 503 (Google's shape); the request moves to a chat upstream before any
// byte reached the client, streamed and not, and the SDK gets the whole
// answer.
func TestGeminiFailoverNativeToTranslated(t *testing.T) {
	native := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		googleError(w, http.StatusServiceUnavailable, "UNAVAILABLE", "The model is overloaded. Please try again later.")
	})
	chatUp := newUpstream(t, completion("from chat"))
	p := startProxy(t, geminiConfig([]*fakeUpstream{native, chatUp}, []bool{true, false}))
	c := geminiClient(t, p, "client-key")
	res, err := c.Models.GenerateContent(context.Background(), "m", genai.Text("hi"), nil)
	if err != nil || res.Text() != "from chat" || res.Candidates[0].FinishReason != genai.FinishReasonStop {
		t.Fatalf("non-stream %+v %v", res, err)
	}
	chunks, err := geminiStream(c, "m", "hi")
	if err != nil || streamText(chunks) != "from chat" || chunks[len(chunks)-1].Candidates[0].FinishReason != genai.FinishReasonStop {
		t.Fatalf("stream %q %v", streamText(chunks), err)
	}
	nc, cc := native.Calls(), chatUp.Calls()
	if len(nc) != 2 || nc[0].Path != "/v1beta/models/real-model:generateContent" || nc[1].Path != "/v1beta/models/real-model:streamGenerateContent" ||
		len(cc) != 2 || cc[0].Path != "/v1/chat/completions" {
		t.Fatalf("calls native %+v chat %+v", nc, cc)
	}
	for _, call := range cc {
		if call.Header.Get("X-Goog-Api-Key") != "" || call.Header.Get("Authorization") != "Bearer sk-test-secret-2" {
			t.Fatalf("chat upstream headers %v", call.Header)
		}
	}
	if p.requests("m", "u1", "p1", "5xx") != 2 || p.requests("m", "u2", "p2", "ok") != 2 {
		t.Fatalf("metrics:\n%s", p.metrics())
	}
}

// TestGeminiProbe: an upstream that speaks only Gemini is probed in
// Gemini's API: its stream URL (alt=sse) with its model in the path, no
// model member in the body, the provider's key in x-goog-api-key; the
// probe's answer ends the cooling long before the backoff would.
func TestGeminiProbe(t *testing.T) {
	var mu sync.Mutex
	var probes []upstreamCall
	healthy := false
	g := newGate()
	defer g.open()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		body := readReq(r)
		mu.Lock()
		isProbe, ok := strings.Contains(body, "2+2="), healthy
		if isProbe {
			probes = append(probes, upstreamCall{Path: r.URL.Path + "?" + r.URL.RawQuery, Header: r.Header.Clone(), Body: []byte(body)})
		}
		mu.Unlock()
		if isProbe || ok {
			nativeGemini("4")(w, r)
			return
		}
		g.handler(func(w http.ResponseWriter, r *http.Request) {
			googleError(w, http.StatusInternalServerError, "INTERNAL", "An internal error has occurred.")
		})(w, r)
	})
	cfg := geminiConfig([]*fakeUpstream{up}, []bool{true})
	prov := cfg["providers"].([]any)[0].(map[string]any)
	prov["backoff"], prov["probe_interval"] = "5m", "100ms"
	p := startProxy(t, cfg)

	// Four failures at once: cooling 1+2+4+8 s, until ~8 s from now.
	c := geminiClient(t, p, "k")
	done := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := c.Models.GenerateContent(context.Background(), "m", genai.Text("hi"), nil)
			done <- err
		}()
	}
	g.waitArrivals(t, 4)
	mu.Lock()
	healthy = true // from now on the upstream answers; only a probe can tell
	mu.Unlock()
	g.open()
	for range 4 {
		<-done
	}
	if c := p.upstreamGauge("cooling_seconds", "u1", "p1"); c <= 4 {
		t.Fatalf("cooling %v s after four failures, want > 4", c)
	}
	eventually(t, 6*time.Second, "a probe answered", func() bool {
		return p.metric("llm_proxy_probe_pings_total", "upstream", "u1", "provider", "p1", "result", "ok") >= 1
	})
	if c := p.upstreamGauge("cooling_seconds", "u1", "p1"); c != 0 {
		t.Fatalf("cooling %v s after a good probe", c)
	}
	mu.Lock()
	pr := append([]upstreamCall(nil), probes...)
	mu.Unlock()
	var body map[string]any
	if len(pr) == 0 || pr[0].Path != "/v1beta/models/real-model:streamGenerateContent?alt=sse" ||
		json.Unmarshal(pr[0].Body, &body) != nil || body["model"] != nil || body["contents"] == nil ||
		pr[0].Header.Get("X-Goog-Api-Key") != geminiProviderKey {
		t.Fatalf("probes %+v", pr)
	}
	res, err := c.Models.GenerateContent(context.Background(), "m", genai.Text("hi"), nil)
	if err != nil || res.Text() != "4" {
		t.Fatalf("after the probe: %+v %v", res, err)
	}
}

// TestGeminiResume: a translated Gemini stream whose chat upstream breaks
// mid-answer is continued on the next one (resume on): the SDK reads the
// whole text and one finishReason, no error; the continuation is a chat
// stream ending in the delivered text.
func TestGeminiResume(t *testing.T) {
	a := newUpstream(t, faultChunkedCut(firstEvents(40)))
	b := newUpstream(t, deterministic(resumeB, false, 1))
	p := startProxy(t, resumeConfig(a, b, "30s"))
	ok0 := p.resumes("ok")
	chunks, err := geminiStream(geminiClient(t, p, "k"), "m", "count")
	if err != nil || streamText(chunks) != resumeFull {
		t.Fatalf("stream %q: %v", streamText(chunks), err)
	}
	finishes := 0
	for _, c := range chunks {
		if len(c.Candidates) > 0 && c.Candidates[0].FinishReason != "" {
			finishes++
		}
	}
	if finishes != 1 || chunks[len(chunks)-1].Candidates[0].FinishReason != genai.FinishReasonStop {
		t.Fatalf("%d finish reasons", finishes)
	}
	if d := p.resumes("ok") - ok0; d != 1 {
		t.Errorf("resumes ok counted %v, want 1", d)
	}
	calls := b.Calls()
	var chat struct{ Stream bool }
	if len(calls) != 1 {
		t.Fatalf("second upstream: %d calls, want 1", len(calls))
	}
	if calls[0].Path != "/v1/chat/completions" || json.Unmarshal(calls[0].Body, &chat) != nil || !chat.Stream {
		t.Fatalf("second upstream: a call at %s: %s", calls[0].Path, calls[0].Body)
	}
	if prefix, ok := lastAssistant(calls[0].Body); !ok || prefix != strings.Join(resumeTokens[:40], "") {
		t.Errorf("prefill = %q (%v)", prefix, ok)
	}
}
