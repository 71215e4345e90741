package integration

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// chatMsg is the part of an outgoing chat message these tests read.
type chatMsg struct {
	Role       string `json:"role"`
	Content    any    `json:"content"`
	ToolCallID string `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// chatReq is the part of an outgoing chat request these tests read.
type chatReq struct {
	Model             string         `json:"model"`
	Stream            bool           `json:"stream"`
	StreamOptions     map[string]any `json:"stream_options"`
	Messages          []chatMsg      `json:"messages"`
	Tools             []chatTool     `json:"tools"`
	ToolChoice        any            `json:"tool_choice"`
	ParallelToolCalls *bool          `json:"parallel_tool_calls"`
	ReasoningEffort   string         `json:"reasoning_effort"`
}

type chatTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string         `json:"name"`
		Description string         `json:"description"`
		Parameters  map[string]any `json:"parameters"`
	} `json:"function"`
}

func decodeChat(t *testing.T, body []byte) (chatReq, map[string]json.RawMessage) {
	t.Helper()
	var c chatReq
	var all map[string]json.RawMessage
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatalf("upstream body is not a chat request: %v\n%s", err, body)
	}
	_ = json.Unmarshal(body, &all)
	return c, all
}

// toolCallStream streams one chat tool call whose arguments arrive in the
// given pieces.
func toolCallStream(id, name string, pieces ...string) http.HandlerFunc {
	var chunks []string
	chunks = append(chunks, chunk(`{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":`+quote(id)+`,"type":"function","function":{"name":`+quote(name)+`,"arguments":""}}]}`, ""))
	for _, p := range pieces {
		chunks = append(chunks, chunk(`{"tool_calls":[{"index":0,"function":{"arguments":`+quote(p)+`}}]}`, ""))
	}
	chunks = append(chunks, chunk(`{}`, "tool_calls"),
		`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":9,"total_tokens":29}}`)
	return chatStream(chunks...)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestResponsesStreamedFunctionRoundTrip: turn 1 streams a function_call
// whose arguments arrive in deltas (output_item.added with call_id and
// name, arguments deltas, .done with the whole arguments, output_item.done);
// turn 2, sent stateless with the function_call and its
// function_call_output, reaches the chat upstream as the assistant's
// tool call and a tool message, and the final text streams back.
func TestResponsesStreamedFunctionRoundTrip(t *testing.T) {
	up := newUpstream(t, toolCallStream("call_fn7", "get_weather", `{"ci`, `ty":"Pa`, `ris"}`))
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	c := responsesClient(p)
	tools := []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{Name: "get_weather",
		Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}}}
	input := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("weather in Paris?", responses.EasyInputMessageRoleUser)}
	params := responses.ResponseNewParams{Model: "m", Tools: tools, Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}}

	s1 := streamResponse(t, c, params)
	if s1.args != `{"city":"Paris"}` {
		t.Fatalf("arguments deltas %q", s1.args)
	}
	wantOrder := []string{"response.created", "response.in_progress", "response.output_item.added",
		"response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done", "response.completed"}
	if !subsequence(s1.types, wantOrder) {
		t.Fatalf("events %v, want in order %v", s1.types, wantOrder)
	}
	if len(s1.final.Output) != 1 || s1.final.Output[0].Type != "function_call" {
		t.Fatalf("output %s", s1.final.RawJSON())
	}
	fc := s1.final.Output[0].AsFunctionCall()
	if fc.CallID != "call_fn7" || fc.Name != "get_weather" || fc.Arguments != `{"city":"Paris"}` || fc.Status != "completed" ||
		s1.final.Usage.InputTokens != 20 || s1.final.Usage.OutputTokens != 9 {
		t.Fatalf("function_call %+v usage %+v", fc, s1.final.Usage)
	}

	up.setHandler(completion("It is sunny."))
	input = append(input, responses.ResponseInputItemParamOfFunctionCall(fc.Arguments, fc.CallID, fc.Name),
		responses.ResponseInputItemUnionParam{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{CallID: openai.String(fc.CallID),
			Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String("22C sunny")}}})
	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: input}
	s2 := streamResponse(t, c, params)
	if s2.text != "It is sunny." || s2.final.OutputText() != "It is sunny." {
		t.Fatalf("turn 2 text %q / %q", s2.text, s2.final.OutputText())
	}
	calls := up.Calls()
	if len(calls) != 2 {
		t.Fatalf("upstream calls %d", len(calls))
	}
	turn2, _ := decodeChat(t, calls[1].Body)
	m := turn2.Messages
	if len(m) != 3 || m[0].Role != "user" || m[1].Role != "assistant" || len(m[1].ToolCalls) != 1 ||
		m[1].ToolCalls[0].ID != "call_fn7" || m[1].ToolCalls[0].Function.Name != "get_weather" ||
		m[1].ToolCalls[0].Function.Arguments != `{"city":"Paris"}` || m[2].Role != "tool" || m[2].ToolCallID != "call_fn7" ||
		m[2].Content != "22C sunny" || !turn2.Stream || turn2.StreamOptions["include_usage"] != true {
		t.Fatalf("turn 2 upstream body %s", calls[1].Body)
	}
}

// subsequence reports whether want appears in got in order.
func subsequence(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// TestResponsesStreamedCustomToolRoundTrip: the apply_patch custom tool
// streamed: the chat function's {"input": …} arguments arrive cut at
// awkward places (inside the key, between a backslash and its escape,
// inside a \" pair); the client sees custom_tool_call_input deltas adding
// up to the patch unchanged and a custom_tool_call item; the next turn's
// custom_tool_call and custom_tool_call_output reach the upstream as a tool
// call with {"input": patch} and a tool message.
func TestResponsesStreamedCustomToolRoundTrip(t *testing.T) {
	args, _ := json.Marshal(map[string]string{"input": applyPatch})
	a := string(args)
	// Cut points: inside "input", right after a backslash, inside \".
	bs := strings.Index(a, `\n`) + 1
	q := strings.Index(a, `\"`) + 1
	pieces := []string{a[:4], a[4:bs], a[bs:q], a[q:]}
	if strings.Join(pieces, "") != a || bs <= 4 || q <= bs {
		t.Fatalf("bad cut points in %s", a)
	}
	up := newUpstream(t, toolCallStream("call_ap1", "apply_patch", pieces...))
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	c := responsesClient(p)
	tools := []responses.ToolUnionParam{{OfCustom: &responses.CustomToolParam{Name: "apply_patch", Description: openai.String("edit files")}}}
	input := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("fix a.go", responses.EasyInputMessageRoleUser)}
	params := responses.ResponseNewParams{Model: "m", Tools: tools, Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}}

	s1 := streamResponse(t, c, params)
	if s1.args != applyPatch {
		t.Fatalf("custom_tool_call_input deltas %q, want %q", s1.args, applyPatch)
	}
	if !subsequence(s1.types, []string{"response.output_item.added", "response.custom_tool_call_input.delta",
		"response.custom_tool_call_input.done", "response.output_item.done", "response.completed"}) {
		t.Fatalf("events %v", s1.types)
	}
	if len(s1.final.Output) != 1 || s1.final.Output[0].Type != "custom_tool_call" {
		t.Fatalf("output %s", s1.final.RawJSON())
	}
	call := s1.final.Output[0].AsCustomToolCall()
	if call.CallID != "call_ap1" || call.Name != "apply_patch" || call.Input != applyPatch {
		t.Fatalf("custom_tool_call %+v", call)
	}

	up.setHandler(completion("patched"))
	input = append(input,
		responses.ResponseInputItemUnionParam{OfCustomToolCall: &responses.ResponseCustomToolCallParam{CallID: call.CallID, Name: call.Name, Input: call.Input}},
		responses.ResponseInputItemUnionParam{OfCustomToolCallOutput: &responses.ResponseCustomToolCallOutputParam{CallID: call.CallID,
			Output: responses.ResponseCustomToolCallOutputOutputUnionParam{OfString: openai.String("Success. Updated a.go")}}})
	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: input}
	if s2 := streamResponse(t, c, params); s2.text != "patched" {
		t.Fatalf("turn 2 text %q", s2.text)
	}
	turn2, _ := decodeChat(t, up.Calls()[1].Body)
	m := turn2.Messages
	if len(m) != 3 || len(m[1].ToolCalls) != 1 || m[1].ToolCalls[0].ID != "call_ap1" || m[1].ToolCalls[0].Function.Name != "apply_patch" ||
		m[2].Role != "tool" || m[2].ToolCallID != "call_ap1" || m[2].Content != "Success. Updated a.go" {
		t.Fatalf("turn 2 upstream body %s", up.Calls()[1].Body)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(m[1].ToolCalls[0].Function.Arguments), &got); err != nil || got["input"] != applyPatch {
		t.Fatalf("turn 2 apply_patch arguments %q (%v)", m[1].ToolCalls[0].Function.Arguments, err)
	}
}

// TestResponsesThinkTagsSplitAcrossChunks: a MiniMax-style upstream under
// think_tags split whose tags are cut across chunks (`<thi` + `nk>`,
// `</th` + `ink>`) gives the Responses client reasoning deltas, then clean
// text: no tag fragment in any text delta or in the final output.
func TestResponsesThinkTagsSplitAcrossChunks(t *testing.T) {
	up := newUpstream(t, chatStream(
		chunk(`{"role":"assistant","content":"<thi"}`, ""),
		chunk(`{"content":"nk>Let me"}`, ""),
		chunk(`{"content":" think</th"}`, ""),
		chunk(`{"content":"ink>The answer"}`, ""),
		chunk(`{"content":" is 4."}`, ""),
		chunk(`{}`, "stop"),
		`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":8,"total_tokens":12}}`))
	cfg := frontsConfig([]*fakeUpstream{up}, []bool{false})
	cfg["providers"].([]any)[0].(map[string]any)["think_tags"] = "split"
	p := startProxy(t, cfg)
	s := streamResponse(t, responsesClient(p), responses.ResponseNewParams{Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("2+2?")}})
	if s.reasoning != "Let me think" || s.text != "The answer is 4." {
		t.Fatalf("reasoning %q text %q (events %v)", s.reasoning, s.text, s.types)
	}
	out := s.final.Output
	if len(out) != 2 || out[0].Type != "reasoning" || len(out[0].Content) != 1 || out[0].Content[0].Text != "Let me think" ||
		out[1].Type != "message" || s.final.OutputText() != "The answer is 4." || s.final.Usage.OutputTokens != 8 {
		t.Fatalf("final response %s", s.final.RawJSON())
	}
	if !subsequence(s.types, []string{"response.reasoning_text.delta", "response.reasoning_text.done", "response.output_text.delta"}) {
		t.Fatalf("events %v", s.types)
	}
}

// codexSample returns the requests recorded from Codex 0.169.0: headers
// and bodies as sent.
func codexSample(t *testing.T) []struct {
	Headers map[string]string `json:"headers"`
	Body    json.RawMessage   `json:"body"`
} {
	t.Helper()
	raw, err := os.ReadFile("../llmroute/wire/responses/testdata/codex-0.169.0.responses.json")
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Requests []struct {
			Headers map[string]string `json:"headers"`
			Body    json.RawMessage   `json:"body"`
		} `json:"requests"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil || len(rec.Requests) != 2 {
		t.Fatalf("sample: %v", err)
	}
	return rec.Requests
}

// sendRecorded posts a recorded Codex request (its body and its own
// headers, minus the transport ones) and returns the SSE data payloads.
func sendRecorded(t *testing.T, p *proxy, hdr map[string]string, body []byte) []string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/responses", strings.NewReader(string(body)))
	for k, v := range hdr {
		switch strings.ToLower(k) {
		case "host", "content-length":
			continue
		case "authorization":
			v = "Bearer client-key"
		}
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var data []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			data = append(data, d)
		}
	}
	return data
}

// TestResponsesCodexSampleTwoTurns replays the two requests Codex 0.169.0
// sent (bodies and headers as recorded: developer messages, 8 function
// tools, apply_patch as a custom grammar tool, tool_search and web_search,
// reasoning.effort, include, store:false, client_metadata; turn 2 adds the
// encrypted reasoning item, the custom_tool_call and its output) against a
// chat-only upstream, and checks what the upstream received and what Codex
// got back.
func TestResponsesCodexSampleTwoTurns(t *testing.T) {
	rec := codexSample(t)
	var firstBody map[string]json.RawMessage
	_ = json.Unmarshal(rec[0].Body, &firstBody)
	var turn2 struct {
		Input []map[string]any `json:"input"`
	}
	_ = json.Unmarshal(rec[1].Body, &turn2)
	var patch, callID string
	for _, it := range turn2.Input {
		if it["type"] == "custom_tool_call" {
			patch, callID = it["input"].(string), it["call_id"].(string)
		}
	}
	args, _ := json.Marshal(map[string]string{"input": patch})
	up := newUpstream(t, toolCallStream(callID, "apply_patch", string(args[:10]), string(args[10:])))
	cfg := frontsConfig([]*fakeUpstream{up}, []bool{false})
	cfg["providers"].([]any)[0].(map[string]any)["session_header"] = "x-session-affinity"
	cfg = withModel(cfg, "m", "u1")
	cfg["models"].([]any)[0].(map[string]any)["name"] = "gpt-coder"
	p := startProxy(t, cfg)

	// Turn 1: Codex gets the apply_patch call back as a custom_tool_call.
	data := sendRecorded(t, p, rec[0].Headers, rec[0].Body)
	var completed bool
	for _, d := range data {
		var ev struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal([]byte(d), &ev); err != nil {
			t.Fatalf("event is not JSON (%v): %s", err, d)
		}
		completed = completed || ev.Type == "response.completed"
		if d == "[DONE]" {
			t.Fatalf("a Responses stream got [DONE]")
		}
	}
	var item struct {
		Item struct {
			Type   string `json:"type"`
			CallID string `json:"call_id"`
			Name   string `json:"name"`
			Input  string `json:"input"`
		} `json:"item"`
	}
	for _, d := range data {
		if strings.Contains(d, `"type":"response.output_item.done"`) {
			_ = json.Unmarshal([]byte(d), &item)
		}
	}
	if !completed || item.Item.Type != "custom_tool_call" || item.Item.CallID != callID || item.Item.Name != "apply_patch" || item.Item.Input != patch {
		t.Fatalf("turn 1 item %+v completed %v\n%s", item.Item, completed, strings.Join(data, "\n"))
	}

	calls := up.Calls()
	c1, all1 := decodeChat(t, calls[0].Body)
	if calls[0].Path != "/v1/chat/completions" || c1.Model != "real-model" || !c1.Stream || c1.StreamOptions["include_usage"] != true ||
		c1.ReasoningEffort != "medium" || c1.ParallelToolCalls == nil || !*c1.ParallelToolCalls || c1.ToolChoice != "auto" {
		t.Fatalf("turn 1 upstream body head %s", calls[0].Body[:min(len(calls[0].Body), 400)])
	}
	for _, k := range []string{"input", "store", "include", "client_metadata", "prompt_cache_key", "text", "reasoning", "instructions"} {
		if _, ok := all1[k]; ok {
			t.Errorf("turn 1: the chat upstream got the Responses field %q", k)
		}
	}
	// Two developer messages become one system message; two user messages
	// stay two.
	if len(c1.Messages) != 3 || c1.Messages[0].Role != "system" || c1.Messages[1].Role != "user" || c1.Messages[2].Role != "user" {
		t.Fatalf("turn 1 roles %v", roles(c1.Messages))
	}
	// 8 function tools and apply_patch as a one-string-parameter function;
	// tool_search and web_search dropped.
	var names []string
	var ap chatTool
	for _, tl := range c1.Tools {
		if tl.Type != "function" {
			t.Errorf("tool of type %q reached the chat upstream", tl.Type)
		}
		names = append(names, tl.Function.Name)
		if tl.Function.Name == "apply_patch" {
			ap = tl
		}
	}
	want := "exec_command write_stdin request_user_input apply_patch view_image get_goal create_goal update_goal"
	if strings.Join(names, " ") != want {
		t.Fatalf("upstream tools %v, want %s", names, want)
	}
	if props, _ := ap.Function.Parameters["properties"].(map[string]any); props["input"] == nil ||
		!strings.Contains(ap.Function.Description, "lark grammar") {
		t.Fatalf("apply_patch as a function: %+v", ap.Function)
	}
	if got := calls[0].Header.Get("X-Session-Affinity"); got != rec[0].Headers["session-id"] {
		t.Fatalf("session header %q, want Codex's session-id %q", got, rec[0].Headers["session-id"])
	}
	if logs := p.logEntries("responses request: left out what a chat upstream cannot take"); len(logs) == 0 ||
		!strings.Contains(asJSON(logs[0]["dropped_tools"]), "web_search") || !strings.Contains(asJSON(logs[0]["dropped_tools"]), "tool_search") {
		t.Fatalf("dropped tools warning %v", logs)
	}

	// Turn 2 as recorded: the reasoning item (encrypted only), the
	// custom_tool_call and its output, then the final answer.
	up.setHandler(completion("Created hello.txt."))
	data = sendRecorded(t, p, rec[1].Headers, rec[1].Body)
	var final string
	for _, d := range data {
		if strings.Contains(d, `"type":"response.output_text.done"`) {
			var ev struct{ Text string }
			_ = json.Unmarshal([]byte(d), &ev)
			final = ev.Text
		}
	}
	if final != "Created hello.txt." {
		t.Fatalf("turn 2 text %q\n%s", final, strings.Join(data, "\n"))
	}
	calls = up.Calls()
	c2, _ := decodeChat(t, calls[1].Body)
	m := c2.Messages
	if len(m) != 5 || m[3].Role != "assistant" || len(m[3].ToolCalls) != 1 || m[3].ToolCalls[0].ID != callID ||
		m[3].ToolCalls[0].Function.Name != "apply_patch" || m[4].Role != "tool" || m[4].ToolCallID != callID {
		t.Fatalf("turn 2 roles %v body tail %s", roles(m), tail(string(calls[1].Body), 600))
	}
	var a map[string]string
	if json.Unmarshal([]byte(m[3].ToolCalls[0].Function.Arguments), &a) != nil || a["input"] != patch {
		t.Fatalf("turn 2 apply_patch arguments %q", m[3].ToolCalls[0].Function.Arguments)
	}
	if out, _ := m[4].Content.(string); !strings.HasPrefix(out, "<elided: 92 chars>") {
		t.Fatalf("turn 2 tool output %v", m[4].Content)
	}
	// No reasoning_field: the encrypted reasoning goes nowhere.
	if strings.Contains(string(calls[1].Body), "gAAAAAB") || strings.Contains(string(calls[1].Body), "encrypted") {
		t.Fatalf("encrypted reasoning reached the chat upstream")
	}
	// Same session on both turns: Codex's session-id header.
	if calls[1].Header.Get("X-Session-Affinity") != calls[0].Header.Get("X-Session-Affinity") {
		t.Fatalf("session changed between turns")
	}
}

func roles(ms []chatMsg) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Role)
	}
	return out
}

func asJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
