package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// applyPatch is a multi-line freeform input as Codex's apply_patch sends it.
const applyPatch = "*** Begin Patch\n*** Update File: a.go\n@@\n-\tx := \"old\"\n+\tx := \"new\\tq\"\n*** End Patch\n"

// chatToolCall answers a chat request (non-stream) with one tool call.
func chatToolCall(name, args string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-t","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_up1","type":"function","function":{"name":%q,"arguments":%q}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`, name, args)
	}
}

func responsesClient(p *proxy) openai.Client {
	return openai.NewClient(ooption.WithBaseURL(p.URL+"/v1"), ooption.WithAPIKey("client-key"), ooption.WithMaxRetries(0), ooption.WithHTTPClient(testClient))
}

// TestResponsesCustomToolRoundTrip: a `custom` apply_patch tool reaches a
// chat-only upstream as a one-string-parameter function, the call comes
// back as custom_tool_call with the patch unchanged, and the next turn
// (sent stateless with custom_tool_call_output) reaches the upstream as an
// assistant tool call plus a tool message carrying the same call id.
func TestResponsesCustomToolRoundTrip(t *testing.T) {
	args, _ := json.Marshal(map[string]string{"input": applyPatch})
	up := newUpstream(t, chatToolCall("apply_patch", string(args)))
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	c := responsesClient(p)
	tools := []responses.ToolUnionParam{{OfCustom: &responses.CustomToolParam{Name: "apply_patch", Description: openai.String("edit files")}}}
	input := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("fix a.go", responses.EasyInputMessageRoleUser)}
	r, err := c.Responses.New(context.Background(), responses.ResponseNewParams{Model: "m", Tools: tools,
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}})
	if err != nil {
		t.Fatalf("Responses.New: %v", err)
	}
	var call responses.ResponseCustomToolCall
	for _, it := range r.Output {
		if it.Type == "custom_tool_call" {
			call = it.AsCustomToolCall()
		}
	}
	if call.Name != "apply_patch" || call.Input != applyPatch || call.CallID == "" {
		t.Fatalf("custom call %+v in %+v", call, r.Output)
	}
	if r.Usage.InputTokens != 5 || r.Usage.OutputTokens != 7 {
		t.Fatalf("usage %+v", r.Usage)
	}
	var sent struct {
		Tools []struct {
			Type     string `json:"type"`
			Function struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(up.Calls()[0].Body, &sent); err != nil || len(sent.Tools) != 1 ||
		sent.Tools[0].Type != "function" || sent.Tools[0].Function.Name != "apply_patch" ||
		!strings.Contains(string(sent.Tools[0].Function.Parameters), `"string"`) {
		t.Fatalf("upstream tools %s (%v)", up.Calls()[0].Body, err)
	}

	// Second turn, stateless: the whole conversation again plus the output.
	up.setHandler(completion("patched"))
	input = append(input,
		responses.ResponseInputItemUnionParam{OfCustomToolCall: &responses.ResponseCustomToolCallParam{CallID: call.CallID, Name: "apply_patch", Input: applyPatch}},
		responses.ResponseInputItemUnionParam{OfCustomToolCallOutput: &responses.ResponseCustomToolCallOutputParam{CallID: call.CallID,
			Output: responses.ResponseCustomToolCallOutputOutputUnionParam{OfString: openai.String("Done!")}}})
	r, err = c.Responses.New(context.Background(), responses.ResponseNewParams{Model: "m", Tools: tools,
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}})
	if err != nil || r.OutputText() != "patched" {
		t.Fatalf("turn 2: %v %+v", err, r)
	}
	var turn2 struct {
		Messages []struct {
			Role       string `json:"role"`
			Content    any    `json:"content"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string `json:"id"`
				Function struct{ Name, Arguments string }
			} `json:"tool_calls"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(up.Calls()[1].Body, &turn2); err != nil {
		t.Fatal(err)
	}
	var gotCall, gotOut bool
	for _, m := range turn2.Messages {
		for _, tc := range m.ToolCalls {
			var a map[string]string
			_ = json.Unmarshal([]byte(tc.Function.Arguments), &a)
			gotCall = gotCall || (tc.ID == call.CallID && a["input"] == applyPatch)
		}
		gotOut = gotOut || (m.Role == "tool" && m.ToolCallID == call.CallID && fmt.Sprint(m.Content) == "Done!")
	}
	if !gotCall || !gotOut {
		t.Fatalf("turn 2 upstream messages %s", up.Calls()[1].Body)
	}
}

// TestResponsesPreviousIDAndSchema: previous_response_id is refused on a
// translated upstream with a 400 the SDK parses; text.format json_schema
// reaches the upstream as response_format.
func TestResponsesPreviousIDAndSchema(t *testing.T) {
	up := newUpstream(t, completion(`{"a":1}`))
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	c := responsesClient(p)
	_, err := c.Responses.New(context.Background(), responses.ResponseNewParams{Model: "m", PreviousResponseID: openai.String("resp_1"),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != "unsupported_parameter" {
		t.Fatalf("previous_response_id: %v", err)
	}
	if len(up.Calls()) != 0 {
		t.Fatalf("the refused request reached the upstream")
	}
	schema := map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "integer"}}}
	r, err := c.Responses.New(context.Background(), responses.ResponseNewParams{Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
		Text: responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigUnionParam{
			OfJSONSchema: &responses.ResponseFormatTextJSONSchemaConfigParam{Name: "obj", Schema: schema}}}})
	if err != nil || r.OutputText() != `{"a":1}` {
		t.Fatalf("schema: %v %+v", err, r)
	}
	var sent struct {
		ResponseFormat struct {
			Type       string `json:"type"`
			JSONSchema struct {
				Name   string         `json:"name"`
				Schema map[string]any `json:"schema"`
			} `json:"json_schema"`
		} `json:"response_format"`
	}
	if err := json.Unmarshal(up.Calls()[0].Body, &sent); err != nil || sent.ResponseFormat.Type != "json_schema" ||
		sent.ResponseFormat.JSONSchema.Name != "obj" || sent.ResponseFormat.JSONSchema.Schema["type"] != "object" {
		t.Fatalf("upstream body %s", up.Calls()[0].Body)
	}
}

// TestResponsesReasoningContent: a DeepSeek-style stream with
// reasoning_content deltas yields reasoning events before the text.
func TestResponsesReasoningContent(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		chunk := func(delta string) string {
			return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}` + "\n\n"
		}
		writeStream(w, []string{chunk(`{"role":"assistant","reasoning_content":"think "}`), chunk(`{"reasoning_content":"hard"}`),
			chunk(`{"content":"answer"}`),
			`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}` + "\n\n",
			"data: [DONE]\n\n"}, 0)
	})
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	c := responsesClient(p)
	st := c.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	var reasoning, text string
	var final responses.Response
	seq := int64(-1)
	for st.Next() {
		ev := st.Current()
		if ev.SequenceNumber <= seq {
			t.Fatalf("sequence_number %d after %d", ev.SequenceNumber, seq)
		}
		seq = ev.SequenceNumber
		switch ev.Type {
		case "response.reasoning_text.delta", "response.reasoning_summary_text.delta":
			if text != "" {
				t.Fatalf("reasoning after text")
			}
			reasoning += ev.Delta
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			final = ev.Response
		}
	}
	if err := st.Err(); err != nil || reasoning != "think hard" || text != "answer" || final.Usage.OutputTokens != 3 {
		t.Fatalf("reasoning %q text %q usage %+v err %v", reasoning, text, final.Usage, err)
	}
}

// nativeResponses answers POST /v1/responses as OpenAI does: a response
// object, or the documented event stream with sequence numbers.
func nativeResponses(text string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/responses") {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		msg := fmt.Sprintf(`{"id":"msg_n1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":%q,"annotations":[]}]}`, text)
		resp := func(status, output string) string {
			return fmt.Sprintf(`{"id":"resp_n1","object":"response","created_at":1,"status":%q,"model":"real-model","output":[%s],"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":0}}}`, status, output)
		}
		if !isStream(r) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, resp("completed", msg))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		seq := 0
		ev := func(typ, rest string) {
			fmt.Fprintf(w, "event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,%s}\n\n", typ, typ, seq, rest)
			seq++
		}
		ev("response.created", `"response":`+resp("in_progress", ""))
		ev("response.in_progress", `"response":`+resp("in_progress", ""))
		ev("response.output_item.added", `"output_index":0,"item":{"id":"msg_n1","type":"message","status":"in_progress","role":"assistant","content":[]}`)
		ev("response.content_part.added", `"item_id":"msg_n1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}`)
		ev("response.output_text.delta", fmt.Sprintf(`"item_id":"msg_n1","output_index":0,"content_index":0,"delta":%q`, text))
		ev("response.output_text.done", fmt.Sprintf(`"item_id":"msg_n1","output_index":0,"content_index":0,"text":%q`, text))
		ev("response.content_part.done", fmt.Sprintf(`"item_id":"msg_n1","output_index":0,"content_index":0,"part":{"type":"output_text","text":%q,"annotations":[]}`, text))
		ev("response.output_item.done", `"output_index":0,"item":`+msg)
		ev("response.completed", `"response":`+resp("completed", msg))
	}
}

// TestResponsesFailoverChatNative: a failing chat-only upstream fails over
// to a native one (body passed as sent, stream byte for byte), and a failing
// native one fails over to a chat-only one; both give the SDK the same text
// and usage.
func TestResponsesFailoverChatNative(t *testing.T) {
	chatUp := newUpstream(t, status(500))
	native := newUpstream(t, nativeResponses("hello"))
	p := startProxy(t, frontsConfig([]*fakeUpstream{chatUp, native}, []bool{false, true}))
	c := responsesClient(p)
	params := responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}
	r, err := c.Responses.New(context.Background(), params)
	if err != nil || r.OutputText() != "hello" || r.Usage.OutputTokens != 1 {
		t.Fatalf("chat→native: %v %+v", err, r)
	}
	st := c.Responses.NewStreaming(context.Background(), params)
	var text string
	var final responses.Response
	for st.Next() {
		ev := st.Current()
		if ev.Type == "response.output_text.delta" {
			text += ev.Delta
		}
		if ev.Type == "response.completed" {
			final = ev.Response
		}
	}
	if st.Err() != nil || text != "hello" || final.OutputText() != "hello" {
		t.Fatalf("chat→native stream %q %v", text, st.Err())
	}
	if calls := native.Calls(); len(calls) != 2 || calls[0].Path != "/v1/responses" || !strings.Contains(string(calls[0].Body), `"model":"real-model"`) {
		t.Fatalf("native calls %+v", calls)
	}

	// Reverse: native fails, chat-only answers through the translator.
	chatUp.setHandler(completion("hello"))
	native.setHandler(status(500))
	p.load(withModel(frontsConfig([]*fakeUpstream{chatUp, native}, []bool{false, true}), "m", "u2", "u1"))
	r2, err := c.Responses.New(context.Background(), params)
	if err != nil || r2.OutputText() != r.OutputText() || r2.Usage.InputTokens != r.Usage.InputTokens ||
		r2.Usage.OutputTokens != r.Usage.OutputTokens || len(r2.Output) != len(r.Output) || r2.Output[0].Type != r.Output[0].Type {
		t.Fatalf("native→chat: %v\ntranslated %+v\nnative %+v", err, r2, r)
	}
	if !strings.HasPrefix(r2.ID, "resp_") || !strings.HasPrefix(r2.Output[0].ID, "msg_") {
		t.Fatalf("translated ids %q %q", r2.ID, r2.Output[0].ID)
	}
}

// TestResponsesErrors: an unknown model is a 404 and an upstream 400 is
// relayed as a 400, both parsed by the SDK as *openai.Error.
func TestResponsesErrors(t *testing.T) {
	up := newUpstream(t, status(400))
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	c := responsesClient(p)
	for _, tc := range []struct {
		model string
		code  int
	}{{"nope", 404}, {"m", 400}} {
		_, err := c.Responses.New(context.Background(), responses.ResponseNewParams{Model: tc.model,
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != tc.code || apiErr.Message == "" {
			t.Fatalf("model %s: want %d, got %v", tc.model, tc.code, err)
		}
	}
}
