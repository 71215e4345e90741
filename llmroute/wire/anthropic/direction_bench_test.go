package anthropic

import (
	"strings"
	"testing"
)

// textStream is a typical streamed chat answer: a role chunk, n text
// deltas, the finish chunk, usage and [DONE] (the same input as
// wire/responses' BenchmarkStreamText, so the two translators compare).
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

// BenchmarkStreamText translates a 200-delta text answer (chat stream →
// Messages events) fed in 512-byte reads, with a pooled Stream (Reset), as
// the core runs it; ns/op and allocs/op are per whole answer.
func BenchmarkStreamText(b *testing.B) {
	up := textStream(200)
	var n int
	emit := func(ev []byte) error { n += len(ev); return nil }
	s := NewStream(&Info{Model: "m"}, emit)
	b.SetBytes(int64(len(up)))
	b.ReportAllocs()
	for b.Loop() {
		s.Reset(&Info{Model: "m"}, emit)
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
}
