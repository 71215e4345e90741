package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	anthropic "github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// nativeMessages answers POST /v1/messages as llama.cpp's server does: a
// message object, or its event stream (every event named), and
// /v1/messages/count_tokens with a count.
func nativeMessages(text string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/count_tokens") {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"input_tokens":42}`)
			return
		}
		if !strings.HasSuffix(r.URL.Path, "/messages") {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		if !isStream(r) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"msg_native1","type":"message","role":"assistant","model":"real-model","content":[{"type":"text","text":%q}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":2}}`, text)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		ev := func(name, data string) { fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data) }
		ev("message_start", `{"type":"message_start","message":{"id":"msg_native1","type":"message","role":"assistant","model":"real-model","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}`)
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
		for _, word := range strings.SplitAfter(text, " ") {
			ev("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, word))
		}
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":3,"output_tokens":2}}`)
		ev("message_stop", `{"type":"message_stop"}`)
	}
}

// frontsConfig: model m served by the listed fakes in order; native ones
// serve messages, responses, embeddings and completions natively with
// x-api-key auth, the others only chat.
func frontsConfig(ups []*fakeUpstream, native []bool) map[string]any {
	var providers, upstreams []any
	var ids []string
	for i, up := range ups {
		p := map[string]any{"id": fmt.Sprintf("p%d", i+1), "url": up.base(), "key": fmt.Sprintf("sk-test-secret-%d", i+1)}
		if native[i] {
			p["apis"] = []string{"chat", "messages", "responses", "embeddings", "completions"}
			p["auth"] = "x-api-key"
		}
		providers = append(providers, p)
		id := fmt.Sprintf("u%d", i+1)
		upstreams = append(upstreams, map[string]any{"id": id, "provider": p["id"], "model": "real-model"})
		ids = append(ids, id)
	}
	return map[string]any{"providers": providers, "upstreams": upstreams,
		"models": []any{map[string]any{"name": "m", "upstreams": ids}}}
}

// withModel replaces cfg's models: name followed by its upstream ids, then
// the next name …
func withModel(cfg map[string]any, spec ...string) map[string]any {
	var models []any
	for _, w := range spec {
		if w == "m" || w == "t" {
			models = append(models, map[string]any{"name": w, "upstreams": []string{}})
			continue
		}
		m := models[len(models)-1].(map[string]any)
		m["upstreams"] = append(m["upstreams"].([]string), w)
	}
	cfg["models"] = models
	return cfg
}

func anthropicClient(p *proxy) anthropic.Client {
	return anthropic.NewClient(aoption.WithBaseURL(p.URL), aoption.WithAPIKey("client-key"), aoption.WithMaxRetries(0), aoption.WithHTTPClient(testClient))
}

func userText(s string) anthropic.MessageParam {
	return anthropic.NewUserMessage(anthropic.NewTextBlock(s))
}

// TestMessagesFrontTranslated: the Anthropic SDK against a chat-only
// upstream, non-stream and stream; the upstream sees a chat request.
func TestMessagesFrontTranslated(t *testing.T) {
	up := newUpstream(t, completion("hello world"))
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	c := anthropicClient(p)
	params := anthropic.MessageNewParams{Model: "m", MaxTokens: 64, System: []anthropic.TextBlockParam{{Text: "be brief"}},
		Messages: []anthropic.MessageParam{userText("hi")}}
	msg, err := c.Messages.New(context.Background(), params)
	if err != nil {
		t.Fatalf("Messages.New: %v", err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Text != "hello world" || msg.StopReason != "end_turn" || msg.Usage.OutputTokens != 1 {
		t.Fatalf("message = %+v", msg)
	}
	calls := up.Calls()
	if len(calls) != 1 || calls[0].Path != "/v1/chat/completions" {
		t.Fatalf("upstream calls = %+v", calls)
	}
	var chat struct {
		Model    string
		Messages []struct{ Role, Content string }
	}
	if err := json.Unmarshal(calls[0].Body, &chat); err != nil || chat.Model != "real-model" || len(chat.Messages) != 2 ||
		chat.Messages[0].Role != "system" || chat.Messages[0].Content != "be brief" || chat.Messages[1].Content != "hi" {
		t.Fatalf("upstream body %s (%v)", calls[0].Body, err)
	}
	if got := calls[0].Header.Get("Authorization"); got != "Bearer sk-test-secret-1" {
		t.Fatalf("Authorization = %q", got)
	}

	acc := streamMessage(t, anthropicClient(p), params)
	if len(acc.Content) != 1 || acc.Content[0].Text != "hello world" || acc.StopReason != "end_turn" {
		t.Fatalf("streamed message = %+v", acc)
	}
	if n := p.requests("m", "u1", "p1", "ok"); n != 2 {
		t.Fatalf("requests_total ok = %v, want 2", n)
	}
	if logs := p.logEntries("request completed"); len(logs) == 0 || logs[len(logs)-1]["api"] != "messages" || logs[len(logs)-1]["mode"] != "translated" {
		t.Fatalf("completion log = %v", logs)
	}
}

// TestMessagesFrontNative: a native Messages upstream gets the body as sent
// (model swapped, billing block removed), the key as x-api-key and the
// anthropic headers; the SDK's accumulated stream equals, field by field,
// what the translated path gives for the same answer (ids aside).
func TestMessagesFrontNative(t *testing.T) {
	native := newUpstream(t, nativeMessages("hello world"))
	chatUp := newUpstream(t, completion("hello world"))
	p := startProxy(t, withModel(frontsConfig([]*fakeUpstream{native, chatUp}, []bool{true, false}), "m", "u1", "t", "u2"))
	body := `{"model":"m","max_tokens":64,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=abc;"},{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/messages?beta=true", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("anthropic-beta", "claude-code-20250219")
	req.Header.Set("x-api-key", "client-key")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got := readAll(t, resp)
	want := `{"id":"msg_native1","type":"message","role":"assistant","model":"real-model","content":[{"type":"text","text":"hello world"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":2}}`
	if resp.StatusCode != 200 || got != want {
		t.Fatalf("native answer %d %s", resp.StatusCode, got)
	}
	calls := native.Calls()
	if len(calls) != 1 || calls[0].Path != "/v1/messages" {
		t.Fatalf("calls %+v", calls)
	}
	wantUp := `{"model":"real-model","max_tokens":64,"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":"hi"}]}`
	if string(calls[0].Body) != wantUp {
		t.Fatalf("upstream body\n got %s\nwant %s", calls[0].Body, wantUp)
	}
	h := calls[0].Header
	if h.Get("X-Api-Key") != "sk-test-secret-1" || h.Get("Authorization") != "" || h.Get("Anthropic-Version") != "2023-06-01" || h.Get("Anthropic-Beta") != "claude-code-20250219" {
		t.Fatalf("upstream headers %v", h)
	}

	// The same conversation streamed natively and translated.
	accumulate := func(model string) anthropic.Message {
		return streamMessage(t, anthropicClient(p), anthropic.MessageNewParams{Model: anthropic.Model(model), MaxTokens: 64, Messages: []anthropic.MessageParam{userText("hi")}})
	}
	n, tr := accumulate("m"), accumulate("t")
	if n.Role != tr.Role || n.Model != tr.Model || n.StopReason != tr.StopReason || n.StopSequence != tr.StopSequence ||
		len(n.Content) != len(tr.Content) || n.Content[0].Type != tr.Content[0].Type || n.Content[0].Text != tr.Content[0].Text ||
		n.Type != tr.Type {
		t.Fatalf("native %+v\ntranslated %+v", n, tr)
	}
	if !strings.HasPrefix(tr.ID, "msg_") {
		t.Fatalf("translated id %q", tr.ID)
	}
}

// TestMessagesFailoverNativeToTranslated: the native upstream answers 503,
// the request moves to the chat-only one before any byte reached the client.
func TestMessagesFailoverNativeToTranslated(t *testing.T) {
	native := newUpstream(t, status(http.StatusServiceUnavailable))
	chatUp := newUpstream(t, completion("from chat"))
	p := startProxy(t, frontsConfig([]*fakeUpstream{native, chatUp}, []bool{true, false}))
	c := anthropicClient(p)
	st := c.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "m", MaxTokens: 16, Messages: []anthropic.MessageParam{userText("hi")}})
	var acc anthropic.Message
	for st.Next() {
		if err := acc.Accumulate(st.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(acc.Content) != 1 || acc.Content[0].Text != "from chat" {
		t.Fatalf("message %+v", acc)
	}
	if len(native.Calls()) != 1 || native.Calls()[0].Path != "/v1/messages" || len(chatUp.Calls()) != 1 || chatUp.Calls()[0].Path != "/v1/chat/completions" {
		t.Fatalf("calls native %d chat %d", len(native.Calls()), len(chatUp.Calls()))
	}
	if p.requests("m", "u1", "p1", "5xx") != 1 || p.requests("m", "u2", "p2", "ok") != 1 {
		t.Fatalf("metrics:\n%s", p.metrics())
	}
}

// TestMessagesErrors: errors the SDK parses, in Anthropic's shape.
func TestMessagesErrors(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"context too long","type":"invalid_request_error","code":"context_length_exceeded"}}`)
	})
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	c := anthropicClient(p)
	check := func(model string, status int, typ string) {
		t.Helper()
		_, err := c.Messages.New(context.Background(), anthropic.MessageNewParams{Model: anthropic.Model(model), MaxTokens: 16, Messages: []anthropic.MessageParam{userText("hi")}})
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) {
			t.Fatalf("%s: err = %v", model, err)
		}
		raw := apiErr.RawJSON()
		var body struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if apiErr.StatusCode != status || json.Unmarshal([]byte(raw), &body) != nil || body.Type != "error" || body.Error.Type != typ {
			t.Fatalf("%s: status %d body %s", model, apiErr.StatusCode, raw)
		}
	}
	check("nope", 404, "not_found_error")
	check("m", 400, "invalid_request_error")
}

// TestCountTokens: a native upstream answers (no slot taken); with only a
// chat upstream the proxy estimates and says so.
func TestCountTokens(t *testing.T) {
	native := newUpstream(t, nativeMessages("x"))
	chatUp := newUpstream(t, completion("x"))
	p := startProxy(t, withModel(frontsConfig([]*fakeUpstream{native, chatUp}, []bool{true, false}), "m", "u1", "t", "u2"))
	c := anthropicClient(p)
	res, err := c.Messages.CountTokens(context.Background(), anthropic.MessageCountTokensParams{Model: "m", Messages: []anthropic.MessageParam{userText("hello there")}})
	if err != nil || res.InputTokens != 42 {
		t.Fatalf("count %+v %v", res, err)
	}
	if c := native.Calls(); len(c) != 1 || c[0].Path != "/v1/messages/count_tokens" {
		t.Fatalf("calls %+v", c)
	}

	var raw *http.Response
	res, err = c.Messages.CountTokens(context.Background(), anthropic.MessageCountTokensParams{Model: "t", Messages: []anthropic.MessageParam{userText("hello there")}}, aoption.WithResponseInto(&raw))
	if err != nil || res.InputTokens <= 0 || raw.Header.Get("X-LLM-Route-Estimate") != "true" {
		t.Fatalf("estimate %+v %v", res, err)
	}
	if len(chatUp.Calls()) != 0 {
		t.Fatalf("a chat-only upstream was asked to count")
	}
}

// TestMessagesSessionHeader: a client's own session id wins over the hash.
func TestMessagesSessionHeader(t *testing.T) {
	up := newUpstream(t, completion("ok"))
	cfg := frontsConfig([]*fakeUpstream{up}, []bool{false})
	cfg["providers"].([]any)[0].(map[string]any)["session_header"] = "x-session-affinity"
	p := startProxy(t, cfg)
	c := anthropicClient(p)
	params := anthropic.MessageNewParams{Model: "m", MaxTokens: 16, Messages: []anthropic.MessageParam{userText("hi")}}
	if _, err := c.Messages.New(context.Background(), params, aoption.WithHeader("x-claude-code-session-id", "cc-session-7")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Messages.New(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	calls := up.Calls()
	if got := calls[0].Header.Get("X-Session-Affinity"); got != "cc-session-7" {
		t.Fatalf("session header %q", got)
	}
	if got := calls[1].Header.Get("X-Session-Affinity"); got == "" || got == "cc-session-7" {
		t.Fatalf("computed session %q", got)
	}
}

// TestResponsesFrontBasic: openai-go's Responses API through a chat-only
// upstream, non-stream and stream.
func TestResponsesFrontBasic(t *testing.T) {
	up := newUpstream(t, completion("hello world"))
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	c := openai.NewClient(ooption.WithBaseURL(p.URL+"/v1"), ooption.WithAPIKey("client-key"), ooption.WithMaxRetries(0), ooption.WithHTTPClient(testClient))
	params := responses.ResponseNewParams{Model: "m", Instructions: openai.String("be brief"),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}
	r, err := c.Responses.New(context.Background(), params)
	if err != nil {
		t.Fatalf("Responses.New: %v", err)
	}
	if r.OutputText() != "hello world" || r.Status != "completed" || r.Usage.OutputTokens != 1 {
		t.Fatalf("response %+v", r)
	}
	st := c.Responses.NewStreaming(context.Background(), params)
	var text string
	completed := false
	for st.Next() {
		ev := st.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			completed = true
		}
	}
	if err := st.Err(); err != nil || text != "hello world" || !completed {
		t.Fatalf("stream text %q completed %v err %v", text, completed, err)
	}
	for _, call := range up.Calls() {
		if call.Path != "/v1/chat/completions" {
			t.Fatalf("upstream path %s", call.Path)
		}
	}
}

// TestEmbeddingsCompletionsPassThrough: embeddings skip the chat-only
// upstream and go natively to the one serving them; a model without any
// gets a 503 that says so.
func TestEmbeddingsCompletionsPassThrough(t *testing.T) {
	const emb = `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,0.25]}],"model":"real-model","usage":{"prompt_tokens":1,"total_tokens":1}}`
	const cmpl = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"real-model","choices":[{"index":0,"text":"42","finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	chatUp := newUpstream(t, completion("x"))
	native := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/embeddings") {
			io.WriteString(w, emb)
			return
		}
		io.WriteString(w, cmpl)
	})
	p := startProxy(t, withModel(frontsConfig([]*fakeUpstream{chatUp, native}, []bool{false, true}), "m", "u1", "u2", "t", "u1"))
	c := openai.NewClient(ooption.WithBaseURL(p.URL+"/v1"), ooption.WithAPIKey("client-key"), ooption.WithMaxRetries(0), ooption.WithHTTPClient(testClient))
	e, err := c.Embeddings.New(context.Background(), openai.EmbeddingNewParams{Model: "m", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hi")}})
	if err != nil || len(e.Data) != 1 || e.Data[0].Embedding[1] != 0.25 {
		t.Fatalf("embeddings %+v %v", e, err)
	}
	co, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("6*7=")}})
	if err != nil || len(co.Choices) != 1 || co.Choices[0].Text != "42" {
		t.Fatalf("completions %+v %v", co, err)
	}
	if len(chatUp.Calls()) != 0 {
		t.Fatalf("the chat-only upstream got %d calls", len(chatUp.Calls()))
	}
	if calls := native.Calls(); len(calls) != 2 || calls[0].Path != "/v1/embeddings" || calls[1].Path != "/v1/completions" ||
		!strings.Contains(string(calls[0].Body), `"model":"real-model"`) {
		t.Fatalf("native calls %+v", calls)
	}

	resp, err := testClient.Post(p.URL+"/v1/embeddings", "application/json", strings.NewReader(`{"model":"t","input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	if msg := expectAPIError(t, resp, 503, "no_upstream_for_api"); !strings.Contains(msg, "embeddings") {
		t.Fatalf("503 message %q", msg)
	}
}

// TestFrontsConfigErrors: a bad apis word or auth names the entry.
func TestFrontsConfigErrors(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))
	cfg := basicConfig(up, 0)
	cfg["providers"].([]any)[0].(map[string]any)["apis"] = []string{"chat", "mesages"}
	if err := p.loadErr(cfg); err == nil || !strings.Contains(err.Error(), `provider "p1": apis: "mesages"`) {
		t.Fatalf("apis error = %v", err)
	}
	cfg = basicConfig(up, 0)
	cfg["providers"].([]any)[0].(map[string]any)["auth"] = "basic"
	if err := p.loadErr(cfg); err == nil || !strings.Contains(err.Error(), `provider "p1": auth: "basic"`) {
		t.Fatalf("auth error = %v", err)
	}
	cfg = basicConfig(up, 0)
	cfg["upstreams"].([]any)[0].(map[string]any)["apis"] = []string{"grpc"}
	if err := p.loadErr(cfg); err == nil || !strings.Contains(err.Error(), `upstream "u1": apis: "grpc"`) {
		t.Fatalf("upstream apis error = %v", err)
	}
}

// chatStream answers a streaming chat request with the given raw chunk
// payloads (each becomes a data: event), then [DONE].
func chatStream(chunks ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var events []string
		for _, c := range chunks {
			events = append(events, "data: "+c+"\n\n")
		}
		writeStream(w, append(events, "data: [DONE]\n\n"), 0)
	}
}

func chunk(delta, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + `}]}`
}

func streamMessage(t *testing.T, c anthropic.Client, params anthropic.MessageNewParams) anthropic.Message {
	t.Helper()
	st := c.Messages.NewStreaming(context.Background(), params)
	var acc anthropic.Message
	for st.Next() {
		if err := acc.Accumulate(st.Current()); err != nil {
			t.Fatalf("Accumulate: %v", err)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return acc
}

// TestMessagesThinking: a MiniMax-style <think> upstream under think_tags
// split and a DeepSeek-style reasoning_content upstream both give the SDK a
// thinking block before the text; usage reaches message_delta.
func TestMessagesThinking(t *testing.T) {
	minimax := newUpstream(t, chatStream(
		chunk(`{"role":"assistant","content":"<think>let me"}`, ""),
		chunk(`{"content":" see</think>four"}`, ""),
		chunk(`{}`, "stop"),
		`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`))
	deepseek := newUpstream(t, chatStream(
		chunk(`{"role":"assistant","reasoning_content":"let me"}`, ""),
		chunk(`{"reasoning_content":" see"}`, ""),
		chunk(`{"content":"four"}`, ""),
		chunk(`{}`, "stop"),
		`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_cache_hit_tokens":4}}`))
	cfg := withModel(frontsConfig([]*fakeUpstream{minimax, deepseek}, []bool{false, false}), "m", "u1", "t", "u2")
	cfg["providers"].([]any)[0].(map[string]any)["think_tags"] = "split"
	p := startProxy(t, cfg)
	c := anthropicClient(p)
	for _, model := range []string{"m", "t"} {
		msg := streamMessage(t, c, anthropic.MessageNewParams{Model: anthropic.Model(model), MaxTokens: 64, Messages: []anthropic.MessageParam{userText("2+2?")}})
		if len(msg.Content) != 2 || msg.Content[0].Type != "thinking" || msg.Content[0].Thinking != "let me see" ||
			msg.Content[1].Type != "text" || msg.Content[1].Text != "four" || msg.StopReason != "end_turn" || msg.Usage.OutputTokens != 5 {
			t.Fatalf("%s: message %+v", model, msg)
		}
		if model == "t" && (msg.Usage.InputTokens != 6 || msg.Usage.CacheReadInputTokens != 4) {
			t.Fatalf("usage %+v", msg.Usage)
		}
		if strings.Contains(msg.Content[1].Text, "think") {
			t.Fatalf("think tag leaked: %q", msg.Content[1].Text)
		}
	}
}

// TestMessagesToolRoundTrip: tool_use from the chat upstream's tool_calls,
// then the tool_result turn reaches the upstream as a tool message.
func TestMessagesToolRoundTrip(t *testing.T) {
	up := newUpstream(t, chatStream(
		chunk(`{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}`, ""),
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}`, ""),
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}`, ""),
		chunk(`{}`, "tool_calls")))
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	c := anthropicClient(p)
	tools := []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: "get_weather",
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}}}}}
	params := anthropic.MessageNewParams{Model: "m", MaxTokens: 64, Tools: tools, Messages: []anthropic.MessageParam{userText("weather in Paris?")}}
	msg := streamMessage(t, c, params)
	if msg.StopReason != "tool_use" || len(msg.Content) != 1 || msg.Content[0].Type != "tool_use" || msg.Content[0].Name != "get_weather" ||
		string(msg.Content[0].Input) != `{"city":"Paris"}` || msg.Content[0].ID == "" {
		t.Fatalf("message %+v input %s", msg, msg.Content[0].Input)
	}
	// Turn two: the client ran the tool.
	up.setHandler(completion("sunny"))
	params.Messages = append(params.Messages, msg.ToParam(),
		anthropic.NewUserMessage(anthropic.NewToolResultBlock(msg.Content[0].ID, "22C sunny", false)))
	final, err := c.Messages.New(context.Background(), params)
	if err != nil || final.Content[0].Text != "sunny" {
		t.Fatalf("turn two %+v %v", final, err)
	}
	var chat struct {
		Messages []struct {
			Role       string
			Content    any
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string
				Function struct{ Name, Arguments string }
			} `json:"tool_calls"`
		}
		Tools []struct {
			Type     string
			Function struct{ Name string }
		}
	}
	calls := up.Calls()
	if err := json.Unmarshal(calls[1].Body, &chat); err != nil {
		t.Fatal(err)
	}
	m := chat.Messages
	if len(m) != 3 || m[1].Role != "assistant" || len(m[1].ToolCalls) != 1 || m[1].ToolCalls[0].ID != msg.Content[0].ID ||
		m[1].ToolCalls[0].Function.Arguments != `{"city":"Paris"}` || m[2].Role != "tool" || m[2].ToolCallID != msg.Content[0].ID ||
		m[2].Content != "22C sunny" || len(chat.Tools) != 1 || chat.Tools[0].Function.Name != "get_weather" {
		t.Fatalf("turn two upstream body %s", calls[1].Body)
	}
}

// TestMessagesStreamBreak: a chat upstream that resets mid-stream gives the
// Messages client an `event: error` in Anthropic's shape, then an abort.
func TestMessagesStreamBreak(t *testing.T) {
	up := newUpstream(t, resetAfter([]string{"data: " + chunk(`{"role":"assistant","content":"partial"}`, "") + "\n\n"}))
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	resp, err := testClient.Post(p.URL+"/v1/messages", "application/json",
		strings.NewReader(`{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body) // ends in an error: the abort
	resp.Body.Close()
	s := string(body)
	if !strings.Contains(s, "event: message_start") || !strings.Contains(s, `"partial"`) ||
		!strings.Contains(s, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"") || strings.Contains(s, "message_stop") {
		t.Fatalf("stream:\n%s", s)
	}
	eventually(t, 10*time.Second, "net_err recorded", func() bool { return p.requests("m", "u1", "p1", "net_err") == 1 })
}

// TestMessagesImagesStopsAndBusy: an image block and stop_sequences reach
// the chat upstream as image_url and stop; finish_reason length is
// max_tokens; a busy model is the SDK's 503 overloaded_error.
func TestMessagesImagesStopsAndBusy(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-2","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":"a red"},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`)
	})
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	c := anthropicClient(p)
	img := anthropic.NewImageBlockBase64("image/png", "iVBORw0KGgo=")
	msg, err := c.Messages.New(context.Background(), anthropic.MessageNewParams{Model: "m", MaxTokens: 2, StopSequences: []string{"END"},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("what is this?"), img)}})
	if err != nil || msg.StopReason != "max_tokens" || msg.Content[0].Text != "a red" || msg.Usage.InputTokens != 9 {
		t.Fatalf("message %+v %v", msg, err)
	}
	var chat struct {
		Stop      []string
		MaxTokens int `json:"max_tokens"`
		Messages  []struct {
			Content []struct {
				Type     string
				Text     string
				ImageURL struct{ URL string } `json:"image_url"`
			}
		}
	}
	body := up.Calls()[0].Body
	if err := json.Unmarshal(body, &chat); err != nil || len(chat.Stop) != 1 || chat.Stop[0] != "END" || chat.MaxTokens != 2 ||
		len(chat.Messages) != 1 || len(chat.Messages[0].Content) != 2 || chat.Messages[0].Content[1].Type != "image_url" ||
		chat.Messages[0].Content[1].ImageURL.URL != "data:image/png;base64,iVBORw0KGgo=" {
		t.Fatalf("upstream body %s (%v)", body, err)
	}

	// Busy: one slot, held by a hanging request.
	g := newGate()
	up.setHandler(g.handler(completion("late")))
	cfg := frontsConfig([]*fakeUpstream{up}, []bool{false})
	cfg["upstreams"].([]any)[0].(map[string]any)["max_concurrency"] = 1
	p.load(cfg)
	done := p.goChat(context.Background(), chatBody("m", false))
	g.waitArrivals(t, 1)
	_, err = c.Messages.New(context.Background(), anthropic.MessageNewParams{Model: "m", MaxTokens: 2, Messages: []anthropic.MessageParam{userText("hi")}})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || !strings.Contains(apiErr.RawJSON(), `"overloaded_error"`) || apiErr.Response.Header.Get("Retry-After") != "1" {
		t.Fatalf("busy: %v", err)
	}
	g.open()
	await(t, done)
}
