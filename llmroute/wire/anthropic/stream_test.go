package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand"
	"strings"
	"testing"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// sse frames chat chunks the way OpenAI does.
func sse(chunks ...string) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString("data: ")
		b.WriteString(c)
		b.WriteString("\n\n")
	}
	return b.String()
}

// openAIToolStream is a chat stream in OpenAI's shapes: role chunk, text,
// two parallel tool calls, finish_reason, the include_usage chunk, [DONE].
var openAIToolStream = sse(
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"content":"Checking"},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"content":" both."},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \"Paris\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"city\": "}}]},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"Rome\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":40,"total_tokens":160,"prompt_tokens_details":{"cached_tokens":100}}}`,
	`[DONE]`,
)

const wantToolEvents = `event: message_start
data: {"type":"message_start","message":{"id":"msg_9","type":"message","role":"assistant","model":"gpt-x","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}}

event: ping
data: {"type": "ping"}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Checking"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" both."}}

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
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\": "}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"Rome\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":40}}

event: message_stop
data: {"type":"message_stop"}

`

// deepSeekStream reasons in reasoning_content, then answers, with no [DONE]
// and a final chunk carrying both finish_reason and usage.
var deepSeekStream = sse(
	`{"id":"ds-1","object":"chat.completion.chunk","model":"deepseek-reasoner","choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":""},"finish_reason":null}]}`,
	`{"id":"ds-1","object":"chat.completion.chunk","model":"deepseek-reasoner","choices":[{"index":0,"delta":{"content":null,"reasoning_content":"The user"},"finish_reason":null}]}`,
	`{"id":"ds-1","object":"chat.completion.chunk","model":"deepseek-reasoner","choices":[{"index":0,"delta":{"content":null,"reasoning_content":" greets."},"finish_reason":null}]}`,
	`{"id":"ds-1","object":"chat.completion.chunk","model":"deepseek-reasoner","choices":[{"index":0,"delta":{"content":"Hello","reasoning_content":null},"finish_reason":null}]}`,
	`{"id":"ds-1","object":"chat.completion.chunk","model":"deepseek-reasoner","choices":[{"index":0,"delta":{"content":"!","reasoning_content":null},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16,"prompt_cache_hit_tokens":0}}`,
)

const wantDeepSeekEvents = `event: message_start
data: {"type":"message_start","message":{"id":"msg_ds-1","type":"message","role":"assistant","model":"deepseek-reasoner","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}}

event: ping
data: {"type": "ping"}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"The user"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":" greets."}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":""}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hello"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"!"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":9,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":7}}

event: message_stop
data: {"type":"message_stop"}

`

// run feeds up to a new Stream in the pieces split gives, then Closes it,
// and returns the events, checking each emit is one whole well-formed event.
func run(t testing.TB, up string, split func(string) []string) string {
	t.Helper()
	var out bytes.Buffer
	s := NewStream(&Info{Model: "asked"}, func(ev []byte) error {
		checkEvent(t, ev)
		out.Write(ev)
		return nil
	})
	for _, p := range split(up) {
		if _, err := s.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !s.Finished() {
		t.Error("not Finished after Close")
	}
	return out.String()
}

// checkEvent asserts ev is "event: T\ndata: {json with type T}\n\n".
func checkEvent(t testing.TB, ev []byte) {
	t.Helper()
	name, rest, ok := bytes.Cut(ev, []byte("\n"))
	data, ok2 := bytes.CutPrefix(rest, []byte("data: "))
	if !ok || !ok2 || !bytes.HasPrefix(name, []byte("event: ")) || !bytes.HasSuffix(data, []byte("\n\n")) ||
		bytes.Count(ev, []byte("\n")) != 3 {
		t.Fatalf("malformed event %q", ev)
	}
	var v struct{ Type string }
	if err := json.Unmarshal(data, &v); err != nil || v.Type != string(name[len("event: "):]) {
		t.Fatalf("event %q: type %q, err %v", ev, v.Type, err)
	}
}

func whole(s string) []string { return []string{s} }

func bytewise(s string) []string {
	out := make([]string, len(s))
	for i := range s {
		out[i] = s[i : i+1]
	}
	return out
}

func randomly(seed int64) func(string) []string {
	return func(s string) []string {
		r := rand.New(rand.NewSource(seed))
		var out []string
		for len(s) > 0 {
			n := 1 + r.Intn(min(len(s), 40))
			out = append(out, s[:n])
			s = s[n:]
		}
		return out
	}
}

func TestStreamEvents(t *testing.T) {
	crlf := func(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }
	for _, tc := range []struct {
		name, up, want string
	}{
		{"openai tools", openAIToolStream, wantToolEvents},
		{"openai tools CRLF", crlf(openAIToolStream), wantToolEvents},
		{"deepseek reasoning, no [DONE]", deepSeekStream, wantDeepSeekEvents},
	} {
		for _, sp := range []struct {
			name  string
			split func(string) []string
		}{{"whole", whole}, {"bytewise", bytewise}, {"random1", randomly(1)}, {"random2", randomly(2)}} {
			t.Run(tc.name+"/"+sp.name, func(t *testing.T) {
				if got := run(t, tc.up, sp.split); got != tc.want {
					t.Errorf("events differ\n got:\n%s\nwant:\n%s", got, tc.want)
				}
			})
		}
	}
}

// A think-tag upstream (MiniMax style) split by transform's rewriter before
// the translation: tags never reach the client, their text is a thinking
// block.
func TestStreamAfterThinkSplit(t *testing.T) {
	up := sse(
		`{"id":"mm","model":"MiniMax-M2","choices":[{"index":0,"delta":{"role":"assistant","content":"<thi"}}]}`,
		`{"id":"mm","model":"MiniMax-M2","choices":[{"index":0,"delta":{"content":"nk>plan</th"}}]}`,
		`{"id":"mm","model":"MiniMax-M2","choices":[{"index":0,"delta":{"content":"ink>\n\nDone."},"finish_reason":"stop"}]}`,
		`{"id":"mm","model":"MiniMax-M2","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}`,
		`[DONE]`,
	)
	var out bytes.Buffer
	s := NewStream(&Info{}, func(ev []byte) error { checkEvent(t, ev); out.Write(ev); return nil })
	rw := transform.NewStreamRewriter(transform.ThinkSplit, func(b []byte) error { _, err := s.Write(b); return err })
	for _, p := range bytewise(up) {
		if _, err := rw.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var thinking, text strings.Builder
	for _, line := range strings.Split(out.String(), "\n") {
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Delta struct{ Type, Text, Thinking string }
		}
		json.Unmarshal([]byte(d), &ev)
		switch ev.Delta.Type {
		case "text_delta":
			text.WriteString(ev.Delta.Text)
		case "thinking_delta":
			thinking.WriteString(ev.Delta.Thinking)
		}
	}
	if thinking.String() != "plan" || text.String() != "\n\nDone." {
		t.Errorf("thinking %q, text %q\n%s", thinking.String(), text.String(), out.String())
	}
	if !strings.Contains(out.String(), `"stop_reason":"end_turn"`) || !strings.Contains(out.String(), `"output_tokens":4}`) {
		t.Errorf("end:\n%s", out.String())
	}
}

func TestStreamEdges(t *testing.T) {
	t.Run("[DONE] alone: an empty message", func(t *testing.T) {
		got := run(t, "data: [DONE]\n\n", whole)
		want := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_"
		if !strings.HasPrefix(got, want) || !strings.Contains(got, `"model":"asked"`) ||
			!strings.HasSuffix(got, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":0}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
			t.Errorf("got:\n%s", got)
		}
	})
	t.Run("error payload mid-stream", func(t *testing.T) {
		up := sse(`{"id":"x","choices":[{"index":0,"delta":{"content":"par"}}]}`,
			`{"error":{"message":"upstream \"overloaded\"","type":"server_error","code":"overloaded"}}`,
			`{"id":"x","choices":[{"index":0,"delta":{"content":"ignored"}}]}`)
		got := run(t, up, bytewise)
		if !strings.HasSuffix(got, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"par\"}}\n\n"+
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"upstream \\\"overloaded\\\"\",\"code\":\"overloaded\"}}\n\n") {
			t.Errorf("got:\n%s", got)
		}
	})
	t.Run("Fail after the first byte", func(t *testing.T) {
		var out bytes.Buffer
		s := NewStream(&Info{}, func(ev []byte) error { checkEvent(t, ev); out.Write(ev); return nil })
		s.Write([]byte(sse(`{"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}`)))
		if s.Finished() {
			t.Fatal("finished early")
		}
		if err := s.Fail("stream_stalled", "upstream stalled"); err != nil {
			t.Fatal(err)
		}
		if !s.Finished() || !strings.HasSuffix(out.String(), "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"upstream stalled\",\"code\":\"stream_stalled\"}}\n\n") {
			t.Errorf("got:\n%s", out.String())
		}
		n := out.Len()
		s.Write([]byte(sse(`{"id":"x","choices":[{"index":0,"delta":{"content":"b"}}]}`, "[DONE]")))
		s.Close()
		if out.Len() != n {
			t.Errorf("events after the error: %s", out.String()[n:])
		}
	})
	t.Run("comments, event lines, junk and an unterminated last event", func(t *testing.T) {
		up := ": keepalive\n\nevent: chunk\ndata: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: not json\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"},\"finish_reason\":\"stop\"}]}"
		got := run(t, up, bytewise)
		if strings.Count(got, "text_delta") != 2 || !strings.Contains(got, `"stop_reason":"end_turn"`) {
			t.Errorf("got:\n%s", got)
		}
	})
	t.Run("tool call reported with finish_reason stop", func(t *testing.T) {
		up := sse(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"stop"}]}`, "[DONE]")
		if got := run(t, up, whole); !strings.Contains(got, `"stop_reason":"tool_use"`) {
			t.Errorf("got:\n%s", got)
		}
	})
	t.Run("emit error stops the stream", func(t *testing.T) {
		boom := errors.New("client gone")
		calls := 0
		s := NewStream(&Info{}, func([]byte) error { calls++; return boom })
		if _, err := s.Write([]byte(openAIToolStream)); err != boom {
			t.Fatalf("Write err %v", err)
		}
		if err := s.Close(); err != boom || calls != 1 {
			t.Fatalf("Close err %v after %d emits", err, calls)
		}
	})
	t.Run("Reset reuses the Stream", func(t *testing.T) {
		var a, b bytes.Buffer
		s := NewStream(&Info{}, func(ev []byte) error { a.Write(ev); return nil })
		s.Write([]byte(openAIToolStream))
		s.Close()
		s.Reset(&Info{}, func(ev []byte) error { b.Write(ev); return nil })
		s.Write([]byte(openAIToolStream))
		s.Close()
		if a.String() != wantToolEvents || b.String() != wantToolEvents {
			t.Errorf("after Reset:\n%s", b.String())
		}
	})
}

func TestStreamChoicesAndLimits(t *testing.T) {
	t.Run("only choice 0", func(t *testing.T) {
		up := sse(`{"id":"x","choices":[{"index":1,"delta":{"content":"B"}},{"index":0,"delta":{"content":"A"}}]}`,
			`{"id":"x","choices":[{"index":1,"delta":{"content":"B"},"finish_reason":"length"}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, "[DONE]")
		got := run(t, up, whole)
		if strings.Contains(got, `"B"`) || !strings.Contains(got, `"text":"A"`) || !strings.Contains(got, `"stop_reason":"end_turn"`) {
			t.Errorf("got:\n%s", got)
		}
	})
	t.Run("Fail after message_stop emits nothing", func(t *testing.T) {
		var out bytes.Buffer
		s := NewStream(&Info{}, func(ev []byte) error { out.Write(ev); return nil })
		s.Write([]byte(openAIToolStream))
		n := out.Len()
		if err := s.Fail("stream_interrupted", "x"); err != nil || out.Len() != n {
			t.Errorf("Fail after the end: %v, %q", err, out.String()[n:])
		}
	})
	t.Run("an oversized event is dropped, the next one is used", func(t *testing.T) {
		big := strings.Repeat("data: "+strings.Repeat("x", 1<<20)+"\n", 5) + "\n"
		up := big + sse(`{"id":"x","choices":[{"index":0,"delta":{"content":"after"}}]}`, "[DONE]")
		got := run(t, up, randomly(3))
		if !strings.Contains(got, `"text":"after"`) || strings.Contains(got, "xxxx") {
			t.Errorf("got:\n%.500s", got)
		}
	})
}
