package gemini

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/genai"
)

// gateway is a real HTTP server that does what the core does with this
// package, against a fixed chat answer: the SDK's request body goes through
// ToChat (it must translate), the answer through FromChat or Stream, errors
// through ErrorBody.
type gateway struct {
	t          *testing.T
	chat       string // non-stream chat.completion
	chatStream string // chat SSE
	split      func(string) []string
	fail       int // answer this status with ErrorBody
	lastChat   []byte
	raw        bytes.Buffer // the stream bytes the client got
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if g.fail != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(g.fail)
		w.Write(ErrorBody(g.fail, "all_upstreams_busy", "all upstreams busy", 2))
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/v1beta/")
	switch {
	case r.Method == http.MethodGet && path == "models":
		w.Write(ModelsBody([]string{"m", "t"}))
		return
	case r.Method == http.MethodGet && strings.HasPrefix(path, "models/"):
		if name := strings.TrimPrefix(path, "models/"); name == "m" {
			w.Write(ModelBody(name))
		} else {
			w.WriteHeader(404)
			w.Write(ErrorBody(404, "", "model "+name+" not found", 0))
		}
		return
	case strings.HasSuffix(path, ":countTokens"):
		n, err := CountTokensEstimate(body)
		if err != nil {
			g.t.Errorf("countTokens body %s: %v", body, err)
		}
		w.Write(CountTokensBody(n))
		return
	}
	model, verb, _ := strings.Cut(strings.TrimPrefix(path, "models/"), ":")
	stream := verb == "streamGenerateContent"
	if stream && r.URL.Query().Get("alt") != "sse" {
		g.t.Errorf("stream without alt=sse: %s", r.URL)
	}
	chat, info, err := ToChat(nil, body, Options{ReasoningField: "reasoning_content", Model: model, Stream: stream})
	if err != nil {
		g.t.Errorf("ToChat(SDK request %s): %v", body, err)
		w.WriteHeader(400)
		w.Write(ErrorBody(400, "", err.Error(), 0))
		return
	}
	g.lastChat = chat
	if !stream {
		out, err := FromChat(nil, []byte(g.chat), info)
		if err != nil {
			g.t.Errorf("FromChat: %v", err) // not Fatal: this is the server's goroutine
			w.WriteHeader(502)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	s := NewStream(info, func(ev []byte) error {
		if p := eventProblem(ev); p != "" {
			g.t.Errorf("%s: %q", p, ev) // not Fatal: this is the server's goroutine
		}
		g.raw.Write(ev)
		_, err := w.Write(ev)
		fl.Flush()
		return err
	})
	for _, p := range g.split(g.chatStream) {
		s.Write([]byte(p))
	}
	if err := s.Close(); errors.Is(err, ErrUnfinished) {
		s.Fail("stream_interrupted", "the upstream stream was interrupted before it finished")
	}
}

func sdkClient(t *testing.T, g *gateway) *genai.Client {
	t.Helper()
	g.t = t
	if g.split == nil {
		g.split = whole
	}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	c, err := genai.NewClient(context.Background(), &genai.ClientConfig{APIKey: "client-key", Backend: genai.BackendGeminiAPI,
		HTTPClient: srv.Client(), HTTPOptions: genai.HTTPOptions{BaseURL: srv.URL, APIVersion: "v1beta"}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// accumulate joins streamed chunks as a client does: consecutive text parts
// of the same kind (thought or not) concatenated, empty text parts skipped,
// other parts appended; the last finishReason and usageMetadata kept.
func accumulate(chunks []*genai.GenerateContentResponse) *genai.GenerateContentResponse {
	acc := &genai.GenerateContentResponse{Candidates: []*genai.Candidate{{Content: &genai.Content{Role: "model"}}}}
	c := acc.Candidates[0]
	for _, ch := range chunks {
		acc.ModelVersion, acc.ResponseID = ch.ModelVersion, ch.ResponseID
		if ch.UsageMetadata != nil {
			acc.UsageMetadata = ch.UsageMetadata
		}
		if len(ch.Candidates) == 0 {
			continue
		}
		if ch.Candidates[0].FinishReason != "" {
			c.FinishReason = ch.Candidates[0].FinishReason
		}
		for _, p := range ch.Candidates[0].Content.Parts {
			ps := c.Content.Parts
			switch {
			case p.FunctionCall == nil && p.Text == "":
			case p.FunctionCall == nil && len(ps) > 0 && ps[len(ps)-1].FunctionCall == nil && ps[len(ps)-1].Thought == p.Thought:
				ps[len(ps)-1].Text += p.Text
			default:
				cp := *p
				c.Content.Parts = append(c.Content.Parts, &cp)
			}
		}
	}
	return acc
}

func jsonOf(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The non-stream answer and the accumulated stream decode with the SDK's
// types to the same response, field by field, whole or byte by byte.
func TestSDKAnswers(t *testing.T) {
	const nonStream = `{"id":"chatcmpl-9","object":"chat.completion","model":"gpt-x","choices":[{"index":0,"message":{"role":"assistant","content":"Checking both.",` +
		`"tool_calls":[{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},{"id":"call_b","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Rome\\u2028\"}"}}]},"finish_reason":"tool_calls"}],` +
		`"usage":{"prompt_tokens":120,"completion_tokens":40,"total_tokens":160,"prompt_tokens_details":{"cached_tokens":100}}}`
	ctx := context.Background()
	g := &gateway{chat: nonStream, chatStream: toolStream}
	c := sdkClient(t, g)
	contents := []*genai.Content{genai.NewContentFromText("weather in Paris and Rome?", genai.RoleUser)}
	cfg := &genai.GenerateContentConfig{
		SystemInstruction: genai.NewContentFromText("be brief", genai.RoleUser),
		ThinkingConfig:    &genai.ThinkingConfig{IncludeThoughts: true, ThinkingLevel: genai.ThinkingLevelHigh},
		Tools: []*genai.Tool{{FunctionDeclarations: []*genai.FunctionDeclaration{{Name: "get_weather", Description: "d",
			Parameters: &genai.Schema{Type: genai.TypeObject, Properties: map[string]*genai.Schema{"city": {Type: genai.TypeString}}, Required: []string{"city"}}}}}},
	}
	resp, err := c.Models.GenerateContent(ctx, "m", contents, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Text() != "Checking both." || len(resp.FunctionCalls()) != 2 || resp.FunctionCalls()[1].Args["city"] != "Rome\u2028" ||
		resp.FunctionCalls()[0].ID != "call_a" || resp.Candidates[0].FinishReason != genai.FinishReasonStop ||
		resp.UsageMetadata.PromptTokenCount != 120 || resp.UsageMetadata.CachedContentTokenCount != 100 || resp.ModelVersion != "gpt-x" || resp.ResponseID != "chatcmpl-9" {
		t.Errorf("non-stream answer: %s", jsonOf(t, resp))
	}
	// The SDK's own request translated: system first, the Gemini Schema
	// lower-cased, reasoning_effort high.
	for _, want := range []string{`{"messages":[{"role":"system","content":"be brief"}`, `"parameters":{"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"}`, `"reasoning_effort":"high"`} {
		if !strings.Contains(string(g.lastChat), want) {
			t.Errorf("SDK request → chat lacks %s:\n%s", want, g.lastChat)
		}
	}
	resp.SDKHTTPResponse = nil
	want := jsonOf(t, resp)

	for _, sp := range []struct {
		name  string
		split func(string) []string
	}{{"whole", whole}, {"bytewise", bytewise}} {
		g.split = sp.split
		var chunks []*genai.GenerateContentResponse
		for ch, err := range c.Models.GenerateContentStream(ctx, "m", contents, cfg) {
			if err != nil {
				t.Fatalf("%s: stream error %v", sp.name, err)
			}
			chunks = append(chunks, ch)
		}
		if len(chunks) != 3 {
			t.Errorf("%s: %d chunks, want 3", sp.name, len(chunks))
		}
		for _, ch := range chunks[:len(chunks)-1] {
			if ch.UsageMetadata != nil || ch.Candidates[0].FinishReason != "" {
				t.Errorf("%s: finishReason or usage before the last event", sp.name)
			}
		}
		if got := jsonOf(t, accumulate(chunks)); got != want {
			t.Errorf("%s: accumulated stream\n got %s\nwant %s", sp.name, got, want)
		}
	}
	if bytes.Contains(g.raw.Bytes(), []byte("\n: ")) || bytes.HasPrefix(g.raw.Bytes(), []byte(":")) || bytes.Contains(g.raw.Bytes(), []byte("event:")) {
		t.Error("comment or event: line in the stream")
	}
}

// Thoughts reach the SDK as parts with Thought true, with the thought count.
func TestSDKThoughts(t *testing.T) {
	g := &gateway{chatStream: deepSeekStream, split: bytewise}
	c := sdkClient(t, g)
	var chunks []*genai.GenerateContentResponse
	for ch, err := range c.Models.GenerateContentStream(context.Background(), "m", genai.Text("hi"),
		&genai.GenerateContentConfig{ThinkingConfig: &genai.ThinkingConfig{IncludeThoughts: true}}) {
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, ch)
	}
	acc := accumulate(chunks)
	parts := acc.Candidates[0].Content.Parts
	if len(parts) != 2 || !parts[0].Thought || parts[0].Text != "The user greets." || parts[1].Thought || parts[1].Text != "Hello!" ||
		acc.Candidates[0].FinishReason != genai.FinishReasonMaxTokens || acc.UsageMetadata.ThoughtsTokenCount != 4 || acc.UsageMetadata.CandidatesTokenCount != 3 {
		t.Errorf("accumulated: %s", jsonOf(t, acc))
	}
}

// Errors reach the SDK as APIError with Google's status names: a proxy
// error body with its details, and an error event inside a stream.
func TestSDKErrors(t *testing.T) {
	ctx := context.Background()
	g := &gateway{fail: 503}
	c := sdkClient(t, g)
	_, err := c.Models.GenerateContent(ctx, "m", genai.Text("hi"), nil)
	var ae genai.APIError
	if !errors.As(err, &ae) || ae.Code != 503 || ae.Status != "UNAVAILABLE" || ae.Message != "all upstreams busy" || len(ae.Details) != 2 ||
		ae.Details[0]["reason"] != "all_upstreams_busy" || ae.Details[1]["retryDelay"] != "2s" {
		t.Errorf("non-stream error: %#v", err)
	}

	g2 := &gateway{chatStream: sse(`{"id":"x","model":"m","choices":[{"index":0,"delta":{"content":"half"}}]}`)}
	c2 := sdkClient(t, g2)
	var texts []string
	err = nil
	for ch, e := range c2.Models.GenerateContentStream(ctx, "m", genai.Text("hi"), nil) {
		if e != nil {
			err = e
			break
		}
		texts = append(texts, ch.Text())
	}
	if !errors.As(err, &ae) || ae.Code != 503 || ae.Status != "UNAVAILABLE" || !strings.Contains(ae.Message, "interrupted") || !reflect.DeepEqual(texts, []string{"half"}) {
		t.Errorf("stream error: %#v after %q", err, texts)
	}
}

// countTokens and the model list as the SDK reads them.
func TestSDKCountAndModels(t *testing.T) {
	ctx := context.Background()
	c := sdkClient(t, &gateway{})
	ct, err := c.Models.CountTokens(ctx, "m", genai.Text("abcdefgh"), nil)
	if err != nil || ct.TotalTokens != 2+1+4 { // "abcdefgh" + "user" = 12 bytes → 3; one content 4
		t.Errorf("CountTokens = %+v, %v", ct, err)
	}
	page, err := c.Models.List(ctx, nil)
	if err != nil || len(page.Items) != 2 || page.Items[0].Name != "models/m" || page.Items[1].DisplayName != "t" ||
		!reflect.DeepEqual(page.Items[0].SupportedActions, []string{"generateContent", "streamGenerateContent", "countTokens"}) || page.NextPageToken != "" {
		t.Errorf("List = %s, %v", jsonOf(t, page.Items), err)
	}
	m, err := c.Models.Get(ctx, "m", nil)
	if err != nil || m.Name != "models/m" || m.Version != "llm_route" {
		t.Errorf("Get = %+v, %v", m, err)
	}
	_, err = c.Models.Get(ctx, "nope", nil)
	var ae genai.APIError
	if !errors.As(err, &ae) || ae.Code != 404 || ae.Status != "NOT_FOUND" {
		t.Errorf("Get(unknown) = %v", err)
	}
}
