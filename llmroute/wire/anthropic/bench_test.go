package anthropic

import (
	"bytes"
	"strings"
	"testing"
)

func BenchmarkToChatSample(b *testing.B) {
	body := readSample(b, "claude-code-turn2.json")
	dst := make([]byte, 0, 2*len(body))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		out, _, err := ToChat(dst[:0], body, Options{ReasoningField: "reasoning_content"})
		if err != nil || len(out) == 0 {
			b.Fatal(err)
		}
	}
}

func BenchmarkStripBillingBlock(b *testing.B) {
	body := readSample(b, "claude-code-turn2.json")
	dst := make([]byte, 0, len(body))
	b.ReportAllocs()
	for b.Loop() {
		StripBillingBlock(dst[:0], body)
	}
}

func BenchmarkSessionBody(b *testing.B) {
	body := readSample(b, "claude-code-turn2.json")
	dst := make([]byte, 0, len(body))
	b.ReportAllocs()
	for b.Loop() {
		SessionBody(dst[:0], body)
	}
}

func BenchmarkFromChat(b *testing.B) {
	chat := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m-up","choices":[{"index":0,"message":{"role":"assistant","content":"Let me check the weather for you.","reasoning_content":"The user wants the weather.",` +
		`"tool_calls":[{"id":"call_7","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},"finish_reason":"tool_calls"}],` +
		`"usage":{"prompt_tokens":500,"completion_tokens":40,"total_tokens":540,"prompt_tokens_details":{"cached_tokens":400}}}`)
	info := &Info{Model: "m"}
	dst := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FromChat(dst[:0], chat, info); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStreamEvent is the cost per upstream text chunk of a long
// answer (ns/op and allocs/op are per chunk).
func BenchmarkStreamEvent(b *testing.B) {
	chunk := []byte(sse(`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}],"usage":null}`))
	var n int
	s := NewStream(&Info{Model: "m"}, func(ev []byte) error { n += len(ev); return nil })
	s.Write(chunk) // message_start, block start
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	if n == 0 {
		b.Fatal("nothing emitted")
	}
}

// BenchmarkStreamToolCall is a whole tool-calling stream (11 chunks).
func BenchmarkStreamToolCall(b *testing.B) {
	up := []byte(openAIToolStream)
	var out bytes.Buffer
	s := NewStream(nil, nil)
	emit := func(ev []byte) error { out.Write(ev); return nil }
	b.SetBytes(int64(len(up)))
	b.ReportAllocs()
	for b.Loop() {
		out.Reset()
		s.Reset(&Info{}, emit)
		s.Write(up)
		s.Close()
	}
	if !strings.HasSuffix(out.String(), "message_stop\"}\n\n") {
		b.Fatal(out.String())
	}
}
