package kvsim

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// outputToken is the text of every generated token (TokenBytes long), so
// an answer's content is predictable: OutputTokens × "tok ".
const outputToken = "tok "

// answer is what one request produced, rendered in its engine's shapes.
type answer struct {
	id, model                         string
	created                           int64
	engine                            Engine
	prompt, cached, evaluated, output int
	prefill, decode                   time.Duration
}

func (a answer) content() string { return strings.Repeat(outputToken, a.output) }

// usage is the OpenAI usage object; llama.cpp and vLLM add the reused
// prompt tokens, Ollama does not.
func (a answer) usage() map[string]any {
	u := map[string]any{
		"prompt_tokens":     a.prompt,
		"completion_tokens": a.output,
		"total_tokens":      a.prompt + a.output,
	}
	if a.engine != None {
		u["prompt_tokens_details"] = map[string]any{"cached_tokens": a.cached}
	}
	return u
}

// timings is llama.cpp's: cache_n reused, prompt_n evaluated.
func (a answer) timings() map[string]any {
	pms, dms := ms(a.prefill), ms(a.decode)
	return map[string]any{
		"cache_n":                a.cached,
		"prompt_n":               a.evaluated,
		"prompt_ms":              pms,
		"prompt_per_token_ms":    per(pms, a.evaluated),
		"prompt_per_second":      rate(a.evaluated, pms),
		"predicted_n":            a.output,
		"predicted_ms":           dms,
		"predicted_per_token_ms": per(dms, a.output),
		"predicted_per_second":   rate(a.output, dms),
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func per(total float64, n int) float64 {
	if n == 0 {
		return 0
	}
	return total / float64(n)
}

func rate(n int, totalMS float64) float64 {
	if totalMS == 0 {
		return 0
	}
	return 1e3 * float64(n) / totalMS
}

func (a answer) fingerprint() string {
	if a.engine == None {
		return "fp_ollama"
	}
	return "kvsim"
}

// completion is the non-streaming answer.
func (a answer) completion() map[string]any {
	c := map[string]any{
		"id": a.id, "object": "chat.completion", "created": a.created, "model": a.model,
		"system_fingerprint": a.fingerprint(),
		"choices": []any{map[string]any{
			"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": a.content()},
		}},
		"usage": a.usage(),
	}
	if a.engine == LlamaCpp {
		c["timings"] = a.timings()
	}
	return c
}

// chunk is one chat.completion.chunk with the given choices.
func (a answer) chunk(choices []any) map[string]any {
	return map[string]any{
		"id": a.id, "object": "chat.completion.chunk", "created": a.created, "model": a.model,
		"system_fingerprint": a.fingerprint(), "choices": choices,
	}
}

func delta(d map[string]any, finish any) []any {
	return []any{map[string]any{"index": 0, "delta": d, "finish_reason": finish}}
}

// stream writes the answer as SSE the way the engines frame it: a chunk
// with the role at the end of the prefill (first is called as it is
// flushed), one chunk per token every perToken, a chunk with the finish
// reason, with includeUsage a last chunk with empty choices and the
// usage, then [DONE]. llama.cpp puts its timings on the last chunk. It
// returns false when the client went away.
func (a answer) stream(ctx context.Context, w http.ResponseWriter, perToken time.Duration, includeUsage bool, first func()) bool {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	send := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := w.Write(append(append([]byte("data: "), b...), '\n', '\n')); err != nil {
			return false
		}
		if fl != nil {
			fl.Flush()
		}
		return true
	}
	role := map[string]any{"role": "assistant", "content": nil}
	if a.engine != LlamaCpp {
		role["content"] = ""
	}
	if !send(a.chunk(delta(role, nil))) {
		return false
	}
	first()
	for i := 0; i < a.output; i++ {
		if !sleep(ctx, perToken) || !send(a.chunk(delta(map[string]any{"content": outputToken}, nil))) {
			return false
		}
	}
	last := a.chunk(delta(map[string]any{}, "stop"))
	if includeUsage {
		if !send(last) {
			return false
		}
		last = a.chunk([]any{})
		last["usage"] = a.usage()
	}
	if a.engine == LlamaCpp {
		last["timings"] = a.timings()
	}
	if !send(last) {
		return false
	}
	_, err := w.Write([]byte("data: [DONE]\n\n"))
	if fl != nil {
		fl.Flush()
	}
	return err == nil
}
