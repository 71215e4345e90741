package integration

import (
	"fmt"
	"net/http"
	"testing"

	anthropic "github.com/anthropics/anthropic-sdk-go/v2"
)

// TestMessagesToolCallsWithoutIndex: a chat upstream that sends each tool
// call's first delta with an id but no index (and the arguments after it,
// without either) gives the Anthropic SDK two tool_use blocks, not one
// with both calls' arguments run together.
func TestMessagesToolCallsWithoutIndex(t *testing.T) {
	chunk := func(delta, finish string) string {
		f := "null"
		if finish != "" {
			f = fmt.Sprintf("%q", finish)
		}
		return fmt.Sprintf(`data: {"id":"chatcmpl-t","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n", delta, f)
	}
	events := []string{
		chunk(`{"role":"assistant","content":null,"tool_calls":[{"id":"call_a","type":"function","function":{"name":"read_file","arguments":""}}]}`, ""),
		chunk(`{"tool_calls":[{"function":{"arguments":"{\"path\":"}}]}`, ""),
		chunk(`{"tool_calls":[{"function":{"arguments":"\"a.go\"}"}}]}`, ""),
		chunk(`{"tool_calls":[{"id":"call_b","type":"function","function":{"name":"read_file","arguments":""}}]}`, ""),
		chunk(`{"tool_calls":[{"function":{"arguments":"{\"path\":\"b.go\"}"}}]}`, ""),
		chunk(`{}`, "tool_calls"),
		"data: [DONE]\n\n",
	}
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { writeStream(w, events, 0) })
	p := startProxy(t, frontsConfig([]*fakeUpstream{up}, []bool{false}))
	tool := anthropic.ToolParam{Name: "read_file", InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"path": map[string]any{"type": "string"}}}}
	acc := streamMessage(t, anthropicClient(p), anthropic.MessageNewParams{Model: "m", MaxTokens: 256,
		Messages: []anthropic.MessageParam{userText("read a.go and b.go")},
		Tools:    []anthropic.ToolUnionParam{{OfTool: &tool}}})
	var got []string
	for _, b := range acc.Content {
		got = append(got, fmt.Sprintf("%s %s %s %s", b.Type, b.ID, b.Name, b.Input))
	}
	want := []string{`tool_use call_a read_file {"path":"a.go"}`, `tool_use call_b read_file {"path":"b.go"}`}
	if fmt.Sprint(got) != fmt.Sprint(want) || acc.StopReason != "tool_use" {
		t.Fatalf("content blocks\n got %q\nwant %q\nstop_reason %q", got, want, acc.StopReason)
	}
}
