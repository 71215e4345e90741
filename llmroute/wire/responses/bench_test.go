package responses

import (
	"strings"
	"testing"
)

// BenchmarkToChatCodex translates Codex's recorded second turn (39 KB, ten
// tools, a custom tool call and its output).
func BenchmarkToChatCodex(b *testing.B) {
	body := codexBodies(b)[1]
	opt := Options{ReasoningField: "reasoning_content"}
	var dst []byte
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		out, _, err := ToChat(dst[:0], body, opt)
		if err != nil {
			b.Fatal(err)
		}
		dst = out
	}
}

// benchUpstream is a typical streamed answer: reasoning, 200 text deltas, a
// custom tool call in 40 deltas, usage.
func benchUpstream() []byte {
	var sb strings.Builder
	sb.WriteString(chatChunk(`{"role":"assistant","content":""}`, ""))
	for i := 0; i < 20; i++ {
		sb.WriteString(chatChunk(`{"reasoning_content":"thinking about it "}`, ""))
	}
	for i := 0; i < 200; i++ {
		sb.WriteString(chatChunk(`{"content":"some words here "}`, ""))
	}
	sb.WriteString(chatChunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"apply_patch","arguments":"{\"input\":\""}}]}`, ""))
	for i := 0; i < 40; i++ {
		sb.WriteString(chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"+a line\\n"}}]}`, ""))
	}
	sb.WriteString(chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"\"}"}}]}`, ""))
	sb.WriteString(chatChunk(`{}`, "tool_calls"))
	sb.WriteString(usageChunk)
	sb.WriteString("data: [DONE]\n\n")
	return []byte(sb.String())
}

// BenchmarkStream translates benchUpstream fed in 512-byte reads, with a
// pooled Stream (Reset), as the core would run it.
func BenchmarkStream(b *testing.B) {
	up := benchUpstream()
	info := infoFor(b, toolsBody)
	emit := func([]byte) error { return nil }
	s := NewStream(info, emit)
	b.SetBytes(int64(len(up)))
	b.ReportAllocs()
	for b.Loop() {
		s.Reset(info, emit)
		for p := up; len(p) > 0; {
			n := min(512, len(p))
			if _, err := s.Write(p[:n]); err != nil {
				b.Fatal(err)
			}
			p = p[n:]
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFromChat(b *testing.B) {
	info := infoFor(b, toolsBody)
	chat := []byte(`{"id":"chatcmpl-9","object":"chat.completion","created":1700000001,"model":"qwen3-coder","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("some words here ", 200) + `","reasoning_content":"need ls","tool_calls":[{"id":"call_9","type":"function","function":{"name":"exec_command","arguments":"{\"cmd\":\"ls\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`)
	var dst []byte
	b.SetBytes(int64(len(chat)))
	b.ReportAllocs()
	for b.Loop() {
		out, err := FromChat(dst[:0], chat, info)
		if err != nil {
			b.Fatal(err)
		}
		dst = out
	}
}
