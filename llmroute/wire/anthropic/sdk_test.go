package anthropic

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/ssestream"
)

// sdkAccumulate decodes an Anthropic event stream with the official Go SDK's
// SSE decoder and accumulates it with Message.Accumulate, as a client does.
func sdkAccumulate(t *testing.T, events []byte) sdk.Message {
	t.Helper()
	res := &http.Response{
		StatusCode: 200,
		Header:     http.Header{"Content-Type": {"text/event-stream"}},
		Body:       io.NopCloser(bytes.NewReader(events)),
	}
	st := ssestream.NewStream[sdk.MessageStreamEventUnion](ssestream.NewDecoder(res), nil)
	var msg sdk.Message
	n := 0
	for st.Next() {
		if err := msg.Accumulate(st.Current()); err != nil {
			t.Fatalf("Accumulate event %d: %v", n, err)
		}
		n++
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if n == 0 {
		t.Fatal("the SDK saw no events")
	}
	return msg
}

// fields is what a client reads of a message, for field-by-field equality.
type fields struct {
	ID, Model, Role, StopReason, StopSequence string
	Content                                   []block
	In, Out, CacheRead, CacheCreation         int64
}

type block struct {
	Type, Text, Thinking, Signature, ID, Name string
	Input                                     any
}

func fieldsOf(t *testing.T, m sdk.Message) fields {
	f := fields{ID: m.ID, Model: string(m.Model), Role: string(m.Role), StopReason: string(m.StopReason), StopSequence: m.StopSequence,
		In: m.Usage.InputTokens, Out: m.Usage.OutputTokens, CacheRead: m.Usage.CacheReadInputTokens, CacheCreation: m.Usage.CacheCreationInputTokens}
	for _, c := range m.Content {
		b := block{Type: c.Type, Text: c.Text, Thinking: c.Thinking, Signature: c.Signature, ID: c.ID, Name: c.Name}
		if c.Type == "tool_use" {
			if err := json.Unmarshal(c.Input, &b.Input); err != nil {
				t.Fatalf("tool input %q: %v", c.Input, err)
			}
		}
		f.Content = append(f.Content, b)
	}
	return f
}

// The SDK's accumulated stream equals, field by field, the same answer sent
// natively (an Anthropic-shaped stream) and the non-stream translation.
func TestStreamThroughSDK(t *testing.T) {
	// The answer of openAIToolStream, as a native Messages server streams it.
	native := `event: message_start
data: {"type":"message_start","message":{"id":"msg_9","type":"message","role":"assistant","model":"gpt-x","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Checking both."}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"call_a","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Paris\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"call_b","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Rome\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":40}}

event: message_stop
data: {"type":"message_stop"}

`
	want := fieldsOf(t, sdkAccumulate(t, []byte(native)))
	if want.StopReason != "tool_use" || len(want.Content) != 3 || want.In != 20 || want.CacheRead != 100 {
		t.Fatalf("native fixture accumulates to %+v", want)
	}

	for _, sp := range []struct {
		name  string
		split func(string) []string
	}{{"whole", whole}, {"bytewise", bytewise}} {
		got := fieldsOf(t, sdkAccumulate(t, []byte(run(t, openAIToolStream, sp.split))))
		if !equalJSON(got, want) {
			t.Errorf("%s: translated stream\n got: %+v\nwant: %+v", sp.name, got, want)
		}
	}

	chat := `{"id":"chatcmpl-9","object":"chat.completion","model":"gpt-x","choices":[{"index":0,"message":{"role":"assistant","content":"Checking both.",` +
		`"tool_calls":[{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},{"id":"call_b","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Rome\"}"}}]},"finish_reason":"tool_calls"}],` +
		`"usage":{"prompt_tokens":120,"completion_tokens":40,"total_tokens":160,"prompt_tokens_details":{"cached_tokens":100}}}`
	body, err := FromChat(nil, []byte(chat), &Info{})
	if err != nil {
		t.Fatal(err)
	}
	var msg sdk.Message
	if err := json.Unmarshal(body, &msg); err != nil {
		t.Fatal(err)
	}
	if got := fieldsOf(t, msg); !equalJSON(got, want) {
		t.Errorf("non-stream\n got: %+v\nwant: %+v", got, want)
	}
}

// Thinking: the SDK sees a thinking block with an empty signature, then text.
func TestThinkingThroughSDK(t *testing.T) {
	got := fieldsOf(t, sdkAccumulate(t, []byte(run(t, deepSeekStream, bytewise))))
	want := fields{ID: "msg_ds-1", Model: "deepseek-reasoner", Role: "assistant", StopReason: "max_tokens",
		Content: []block{{Type: "thinking", Thinking: "The user greets."}, {Type: "text", Text: "Hello!"}}, In: 9, Out: 7}
	if !equalJSON(got, want) {
		t.Errorf("\n got: %+v\nwant: %+v", got, want)
	}
}

// An error event reaches the SDK as an error.
func TestErrorThroughSDK(t *testing.T) {
	var out bytes.Buffer
	s := NewStream(&Info{}, func(ev []byte) error { out.Write(ev); return nil })
	s.Write([]byte(sse(`{"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}`)))
	s.Fail("stream_interrupted", "upstream connection lost")
	res := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(&out)}
	st := ssestream.NewStream[sdk.MessageStreamEventUnion](ssestream.NewDecoder(res), nil)
	for st.Next() {
	}
	if err := st.Err(); err == nil || !bytes.Contains([]byte(err.Error()), []byte("upstream connection lost")) {
		t.Errorf("SDK error %v", err)
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
