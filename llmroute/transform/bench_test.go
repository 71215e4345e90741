package transform

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A typical OpenAI-style content chunk (~230 bytes) with no tags.
var benchChunk = []byte(`data: {"id":"chatcmpl-AbCdEf0123456789","object":"chat.completion.chunk","created":1751000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_a1b2c3d4e5","choices":[{"index":0,"delta":{"content":" the quick brown fox"},"logprobs":null,"finish_reason":null}]}` + "\n\n")

// BenchmarkStreamPlainCopy is the baseline: what the handler does with
// think_tags off (hand each read to the writer).
func BenchmarkStreamPlainCopy(b *testing.B) {
	var n int
	emit := func(ev []byte) error { n += len(ev); return nil }
	b.SetBytes(int64(len(benchChunk)))
	b.ReportAllocs()
	for b.Loop() {
		emit(benchChunk)
	}
}

// BenchmarkStreamPassthrough: a split-mode rewriter on chunks that need no
// change, one event per Write (how upstreams usually flush).
func BenchmarkStreamPassthrough(b *testing.B) {
	var n int
	s := NewStreamRewriter(ThinkSplit, func(ev []byte) error { n += len(ev); return nil })
	b.SetBytes(int64(len(benchChunk)))
	b.ReportAllocs()
	for b.Loop() {
		s.Write(benchChunk)
	}
}

// BenchmarkStreamPassthroughBatch: 16 unchanged events per Write (a busy
// upstream read); SetBytes counts one event, so ns/op is per 16 events.
func BenchmarkStreamPassthroughBatch(b *testing.B) {
	var n, calls int
	s := NewStreamRewriter(ThinkSplit, func(ev []byte) error { n += len(ev); calls++; return nil })
	in := bytes.Repeat(benchChunk, 16)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		s.Write(in)
	}
}

// BenchmarkStreamPassthroughSplitWrites: the same with every event cut in
// two writes, so it goes through the carry buffer.
func BenchmarkStreamPassthroughSplitWrites(b *testing.B) {
	var n int
	s := NewStreamRewriter(ThinkSplit, func(ev []byte) error { n += len(ev); return nil })
	half := len(benchChunk) / 2
	b.SetBytes(int64(len(benchChunk)))
	b.ReportAllocs()
	for b.Loop() {
		s.Write(benchChunk[:half])
		s.Write(benchChunk[half:])
	}
}

// BenchmarkStreamSplit: every event is rewritten (content inside a think
// block moves to reasoning_content); a cycle of 4 events.
func BenchmarkStreamSplit(b *testing.B) {
	mk := func(c string) []byte {
		return []byte(`data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"MiniMax-M1","choices":[{"index":0,"delta":{"content":` + string(mustJSON(c)) + `,"role":"assistant"}}]}` + "\n\n")
	}
	events := [][]byte{mk("<think>The user asks"), mk(" about \u003cthings\u003e, \"quoted\"\n"), mk("more thinking</thi"), mk("nk>\n\nAnswer text here")}
	total := 0
	for _, e := range events {
		total += len(e)
	}
	var n int
	s := NewStreamRewriter(ThinkSplit, func(ev []byte) error { n += len(ev); return nil })
	b.SetBytes(int64(total / len(events)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Write(events[i&3])
		i++
	}
}

func benchBody(size int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"my-gpt","stream":true,"temperature":0.7,"messages":[{"role":"system","content":"You are a helpful assistant. Answer concisely."}`)
	for i := 0; sb.Len() < size; i++ {
		fmt.Fprintf(&sb, `,{"role":"user","content":"Question %d: explain the difference between a mutex and a channel in Go, with an example \"quoted\" and a newline\n."}`, i)
		fmt.Fprintf(&sb, `,{"role":"assistant","content":"Answer %d: a mutex guards shared memory; a channel passes ownership.","reasoning":"Think about Go memory model %d."}`, i, i)
	}
	sb.WriteString(`],"max_tokens":1024}`)
	return []byte(sb.String())
}

func benchEdit(_ testing.TB, backfill bool) *RequestEdit {
	p1, _ := CompilePatch([]byte(`{"provider":{"allow_fallbacks":false}}`))
	p2, _ := CompilePatch([]byte(`{"provider":{"ignore":["deepseek"]}}`))
	p3, _ := CompilePatch([]byte(`{"reasoning":{"enabled":false}}`))
	e := &RequestEdit{Model: "gpt-4o", Patch: p1.Then(p2).Then(p3)}
	if backfill {
		e.ReasoningField = "reasoning_content"
	}
	return e
}

func benchRewrite(b *testing.B, size int, backfill bool) {
	body := benchBody(size)
	e := benchEdit(b, backfill)
	dst := make([]byte, 0, len(body)*2)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ParseRequest(body); err != nil {
			b.Fatal(err)
		}
		var err error
		if dst, err = RewriteRequest(dst[:0], body, e); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRewriteRequest: ParseRequest + RewriteRequest (model swap + a
// three-layer patch), as the handler runs them per attempt.
func BenchmarkRewriteRequest1500B(b *testing.B) { benchRewrite(b, 1500, false) }
func BenchmarkRewriteRequest1MB(b *testing.B)   { benchRewrite(b, 1<<20, false) }

// BenchmarkBackfill200: RewriteRequest with reasoning backfill on a
// 200-message history where every assistant message gets the field.
func BenchmarkBackfill200(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","messages":[`)
	for i := 0; i < 100; i++ {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `{"role":"user","content":"Question %d about the codebase?"},{"role":"assistant","content":"Answer %d.","reasoning_details":[{"type":"reasoning.text","text":"step one %d"},{"type":"reasoning.text","text":"step two"}]}`, i, i, i)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	e := &RequestEdit{ReasoningField: "reasoning_content"}
	dst := make([]byte, 0, len(body)*2)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = RewriteRequest(dst[:0], body, e)
	}
}

func BenchmarkParseRequest1MB(b *testing.B) {
	body := benchBody(1 << 20)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ParseRequest(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCompilePatchThen: config-time cost of building an edit.
func BenchmarkCompilePatchThen(b *testing.B) {
	raws := [][]byte{[]byte(`{"provider":{"allow_fallbacks":false,"order":["a","b"]}}`), []byte(`{"provider":{"ignore":["deepseek"]},"top_p":0.9}`), []byte(`{"reasoning":{"enabled":false}}`)}
	b.ReportAllocs()
	for b.Loop() {
		p1, _ := CompilePatch(raws[0])
		p2, _ := CompilePatch(raws[1])
		p3, _ := CompilePatch(raws[2])
		_ = p1.Then(p2).Then(p3)
	}
}

// BenchmarkSessionsID200: session id of a 200-message history, registry warm.
func BenchmarkSessionsID200(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","messages":[{"role":"system","content":"sys"}`)
	for i := 0; i < 100; i++ {
		fmt.Fprintf(&sb, `,{"role":"user","content":"Question %d about the codebase?"},{"role":"assistant","content":"Answer %d, with some more words to make it realistic.","reasoning":"r"}`, i, i)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	s := NewSessions(1000, 6*time.Hour, time.Now)
	s.ID(body)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		s.ID(body)
	}
}

func BenchmarkRewriteCompletion(b *testing.B) {
	body := []byte(`{"id":"x","object":"chat.completion","created":1,"model":"MiniMax-M1","choices":[{"index":0,"message":{"role":"assistant","content":"<think>\nThe user wants a haiku about autumn.\n</think>\n\nCrimson leaves drifting\nwhispers of the cooling wind\nthe year exhales slow"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":40,"total_tokens":60}}`)
	dst := make([]byte, 0, 1024)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = RewriteCompletion(dst[:0], body, ThinkSplit)
	}
}
