package integration

// The Gemini front translated to chat, driven by Google's Go SDK
// (google.golang.org/genai) and by the requests Gemini CLI really sends,
// against chat-only fakes with real chat SSE framing: what the chat
// upstream receives, and what the SDK makes of the translated answer,
// streamed and not, compared with a native Gemini upstream's.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/genai"
)

// chatCall is a tool call a chat fake answers with; an empty id is sent as
// none (some local servers leave it out).
type chatCall struct{ id, name, args string }

// chatAnswer is a chat-only upstream giving reasoning (reasoning_content,
// DeepSeek/llama.cpp style), text and tool calls, as a chat.completion or,
// when the request streams, as chunks: the reasoning and text in pieces,
// each call opened with its id and name and its arguments in two
// fragments interleaved with the other calls', the finish chunk, a usage
// chunk without choices (include_usage) and [DONE]. Usage: 10 prompt
// tokens, 7 completion tokens (3 of them reasoning when there is some).
func chatAnswer(reasoning, text string, calls []chatCall) http.HandlerFunc {
	return chatAnswerGap(reasoning, text, calls, 0)
}

// chatAnswerGap is chatAnswer with gap between the stream's events.
func chatAnswerGap(reasoning, text string, calls []chatCall, gap time.Duration) http.HandlerFunc {
	const id = "chatcmpl-gem"
	usage := `{"prompt_tokens":10,"completion_tokens":7,"total_tokens":17}`
	if reasoning != "" {
		usage = `{"prompt_tokens":10,"completion_tokens":7,"total_tokens":17,"completion_tokens_details":{"reasoning_tokens":3}}`
	}
	finish := "stop"
	if len(calls) > 0 {
		finish = "tool_calls"
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if !isStream(r) {
			msg := obj("role", "assistant", "content", nil)
			if reasoning != "" {
				msg["reasoning_content"] = reasoning
			}
			if text != "" {
				msg["content"] = text
			}
			var tcs []any
			for _, c := range calls {
				tc := obj("type", "function", "function", obj("name", c.name, "arguments", c.args))
				if c.id != "" {
					tc["id"] = c.id
				}
				tcs = append(tcs, tc)
			}
			if tcs != nil {
				msg["tool_calls"] = tcs
			}
			m, _ := json.Marshal(msg)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":%q,"object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":%s,"finish_reason":%q}],"usage":%s}`, id, m, finish, usage)
			return
		}
		ev := func(delta, finish string) string {
			f := "null"
			if finish != "" {
				f = `"` + finish + `"`
			}
			return fmt.Sprintf(`data: {"id":%q,"object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n", id, delta, f)
		}
		q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
		events := []string{ev(`{"role":"assistant","content":""}`, "")}
		for _, piece := range halves(reasoning) {
			events = append(events, ev(`{"reasoning_content":`+q(piece)+`}`, ""))
		}
		for _, piece := range strings.SplitAfter(text, " ") {
			if piece != "" {
				events = append(events, ev(`{"content":`+q(piece)+`}`, ""))
			}
		}
		for i, c := range calls {
			idField := ""
			if c.id != "" {
				idField = `"id":` + q(c.id) + `,`
			}
			events = append(events, ev(fmt.Sprintf(`{"tool_calls":[{"index":%d,%s"type":"function","function":{"name":%s,"arguments":""}}]}`, i, idField, q(c.name)), ""))
		}
		for half := range 2 {
			for i, c := range calls {
				events = append(events, ev(fmt.Sprintf(`{"tool_calls":[{"index":%d,"function":{"arguments":%s}}]}`, i, q(halves(c.args)[half])), ""))
			}
		}
		events = append(events, ev(`{}`, finish),
			fmt.Sprintf(`data: {"id":%q,"object":"chat.completion.chunk","created":1,"model":"real-model","choices":[],"usage":%s}`+"\n\n", id, usage),
			"data: [DONE]\n\n")
		writeStream(w, events, gap)
	}
}

// halves cuts s in two pieces (both "" for "").
func halves(s string) [2]string { return [2]string{s[:len(s)/2], s[len(s)/2:]} }

// chatTurns answers with first until the request carries a tool result
// (a tool message), then with second.
func chatTurns(first, second http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(readReq(r), `"role":"tool"`) {
			second(w, r)
			return
		}
		first(w, r)
	}
}

// chatRequest is what a chat upstream received, decoded.
type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role             string          `json:"role"`
		Content          json.RawMessage `json:"content"`
		ReasoningContent *string         `json:"reasoning_content"`
		ToolCallID       string          `json:"tool_call_id"`
		ToolCalls        []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []struct {
		Type     string `json:"type"`
		Function struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
	ResponseFormat  json.RawMessage `json:"response_format"`
	ReasoningEffort *string         `json:"reasoning_effort"`
	Stream          *bool           `json:"stream"`
	StreamOptions   *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func decodeChatCall(t *testing.T, call upstreamCall) chatRequest {
	t.Helper()
	var req chatRequest
	if call.Path != "/v1/chat/completions" || json.Unmarshal(call.Body, &req) != nil {
		t.Fatalf("not a chat request: %s %s", call.Path, call.Body)
	}
	return req
}

// contentText is a chat message's content when it is a string.
func contentText(raw json.RawMessage) string {
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

// roles lists a chat request's message roles.
func (r chatRequest) roles() []string {
	var out []string
	for _, m := range r.Messages {
		out = append(out, m.Role)
	}
	return out
}

// sameJSON reports whether two JSON texts hold the same value (key order
// and spacing aside).
func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// geminiSSE checks a raw Gemini stream is framed as Google frames it —
// every event exactly `data: <one-line JSON>\r\n\r\n`, no comment, no
// event: line, nothing else — and returns the payloads.
func geminiSSE(t *testing.T, raw string) []string {
	t.Helper()
	if !strings.HasSuffix(raw, "\r\n\r\n") {
		t.Fatalf("stream does not end with an event framed \\r\\n\\r\\n: %q", tail(raw, 300))
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(raw, "\r\n\r\n"), "\r\n\r\n") {
		payload, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.ContainsAny(payload, "\r\n") || !json.Valid([]byte(payload)) {
			t.Fatalf("event is not one `data: <JSON>` line: %q\nstream %q", ev, tail(raw, 600))
		}
		out = append(out, payload)
	}
	return out
}

// accumulateGemini folds a Gemini answer's chunks into one response, as a
// client stitches a stream: consecutive text parts of the same kind
// (thought or not) joined, other parts (function calls) kept in order,
// empty text parts left out; the last finishReason, usageMetadata,
// modelVersion and responseId win. The SDK's HTTP response is dropped.
// One non-stream answer goes through it too, so both are compared in the
// same form.
func accumulateGemini(chunks []*genai.GenerateContentResponse) *genai.GenerateContentResponse {
	acc := &genai.GenerateContentResponse{}
	cand := &genai.Candidate{Content: &genai.Content{}}
	for _, ch := range chunks {
		if ch.UsageMetadata != nil {
			acc.UsageMetadata = ch.UsageMetadata
		}
		if ch.ModelVersion != "" {
			acc.ModelVersion = ch.ModelVersion
		}
		if ch.ResponseID != "" {
			acc.ResponseID = ch.ResponseID
		}
		if len(ch.Candidates) == 0 {
			continue
		}
		c := ch.Candidates[0]
		cand.Index = c.Index
		if c.FinishReason != "" {
			cand.FinishReason = c.FinishReason
		}
		if c.Content == nil {
			continue
		}
		if c.Content.Role != "" {
			cand.Content.Role = c.Content.Role
		}
		for _, part := range c.Content.Parts {
			parts := cand.Content.Parts
			isText := part.FunctionCall == nil && part.FunctionResponse == nil && part.InlineData == nil
			switch {
			case isText && part.Text == "":
			case isText && len(parts) > 0 && parts[len(parts)-1].FunctionCall == nil && parts[len(parts)-1].Thought == part.Thought:
				parts[len(parts)-1].Text += part.Text
			default:
				cp := *part
				cand.Content.Parts = append(parts, &cp)
			}
		}
	}
	acc.Candidates = []*genai.Candidate{cand}
	return acc
}

// geminiCollect is the SDK's GenerateContentStream to the end: its chunks
// and the first error.
func geminiCollect(c *genai.Client, model string, contents []*genai.Content, cfg *genai.GenerateContentConfig) ([]*genai.GenerateContentResponse, error) {
	var chunks []*genai.GenerateContentResponse
	for res, err := range c.Models.GenerateContentStream(context.Background(), model, contents, cfg) {
		if err != nil {
			return chunks, err
		}
		chunks = append(chunks, res)
	}
	return chunks, nil
}

// geminiBoth asks the same question without and with streaming and
// returns both answers, each accumulated.
func geminiBoth(t *testing.T, c *genai.Client, model string, contents []*genai.Content, cfg *genai.GenerateContentConfig) (whole, streamed *genai.GenerateContentResponse) {
	t.Helper()
	res, err := c.Models.GenerateContent(context.Background(), model, contents, cfg)
	if err != nil {
		t.Fatalf("GenerateContent %s: %v", model, err)
	}
	chunks, err := geminiCollect(c, model, contents, cfg)
	if err != nil {
		t.Fatalf("GenerateContentStream %s: %v (after %d chunks)", model, err, len(chunks))
	}
	if len(chunks) < 2 {
		t.Fatalf("stream %s: %d chunks, want several", model, len(chunks))
	}
	return accumulateGemini([]*genai.GenerateContentResponse{res}), accumulateGemini(chunks)
}

// TestGeminiTranslatedText: a chat-only upstream serves the Gemini front.
// It receives a chat request (system instruction first, the user's text,
// its own model, the provider's Bearer key and never the client's Google
// key); the SDK gets the text, STOP and the usage; the completion is
// logged as the gemini front translated and counted as ok.
func TestGeminiTranslatedText(t *testing.T) {
	up := newUpstream(t, completion("hello world"))
	p := startProxy(t, geminiConfig([]*fakeUpstream{up}, []bool{false}))
	c := geminiClient(t, p, "client-key")
	res, err := c.Models.GenerateContent(context.Background(), "m", genai.Text("hi"),
		&genai.GenerateContentConfig{SystemInstruction: genai.NewContentFromText("be brief", genai.RoleUser)})
	if err != nil {
		t.Fatalf("GenerateContent: %v", err)
	}
	u := res.UsageMetadata
	if res.Text() != "hello world" || len(res.Candidates) != 1 || res.Candidates[0].FinishReason != genai.FinishReasonStop ||
		res.Candidates[0].Content.Role != genai.RoleModel || res.ModelVersion != "real-model" || res.ResponseID == "" ||
		u == nil || u.PromptTokenCount != 3 || u.CandidatesTokenCount != 1 || u.TotalTokenCount != 4 {
		b, _ := json.Marshal(res)
		t.Fatalf("response %s", b)
	}
	calls := up.Calls()
	if len(calls) != 1 {
		t.Fatalf("%d upstream calls", len(calls))
	}
	req := decodeChatCall(t, calls[0])
	if req.Model != "real-model" || !reflect.DeepEqual(req.roles(), []string{"system", "user"}) ||
		contentText(req.Messages[0].Content) != "be brief" || contentText(req.Messages[1].Content) != "hi" || req.Stream != nil && *req.Stream {
		t.Fatalf("upstream body %s", calls[0].Body)
	}
	if h := calls[0].Header; h.Get("Authorization") != "Bearer sk-test-secret-1" || h.Get("X-Goog-Api-Key") != "" ||
		strings.Contains(fmt.Sprint(h), "client-key") || strings.Contains(string(calls[0].Body), "client-key") {
		t.Fatalf("upstream headers %v", h)
	}
	if logs := p.logEntries("request completed"); len(logs) == 0 || logs[len(logs)-1]["api"] != "gemini" || logs[len(logs)-1]["mode"] != "translated" {
		t.Fatalf("completion log = %v", logs)
	}
	if n := p.requests("m", "u1", "p1", "ok"); n != 1 {
		t.Fatalf("requests ok = %v", n)
	}
}

// TestGeminiTranslatedStream: a chat stream (usage in its own last chunk,
// the upstream pausing longer than the heartbeat interval) reaches the
// SDK as Gemini chunks: text in order, finishReason and the whole usage
// (cached and thought tokens included) on the last chunk only, no SDK
// error; on the wire every event is `data: <JSON>\r\n\r\n` with no
// keepalive comment between; the tokens are counted.
func TestGeminiTranslatedStream(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		usage := `{"prompt_tokens":20,"completion_tokens":6,"total_tokens":26,"prompt_tokens_details":{"cached_tokens":8},"completion_tokens_details":{"reasoning_tokens":2}}`
		writeStream(w, []string{
			"data: " + chunk(`{"role":"assistant","content":"hello "}`, "") + "\n\n",
			"data: " + chunk(`{"content":"big "}`, "") + "\n\n",
			"data: " + chunk(`{"content":"world"}`, "") + "\n\n",
			"data: " + chunk(`{}`, "stop") + "\n\n",
			`data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[],"usage":` + usage + "}\n\n",
			"data: [DONE]\n\n",
		}, 250*time.Millisecond)
	})
	cfg := geminiConfig([]*fakeUpstream{up}, []bool{false})
	cfg["heartbeat_interval"] = "100ms"
	p := startProxy(t, cfg)
	chunks, err := geminiStream(geminiClient(t, p, "client-key"), "m", "hi")
	if err != nil {
		t.Fatalf("stream: %v (after %d chunks)", err, len(chunks))
	}
	if len(chunks) < 3 || streamText(chunks) != "hello big world" {
		t.Fatalf("%d chunks, text %q", len(chunks), streamText(chunks))
	}
	for i, ch := range chunks {
		last := i == len(chunks)-1
		if len(ch.Candidates) != 1 || (ch.Candidates[0].FinishReason != "") != last || (ch.UsageMetadata != nil) != last {
			b, _ := json.Marshal(ch)
			t.Fatalf("chunk %d of %d: %s (finishReason and usage belong on the last chunk only)", i, len(chunks), b)
		}
	}
	last := chunks[len(chunks)-1]
	want := &genai.GenerateContentResponseUsageMetadata{PromptTokenCount: 20, CachedContentTokenCount: 8, CandidatesTokenCount: 4, ThoughtsTokenCount: 2, TotalTokenCount: 26}
	if last.Candidates[0].FinishReason != genai.FinishReasonStop || !reflect.DeepEqual(last.UsageMetadata, want) {
		b, _ := json.Marshal(last)
		t.Fatalf("last chunk %s", b)
	}
	calls := up.Calls()
	req := decodeChatCall(t, calls[0])
	if req.Stream == nil || !*req.Stream || req.StreamOptions == nil || !req.StreamOptions.IncludeUsage {
		t.Fatalf("upstream body %s: want stream with include_usage", calls[0].Body)
	}
	eventually(t, 5*time.Second, "tokens counted", func() bool {
		return p.metric("llm_proxy_tokens_total", "model", "m", "upstream", "u1", "provider", "p1", "type", "output") == 6
	})
	for typ, n := range map[string]float64{"input": 20, "cached_input": 8, "reasoning": 2} {
		if got := p.metric("llm_proxy_tokens_total", "model", "m", "upstream", "u1", "provider", "p1", "type", typ); got != n {
			t.Errorf("tokens %s = %v, want %v", typ, got, n)
		}
	}

	resp := p.postGemini(t, "/v1beta/models/m:streamGenerateContent?alt=sse", `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`)
	raw := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("raw stream %d %s %q", resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	evs := geminiSSE(t, raw)
	if strings.Count(raw, `"finishReason"`) != 1 || !strings.Contains(evs[len(evs)-1], `"finishReason":"STOP"`) {
		t.Fatalf("finishReason not once, on the last event: %q", raw)
	}
}

// eqNativeGemini answers like Google's Gemini API with the answer eqChat
// gives in chat terms: a thought, text, the get_weather call with its id,
// usage (10 prompt tokens, 4 cached, 5 candidate tokens); streamed the
// thought and the text in pieces, the call, finishReason and the whole
// usage in the last event.
func eqNativeGemini() http.HandlerFunc {
	const usage = `{"promptTokenCount":10,"candidatesTokenCount":5,"totalTokenCount":15,"cachedContentTokenCount":4}`
	call := fmt.Sprintf(`{"functionCall":{"id":%q,"name":%q,"args":%s}}`, eqCallID, eqTool, eqArgs)
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Goog-Api-Key") != geminiProviderKey {
			googleError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "API key not valid.")
			return
		}
		if strings.HasSuffix(r.URL.Path, ":generateContent") {
			w.Header().Set("Content-Type", "application/json; charset=UTF-8")
			fmt.Fprintf(w, `{"candidates":[{"content":{"parts":[{"text":%q,"thought":true},{"text":%q},%s],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":%s,"modelVersion":"real-model","responseId":"resp-eq"}`,
				eqThinking, eqText, call, usage)
			return
		}
		ev := func(parts, tail string) string {
			return `data: {"candidates":[{"content":{"parts":[` + parts + `],"role":"model"},` + tail + `,"modelVersion":"real-model","responseId":"resp-eq"}` + "\r\n\r\n"
		}
		partial := `"index":0}],"usageMetadata":{"promptTokenCount":10,"totalTokenCount":10}`
		writeStream(w, []string{
			ev(`{"text":"The user ","thought":true}`, partial),
			ev(`{"text":"wants the weather.","thought":true}`, partial),
			ev(`{"text":"Let me "}`, partial),
			ev(`{"text":"check."}`, partial),
			ev(call, `"finishReason":"STOP","index":0}],"usageMetadata":`+usage),
		}, 0)
	}
}

// TestGeminiStreamMatchesNonStream: the same question answered without and
// with streaming accumulates to the same response, field by field —
// thought, text, the function call (id, name, parsed args), finishReason,
// usage, model — natively and translated; and the native and translated
// responses are equal too. Only responseId, which the proxy or the
// upstream generates per answer, is ignored (a translated one is checked
// for being set).
func TestGeminiStreamMatchesNonStream(t *testing.T) {
	native := newUpstream(t, eqNativeGemini())
	chatUp := newUpstream(t, eqChat())
	p := startProxy(t, withModel(geminiConfig([]*fakeUpstream{native, chatUp}, []bool{true, false}), "m", "u1", "t", "u2"))
	c := geminiClient(t, p, "client-key")
	cfg := &genai.GenerateContentConfig{ThinkingConfig: &genai.ThinkingConfig{IncludeThoughts: true}}
	nWhole, nStream := geminiBoth(t, c, "m", genai.Text("weather in Paris?"), cfg)
	tWhole, tStream := geminiBoth(t, c, "t", genai.Text("weather in Paris?"), cfg)

	// The native answer is what the fake said; checked once here so the
	// comparisons below compare something whole.
	parts := nWhole.Candidates[0].Content.Parts
	if len(parts) != 3 || !parts[0].Thought || parts[0].Text != eqThinking || parts[1].Thought || parts[1].Text != eqText ||
		parts[2].FunctionCall == nil || parts[2].FunctionCall.ID != eqCallID || parts[2].FunctionCall.Args["city"] != "Paris" {
		b, _ := json.Marshal(nWhole)
		t.Fatalf("native answer %s", b)
	}
	if tWhole.ResponseID == "" || tStream.ResponseID == "" {
		t.Errorf("translated responseId empty: %q %q", tWhole.ResponseID, tStream.ResponseID)
	}
	expectSame(t, "native: stream and non-stream", nStream, nWhole, "responseId")
	expectSame(t, "translated: stream and non-stream", tStream, tWhole, "responseId")
	expectSame(t, "non-stream: native and translated", tWhole, nWhole, "responseId")
	expectSame(t, "stream: native and translated", tStream, nStream, "responseId")
	if n := len(chatUp.Calls()); n != 2 {
		t.Fatalf("chat upstream calls %d, want 2", n)
	}
}

// TestGeminiToolRoundTrip: turn 1's functionCall carries an id (the chat
// upstream's, or one the proxy makes up when the upstream sent none); the
// SDK's turn 2 echoes it in functionResponse, and the chat upstream then
// receives the call as the assistant's tool_calls[0].id and the result as
// a tool message whose tool_call_id is that same id, streamed or not.
func TestGeminiToolRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		id     string
		stream bool
	}{
		{"upstream id", "call_up_1", false},
		{"upstream id, stream", "call_up_1", true},
		{"no upstream id", "", false},
		{"no upstream id, stream", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, chatTurns(
				chatAnswer("", "Let me check.", []chatCall{{tc.id, "get_weather", `{"city":"Paris"}`}}),
				chatAnswer("", "It is sunny.", nil)))
			p := startProxy(t, geminiConfig([]*fakeUpstream{up}, []bool{false}))
			c := geminiClient(t, p, "k")
			tools := &genai.GenerateContentConfig{Tools: []*genai.Tool{{FunctionDeclarations: []*genai.FunctionDeclaration{{
				Name: "get_weather", Description: "The weather in a city",
				ParametersJsonSchema: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}},
			}}}}}
			history := genai.Text("weather in Paris?")
			ask := func() *genai.GenerateContentResponse {
				if !tc.stream {
					res, err := c.Models.GenerateContent(context.Background(), "m", history, tools)
					if err != nil {
						t.Fatalf("GenerateContent: %v", err)
					}
					return res
				}
				chunks, err := geminiCollect(c, "m", history, tools)
				if err != nil {
					t.Fatalf("stream: %v", err)
				}
				return accumulateGemini(chunks)
			}
			res := ask()
			fcs := res.FunctionCalls()
			if len(fcs) != 1 || fcs[0].Name != "get_weather" || !reflect.DeepEqual(fcs[0].Args, map[string]any{"city": "Paris"}) {
				b, _ := json.Marshal(res)
				t.Fatalf("turn 1 %s", b)
			}
			id := fcs[0].ID
			if tc.id != "" && id != tc.id || tc.id == "" && !regexp.MustCompile(`^call_[a-z0-9]{24}$`).MatchString(id) {
				t.Fatalf("functionCall id %q (upstream sent %q)", id, tc.id)
			}

			history = append(history, res.Candidates[0].Content, genai.NewContentFromParts([]*genai.Part{{FunctionResponse: &genai.FunctionResponse{
				ID: id, Name: "get_weather", Response: map[string]any{"output": "sunny, 24 C"}}}}, genai.RoleUser))
			if got := ask(); got.Text() != "It is sunny." {
				t.Fatalf("turn 2 text %q", got.Text())
			}
			calls := up.Calls()
			req := decodeChatCall(t, calls[len(calls)-1])
			if !reflect.DeepEqual(req.roles(), []string{"user", "assistant", "tool"}) {
				t.Fatalf("turn 2 upstream roles %v: %s", req.roles(), calls[len(calls)-1].Body)
			}
			a, tool := req.Messages[1], req.Messages[2]
			if len(a.ToolCalls) != 1 || a.ToolCalls[0].ID != id || tool.ToolCallID != id || a.ToolCalls[0].Function.Name != "get_weather" ||
				!sameJSON([]byte(a.ToolCalls[0].Function.Arguments), []byte(`{"city":"Paris"}`)) || contentText(tool.Content) != "sunny, 24 C" {
				t.Fatalf("turn 2 upstream body (want tool_calls[0].id == tool_call_id == %q): %s", id, calls[len(calls)-1].Body)
			}
			if len(req.Tools) != 1 || req.Tools[0].Function.Name != "get_weather" {
				t.Fatalf("tools %s", calls[len(calls)-1].Body)
			}
		})
	}
}

// TestGeminiParallelCalls: two tool calls in one chat answer (streamed with
// their argument fragments interleaved) reach the SDK as two functionCall
// parts in order, with distinct ids and whole arguments; turn 2 answers
// both, and the chat upstream receives one assistant message with both
// calls and two tool messages in call order, each with its call's id.
func TestGeminiParallelCalls(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ids    [2]string
		stream bool
	}{
		{"non-stream", [2]string{"call_a", "call_b"}, false},
		{"stream", [2]string{"call_a", "call_b"}, true},
		{"no upstream ids, non-stream", [2]string{}, false},
		{"no upstream ids, stream", [2]string{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := []chatCall{{tc.ids[0], "get_weather", `{"city":"Paris","unit":"celsius"}`}, {tc.ids[1], "get_time", `{"tz":"Europe/Paris"}`}}
			up := newUpstream(t, chatTurns(chatAnswer("", "", calls), chatAnswer("", "Sunny, 14:00.", nil)))
			p := startProxy(t, geminiConfig([]*fakeUpstream{up}, []bool{false}))
			c := geminiClient(t, p, "k")
			history := genai.Text("weather and time in Paris?")
			ask := func() *genai.GenerateContentResponse {
				if !tc.stream {
					res, err := c.Models.GenerateContent(context.Background(), "m", history, nil)
					if err != nil {
						t.Fatalf("GenerateContent: %v", err)
					}
					return res
				}
				chunks, err := geminiCollect(c, "m", history, nil)
				if err != nil {
					t.Fatalf("stream: %v", err)
				}
				return accumulateGemini(chunks)
			}
			res := ask()
			fcs := res.FunctionCalls()
			if len(fcs) != 2 || fcs[0].Name != "get_weather" || fcs[1].Name != "get_time" ||
				!reflect.DeepEqual(fcs[0].Args, map[string]any{"city": "Paris", "unit": "celsius"}) || !reflect.DeepEqual(fcs[1].Args, map[string]any{"tz": "Europe/Paris"}) ||
				fcs[0].ID == "" || fcs[0].ID == fcs[1].ID || tc.ids[0] != "" && (fcs[0].ID != tc.ids[0] || fcs[1].ID != tc.ids[1]) {
				b, _ := json.Marshal(res)
				t.Fatalf("turn 1 %s", b)
			}
			if res.Candidates[0].FinishReason != genai.FinishReasonStop {
				t.Fatalf("finishReason %q, want STOP (Gemini's with function calls)", res.Candidates[0].FinishReason)
			}

			history = append(history, res.Candidates[0].Content, genai.NewContentFromParts([]*genai.Part{
				{FunctionResponse: &genai.FunctionResponse{ID: fcs[0].ID, Name: fcs[0].Name, Response: map[string]any{"output": "sunny"}}},
				{FunctionResponse: &genai.FunctionResponse{ID: fcs[1].ID, Name: fcs[1].Name, Response: map[string]any{"output": "14:00"}}},
			}, genai.RoleUser))
			if got := ask(); got.Text() != "Sunny, 14:00." {
				t.Fatalf("turn 2 text %q", got.Text())
			}
			all := up.Calls()
			body := all[len(all)-1].Body
			req := decodeChatCall(t, all[len(all)-1])
			if !reflect.DeepEqual(req.roles(), []string{"user", "assistant", "tool", "tool"}) {
				t.Fatalf("turn 2 upstream roles %v: %s", req.roles(), body)
			}
			a := req.Messages[1]
			if len(a.ToolCalls) != 2 || a.ToolCalls[0].ID != fcs[0].ID || a.ToolCalls[1].ID != fcs[1].ID ||
				!sameJSON([]byte(a.ToolCalls[0].Function.Arguments), []byte(calls[0].args)) || !sameJSON([]byte(a.ToolCalls[1].Function.Arguments), []byte(calls[1].args)) {
				t.Fatalf("turn 2 assistant message: %s", body)
			}
			if req.Messages[2].ToolCallID != fcs[0].ID || contentText(req.Messages[2].Content) != "sunny" ||
				req.Messages[3].ToolCallID != fcs[1].ID || contentText(req.Messages[3].Content) != "14:00" {
				t.Fatalf("turn 2 tool messages (want %s then %s): %s", fcs[0].ID, fcs[1].ID, body)
			}
		})
	}
}

// TestGeminiThinking: the chat upstream's reasoning_content becomes a part
// with thought true, before the text, when the request sets
// includeThoughts, and no thought part at all without it; the reasoning
// tokens are thoughtsTokenCount either way (and not candidate tokens).
// thinkingLevel is sent as reasoning_effort. A thought part in the
// history goes up as reasoning_content when the provider names that
// reasoning field, and not at all otherwise.
func TestGeminiThinking(t *testing.T) {
	up := newUpstream(t, chatAnswer("Thinking it through.", "The answer is 4.", nil))
	cfg := geminiConfig([]*fakeUpstream{up}, []bool{false})
	p := startProxy(t, cfg)
	c := geminiClient(t, p, "k")
	for _, include := range []bool{true, false} {
		conf := &genai.GenerateContentConfig{ThinkingConfig: &genai.ThinkingConfig{IncludeThoughts: include, ThinkingLevel: genai.ThinkingLevelHigh}}
		whole, streamed := geminiBoth(t, c, "m", genai.Text("2+2?"), conf)
		for what, res := range map[string]*genai.GenerateContentResponse{"non-stream": whole, "stream": streamed} {
			parts := res.Candidates[0].Content.Parts
			var thoughts, texts []string
			for _, part := range parts {
				if part.Thought {
					thoughts = append(thoughts, part.Text)
				} else {
					texts = append(texts, part.Text)
				}
			}
			wantThoughts := []string(nil)
			if include {
				wantThoughts = []string{"Thinking it through."}
			}
			u := res.UsageMetadata
			if !reflect.DeepEqual(thoughts, wantThoughts) || !reflect.DeepEqual(texts, []string{"The answer is 4."}) || include && !parts[0].Thought ||
				u == nil || u.ThoughtsTokenCount != 3 || u.CandidatesTokenCount != 4 || u.PromptTokenCount != 10 || u.TotalTokenCount != 17 {
				b, _ := json.Marshal(res)
				t.Fatalf("includeThoughts %v, %s: %s", include, what, b)
			}
		}
	}
	for _, call := range up.Calls() {
		if req := decodeChatCall(t, call); req.ReasoningEffort == nil || *req.ReasoningEffort != "high" {
			t.Fatalf("thinkingLevel HIGH: upstream body %s", call.Body)
		}
	}

	history := []*genai.Content{
		genai.NewContentFromText("2+2?", genai.RoleUser),
		genai.NewContentFromParts([]*genai.Part{{Text: "Adding.", Thought: true}, {Text: "4"}}, genai.RoleModel),
		genai.NewContentFromText("and 3+3?", genai.RoleUser),
	}
	for _, field := range []string{"reasoning_content", ""} {
		if field != "" {
			cfg["providers"].([]any)[0].(map[string]any)["reasoning_field"] = field
		} else {
			delete(cfg["providers"].([]any)[0].(map[string]any), "reasoning_field")
		}
		p.load(cfg)
		if _, err := c.Models.GenerateContent(context.Background(), "m", history, nil); err != nil {
			t.Fatal(err)
		}
		calls := up.Calls()
		req := decodeChatCall(t, calls[len(calls)-1])
		a := req.Messages[1]
		if req.ReasoningEffort != nil || a.Role != "assistant" || contentText(a.Content) != "4" || strings.Contains(string(calls[len(calls)-1].Body), `"thought"`) ||
			field != "" && (a.ReasoningContent == nil || *a.ReasoningContent != "Adding.") || field == "" && strings.Contains(string(calls[len(calls)-1].Body), "Adding.") {
			t.Fatalf("reasoning_field %q: upstream body %s", field, calls[len(calls)-1].Body)
		}
	}
}

// TestGeminiJSONMode: JSON mode reaches the chat upstream as
// response_format — with responseJsonSchema (Google's upper-case OpenAPI
// type names, as Gemini CLI sends them, lower-cased), with responseSchema
// (the SDK's Schema: nullable and propertyOrdering turned into JSON
// Schema), and with only the MIME type (json_object) — and the SDK reads
// the JSON text back.
func TestGeminiJSONMode(t *testing.T) {
	answer := `{"score":5,"why":"easy"}`
	up := newUpstream(t, completion(answer))
	p := startProxy(t, geminiConfig([]*fakeUpstream{up}, []bool{false}))
	c := geminiClient(t, p, "k")
	one := int64(1)
	yes := true
	for _, tc := range []struct {
		name string
		cfg  *genai.GenerateContentConfig
		want string
	}{
		{"responseJsonSchema", &genai.GenerateContentConfig{ResponseMIMEType: "application/json", ResponseJsonSchema: map[string]any{
			"type": "OBJECT", "properties": map[string]any{
				"score": map[string]any{"type": "INTEGER", "description": "1-100"},
				"why":   map[string]any{"type": "STRING"},
				"tags":  map[string]any{"type": "ARRAY", "items": map[string]any{"type": "STRING"}},
			}, "required": []string{"score", "why"}}},
			`{"type":"json_schema","json_schema":{"name":"response","strict":false,"schema":{"type":"object","properties":{"score":{"type":"integer","description":"1-100"},"why":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}},"required":["score","why"]}}}`},
		{"responseSchema", &genai.GenerateContentConfig{ResponseMIMEType: "application/json", ResponseSchema: &genai.Schema{
			Type: genai.TypeObject, Properties: map[string]*genai.Schema{
				"score": {Type: genai.TypeInteger},
				"why":   {Type: genai.TypeString, Nullable: &yes},
				"tags":  {Type: genai.TypeArray, Items: &genai.Schema{Type: genai.TypeString}, MinItems: &one},
			}, Required: []string{"score"}, PropertyOrdering: []string{"score", "why", "tags"}}},
			`{"type":"json_schema","json_schema":{"name":"response","strict":false,"schema":{"type":"object","properties":{"score":{"type":"integer"},"why":{"type":["string","null"]},"tags":{"type":"array","items":{"type":"string"},"minItems":1}},"required":["score"]}}}`},
		{"mime type only", &genai.GenerateContentConfig{ResponseMIMEType: "application/json"}, `{"type":"json_object"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := c.Models.GenerateContent(context.Background(), "m", genai.Text("rate it"), tc.cfg)
			if err != nil || res.Text() != answer {
				t.Fatalf("answer %+v %v", res, err)
			}
			calls := up.Calls()
			req := decodeChatCall(t, calls[len(calls)-1])
			if !sameJSON(req.ResponseFormat, []byte(tc.want)) {
				t.Fatalf("response_format\n got %s\nwant %s", req.ResponseFormat, tc.want)
			}
		})
	}
}

// TestGeminiCountTokensEstimated: countTokens for a model whose upstreams
// speak only chat is answered by the proxy's local estimate — it grows
// with the text, counts the system instruction and tools, reads the
// generateContentRequest form the same — marked X-LLM-Route-Estimate:
// true, and the chat upstream is never asked.
func TestGeminiCountTokensEstimated(t *testing.T) {
	up := newUpstream(t, completion("x"))
	p := startProxy(t, geminiConfig([]*fakeUpstream{up}, []bool{false}))
	c := geminiClient(t, p, "k")
	count := func(text string) int32 {
		res, err := c.Models.CountTokens(context.Background(), "m", genai.Text(text), nil)
		if err != nil || res.SDKHTTPResponse == nil || res.SDKHTTPResponse.Headers.Get("X-LLM-Route-Estimate") != "true" {
			t.Fatalf("count %+v %v", res, err)
		}
		return res.TotalTokens
	}
	// About four bytes a token, plus a few per content.
	small, big := count(strings.Repeat("abcd", 100)), count(strings.Repeat("abcd", 1000))
	if small < 100 || small > 120 || big < 1000 || big > 1020 {
		t.Fatalf("estimates %d for 400 bytes, %d for 4000 bytes", small, big)
	}
	raw := func(body string) int {
		resp := p.postGemini(t, "/v1beta/models/m:countTokens", body)
		got := readAll(t, resp)
		var v struct{ TotalTokens int }
		if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Route-Estimate") != "true" || json.Unmarshal([]byte(got), &v) != nil {
			t.Fatalf("countTokens %d %s", resp.StatusCode, got)
		}
		return v.TotalTokens
	}
	plain := `{"contents":[{"role":"user","parts":[{"text":"` + strings.Repeat("abcd", 100) + `"}]}]}`
	withSystem := `{"contents":[{"role":"user","parts":[{"text":"` + strings.Repeat("abcd", 100) + `"}]}],"systemInstruction":{"parts":[{"text":"` + strings.Repeat("efgh", 200) + `"}]},` +
		`"tools":[{"functionDeclarations":[{"name":"f","description":"` + strings.Repeat("ijkl", 100) + `"}]}]}`
	n, ns, nw := raw(plain), raw(withSystem), raw(`{"generateContentRequest":{"model":"models/m",`+strings.TrimPrefix(plain, "{")+`}`)
	if n != int(small) || ns < n+300 || nw != n {
		t.Fatalf("estimates: plain %d (SDK %d), with system and tools %d, wrapped %d", n, small, ns, nw)
	}
	if calls := up.Calls(); len(calls) != 0 {
		t.Fatalf("the chat upstream was asked %d times", len(calls))
	}
}

// recordedCLI is the recorded Gemini CLI session.
type recordedCLI struct {
	Requests []struct {
		Method  string            `json:"method"`
		URL     string            `json:"url"`
		Headers map[string]string `json:"headers"`
		Body    json.RawMessage   `json:"body"`
	} `json:"requests"`
}

// TestGeminiRecordedCLIRequests replays what Gemini CLI 0.61.0 sent (the
// model-router classifier in JSON mode, then two streamed turns with 15
// function declarations, the second after a write_file call) against a
// chat-only upstream, with the CLI's own model names configured. The
// upstream receives one system message, first; the classifier's schema
// lower-cased; the 15 tools with the declarations' schemas unchanged;
// the CLI's call id on both the assistant's tool call and the tool
// message; reasoning_effort high (the CLI's thinkingLevel HIGH); no
// thought signature and no topK anywhere. The CLI gets 200 and a Gemini
// stream framed as Google's.
func TestGeminiRecordedCLIRequests(t *testing.T) {
	raw, err := os.ReadFile("testdata/clients/gemini-cli-0.61.0.generatecontent.json")
	if err != nil {
		t.Fatal(err)
	}
	var rec recordedCLI
	if err := json.Unmarshal(raw, &rec); err != nil || len(rec.Requests) != 3 {
		t.Fatalf("recorded requests: %d, %v", len(rec.Requests), err)
	}
	const classifier = `{"complexity_reasoning":"one small file","complexity_score":5}`
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(readReq(r), `"stream":true`) {
			completion(classifier)(w, r)
			return
		}
		chatTurns(chatAnswer("I need to write a file.", "I will create the file.", []chatCall{{"", "write_file", `{"file_path":"hello.txt","content":"HELLO"}`}}),
			chatAnswer("", "Done.", nil))(w, r)
	})
	cfg := geminiConfig([]*fakeUpstream{up}, []bool{false})
	cfg["models"] = []any{obj("name", "gemini-3.5-flash-lite", "upstreams", []string{"u1"}), obj("name", "gemini-3.8-flash", "upstreams", []string{"u1"})}
	p := startProxy(t, cfg)

	var answers []string
	for i, q := range rec.Requests {
		// The file is indented for reading; the CLI sends compact JSON.
		var compact bytes.Buffer
		if err := json.Compact(&compact, q.Body); err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequest(q.Method, p.URL+q.URL, &compact)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range q.Headers {
			switch strings.ToLower(k) {
			case "host", "content-length", "connection", "accept-encoding":
			default:
				req.Header.Set(k, v)
			}
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		if strings.Contains(q.URL, ":streamGenerateContent") {
			if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("request %d: Content-Type %q", i, resp.Header.Get("Content-Type"))
			}
			evs := geminiSSE(t, body)
			if !strings.Contains(evs[len(evs)-1], `"finishReason":"STOP"`) || strings.Count(body, `"finishReason"`) != 1 {
				t.Fatalf("request %d: stream %q", i, body)
			}
		}
		answers = append(answers, body)
	}
	var res genai.GenerateContentResponse
	if err := json.Unmarshal([]byte(answers[0]), &res); err != nil || res.Text() != classifier {
		t.Fatalf("classifier answer %s", answers[0])
	}
	if !strings.Contains(answers[1], `"functionCall":{"id":"call_`) || !strings.Contains(answers[1], `"name":"write_file"`) ||
		!strings.Contains(answers[1], `"thought":true`) || !strings.Contains(answers[2], `"text":"Done."`) {
		t.Fatalf("turn answers:\n%s\n%s", answers[1], answers[2])
	}

	calls := up.Calls()
	if len(calls) != 3 {
		t.Fatalf("%d upstream calls", len(calls))
	}
	var sent [3]chatRequest
	for i, call := range calls {
		sent[i] = decodeChatCall(t, call)
		var body map[string]json.RawMessage
		_ = json.Unmarshal(call.Body, &body)
		for _, bad := range []string{"thoughtSignature", "Signature", "top_k", "topK", "<client key>", "generationConfig", "systemInstruction"} {
			if strings.Contains(string(call.Body), bad) {
				t.Errorf("upstream request %d contains %q", i, bad)
			}
		}
		var q struct {
			SystemInstruction struct{ Parts []struct{ Text string } }
		}
		_ = json.Unmarshal(rec.Requests[i].Body, &q)
		r := sent[i]
		systems := 0
		for _, m := range r.Messages {
			if m.Role == "system" {
				systems++
			}
		}
		if systems != 1 || r.Messages[0].Role != "system" || contentText(r.Messages[0].Content) != q.SystemInstruction.Parts[0].Text {
			t.Errorf("upstream request %d: roles %v, want one system message (the system instruction) first", i, r.roles())
		}
		if r.ReasoningEffort == nil || *r.ReasoningEffort != "high" {
			t.Errorf("upstream request %d: reasoning_effort %v, want high (thinkingLevel HIGH)", i, r.ReasoningEffort)
		}
		if call.Header.Get("X-Goog-Api-Key") != "" || body["model"] == nil || r.Model != "real-model" {
			t.Errorf("upstream request %d: model %q, X-Goog-Api-Key %q", i, r.Model, call.Header.Get("X-Goog-Api-Key"))
		}
	}

	// The classifier: JSON mode, not streamed, the schema's type names
	// lower-cased, the user's two texts as two user messages.
	var schema struct {
		Type       string
		JSONSchema struct {
			Schema json.RawMessage
		} `json:"json_schema"`
	}
	_ = json.Unmarshal(sent[0].ResponseFormat, &schema)
	want := `{"type":"object","properties":{"complexity_reasoning":{"type":"string","description":"Brief explanation for the score."},"complexity_score":{"type":"integer","description":"Complexity score from 1-100."}},"required":["complexity_reasoning","complexity_score"]}`
	if schema.Type != "json_schema" || !sameJSON(schema.JSONSchema.Schema, []byte(want)) || sent[0].Stream != nil || len(sent[0].Tools) != 0 ||
		!reflect.DeepEqual(sent[0].roles(), []string{"system", "user", "user"}) {
		t.Errorf("classifier upstream body %s", calls[0].Body)
	}

	// The turns: streamed with usage, the 15 declarations as tools.
	var decl struct {
		Tools []struct {
			FunctionDeclarations []struct {
				Name                 string
				Description          string
				ParametersJsonSchema json.RawMessage
			}
		}
	}
	if err := json.Unmarshal(rec.Requests[1].Body, &decl); err != nil || len(decl.Tools) != 1 || len(decl.Tools[0].FunctionDeclarations) != 15 {
		t.Fatalf("recorded declarations: %v", err)
	}
	for i := 1; i <= 2; i++ {
		r := sent[i]
		if r.Stream == nil || !*r.Stream || r.StreamOptions == nil || !r.StreamOptions.IncludeUsage || len(r.Tools) != 15 {
			t.Fatalf("turn %d: stream %v, %d tools: %s", i, r.Stream, len(r.Tools), tail(string(calls[i].Body), 400))
		}
		for j, d := range decl.Tools[0].FunctionDeclarations {
			tool := r.Tools[j]
			if tool.Type != "function" || tool.Function.Name != d.Name || tool.Function.Description != d.Description || !sameJSON(tool.Function.Parameters, d.ParametersJsonSchema) {
				t.Errorf("turn %d tool %d: %+v, want the declaration %s with parameters %s", i, j, tool, d.Name, d.ParametersJsonSchema)
			}
		}
	}
	if !reflect.DeepEqual(sent[1].roles(), []string{"system", "user"}) {
		t.Errorf("turn 1 roles %v", sent[1].roles())
	}
	// Turn 2: the CLI's own call id on the call and on its result.
	const id = "write_file_1796525615012_0"
	r := sent[2]
	if !reflect.DeepEqual(r.roles(), []string{"system", "user", "assistant", "tool"}) {
		t.Fatalf("turn 2 roles %v: %s", r.roles(), tail(string(calls[2].Body), 600))
	}
	a, tool := r.Messages[2], r.Messages[3]
	if contentText(a.Content) != "I will create the file." || len(a.ToolCalls) != 1 || a.ToolCalls[0].ID != id || a.ToolCalls[0].Function.Name != "write_file" ||
		!sameJSON([]byte(a.ToolCalls[0].Function.Arguments), []byte(`{"file_path":"<workdir>/hello.txt","content":"HELLO-cc1aaa01"}`)) ||
		tool.ToolCallID != id || contentText(tool.Content) != "<elided: 141 chars>" {
		m, _ := json.Marshal(r.Messages[2:])
		t.Errorf("turn 2 (want the id %s on the assistant's call and the tool message): %s", id, m)
	}
}

// TestGeminiResumeThoughtsKept: a translated Gemini stream that asked for
// thoughts breaks after its reasoning and 20 of 60 tokens; the second
// upstream continues it (resume on, heartbeats on). The SDK reads one
// stream without error: the thought it had, then the whole text, one
// finishReason on the last chunk, with the continuation's usage; on the
// wire it stays Google's framing, with no keepalive comment and nothing of
// the chat stream leaking through. (TestGeminiResume covers the plain
// text case.)
func TestGeminiResumeThoughtsKept(t *testing.T) {
	reasoned := append([]string{resumeA.chunk(`{"role":"assistant","reasoning_content":"think "}`, ""), resumeA.chunk(`{"reasoning_content":"hard"}`, "")},
		firstEvents(20)[1:]...)
	a := newUpstream(t, faultChunkedCut(reasoned))
	// The continuation takes several heartbeat periods to start, as a
	// prefill does: no keepalive may fill the pause.
	b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(400 * time.Millisecond)
		deterministic(resumeB, false, 1)(w, r)
	})
	p := startProxy(t, resumeConfig(a, b, "30s"))
	ok0 := p.resumes("ok")
	body := `{"contents":[{"role":"user","parts":[{"text":"count"}]}],"generationConfig":{"thinkingConfig":{"includeThoughts":true}}}`
	resp := p.postGemini(t, "/v1beta/models/m:streamGenerateContent?alt=sse", body)
	raw, rerr := faultRead(resp)
	if rerr != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d, read error %v; stream %q", resp.StatusCode, rerr, tail(raw, 300))
	}
	var chunks []*genai.GenerateContentResponse
	for _, ev := range geminiSSE(t, raw) {
		var ch genai.GenerateContentResponse
		if err := json.Unmarshal([]byte(ev), &ch); err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, &ch)
	}
	finishes := 0
	for _, ch := range chunks {
		if len(ch.Candidates) > 0 && ch.Candidates[0].FinishReason != "" {
			finishes++
		}
	}
	acc := accumulateGemini(chunks)
	parts := acc.Candidates[0].Content.Parts
	last := chunks[len(chunks)-1]
	if finishes != 1 || last.Candidates[0].FinishReason != genai.FinishReasonStop || len(parts) != 2 ||
		!parts[0].Thought || parts[0].Text != "think hard" || parts[1].Thought || parts[1].Text != resumeFull {
		b, _ := json.Marshal(acc)
		t.Fatalf("%d finishReasons; accumulated %s", finishes, b)
	}
	if last.UsageMetadata == nil || last.UsageMetadata.CandidatesTokenCount != 40 {
		t.Errorf("usage %+v, want the continuation's 40 output tokens", last.UsageMetadata)
	}
	if strings.Contains(raw, "chat.completion") || strings.Contains(raw, "[DONE]") {
		t.Errorf("chat bytes leaked into the Gemini stream: %q", tail(raw, 300))
	}
	if d := p.resumes("ok") - ok0; d != 1 {
		t.Errorf("resumes ok counted %v, want 1", d)
	}
	calls := b.Calls()
	if len(calls) != 1 || calls[0].Path != "/v1/chat/completions" {
		t.Fatalf("second upstream calls %+v", calls)
	}
	wantPrefill(t, calls[0], 20)
}

// TestGeminiTranslatedErrors: what goes wrong on the translated path
// reaches the SDK as Google's errors: the chat upstream's 400 as 400
// INVALID_ARGUMENT with its message (streamed or not); a file a chat
// upstream cannot take (a PDF) refused before any upstream is asked,
// while an image goes up as an image_url data URL; a chat stream that
// breaks after text (no continuation) or carries an error chunk ends
// with an error event the SDK reports, after the text it had.
func TestGeminiTranslatedErrors(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"max_tokens is too large for this model","type":"invalid_request_error","code":"context_length"}}`)
	})
	p := startProxy(t, geminiConfig([]*fakeUpstream{up}, []bool{false}))
	c := geminiClient(t, p, "k")
	_, err := c.Models.GenerateContent(context.Background(), "m", genai.Text("hi"), nil)
	e := expectSDKError(t, "upstream 400", err, 400, "INVALID_ARGUMENT")
	if e.Message != "max_tokens is too large for this model" {
		t.Fatalf("message %q", e.Message)
	}
	_, err = geminiStream(c, "m", "hi")
	expectSDKError(t, "upstream 400, stream", err, 400, "INVALID_ARGUMENT")
	n := len(up.Calls())

	pdf := []*genai.Content{genai.NewContentFromParts([]*genai.Part{genai.NewPartFromText("summarize"), genai.NewPartFromBytes([]byte("%PDF-1.7"), "application/pdf")}, genai.RoleUser)}
	_, err = c.Models.GenerateContent(context.Background(), "m", pdf, nil)
	expectSDKError(t, "a PDF for a chat upstream", err, 400, "INVALID_ARGUMENT")
	if len(up.Calls()) != n {
		t.Fatal("a refused request reached the upstream")
	}
	up.setHandler(completion("a red dot"))
	img := []*genai.Content{genai.NewContentFromParts([]*genai.Part{genai.NewPartFromText("what is it?"), genai.NewPartFromBytes([]byte("\x89PNG"), "image/png")}, genai.RoleUser)}
	if res, err := c.Models.GenerateContent(context.Background(), "m", img, nil); err != nil || res.Text() != "a red dot" {
		t.Fatalf("image: %+v %v", res, err)
	}
	calls := up.Calls()
	req := decodeChatCall(t, calls[len(calls)-1])
	want := `[{"type":"text","text":"what is it?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw=="}}]`
	if len(req.Messages) != 1 || !sameJSON(req.Messages[0].Content, []byte(want)) {
		t.Fatalf("image upstream body %s", calls[len(calls)-1].Body)
	}

	for _, tc := range []struct {
		name   string
		send   http.HandlerFunc
		code   int
		status string
	}{
		{"reset", resetAfter([]string{"data: " + chunk(`{"role":"assistant","content":"half "}`, "") + "\n\n", "data: " + chunk(`{"content":"an answer "}`, "") + "\n\n"}), 503, "UNAVAILABLE"},
		{"error chunk", func(w http.ResponseWriter, r *http.Request) {
			writeStream(w, []string{"data: " + chunk(`{"role":"assistant","content":"half "}`, "") + "\n\n", "data: " + chunk(`{"content":"an answer "}`, "") + "\n\n",
				`data: {"error":{"message":"the model crashed","type":"server_error","code":500}}` + "\n\n"}, 0)
		}, 500, "INTERNAL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up.setHandler(tc.send)
			chunks, err := geminiStream(c, "m", "hi")
			if streamText(chunks) != "half an answer " {
				t.Fatalf("text before the break %q (err %v)", streamText(chunks), err)
			}
			expectSDKError(t, tc.name, err, tc.code, tc.status)
			resp := p.postGemini(t, "/v1beta/models/m:streamGenerateContent?alt=sse", `{"contents":[{"parts":[{"text":"hi"}]}]}`)
			raw, rerr := faultRead(resp)
			evs := geminiSSE(t, raw)
			if !strings.HasPrefix(evs[len(evs)-1], `{"error":`) || strings.Contains(raw, `"finishReason"`) {
				t.Fatalf("events %q", evs)
			}
			// A break is aborted after the error event, so that no client
			// takes the response for complete.
			if tc.name == "reset" && rerr != io.ErrUnexpectedEOF {
				t.Fatalf("read error %v after a break, want the response aborted", rerr)
			}
		})
	}
	eventually(t, 5*time.Second, "every slot released", func() bool { return p.upstreamGauge("inflight", "u1", "p1") == 0 })
}

// TestGeminiTranslatedLineSeparators: U+2028 and U+2029 in a chat answer
// reach the client escaped (the Node SDK's event pattern stops at a raw
// one), streamed and not, and the SDK reads the characters back.
func TestGeminiTranslatedLineSeparators(t *testing.T) {
	const text = "one\u2028two\u2029three"
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if !isStream(r) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}]}`, text)
			return
		}
		writeStream(w, []string{"data: " + chunk(`{"role":"assistant","content":"`+text+`"}`, "") + "\n\n", "data: " + chunk(`{}`, "stop") + "\n\n", "data: [DONE]\n\n"}, 0)
	})
	p := startProxy(t, geminiConfig([]*fakeUpstream{up}, []bool{false}))
	for _, path := range []string{"/v1beta/models/m:generateContent", "/v1beta/models/m:streamGenerateContent?alt=sse"} {
		raw := readAll(t, p.postGemini(t, path, `{"contents":[{"parts":[{"text":"hi"}]}]}`))
		if strings.ContainsAny(raw, "\u2028\u2029") || !strings.Contains(raw, `\u2028`) {
			t.Fatalf("%s: %q", path, raw)
		}
	}
	c := geminiClient(t, p, "k")
	res, err := c.Models.GenerateContent(context.Background(), "m", genai.Text("hi"), nil)
	chunks, serr := geminiStream(c, "m", "hi")
	if err != nil || serr != nil || res.Text() != text || streamText(chunks) != text {
		t.Fatalf("non-stream %q %v; stream %q %v", res.Text(), err, streamText(chunks), serr)
	}
}

// TestGeminiHistoryWithoutIDs: a history whose calls and results carry no
// ids (a client that kept none, as older Gemini models sent none) still
// pairs up for the chat upstream: each call gets call_<content>_<part>,
// and each result takes the id of the earliest unanswered call of its
// name, so two calls of one function are answered in order; the ids are
// the same bytes every turn.
func TestGeminiHistoryWithoutIDs(t *testing.T) {
	up := newUpstream(t, completion("Paris is sunny, Rome is cloudy."))
	p := startProxy(t, geminiConfig([]*fakeUpstream{up}, []bool{false}))
	c := geminiClient(t, p, "k")
	history := []*genai.Content{
		genai.NewContentFromText("weather in Paris and Rome?", genai.RoleUser),
		genai.NewContentFromParts([]*genai.Part{
			genai.NewPartFromFunctionCall("get_weather", map[string]any{"city": "Paris"}),
			genai.NewPartFromFunctionCall("get_weather", map[string]any{"city": "Rome"}),
		}, genai.RoleModel),
		genai.NewContentFromParts([]*genai.Part{
			genai.NewPartFromFunctionResponse("get_weather", map[string]any{"output": "sunny"}),
			genai.NewPartFromFunctionResponse("get_weather", map[string]any{"output": "cloudy"}),
		}, genai.RoleUser),
	}
	for range 2 {
		if res, err := c.Models.GenerateContent(context.Background(), "m", history, nil); err != nil || res.Text() == "" {
			t.Fatalf("answer %+v %v", res, err)
		}
	}
	calls := up.Calls()
	if string(calls[0].Body) != string(calls[1].Body) {
		t.Fatalf("the same history gave different bodies:\n%s\n%s", calls[0].Body, calls[1].Body)
	}
	req := decodeChatCall(t, calls[0])
	if !reflect.DeepEqual(req.roles(), []string{"user", "assistant", "tool", "tool"}) {
		t.Fatalf("roles %v: %s", req.roles(), calls[0].Body)
	}
	a := req.Messages[1]
	if len(a.ToolCalls) != 2 || a.ToolCalls[0].ID == "" || a.ToolCalls[0].ID == a.ToolCalls[1].ID ||
		!sameJSON([]byte(a.ToolCalls[0].Function.Arguments), []byte(`{"city":"Paris"}`)) ||
		req.Messages[2].ToolCallID != a.ToolCalls[0].ID || contentText(req.Messages[2].Content) != "sunny" ||
		req.Messages[3].ToolCallID != a.ToolCalls[1].ID || contentText(req.Messages[3].Content) != "cloudy" {
		t.Fatalf("calls and results not paired in order: %s", calls[0].Body)
	}
}
