package responses

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// sdkPatch is a multi-line freeform input, as apply_patch sends.
const sdkPatch = "*** Begin Patch\n*** Add File: hello.txt\n+HELLO \"quoted\" \\ back\n*** End Patch\n"

// translatingServer stands in for llm_route in front of a chat-only
// upstream that answers with reasoning, text, a custom tool call and a
// function call: it translates the SDK's request with ToChat and the
// scripted chat answer back with FromChat or Stream.
func translatingServer(t *testing.T) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		chat, info, err := ToChat(nil, body, Options{})
		if err != nil {
			e := err.(*Error)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(e.Status)
			_, _ = w.Write(e.Body())
			return
		}
		if !strings.Contains(string(chat), `"name":"apply_patch","description":"Edit files.","parameters":{"type":"object","properties":{"input"`) {
			t.Errorf("custom tool not translated: %s", chat)
		}
		args := `{"input":` + jsonStr(sdkPatch) + `}`
		if !info.Stream {
			resp, err := FromChat(nil, []byte(`{"id":"c","object":"chat.completion","created":1700000000,"model":"qwen3-coder","choices":[{"index":0,"message":{"role":"assistant",`+
				`"reasoning_content":"I will add the file.","content":"Adding it.","tool_calls":[`+
				`{"id":"call_p","type":"function","function":{"name":"apply_patch","arguments":`+jsonStr(args)+`}},`+
				`{"id":"call_l","type":"function","function":{"name":"exec_command","arguments":"{\"cmd\":\"ls\"}"}}]},"finish_reason":"tool_calls"}],`+
				`"usage":{"prompt_tokens":50,"completion_tokens":20,"total_tokens":70,"prompt_tokens_details":{"cached_tokens":10},"completion_tokens_details":{"reasoning_tokens":5}}}`), info)
			if err != nil {
				t.Error(err)
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(resp)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		s := NewStream(info, func(ev []byte) error { _, err := w.Write(ev); return err })
		up := chatChunk(`{"role":"assistant","content":""}`, "") +
			chatChunk(`{"reasoning_content":"I will add "}`, "") + chatChunk(`{"reasoning_content":"the file."}`, "") +
			chatChunk(`{"content":"Adding"}`, "") + chatChunk(`{"content":" it."}`, "") +
			chatChunk(`{"tool_calls":[{"index":0,"id":"call_p","type":"function","function":{"name":"apply_patch","arguments":""}}]}`, "")
		for i := 0; i < len(args); i += 7 {
			up += chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":`+jsonStr(args[i:min(i+7, len(args))])+`}}]}`, "")
		}
		up += chatChunk(`{"tool_calls":[{"index":1,"id":"call_l","type":"function","function":{"name":"exec_command","arguments":"{\"cmd\":\"ls\"}"}}]}`, "") +
			chatChunk(`{}`, "tool_calls") +
			`data: {"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":20,"total_tokens":70,"prompt_tokens_details":{"cached_tokens":10},"completion_tokens_details":{"reasoning_tokens":5}}}` + "\n\n" +
			"data: [DONE]\n\n"
		_, _ = s.Write([]byte(up))
		_ = s.Close()
	}))
}

func sdkParams() responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: "gpt-coder",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("create hello.txt")},
		Tools: []responses.ToolUnionParam{
			responses.ToolParamOfFunction("exec_command", map[string]any{"type": "object", "properties": map[string]any{"cmd": map[string]any{"type": "string"}}}, false),
			{OfCustom: &responses.CustomToolParam{Name: "apply_patch", Description: openai.String("Edit files.")}},
		},
	}
}

// The official Go SDK reads the translated answer, streamed and not, and
// both give the same response.
func TestSDKReadsTranslation(t *testing.T) {
	srv := translatingServer(t)
	defer srv.Close()
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	ctx := context.Background()

	plain, err := client.Responses.New(ctx, sdkParams())
	if err != nil {
		t.Fatal(err)
	}

	stream := client.Responses.NewStreaming(ctx, sdkParams())
	var streamed *responses.Response
	var deltaText, deltaInput strings.Builder
	var doneItems []responses.ResponseOutputItemUnion
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			deltaText.WriteString(ev.Delta)
		case "response.custom_tool_call_input.delta":
			deltaInput.WriteString(ev.Delta)
		case "response.output_item.done":
			doneItems = append(doneItems, ev.AsResponseOutputItemDone().Item)
		case "response.completed":
			r := ev.AsResponseCompleted().Response
			streamed = &r
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if streamed == nil {
		t.Fatal("no response.completed")
	}
	if deltaText.String() != "Adding it." || deltaInput.String() != sdkPatch {
		t.Errorf("deltas: text %q, input %q", deltaText.String(), deltaInput.String())
	}

	for name, r := range map[string]*responses.Response{"non-stream": plain, "stream": streamed} {
		if r.Status != "completed" || r.Model != "qwen3-coder" || !strings.HasPrefix(r.ID, "resp_") {
			t.Errorf("%s: status %q model %q id %q", name, r.Status, r.Model, r.ID)
		}
		if r.OutputText() != "Adding it." {
			t.Errorf("%s: OutputText %q", name, r.OutputText())
		}
		if len(r.Output) != 4 {
			t.Fatalf("%s: %d output items", name, len(r.Output))
		}
		if rs := r.Output[0].AsReasoning(); r.Output[0].Type != "reasoning" || len(rs.Content) != 1 || rs.Content[0].Text != "I will add the file." {
			t.Errorf("%s: reasoning %+v", name, rs)
		}
		if c := r.Output[2].AsCustomToolCall(); r.Output[2].Type != "custom_tool_call" || c.Input != sdkPatch || c.CallID != "call_p" || c.Name != "apply_patch" {
			t.Errorf("%s: custom call %+v", name, c)
		}
		if f := r.Output[3].AsFunctionCall(); r.Output[3].Type != "function_call" || f.Arguments != `{"cmd":"ls"}` || f.CallID != "call_l" || f.Name != "exec_command" {
			t.Errorf("%s: function call %+v", name, f)
		}
		u := r.Usage
		if u.InputTokens != 50 || u.OutputTokens != 20 || u.TotalTokens != 70 || u.InputTokensDetails.CachedTokens != 10 || u.OutputTokensDetails.ReasoningTokens != 5 {
			t.Errorf("%s: usage %+v", name, u)
		}
	}
	// The stream's done items are the completed response's output.
	if len(doneItems) != len(streamed.Output) {
		t.Fatalf("%d done items, %d in completed", len(doneItems), len(streamed.Output))
	}
	for i := range doneItems {
		if doneItems[i].RawJSON() != streamed.Output[i].RawJSON() {
			t.Errorf("item %d: done %s, completed %s", i, doneItems[i].RawJSON(), streamed.Output[i].RawJSON())
		}
	}
	// Stream and non-stream agree item by item, but for the random ids.
	for i := range plain.Output {
		a, b := plain.Output[i], streamed.Output[i]
		if a.Type != b.Type || a.CallID != b.CallID || a.Name != b.Name || a.Input != b.Input || a.Arguments != b.Arguments ||
			strings.SplitN(a.ID, "_", 2)[0] != strings.SplitN(b.ID, "_", 2)[0] || a.ID == b.ID {
			t.Errorf("item %d differs: %s vs %s", i, a.RawJSON(), b.RawJSON())
		}
	}
}

// The SDK surfaces a translator error as an *openai.Error with its code.
func TestSDKReadsErrors(t *testing.T) {
	srv := translatingServer(t)
	defer srv.Close()
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	p := sdkParams()
	p.PreviousResponseID = openai.String("resp_123")
	_, err := client.Responses.New(context.Background(), p)
	var apiErr *openai.Error
	if !asError(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != "unsupported_parameter" || apiErr.Param != "previous_response_id" {
		t.Fatalf("err = %v", err)
	}
}

func asError(err error, target **openai.Error) bool {
	e, ok := err.(*openai.Error)
	if ok {
		*target = e
	}
	return ok
}
