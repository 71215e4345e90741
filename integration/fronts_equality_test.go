package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	anthropic "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// The equality tests: one conversation answered by a native fake and by a
// chat-only fake whose answers correspond (same reasoning, text, tool call,
// usage) must give the SDK equal results, field by field, streamed or not.
// The only fields allowed to differ are ids the proxy legitimately
// generates for a translated answer (listed per front); those are checked
// for shape and uniqueness instead.

// The answer both kinds of fake give.
const (
	eqThinking = "The user wants the weather."
	eqText     = "Let me check."
	eqCallID   = "call_w1"
	eqTool     = "get_weather"
	eqArgs     = `{"city":"Paris"}`
	// chat usage: prompt 10 of which 4 cached, completion 5.
)

// eqChat is the chat-only fake: a DeepSeek-style completion with
// reasoning_content, text and one tool call, or its stream with the usage in
// a last choice-less chunk (as OpenAI sends it for include_usage).
func eqChat() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !isStream(r) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"chatcmpl-eq","object":"chat.completion","created":1700000000,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","reasoning_content":%q,"content":%q,"tool_calls":[{"id":%q,"type":"function","function":{"name":%q,"arguments":%q}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}}}`,
				eqThinking, eqText, eqCallID, eqTool, eqArgs)
			return
		}
		c := func(delta, finish string) string { return "data: " + chunk(delta, finish) + "\n\n" }
		writeStream(w, []string{
			c(`{"role":"assistant","reasoning_content":"The user "}`, ""),
			c(`{"reasoning_content":"wants the weather."}`, ""),
			c(`{"content":"Let me "}`, ""),
			c(`{"content":"check."}`, ""),
			c(fmt.Sprintf(`{"tool_calls":[{"index":0,"id":%q,"type":"function","function":{"name":%q,"arguments":""}}]}`, eqCallID, eqTool), ""),
			c(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}`, ""),
			c(`{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}`, ""),
			c(`{}`, "tool_calls"),
			`data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}}}` + "\n\n",
			"data: [DONE]\n\n",
		}, 0)
	}
}

// eqNativeMessages answers like llama.cpp's /v1/messages: the same answer
// as eqChat in Messages terms (input_tokens excludes the cache read).
func eqNativeMessages() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !isStream(r) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"msg_native_eq","type":"message","role":"assistant","model":"real-model","content":[{"type":"thinking","thinking":%q,"signature":""},{"type":"text","text":%q},{"type":"tool_use","id":%q,"name":%q,"input":%s}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":6,"cache_read_input_tokens":4,"output_tokens":5}}`,
				eqThinking, eqText, eqCallID, eqTool, eqArgs)
			return
		}
		var events []string
		ev := func(name, data string) { events = append(events, "event: "+name+"\ndata: "+data+"\n\n") }
		ev("message_start", `{"type":"message_start","message":{"id":"msg_native_eq","type":"message","role":"assistant","model":"real-model","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":6,"cache_read_input_tokens":4,"output_tokens":0}}}`)
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`)
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"The user "}}`)
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"wants the weather."}}`)
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":""}}`)
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
		ev("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`)
		ev("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Let me "}}`)
		ev("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"check."}}`)
		ev("content_block_stop", `{"type":"content_block_stop","index":1}`)
		ev("content_block_start", fmt.Sprintf(`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":%q,"name":%q,"input":{}}}`, eqCallID, eqTool))
		ev("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}`)
		ev("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"Paris\"}"}}`)
		ev("content_block_stop", `{"type":"content_block_stop","index":2}`)
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":5}}`)
		ev("message_stop", `{"type":"message_stop"}`)
		writeStream(w, events, 0)
	}
}

// sdkView is an SDK result as generic JSON: its exported fields by their
// json names, without the SDK's JSON metadata (raw text, field presence),
// and with every json.RawMessage (a tool's input) parsed, so that key
// order and whitespace do not count.
func sdkView(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	var x any
	if err := json.Unmarshal(b, &x); err != nil {
		t.Fatal(err)
	}
	var strip func(any) any
	strip = func(x any) any {
		switch x := x.(type) {
		case map[string]any:
			delete(x, "JSON")
			for k, v := range x {
				x[k] = strip(v)
			}
		case []any:
			for i := range x {
				x[i] = strip(x[i])
			}
		}
		return x
	}
	return strip(x)
}

// diffViews lists the paths (a.b.0.c) where a and b differ, skipping the
// paths that match one of the ignore patterns (`*` matches one element).
func diffViews(a, b any, ignore ...string) []string {
	var out []string
	var walk func(path string, a, b any)
	skip := func(path string) bool {
		for _, pat := range ignore {
			if ok, _ := matchPath(pat, path); ok {
				return true
			}
		}
		return false
	}
	walk = func(path string, a, b any) {
		if skip(path) {
			return
		}
		am, aok := a.(map[string]any)
		bm, bok := b.(map[string]any)
		if aok && bok {
			keys := map[string]bool{}
			for k := range am {
				keys[k] = true
			}
			for k := range bm {
				keys[k] = true
			}
			for k := range keys {
				walk(strings.TrimPrefix(path+"."+k, "."), am[k], bm[k])
			}
			return
		}
		as, aok := a.([]any)
		bs, bok := b.([]any)
		if aok && bok && len(as) == len(bs) {
			for i := range as {
				walk(fmt.Sprintf("%s.%d", path, i), as[i], bs[i])
			}
			return
		}
		if !reflect.DeepEqual(a, b) {
			ja, _ := json.Marshal(a)
			jb, _ := json.Marshal(b)
			out = append(out, fmt.Sprintf("%s: %s != %s", path, ja, jb))
		}
	}
	walk("", a, b)
	sort.Strings(out)
	return out
}

func matchPath(pat, path string) (bool, error) {
	ps, xs := strings.Split(pat, "."), strings.Split(path, ".")
	if len(ps) != len(xs) {
		return false, nil
	}
	for i := range ps {
		if ps[i] != "*" && ps[i] != xs[i] {
			return false, nil
		}
	}
	return true, nil
}

func expectSame(t *testing.T, what string, a, b any, ignore ...string) {
	t.Helper()
	if d := diffViews(sdkView(t, a), sdkView(t, b), ignore...); len(d) > 0 {
		t.Errorf("%s differ:\n  %s", what, strings.Join(d, "\n  "))
	}
}

// TestMessagesSDKEquality: the Anthropic SDK's message from a native
// Messages upstream and from a chat-only one are equal field by field —
// thinking (with its empty signature), text, tool_use (id, name, parsed
// input), stop_reason, stop_sequence, usage (input, output, cache read) —
// and the accumulated stream equals the non-stream message on both paths.
// Only the message id differs: a translated answer's is msg_ + the chat
// completion's id.
func TestMessagesSDKEquality(t *testing.T) {
	native := newUpstream(t, eqNativeMessages())
	chatUp := newUpstream(t, eqChat())
	p := startProxy(t, withModel(frontsConfig([]*fakeUpstream{native, chatUp}, []bool{true, false}), "m", "u1", "t", "u2"))
	c := anthropicClient(p)
	tools := []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: eqTool,
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}}}}}
	params := func(model string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{Model: anthropic.Model(model), MaxTokens: 256, Tools: tools,
			System:   []anthropic.TextBlockParam{{Text: "be brief"}},
			Messages: []anthropic.MessageParam{userText("weather in Paris?")}}
	}
	get := func(model string) (plain, streamed anthropic.Message) {
		t.Helper()
		m, err := c.Messages.New(context.Background(), params(model))
		if err != nil {
			t.Fatalf("%s: Messages.New: %v", model, err)
		}
		return *m, streamMessage(t, c, params(model))
	}
	nPlain, nStream := get("m")
	tPlain, tStream := get("t")

	// The native fake's answer is what the test means by "right".
	if len(nPlain.Content) != 3 || nPlain.Content[0].Thinking != eqThinking || nPlain.Content[1].Text != eqText ||
		nPlain.Content[2].ID != eqCallID || string(nPlain.Content[2].Input) != eqArgs || nPlain.StopReason != "tool_use" ||
		nPlain.Usage.InputTokens != 6 || nPlain.Usage.CacheReadInputTokens != 4 || nPlain.Usage.OutputTokens != 5 {
		t.Fatalf("native message %s", nPlain.RawJSON())
	}
	expectSame(t, "native stream vs non-stream", nStream, nPlain)
	expectSame(t, "translated non-stream vs native", tPlain, nPlain, "id")
	expectSame(t, "translated stream vs native", tStream, nPlain, "id")
	expectSame(t, "translated stream vs translated non-stream", tStream, tPlain, "id")

	// The translated id is the chat completion's id under msg_ (our
	// choice; wire/anthropic derives it so that a log line of the upstream
	// and the client's message id correlate): chatcmpl-eq and the stream's
	// chatcmpl-9 here.
	if tPlain.ID != "msg_eq" || tStream.ID != "msg_9" {
		t.Errorf("translated message ids %q, %q; want msg_eq, msg_9", tPlain.ID, tStream.ID)
	}
	if n := len(chatUp.Calls()); n != 2 {
		t.Fatalf("chat upstream calls %d, want 2", n)
	}
}

// eqNativeResponses answers like OpenAI's /v1/responses: the same answer
// as eqChat as a Response object (reasoning, message, function_call; usage
// with input_tokens including the cached ones), echoing the request fields
// as OpenAI does, or the documented event stream.
func eqNativeResponses() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Instructions json.RawMessage `json:"instructions"`
			Tools        json.RawMessage `json:"tools"`
			Stream       bool            `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		rs := fmt.Sprintf(`{"id":"rs_n1","type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":%q}]}`, eqThinking)
		msg := fmt.Sprintf(`{"id":"msg_n1","type":"message","status":"completed","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":%q}],"role":"assistant"}`, eqText)
		fc := fmt.Sprintf(`{"id":"fc_n1","type":"function_call","status":"completed","call_id":%q,"arguments":%q,"name":%q}`, eqCallID, eqArgs, eqTool)
		resp := func(status, output, usage string) string {
			return fmt.Sprintf(`{"id":"resp_n1","object":"response","created_at":1700000000,"status":%q,"background":false,"error":null,"incomplete_details":null,"model":"real-model","output":[%s],"instructions":%s,"max_output_tokens":null,"metadata":{},"parallel_tool_calls":true,"previous_response_id":null,"prompt_cache_key":null,"reasoning":{"effort":null,"summary":null},"safety_identifier":null,"store":false,"temperature":1,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":%s,"top_p":1,"truncation":"disabled","user":null,"usage":%s}`,
				status, output, req.Instructions, req.Tools, usage)
		}
		const usage = `{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":15}`
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, resp("completed", rs+","+msg+","+fc, usage))
			return
		}
		var events []string
		seq := 0
		ev := func(typ, rest string) {
			events = append(events, fmt.Sprintf("event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,%s}\n\n", typ, typ, seq, rest))
			seq++
		}
		ev("response.created", `"response":`+resp("in_progress", "", "null"))
		ev("response.in_progress", `"response":`+resp("in_progress", "", "null"))
		ev("response.output_item.added", `"output_index":0,"item":{"id":"rs_n1","type":"reasoning","summary":[],"content":[]}`)
		ev("response.reasoning_text.delta", `"item_id":"rs_n1","output_index":0,"content_index":0,"delta":"The user "`)
		ev("response.reasoning_text.delta", `"item_id":"rs_n1","output_index":0,"content_index":0,"delta":"wants the weather."`)
		ev("response.reasoning_text.done", fmt.Sprintf(`"item_id":"rs_n1","output_index":0,"content_index":0,"text":%q`, eqThinking))
		ev("response.output_item.done", `"output_index":0,"item":`+rs)
		ev("response.output_item.added", `"output_index":1,"item":{"id":"msg_n1","type":"message","status":"in_progress","content":[],"role":"assistant"}`)
		ev("response.content_part.added", `"item_id":"msg_n1","output_index":1,"content_index":0,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}`)
		ev("response.output_text.delta", `"item_id":"msg_n1","output_index":1,"content_index":0,"delta":"Let me ","logprobs":[]`)
		ev("response.output_text.delta", `"item_id":"msg_n1","output_index":1,"content_index":0,"delta":"check.","logprobs":[]`)
		ev("response.output_text.done", fmt.Sprintf(`"item_id":"msg_n1","output_index":1,"content_index":0,"text":%q,"logprobs":[]`, eqText))
		ev("response.content_part.done", fmt.Sprintf(`"item_id":"msg_n1","output_index":1,"content_index":0,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":%q}`, eqText))
		ev("response.output_item.done", `"output_index":1,"item":`+msg)
		ev("response.output_item.added", fmt.Sprintf(`"output_index":2,"item":{"id":"fc_n1","type":"function_call","status":"in_progress","call_id":%q,"arguments":"","name":%q}`, eqCallID, eqTool))
		ev("response.function_call_arguments.delta", `"item_id":"fc_n1","output_index":2,"delta":"{\"city\":"`)
		ev("response.function_call_arguments.delta", `"item_id":"fc_n1","output_index":2,"delta":"\"Paris\"}"`)
		ev("response.function_call_arguments.done", fmt.Sprintf(`"item_id":"fc_n1","output_index":2,"arguments":%q`, eqArgs))
		ev("response.output_item.done", `"output_index":2,"item":`+fc)
		ev("response.completed", `"response":`+resp("completed", rs+","+msg+","+fc, usage))
		writeStream(w, events, 0)
	}
}

// respStream is what a Responses stream gave the SDK: the completed
// response, and the text, reasoning and arguments accumulated from the
// deltas, each checked against the response it ends with.
type respStream struct {
	final                 responses.Response
	text, reasoning, args string
	types                 []string
}

func streamResponse(t *testing.T, c openai.Client, params responses.ResponseNewParams) respStream {
	t.Helper()
	st := c.Responses.NewStreaming(context.Background(), params)
	var rs respStream
	seq := int64(-1)
	for st.Next() {
		ev := st.Current()
		if ev.SequenceNumber <= seq {
			t.Fatalf("sequence_number %d after %d (%s)", ev.SequenceNumber, seq, ev.Type)
		}
		seq = ev.SequenceNumber
		rs.types = append(rs.types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			rs.text += ev.Delta
		case "response.reasoning_text.delta":
			rs.reasoning += ev.Delta
		case "response.function_call_arguments.delta", "response.custom_tool_call_input.delta":
			rs.args += ev.Delta
		case "response.completed":
			rs.final = ev.Response
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if rs.final.Status != "completed" {
		t.Fatalf("no response.completed; events %v", rs.types)
	}
	return rs
}

// TestResponsesSDKEquality: openai-go's Response from a native Responses
// upstream and from a chat-only one are equal field by field — output
// items (reasoning text, message text, function_call with call_id, name and
// arguments), status, usage (input, cached, output, total) and the echoed
// request fields — and the streamed response.completed equals the
// non-stream response on both paths, as do the deltas accumulated. Allowed
// to differ: the generated ids (response resp_…, items rs_/msg_/fc_…),
// checked for shape and uniqueness; created_at (the proxy's clock on a
// stream); and tools, which the translator echoes as [] by design
// (package doc of wire/responses).
func TestResponsesSDKEquality(t *testing.T) {
	native := newUpstream(t, eqNativeResponses())
	chatUp := newUpstream(t, eqChat())
	p := startProxy(t, withModel(frontsConfig([]*fakeUpstream{native, chatUp}, []bool{true, false}), "m", "u1", "t", "u2"))
	c := responsesClient(p)
	params := func(model string) responses.ResponseNewParams {
		return responses.ResponseNewParams{Model: model, Instructions: openai.String("be brief"),
			Tools: []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{Name: eqTool,
				Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}}},
			Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
				responses.ResponseInputItemParamOfMessage("weather in Paris?", responses.EasyInputMessageRoleUser)}}}
	}
	get := func(model string) (responses.Response, respStream) {
		t.Helper()
		r, err := c.Responses.New(context.Background(), params(model))
		if err != nil {
			t.Fatalf("%s: Responses.New: %v", model, err)
		}
		return *r, streamResponse(t, c, params(model))
	}
	nPlain, nStream := get("m")
	tPlain, tStream := get("t")

	if len(nPlain.Output) != 3 || nPlain.OutputText() != eqText || nPlain.Usage.InputTokens != 10 ||
		nPlain.Usage.InputTokensDetails.CachedTokens != 4 || nPlain.Usage.OutputTokens != 5 {
		t.Fatalf("native response %s", nPlain.RawJSON())
	}
	for name, s := range map[string]respStream{"native": nStream, "translated": tStream} {
		if s.text != eqText || s.reasoning != eqThinking || s.args != eqArgs {
			t.Errorf("%s stream deltas: text %q reasoning %q args %q", name, s.text, s.reasoning, s.args)
		}
	}
	generated := []string{"id", "output.*.id", "tools", "created_at"}
	expectSame(t, "native stream vs non-stream", nStream.final, nPlain)
	expectSame(t, "translated non-stream vs native", tPlain, nPlain, generated...)
	expectSame(t, "translated stream vs native", tStream.final, nPlain, generated...)
	expectSame(t, "translated stream vs translated non-stream", tStream.final, tPlain, generated...)
	// created_at: the upstream's created for a whole completion, the
	// proxy's clock for a stream (response.created goes out before any
	// chunk is read).
	if tPlain.CreatedAt != 1700000000 || time.Since(time.Unix(int64(tStream.final.CreatedAt), 0)).Abs() > time.Minute {
		t.Errorf("created_at: non-stream %v stream %v", tPlain.CreatedAt, tStream.final.CreatedAt)
	}
	if len(tPlain.Tools) != 0 || len(nPlain.Tools) != 1 {
		t.Errorf("tools echoed: translated %d, native %d", len(tPlain.Tools), len(nPlain.Tools))
	}

	// Generated ids: well formed, one random base per response (items share
	// it), unique across responses.
	seen := map[string]bool{}
	for _, r := range []responses.Response{tPlain, tStream.final} {
		m := regexp.MustCompile(`^resp_([0-9a-f]{24})$`).FindStringSubmatch(r.ID)
		if m == nil {
			t.Fatalf("translated response id %q", r.ID)
		}
		for i, it := range r.Output {
			prefix := map[string]string{"reasoning": "rs", "message": "msg", "function_call": "fc"}[it.Type]
			if want := fmt.Sprintf("%s_%s_%d", prefix, m[1], i); it.ID != want {
				t.Errorf("item %d id %q, want %q", i, it.ID, want)
			}
		}
		for _, id := range append([]string{r.ID}, r.Output[0].ID, r.Output[1].ID, r.Output[2].ID) {
			if seen[id] {
				t.Errorf("id %q used twice", id)
			}
			seen[id] = true
		}
	}
	// The stream's item ids are those of its response.completed.
	if len(chatUp.Calls()) != 2 {
		t.Fatalf("chat upstream calls %d, want 2", len(chatUp.Calls()))
	}
}
