package responses

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// chatChunk renders one chat.completion.chunk SSE event with the given
// delta (a JSON object) and finish reason ("" = null).
func chatChunk(delta, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"qwen3-coder","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + "}]}\n\n"
}

const usageChunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"qwen3-coder","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":30,"total_tokens":150,"prompt_tokens_details":{"cached_tokens":100},"completion_tokens_details":{"reasoning_tokens":7}}}` + "\n\n"

func jsonStr(s string) string { b, _ := json.Marshal(s); return string(b) }

// event is one parsed output event.
type event struct {
	name string
	data map[string]any
	raw  string
}

// parseEvents checks the framing of a translated stream (every event named
// after its type, sequence numbers 0, 1, 2 …, data valid JSON, no [DONE])
// and returns its events.
func parseEvents(t testing.TB, out []byte) []event {
	t.Helper()
	if !bytes.HasSuffix(out, []byte("\n\n")) && len(out) > 0 {
		t.Fatalf("stream does not end with a blank line: %q", out)
	}
	var evs []event
	for i, block := range strings.Split(strings.TrimSuffix(string(out), "\n\n"), "\n\n") {
		if block == "" {
			continue
		}
		lines := strings.Split(block, "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "event: ") || !strings.HasPrefix(lines[1], "data: ") {
			t.Fatalf("event %d is not event+data: %q", i, block)
		}
		name, data := lines[0][7:], lines[1][6:]
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("event %d data is not JSON: %v: %s", i, err, data)
		}
		if m["type"] != name {
			t.Fatalf("event %d: name %q, type %v", i, name, m["type"])
		}
		if m["sequence_number"] != float64(i) {
			t.Fatalf("event %d: sequence_number %v", i, m["sequence_number"])
		}
		if _, ok := m["error"]; ok {
			t.Fatalf("event %d has a top-level error (SDKs read it as a stream error): %s", i, data)
		}
		evs = append(evs, event{name: name, data: m, raw: data})
	}
	return evs
}

func names(evs []event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.name
	}
	return out
}

// run feeds upstream to a fresh Stream in chunks of the sizes next returns
// and closes it. ids and created_at are fixed so outputs compare equal.
func run(t testing.TB, info *Info, upstream string, next func() int) []byte {
	t.Helper()
	var out []byte
	s := NewStream(info, func(ev []byte) error { out = append(out, ev...); return nil })
	copy(s.ids.base[:], "0123456789abcdef01234567")
	s.h.created = 1700000000
	b := []byte(upstream)
	for len(b) > 0 {
		n := min(next(), len(b))
		if _, err := s.Write(b[:n]); err != nil {
			t.Fatal(err)
		}
		b = b[n:]
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !s.Finished() {
		t.Fatal("not finished after Close")
	}
	return out
}

func whole() int { return 1 << 30 }

func infoFor(t testing.TB, body string) *Info {
	t.Helper()
	_, info, err := ToChat(nil, []byte(body), Options{})
	if err != nil {
		t.Fatal(err)
	}
	return info
}

const toolsBody = `{"model":"gpt-coder","stream":true,"input":"x","tools":[
 {"type":"function","name":"exec_command","parameters":{"type":"object"}},
 {"type":"custom","name":"apply_patch","format":{"type":"grammar","syntax":"lark","definition":"start: x"}},
 {"type":"namespace","name":"crm","description":"CRM","tools":[{"type":"function","name":"lookup","parameters":{"type":"object"}}]}]}`

func TestStreamReasoningTextUsage(t *testing.T) {
	up := chatChunk(`{"role":"assistant","content":""}`, "") +
		chatChunk(`{"reasoning_content":"Let me "}`, "") +
		chatChunk(`{"reasoning_content":"think."}`, "") +
		chatChunk(`{"content":"Hello \"wo"}`, "") +
		chatChunk(`{"content":"rld\" \u00e9\n"}`, "") +
		chatChunk(`{}`, "stop") + usageChunk + "data: [DONE]\n\n"
	evs := parseEvents(t, run(t, infoFor(t, `{"model":"m","input":"x","stream":true}`), up, whole))
	want := []string{
		"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added",
		"response.reasoning_text.delta", "response.reasoning_text.delta",
		"response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.completed",
	}
	if got := names(evs); !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
	created := evs[0].data["response"].(map[string]any)
	if created["status"] != "in_progress" || created["model"] != "qwen3-coder" || len(created["output"].([]any)) != 0 || created["usage"] != nil {
		t.Errorf("created = %v", created)
	}
	if evs[13].data["text"] != "Hello \"world\" é\n" || evs[6].data["text"] != "Let me think." {
		t.Errorf("done texts %q %q", evs[13].data["text"], evs[6].data["text"])
	}
	final := evs[16].data["response"].(map[string]any)
	if final["status"] != "completed" || final["model"] != "qwen3-coder" || final["object"] != "response" {
		t.Errorf("completed = %v", final)
	}
	if id := final["id"].(string); !strings.HasPrefix(id, "resp_") || id != created["id"] {
		t.Errorf("response ids %v / %v", id, created["id"])
	}
	wantUsage := map[string]any{"input_tokens": 120.0, "input_tokens_details": map[string]any{"cached_tokens": 100.0},
		"output_tokens": 30.0, "output_tokens_details": map[string]any{"reasoning_tokens": 7.0}, "total_tokens": 150.0}
	if !reflect.DeepEqual(final["usage"], wantUsage) {
		t.Errorf("usage = %v", final["usage"])
	}
	out := final["output"].([]any)
	if len(out) != 2 {
		t.Fatalf("output = %v", out)
	}
	rs, msg := out[0].(map[string]any), out[1].(map[string]any)
	if rs["type"] != "reasoning" || !reflect.DeepEqual(rs["content"], []any{map[string]any{"type": "reasoning_text", "text": "Let me think."}}) || !reflect.DeepEqual(rs["summary"], []any{}) {
		t.Errorf("reasoning item = %v", rs)
	}
	if msg["type"] != "message" || msg["role"] != "assistant" || msg["status"] != "completed" ||
		msg["content"].([]any)[0].(map[string]any)["text"] != "Hello \"world\" é\n" {
		t.Errorf("message item = %v", msg)
	}
	// Item ids are consistent across the item's events.
	if evs[11].data["item_id"] != msg["id"] || evs[4].data["item_id"] != rs["id"] || msg["id"] == rs["id"] {
		t.Errorf("item ids: delta %v msg %v rs %v", evs[11].data["item_id"], msg["id"], rs["id"])
	}
	if !reflect.DeepEqual(evs[15].data["item"], msg) {
		t.Errorf("output_item.done %v != final %v", evs[15].data["item"], msg)
	}
}

// The patch text of a custom tool call reaches the client unchanged, however
// the model's JSON arguments were cut into deltas (inside escapes too).
func TestStreamCustomToolMultiline(t *testing.T) {
	patch := "*** Begin Patch\n*** Update File: a.go\n@@ func f() {\n-\treturn \"x\"\n+\treturn \"y\\n\" // ✓ 😀\n*** End Patch\n"
	args := `{"input": ` + jsonStr(patch) + `}`
	pieces := []string{}
	for i := 0; i < len(args); i += 3 { // cuts through \n, \" and UTF-8 sequences of the args text
		pieces = append(pieces, args[i:min(i+3, len(args))])
	}
	up := chatChunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"apply_patch","arguments":""}}]}`, "")
	for _, p := range pieces {
		// Each piece as its own JSON string; pieces cut inside a UTF-8
		// sequence are sent as raw bytes, as a sloppy server might.
		up += chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":`+rawStr(p)+`}}]}`, "")
	}
	up += chatChunk(`{}`, "tool_calls") + usageChunk + "data: [DONE]\n\n"

	info := infoFor(t, toolsBody)
	evs := parseEvents(t, run(t, info, up, whole))
	var deltas strings.Builder
	var done, item map[string]any
	for _, e := range evs {
		switch e.name {
		case "response.custom_tool_call_input.delta":
			deltas.WriteString(e.data["delta"].(string))
		case "response.custom_tool_call_input.done":
			done = e.data
		case "response.output_item.done":
			item = e.data["item"].(map[string]any)
		case "response.function_call_arguments.delta":
			t.Errorf("function event for a custom tool: %s", e.raw)
		}
	}
	if deltas.String() != patch {
		t.Errorf("deltas joined = %q, want %q", deltas.String(), patch)
	}
	if done["input"] != patch {
		t.Errorf("done input = %q", done["input"])
	}
	if item["type"] != "custom_tool_call" || item["input"] != patch || item["name"] != "apply_patch" || item["call_id"] != "call_abc" || !strings.HasPrefix(item["id"].(string), "ctc_") {
		t.Errorf("item = %v", item)
	}
	final := evs[len(evs)-1]
	if final.name != "response.completed" || !reflect.DeepEqual(final.data["response"].(map[string]any)["output"], []any{item}) {
		t.Errorf("final = %s", final.raw)
	}

	// The same call non-streamed.
	chat := `{"id":"c","object":"chat.completion","created":1,"model":"qwen3-coder","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_abc","type":"function","function":{"name":"apply_patch","arguments":` + jsonStr(args) + `}}]},"finish_reason":"tool_calls"}]}`
	r := fromChat(t, chat, info)
	got := r["output"].([]any)[0].(map[string]any)
	if got["type"] != "custom_tool_call" || got["input"] != patch || got["call_id"] != "call_abc" {
		t.Errorf("non-stream item = %v", got)
	}
}

// rawStr quotes s as a JSON string but leaves bytes ≥ 0x80 raw, even
// when they are an incomplete UTF-8 sequence.
func rawStr(s string) string {
	var b []byte
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, fmt.Sprintf(`\u%04x`, c)...)
		default:
			b = append(b, c)
		}
	}
	return string(append(b, '"'))
}

// A custom tool whose model ignored the {"input": …} schema still gets all
// it wrote as the input.
func TestStreamCustomToolFallback(t *testing.T) {
	up := chatChunk(`{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"apply_patch","arguments":"*** Begin"}}]}`, "") +
		chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":" Patch\n"}}]}`, "tool_calls") + "data: [DONE]\n\n"
	evs := parseEvents(t, run(t, infoFor(t, toolsBody), up, whole))
	var deltas string
	for _, e := range evs {
		if e.name == "response.custom_tool_call_input.delta" {
			deltas += e.data["delta"].(string)
		}
		if e.name == "response.custom_tool_call_input.done" && e.data["input"] != "*** Begin Patch\n" {
			t.Errorf("done = %s", e.raw)
		}
	}
	if deltas != "*** Begin Patch\n" {
		t.Errorf("deltas = %q", deltas)
	}
}

func TestStreamFunctionCalls(t *testing.T) {
	up := chatChunk(`{"role":"assistant","content":"Checking."}`, "") +
		chatChunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"exec_command","arguments":""}}]}`, "") +
		chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"cmd\":"}}]}`, "") +
		chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"\"ls\"}"}}]}`, "") +
		chatChunk(`{"tool_calls":[{"index":1,"id":"","type":"function","function":{"name":"crm__lookup","arguments":"{}"}}]}`, "") +
		chatChunk(`{}`, "tool_calls") + "data: [DONE]\n\n"
	evs := parseEvents(t, run(t, infoFor(t, toolsBody), up, whole))
	var items []map[string]any
	var argDeltas []string
	for _, e := range evs {
		switch e.name {
		case "response.output_item.done":
			items = append(items, e.data["item"].(map[string]any))
		case "response.function_call_arguments.delta":
			argDeltas = append(argDeltas, e.data["delta"].(string))
		case "response.function_call_arguments.done":
			if e.data["output_index"] == 1.0 && (e.data["arguments"] != `{"cmd":"ls"}` || e.data["name"] != "exec_command") {
				t.Errorf("arguments.done = %s", e.raw)
			}
		}
	}
	if len(items) != 3 {
		t.Fatalf("items = %v", items)
	}
	fc := items[1]
	if fc["type"] != "function_call" || fc["name"] != "exec_command" || fc["arguments"] != `{"cmd":"ls"}` || fc["call_id"] != "call_1" || !strings.HasPrefix(fc["id"].(string), "fc_") {
		t.Errorf("function_call = %v", fc)
	}
	if !reflect.DeepEqual(argDeltas, []string{`{"cmd":`, `"ls"}`, `{}`}) {
		t.Errorf("argument deltas = %q", argDeltas)
	}
	// A namespace tool maps back to its name and namespace; an upstream
	// without call ids gets generated ones.
	ns := items[2]
	if ns["name"] != "lookup" || ns["namespace"] != "crm" || !strings.HasPrefix(ns["call_id"].(string), "call_") || ns["call_id"] == fc["call_id"] {
		t.Errorf("namespace call = %v", ns)
	}
	if final := evs[len(evs)-1].data["response"].(map[string]any); final["usage"] != nil {
		t.Errorf("usage without a usage chunk = %v", final["usage"])
	}
}

// Any chunking of the upstream bytes gives the same output, byte for byte.
func TestStreamChunkings(t *testing.T) {
	patch := "line 1\n\tline \"2\" ✓\n"
	up := chatChunk(`{"role":"assistant","reasoning_content":"hm ✓"}`, "") +
		chatChunk(`{"content":"text \u00e9"}`, "") +
		chatChunk(`{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"apply_patch","arguments":`+jsonStr(`{"input":`+jsonStr(patch)+`}`)+`}}]}`, "") +
		chatChunk(`{"tool_calls":[{"index":1,"id":"call_2","function":{"name":"exec_command","arguments":"{\"cmd\":\"ls\"}"}}]}`, "") +
		chatChunk(`{}`, "tool_calls") + usageChunk + "data: [DONE]\n\n"
	info := infoFor(t, toolsBody)
	ref := run(t, info, up, whole)
	parseEvents(t, ref)

	crlf := strings.ReplaceAll(up, "\n", "\r\n")
	if got := run(t, info, crlf, whole); !bytes.Equal(got, ref) {
		t.Errorf("CRLF framing differs:\n%s\n---\n%s", got, ref)
	}
	if got := run(t, info, up, func() int { return 1 }); !bytes.Equal(got, ref) {
		t.Errorf("byte-by-byte differs:\n%s\n---\n%s", got, ref)
	}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 50; i++ {
		if got := run(t, info, up, func() int { return 1 + rng.Intn(40) }); !bytes.Equal(got, ref) {
			t.Fatalf("random chunking %d differs:\n%s\n---\n%s", i, got, ref)
		}
	}
	// No [DONE] and no final blank line: Close finishes the same way.
	noDone := strings.TrimSuffix(up, "data: [DONE]\n\n")
	noDone = strings.TrimSuffix(noDone, "\n\n")
	if got := run(t, info, noDone, whole); !bytes.Equal(got, ref) {
		t.Errorf("stream without [DONE] differs:\n%s\n---\n%s", got, ref)
	}
}

func TestStreamIncomplete(t *testing.T) {
	up := chatChunk(`{"content":"cut"}`, "length") + "data: [DONE]\n\n"
	evs := parseEvents(t, run(t, infoFor(t, `{"model":"m","input":"x","max_output_tokens":5}`), up, whole))
	final := evs[len(evs)-1]
	r := final.data["response"].(map[string]any)
	if final.name != "response.incomplete" || r["status"] != "incomplete" ||
		!reflect.DeepEqual(r["incomplete_details"], map[string]any{"reason": "max_output_tokens"}) || r["max_output_tokens"] != 5.0 {
		t.Errorf("final = %s", final.raw)
	}
	if st := r["output"].([]any)[0].(map[string]any)["status"]; st != "incomplete" {
		t.Errorf("message status = %v", st)
	}
}

func TestStreamFail(t *testing.T) {
	var out []byte
	s := NewStream(infoFor(t, `{"model":"m","input":"x"}`), func(ev []byte) error { out = append(out, ev...); return nil })
	_, _ = s.Write([]byte(chatChunk(`{"content":"partial"}`, "")))
	if err := s.Fail("stream_interrupted", "upstream connection lost"); err != nil {
		t.Fatal(err)
	}
	if !s.Finished() {
		t.Error("not finished after Fail")
	}
	// Nothing more after the final event.
	_, _ = s.Write([]byte(chatChunk(`{"content":"late"}`, "stop")))
	_ = s.Close()
	_ = s.Fail("x", "y")
	evs := parseEvents(t, out)
	last := evs[len(evs)-1]
	r := last.data["response"].(map[string]any)
	if last.name != "response.failed" || r["status"] != "failed" ||
		!reflect.DeepEqual(r["error"], map[string]any{"code": "stream_interrupted", "message": "upstream connection lost"}) {
		t.Errorf("last = %s", last.raw)
	}
	if n := names(evs); n[len(n)-2] != "response.output_text.delta" {
		t.Errorf("events = %v", n)
	}

	// Fail before any upstream byte still gives a well-formed stream.
	out = nil
	s = NewStream(infoFor(t, `{"model":"m","input":"x"}`), func(ev []byte) error { out = append(out, ev...); return nil })
	_ = s.Fail("stream_stalled", "no data")
	if n := names(parseEvents(t, out)); !reflect.DeepEqual(n, []string{"response.created", "response.in_progress", "response.failed"}) {
		t.Errorf("events = %v", n)
	}

	// An error object inside the stream ends it as failed too.
	up := chatChunk(`{"content":"a"}`, "") + `data: {"error":{"message":"model crashed","code":"oom"}}` + "\n\n"
	evs = parseEvents(t, run(t, infoFor(t, `{"model":"m","input":"x"}`), up, whole))
	r = evs[len(evs)-1].data["response"].(map[string]any)
	if !reflect.DeepEqual(r["error"], map[string]any{"code": "oom", "message": "model crashed"}) {
		t.Errorf("in-stream error = %v", r["error"])
	}
}

// An emit error stops the stream and is returned from then on.
func TestStreamEmitError(t *testing.T) {
	calls := 0
	s := NewStream(infoFor(t, `{"model":"m","input":"x"}`), func([]byte) error { calls++; return fmt.Errorf("client gone") })
	if _, err := s.Write([]byte(chatChunk(`{"content":"a"}`, "") + chatChunk(`{"content":"b"}`, ""))); err == nil {
		t.Fatal("no error from Write")
	}
	if err := s.Close(); err == nil {
		t.Fatal("no error from Close")
	}
	if calls != 1 {
		t.Errorf("emit called %d times after failing", calls)
	}
}

func fromChat(t testing.TB, chat string, info *Info) map[string]any {
	t.Helper()
	out, err := FromChat(nil, []byte(chat), info)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return m
}

func TestFromChat(t *testing.T) {
	info := infoFor(t, toolsBody)
	chat := `{"id":"chatcmpl-9","object":"chat.completion","created":1700000001,"model":"qwen3-coder",
	 "choices":[{"index":0,"message":{"role":"assistant","content":"Running it.","reasoning_content":"need ls",
	  "tool_calls":[{"id":"call_9","type":"function","function":{"name":"exec_command","arguments":"{\"cmd\":\"ls\"}"}},
	                {"id":"call_10","type":"function","function":{"name":"crm__lookup","arguments":{"q":1}}}]},"finish_reason":"tool_calls"}],
	 "usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}}}`
	r := fromChat(t, chat, info)
	if r["object"] != "response" || r["status"] != "completed" || r["model"] != "qwen3-coder" || r["created_at"] != 1700000001.0 || !strings.HasPrefix(r["id"].(string), "resp_") {
		t.Errorf("response = %v", r)
	}
	out := r["output"].([]any)
	if len(out) != 4 {
		t.Fatalf("output = %v", out)
	}
	types := []string{}
	for _, x := range out {
		types = append(types, x.(map[string]any)["type"].(string))
	}
	if !reflect.DeepEqual(types, []string{"reasoning", "message", "function_call", "function_call"}) {
		t.Errorf("types = %v", types)
	}
	msg := out[1].(map[string]any)
	if !reflect.DeepEqual(msg["content"], []any{map[string]any{"type": "output_text", "text": "Running it.", "annotations": []any{}, "logprobs": []any{}}}) {
		t.Errorf("message = %v", msg)
	}
	fc := out[2].(map[string]any)
	if fc["call_id"] != "call_9" || fc["arguments"] != `{"cmd":"ls"}` || fc["status"] != "completed" || !strings.HasPrefix(fc["id"].(string), "fc_") {
		t.Errorf("function_call = %v", fc)
	}
	ns := out[3].(map[string]any)
	if ns["name"] != "lookup" || ns["namespace"] != "crm" || ns["arguments"] != `{"q":1}` {
		t.Errorf("namespace call = %v", ns)
	}
	u := r["usage"].(map[string]any)
	if u["input_tokens"] != 10.0 || u["output_tokens"] != 5.0 || u["total_tokens"] != 15.0 || u["input_tokens_details"].(map[string]any)["cached_tokens"] != 4.0 {
		t.Errorf("usage = %v", u)
	}
	// Ids are unique across responses.
	if r2 := fromChat(t, chat, info); r2["id"] == r["id"] || r2["output"].([]any)[1].(map[string]any)["id"] == msg["id"] {
		t.Errorf("ids repeat across responses: %v", r2["id"])
	}

	if _, err := FromChat(nil, []byte(`{"choices":[]}`), info); err != ErrNotCompletion {
		t.Errorf("empty choices: %v", err)
	}
	// Length → incomplete.
	r = fromChat(t, `{"choices":[{"message":{"content":"cut"},"finish_reason":"length"}]}`, info)
	if r["status"] != "incomplete" || r["model"] != "gpt-coder" || r["usage"] != nil {
		t.Errorf("incomplete = %v", r)
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		status         int
		body           string
		msg, typ, code string
	}{
		{400, `{"error":{"message":"context too long","type":"invalid_request_error","code":"context_length_exceeded","param":"messages"}}`, "context too long", "invalid_request_error", "context_length_exceeded"},
		{400, `{"error":{"code":400,"message":"bad grammar","type":"invalid_request_error"}}`, "bad grammar", "invalid_request_error", "400"},
		{500, `{"error":"boom"}`, "boom", "server_error", ""},
		{422, `{"detail":"unprocessable"}`, "unprocessable", "invalid_request_error", ""},
		{502, `<html>bad gateway</html>`, "upstream answered 502 Bad Gateway", "server_error", ""},
		{429, ``, "upstream answered 429 Too Many Requests", "rate_limit_error", ""},
	} {
		var e struct {
			Error struct {
				Message, Type string
				Code          *string
			}
		}
		b := TranslateError(tc.status, []byte(tc.body))
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		code := ""
		if e.Error.Code != nil {
			code = *e.Error.Code
		}
		if e.Error.Message != tc.msg || e.Error.Type != tc.typ || code != tc.code {
			t.Errorf("TranslateError(%d, %s) = %s", tc.status, tc.body, b)
		}
	}
	var e map[string]map[string]any
	if err := json.Unmarshal(ErrorBody(503, "all_upstreams_busy", "all upstreams busy"), &e); err != nil ||
		e["error"]["code"] != "all_upstreams_busy" || e["error"]["type"] != "server_error" || e["error"]["message"] != "all upstreams busy" {
		t.Errorf("ErrorBody = %v", e)
	}
}

// Servers that name the field "reasoning" (Ollama, newer vLLM) give the
// same reasoning item; content_filter ends as incomplete.
func TestStreamReasoningFieldAndContentFilter(t *testing.T) {
	up := chatChunk(`{"reasoning":"hmm"}`, "") + chatChunk(`{"content":"no"}`, "content_filter") + "data: [DONE]\n\n"
	evs := parseEvents(t, run(t, infoFor(t, `{"model":"m","input":"x"}`), up, whole))
	final := evs[len(evs)-1]
	r := final.data["response"].(map[string]any)
	out := r["output"].([]any)
	if final.name != "response.incomplete" || !reflect.DeepEqual(r["incomplete_details"], map[string]any{"reason": "content_filter"}) || len(out) != 2 {
		t.Fatalf("final = %s", final.raw)
	}
	if rs := out[0].(map[string]any); rs["type"] != "reasoning" || rs["content"].([]any)[0].(map[string]any)["text"] != "hmm" {
		t.Errorf("reasoning = %v", rs)
	}
}

// A pretty-printed request (valid JSON with line breaks inside the fields
// a Response echoes: reasoning, text, metadata) still gives well-framed
// events: the echo is compacted, so no line break ends a data line early.
func TestStreamEchoOfPrettyRequest(t *testing.T) {
	body := "{\n  \"model\": \"m\",\n  \"stream\": true,\n  \"input\": \"x\",\n  \"reasoning\": {\n    \"effort\": \"medium\"\n  },\n" +
		"  \"text\": {\r\n    \"verbosity\": \"low\"\r\n  },\n  \"metadata\": {\n    \"k\": \"a\\nb\"\n  },\n  \"instructions\": \"be\\nbrief\"\n}"
	out := run(t, infoFor(t, body), chatChunk(`{"role":"assistant","content":"hi"}`, "stop")+"data: [DONE]\n\n", whole)
	evs := parseEvents(t, out)
	resp := evs[0].data["response"].(map[string]any)
	if resp["reasoning"].(map[string]any)["effort"] != "medium" || resp["text"].(map[string]any)["verbosity"] != "low" ||
		resp["metadata"].(map[string]any)["k"] != "a\nb" || resp["instructions"] != "be\nbrief" {
		t.Fatalf("echo %v", resp)
	}
	whole, err := FromChat(nil, []byte(`{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}`), infoFor(t, body))
	if err != nil || bytes.ContainsAny(whole, "\r\n") {
		t.Fatalf("non-stream answer %q (%v)", whole, err)
	}
}
