package responses

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// codexBodies returns the request bodies recorded from Codex 0.169.0.
func codexBodies(t testing.TB) [][]byte {
	t.Helper()
	raw, err := os.ReadFile("testdata/codex-0.169.0.responses.json")
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Requests []struct {
			Body json.RawMessage `json:"body"`
		} `json:"requests"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, r := range rec.Requests {
		out = append(out, r.Body)
	}
	return out
}

// toChat translates and decodes the chat body, failing the test on error.
func toChat(t testing.TB, body string, opt Options) (map[string]any, *Info) {
	t.Helper()
	out, info, err := ToChat(nil, []byte(body), opt)
	if err != nil {
		t.Fatalf("ToChat: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("chat body is not JSON: %v\n%s", err, out)
	}
	return m, info
}

func messages(m map[string]any) []map[string]any {
	var out []map[string]any
	for _, x := range m["messages"].([]any) {
		out = append(out, x.(map[string]any))
	}
	return out
}

func toolNames(m map[string]any) []string {
	var out []string
	tools, _ := m["tools"].([]any)
	for _, x := range tools {
		f := x.(map[string]any)["function"].(map[string]any)
		out = append(out, f["name"].(string))
	}
	return out
}

func findTool(m map[string]any, name string) map[string]any {
	tools, _ := m["tools"].([]any)
	for _, x := range tools {
		tool := x.(map[string]any)
		if tool["type"] != "function" {
			return nil
		}
		if f := tool["function"].(map[string]any); f["name"] == name {
			return f
		}
	}
	return nil
}

func TestToChatCodexTurn1(t *testing.T) {
	body := codexBodies(t)[0]
	m, info := toChat(t, string(body), Options{ReasoningField: "reasoning_content"})

	msgs := messages(m)
	// Two developer messages become one leading system message; then the
	// two user messages.
	if len(msgs) != 3 {
		t.Fatalf("got %d messages, want 3: %v", len(msgs), msgs)
	}
	if msgs[0]["role"] != "system" || !strings.Contains(msgs[0]["content"].(string), "<elided: 21459 chars>\n\n<elided: 4708 chars>") {
		t.Errorf("first message = %v, want the developer texts as one system message", msgs[0])
	}
	if msgs[2]["role"] != "user" || msgs[2]["content"] != "create hello.txt containing HELLO-e74f697d" {
		t.Errorf("last message = %v", msgs[2])
	}

	// Every function tool and apply_patch as a function; tool_search and
	// web_search dropped and reported.
	want := []string{"exec_command", "write_stdin", "request_user_input", "apply_patch", "view_image", "get_goal", "create_goal", "update_goal"}
	if got := toolNames(m); !reflect.DeepEqual(got, want) {
		t.Errorf("tools = %v, want %v", got, want)
	}
	ap := findTool(m, "apply_patch")
	params := ap["parameters"].(map[string]any)
	props := params["properties"].(map[string]any)
	if len(props) != 1 || props["input"].(map[string]any)["type"] != "string" || !reflect.DeepEqual(params["required"], []any{"input"}) {
		t.Errorf("apply_patch parameters = %v, want one required string input", params)
	}
	if d := ap["description"].(string); !strings.Contains(d, "lark grammar") || !strings.Contains(d, "<elided: 578 chars>") {
		t.Errorf("apply_patch description %q lacks its grammar", d)
	}
	if ex := findTool(m, "exec_command"); ex["strict"] != false || ex["parameters"].(map[string]any)["required"].([]any)[0] != "cmd" {
		t.Errorf("exec_command = %v", ex)
	}
	if !reflect.DeepEqual(info.DroppedTools, []string{"tool_search", "web_search"}) {
		t.Errorf("DroppedTools = %v", info.DroppedTools)
	}

	if m["reasoning_effort"] != "medium" || m["tool_choice"] != "auto" || m["parallel_tool_calls"] != true {
		t.Errorf("reasoning_effort/tool_choice/parallel_tool_calls = %v %v %v", m["reasoning_effort"], m["tool_choice"], m["parallel_tool_calls"])
	}
	if m["stream"] != true || !reflect.DeepEqual(m["stream_options"], map[string]any{"include_usage": true}) {
		t.Errorf("stream = %v, stream_options = %v", m["stream"], m["stream_options"])
	}
	if m["model"] != "gpt-coder" || info.Model != "gpt-coder" || !info.Stream {
		t.Errorf("model %v / info %+v", m["model"], info)
	}
	if info.PromptCacheKey != "01a2332f-0da6-7d01-b5d6-d4de1237f481" {
		t.Errorf("PromptCacheKey = %q", info.PromptCacheKey)
	}
	for _, k := range []string{"store", "include", "prompt_cache_key", "text", "client_metadata", "input", "reasoning", "response_format", "verbosity"} {
		if _, ok := m[k]; ok {
			t.Errorf("chat body has %q", k)
		}
	}
}

func TestToChatCodexTurn2(t *testing.T) {
	body := codexBodies(t)[1]
	// With a reasoning field: the reasoning item has only encrypted content,
	// so no reasoning text goes out either way.
	m, _ := toChat(t, string(body), Options{ReasoningField: "reasoning_content"})
	msgs := messages(m)
	if len(msgs) != 5 {
		t.Fatalf("got %d messages, want 5: %v", len(msgs), msgs)
	}
	asst, tool := msgs[3], msgs[4]
	if asst["role"] != "assistant" || asst["content"] != nil {
		t.Errorf("assistant = %v", asst)
	}
	if _, ok := asst["reasoning_content"]; ok {
		t.Errorf("encrypted reasoning leaked into %v", asst)
	}
	calls := asst["tool_calls"].([]any)
	call := calls[0].(map[string]any)
	fn := call["function"].(map[string]any)
	if len(calls) != 1 || call["id"] != "call_fide74f697d" || call["type"] != "function" || fn["name"] != "apply_patch" {
		t.Fatalf("tool call = %v", call)
	}
	var args map[string]string
	if err := json.Unmarshal([]byte(fn["arguments"].(string)), &args); err != nil {
		t.Fatal(err)
	}
	if args["input"] != "*** Begin Patch\n*** Add File: hello.txt\n+HELLO-e74f697d\n*** End Patch\n" || len(args) != 1 {
		t.Errorf("arguments = %q", fn["arguments"])
	}
	if tool["role"] != "tool" || tool["tool_call_id"] != "call_fide74f697d" || tool["content"] != "<elided: 92 chars>" {
		t.Errorf("tool message = %v", tool)
	}
}

// A stateless multi-turn conversation as Codex sends it on a later turn:
// reasoning with readable text, a message, parallel function calls, their
// outputs, a custom call and its output, the final answer, a new question.
func TestToChatMultiTurn(t *testing.T) {
	body := `{"model":"m","instructions":"be brief","input":[
	 {"type":"message","role":"user","content":[{"type":"input_text","text":"look around"}]},
	 {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"sum"}],"content":[{"type":"reasoning_text","text":"I should list files"}],"encrypted_content":"xx"},
	 {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Listing."}]},
	 {"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{\"cmd\":\"ls\"}"},
	 {"type":"function_call","call_id":"c2","name":"exec_command","arguments":"{\"cmd\":\"pwd\"}"},
	 {"type":"function_call_output","call_id":"c1","output":"a.txt"},
	 {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"/work"}]},
	 {"type":"reasoning","id":"rs_2","summary":[{"type":"summary_text","text":"patch it"}]},
	 {"type":"custom_tool_call","call_id":"c3","name":"apply_patch","input":"*** Begin Patch\n*** End Patch\n"},
	 {"type":"custom_tool_call_output","call_id":"c3","output":"Done!"},
	 {"type":"message","role":"assistant","content":[{"type":"output_text","text":"All done."}]},
	 {"role":"user","content":"thanks"}
	],"tools":[{"type":"function","name":"exec_command","parameters":{"type":"object"}},{"type":"custom","name":"apply_patch","format":{"type":"text"}}]}`

	m, _ := toChat(t, body, Options{ReasoningField: "reasoning_content"})
	msgs := messages(m)
	roles := make([]string, len(msgs))
	for i, x := range msgs {
		roles[i] = x["role"].(string)
	}
	wantRoles := []string{"system", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant", "user"}
	if !reflect.DeepEqual(roles, wantRoles) {
		t.Fatalf("roles = %v, want %v", roles, wantRoles)
	}
	if msgs[0]["content"] != "be brief" {
		t.Errorf("system = %v", msgs[0])
	}
	// Text and both calls in one assistant message, with the reasoning text.
	a := msgs[2]
	if a["content"] != "Listing." || a["reasoning_content"] != "I should list files" || len(a["tool_calls"].([]any)) != 2 {
		t.Errorf("assistant 1 = %v", a)
	}
	if msgs[4]["content"] != "/work" || msgs[4]["tool_call_id"] != "c2" {
		t.Errorf("tool 2 = %v", msgs[4])
	}
	// The summary is the reasoning text when there is no content.
	if msgs[5]["reasoning_content"] != "patch it" || msgs[5]["content"] != nil {
		t.Errorf("assistant 2 = %v", msgs[5])
	}
	if _, ok := msgs[7]["reasoning_content"]; ok || msgs[7]["content"] != "All done." {
		t.Errorf("assistant 3 = %v", msgs[7])
	}
	if msgs[8]["content"] != "thanks" {
		t.Errorf("user 2 = %v", msgs[8])
	}

	// Without a reasoning field, reasoning is dropped.
	m, _ = toChat(t, body, Options{})
	for _, x := range messages(m) {
		if _, ok := x["reasoning_content"]; ok {
			t.Errorf("reasoning without a reasoning field: %v", x)
		}
	}
}

// Namespace tools (MCP groups) and tools in an additional_tools input item
// become flat chat functions; calls in history map back to the flat names.
func TestToChatNamespaceAndAdditionalTools(t *testing.T) {
	body := `{"model":"m","input":[
	 {"type":"additional_tools","role":"developer","tools":[
	   {"type":"namespace","name":"mcp__docs__","description":"docs server","tools":[
	     {"type":"function","name":"search","description":"find docs","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}]},
	   {"type":"function","name":"late_tool","parameters":{"type":"object"}}]},
	 {"type":"message","role":"user","content":"find x"},
	 {"type":"function_call","call_id":"c1","name":"lookup","namespace":"crm","arguments":"{}"},
	 {"type":"function_call_output","call_id":"c1","output":"none"}
	],"tools":[
	 {"type":"namespace","name":"crm","description":"CRM","tools":[{"type":"function","name":"lookup","parameters":{"type":"object"}},{"type":"custom","name":"note"}]},
	 {"type":"function","name":"crm__lookup","parameters":{"type":"object"}},
	 {"type":"file_search","vector_store_ids":["v"]},{"type":"mcp","server_label":"x"}
	],"tool_choice":{"type":"function","name":"lookup","namespace":"crm"}}`
	m, info := toChat(t, body, Options{})
	want := []string{"crm__lookup", "crm__note", "crm__lookup_2", "mcp__docs__search", "late_tool"}
	if got := toolNames(m); !reflect.DeepEqual(got, want) {
		t.Fatalf("tools = %v, want %v", got, want)
	}
	if d := findTool(m, "mcp__docs__search")["description"]; d != "find docs" {
		t.Errorf("description = %v", d)
	}
	call := messages(m)[1]["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)
	if call["name"] != "crm__lookup" {
		t.Errorf("history call name = %v", call["name"])
	}
	if tc := m["tool_choice"].(map[string]any)["function"].(map[string]any)["name"]; tc != "crm__lookup" {
		t.Errorf("tool_choice = %v", m["tool_choice"])
	}
	if !reflect.DeepEqual(info.DroppedTools, []string{"file_search", "mcp"}) {
		t.Errorf("DroppedTools = %v", info.DroppedTools)
	}
	// The mapping back, as the answer translation uses it.
	for chat, want := range map[string]toolName{
		"crm__lookup":       {chat: "crm__lookup", name: "lookup", namespace: "crm"},
		"crm__lookup_2":     {chat: "crm__lookup_2", name: "crm__lookup"},
		"crm__note":         {chat: "crm__note", name: "note", namespace: "crm", kind: kindCustom},
		"mcp__docs__search": {chat: "mcp__docs__search", name: "search", namespace: "mcp__docs__"},
		"unknown":           {chat: "unknown", name: "unknown"},
	} {
		if got := info.lookup([]byte(chat)); got != want {
			t.Errorf("lookup(%q) = %+v, want %+v", chat, got, want)
		}
	}
}

func TestToChatParameters(t *testing.T) {
	body := `{"model":"m","input":"hi","max_output_tokens":300,"temperature":0.2,"top_p":0.9,
	 "safety_identifier":"u-1","store":true,"include":["x"],"metadata":{"a":"b"},"stream":false,
	 "text":{"format":{"type":"json_schema","name":"answer","strict":true,"schema":{"type":"object","properties":{"n":{"type":"integer"}}}},"verbosity":"low"},
	 "reasoning":{"effort":"high","summary":"auto"}}`
	m, info := toChat(t, body, Options{})
	want := map[string]any{
		"model":            "m",
		"messages":         []any{map[string]any{"role": "user", "content": "hi"}},
		"max_tokens":       300.0,
		"temperature":      0.2,
		"top_p":            0.9,
		"user":             "u-1",
		"reasoning_effort": "high",
		"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{
			"name": "answer", "strict": true,
			"schema": map[string]any{"type": "object", "properties": map[string]any{"n": map[string]any{"type": "integer"}}},
		}},
	}
	if !reflect.DeepEqual(m, want) {
		t.Errorf("chat body\n got %v\nwant %v", m, want)
	}
	if info.Stream {
		t.Error("Stream for stream:false")
	}

	m, _ = toChat(t, `{"model":"m","input":"hi","text":{"format":{"type":"json_object"}},"user":"a","safety_identifier":"b"}`, Options{})
	if !reflect.DeepEqual(m["response_format"], map[string]any{"type": "json_object"}) || m["user"] != "a" {
		t.Errorf("json_object / user: %v", m)
	}
	m, _ = toChat(t, `{"model":"m","input":"hi","text":{"format":{"type":"text"}},"tool_choice":"required"}`, Options{})
	if _, ok := m["response_format"]; ok {
		t.Errorf("text format became %v", m["response_format"])
	}
	if _, ok := m["tool_choice"]; ok {
		t.Error("tool_choice without tools")
	}
}

func TestToChatImages(t *testing.T) {
	body := `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"what is this"},{"type":"input_image","image_url":"data:image/png;base64,AAAA","detail":"high"},{"type":"input_file","file_id":"f"}]}]}`
	m, info := toChat(t, body, Options{})
	want := []any{
		map[string]any{"type": "text", "text": "what is this"},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64,AAAA", "detail": "high"}},
	}
	if got := messages(m)[0]["content"]; !reflect.DeepEqual(got, want) {
		t.Errorf("content = %v", got)
	}
	if !reflect.DeepEqual(info.DroppedItems, []string{"input_file"}) {
		t.Errorf("DroppedItems = %v", info.DroppedItems)
	}
}

func TestToChatRejects(t *testing.T) {
	for _, tc := range []struct{ body, code, param string }{
		{`{"model":"m","input":"hi","previous_response_id":"resp_1"}`, "unsupported_parameter", "previous_response_id"},
		{`{"model":"m","input":"hi","conversation":"conv_1"}`, "unsupported_parameter", "conversation"},
		{`{"model":"m","prompt":{"id":"p"}}`, "unsupported_parameter", "prompt"},
		{`{"model":"m","input":"hi","background":true}`, "unsupported_parameter", "background"},
		{`{"model":"m","input":[{"type":"item_reference","id":"msg_1"}]}`, "unsupported_parameter", "input"},
		{`{"model":"m","input":[{"type":"message","role":"wizard","content":"x"}]}`, "invalid_value", "input"},
		{`{"model":"m","input":42}`, "invalid_value", "input"},
		{`[1,2]`, "invalid_json", ""},
		{`{"model":`, "invalid_json", ""},
	} {
		_, _, err := ToChat(nil, []byte(tc.body), Options{})
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || e.Code != tc.code || e.Param != tc.param {
			t.Errorf("%s: err = %#v, want 400 %s (%s)", tc.body, err, tc.code, tc.param)
			continue
		}
		var shape struct {
			Error struct{ Message, Type, Code, Param string }
		}
		if err := json.Unmarshal(e.Body(), &shape); err != nil || shape.Error.Code != tc.code || shape.Error.Type != "invalid_request_error" || shape.Error.Message == "" {
			t.Errorf("%s: body %s", tc.body, e.Body())
		}
	}
	// previous_response_id: null is the same as absent.
	if _, _, err := ToChat(nil, []byte(`{"model":"m","input":"hi","previous_response_id":null}`), Options{}); err != nil {
		t.Errorf("null previous_response_id: %v", err)
	}
}
