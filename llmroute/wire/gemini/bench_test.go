package gemini

import (
	"strings"
	"testing"
)

// textStream is a typical streamed chat answer: a role chunk, n text
// deltas, the finish chunk, usage and [DONE] (the input of wire/anthropic's
// and wire/responses' BenchmarkStreamText, so the translators compare).
func textStream(n int) []byte {
	const head = `data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1700000000,"model":"qwen3-coder","choices":[{"index":0,"delta":`
	var sb strings.Builder
	sb.WriteString(head + `{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for i := 0; i < n; i++ {
		sb.WriteString(head + `{"content":" some words"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	sb.WriteString(head + `{},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n")
	sb.WriteString(`data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1700000000,"model":"qwen3-coder","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":200,"total_tokens":320,"prompt_tokens_details":{"cached_tokens":100}}}` + "\n\n")
	sb.WriteString("data: [DONE]\n\n")
	return []byte(sb.String())
}

// BenchmarkStream translates a 200-delta text answer (chat stream → Gemini
// events) fed in 512-byte reads, with a pooled Stream (Reset), as the core
// runs it; allocs/event is per upstream chat event (target 0).
func BenchmarkStream(b *testing.B) {
	const deltas = 200
	up := textStream(deltas)
	events := float64(deltas + 4)
	var n int
	emit := func(ev []byte) error { n += len(ev); return nil }
	info := &Info{Model: "m"}
	s := NewStream(info, emit)
	b.SetBytes(int64(len(up)))
	b.ReportAllocs()
	for b.Loop() {
		s.Reset(info, emit)
		for p := up; len(p) > 0; {
			k := min(512, len(p))
			if _, err := s.Write(p[:k]); err != nil {
				b.Fatal(err)
			}
			p = p[k:]
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
	if n == 0 || !s.Finished() {
		b.Fatal("stream did not finish")
	}
	allocs := testing.AllocsPerRun(20, func() {
		s.Reset(info, emit)
		s.Write(up)
		s.Close()
	})
	b.ReportMetric(allocs/events, "allocs/event")
}

// BenchmarkStreamToolCall is a whole tool-calling stream (11 chunks, two
// parallel calls gathered into the final event).
func BenchmarkStreamToolCall(b *testing.B) {
	up := []byte(toolStream)
	var n int
	emit := func(ev []byte) error { n += len(ev); return nil }
	info := &Info{}
	s := NewStream(info, emit)
	b.SetBytes(int64(len(up)))
	b.ReportAllocs()
	for b.Loop() {
		s.Reset(info, emit)
		s.Write(up)
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkToChat translates the recorded Gemini CLI turn 2 (15 tools, a
// function call and its response).
func BenchmarkToChat(b *testing.B) {
	body := []byte(recordedCLI(b)[2].Body)
	dst := make([]byte, 0, 2*len(body))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		out, _, err := ToChat(dst[:0], body, Options{ReasoningField: "reasoning_content", Model: "gemini-3.8-flash", Stream: true})
		if err != nil || len(out) == 0 {
			b.Fatal(err)
		}
	}
}

func BenchmarkSessionBody(b *testing.B) {
	body := []byte(recordedCLI(b)[2].Body)
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
	info := &Info{Model: "m", IncludeThoughts: true}
	dst := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FromChat(dst[:0], chat, info); err != nil {
			b.Fatal(err)
		}
	}
}
