// Package kvsim is a fake inference server that behaves like a llama.cpp or
// vLLM server in front of one GPU: OpenAI-compatible chat completions
// (streaming or not), a fixed number of slots with a FIFO queue behind
// them, and a prefix KV cache whose hits make the first byte come sooner.
// The integration tests and the load benchmark's fleet scenario use it to
// see where a router sends each conversation and what that costs.
//
// The model, per request:
//
//   - Tokens: the prompt text is what the upstream request carries, in
//     order: each message's role, its text content (string or text parts),
//     its tool calls' names and arguments and its tool_call_id, then the
//     request's tools as JSON. It is cut in TokenBytes (4) byte tokens, so
//     a request that extends another's messages extends its tokens.
//   - Slots: Config.Slots requests run at once (llama.cpp --parallel);
//     more wait inside the server, first come first served, as llama.cpp
//     queues its tasks.
//   - Cache: Config.CacheTokens of whole prompts (llama.cpp's prompt cache,
//     vLLM's prefix cache), least recently used out first. A request reuses
//     the longest common token prefix with any stored prompt; once its
//     prefill is done its own prompt is stored. The engine always
//     evaluates the prompt's last token, and vLLM reuses whole 16-token
//     blocks, so the reused count is at most the prompt's tokens − 1.
//   - Time: once a slot is free, the first byte comes after
//     PrefillPerToken × the tokens not reused; then OutputTokens tokens
//     follow, DecodePerToken each (a stream sends one chunk per token).
//   - Reporting (Config.Engine): LlamaCpp puts `timings` (cache_n,
//     prompt_n = tokens evaluated, …) in the final object or chunk and
//     `usage.prompt_tokens_details.cached_tokens`, as recent llama.cpp
//     servers do; VLLM only the latter; None (Ollama) reports no reuse.
//     Streams carry usage in a last chunk with empty choices when the
//     request sets stream_options.include_usage.
//
// For tests: every answered request is recorded (Requests) with its
// conversation tag (request header X-Test-Conv), its prompt and reused
// tokens and its time to first byte; Hold and Release keep the slots'
// requests from starting (a busy member); FailNext answers 503 like a
// loading llama.cpp.
package kvsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Engine selects how a server reports the prompt tokens it reused.
type Engine string

// The engines whose reporting a server can copy.
const (
	// LlamaCpp: `timings` {cache_n, prompt_n, …} in the final object or
	// chunk, and usage.prompt_tokens_details.cached_tokens.
	LlamaCpp Engine = "llamacpp"
	// VLLM: usage.prompt_tokens_details.cached_tokens only, whole blocks.
	VLLM Engine = "vllm"
	// None: no reuse reported at all (Ollama's OpenAI endpoint).
	None Engine = "none"
)

// ConvHeader is the request header whose value tags a request's record
// (a test's conversation name). A router forwards it only when the
// provider lists it in forward_headers.
const ConvHeader = "X-Test-Conv"

// Config describes one simulated server. Zero values take the defaults.
type Config struct {
	// Slots is how many requests run at once (llama.cpp --parallel).
	// Default 1.
	Slots int
	// CacheTokens is the KV cache's capacity in tokens, all stored
	// prompts together. Default 0: unlimited; negative: no cache.
	CacheTokens int
	// PrefillPerToken is the time to evaluate one prompt token that was
	// not in the cache. Default 0.
	PrefillPerToken time.Duration
	// DecodePerToken is the time to generate one output token. Default 0.
	DecodePerToken time.Duration
	// OutputTokens is how many tokens each answer has (fewer when the
	// request's max_tokens or max_completion_tokens is lower). Default 8.
	OutputTokens int
	// Engine is the reporting shape. Default LlamaCpp.
	Engine Engine
	// Model is the id GET /v1/models lists and answers carry when the
	// request names none. Default "kvsim".
	Model string
}

// Request is the record of one request the server answered.
type Request struct {
	Conv   string    // the X-Test-Conv header, or ""
	At     time.Time // arrival
	Status int       // 200, 503 (FailNext), 400, or 499 when the client left first
	Stream bool
	// PromptTokens and CachedTokens: the prompt's tokens and those taken
	// from the cache (what the engine reports as reused, also for None).
	PromptTokens, CachedTokens int
	// Waited is the time spent waiting for a slot (and in a Hold).
	Waited time.Duration
	// TTFT is arrival → first byte of a stream, or → end of prefill for
	// a non-streaming answer (whose bytes all come at the end).
	TTFT time.Duration
}

// Stats are a server's counters since start or the last Reset.
type Stats struct {
	Requests   int // records of any status
	Served     int // status 200
	Failed     int // FailNext answers
	PromptTok  int // prompt tokens of the served requests
	CachedTok  int // of which reused from the cache
	Evictions  int // prompts the cache pushed out for room (since start)
	CacheUsed  int // tokens in the cache now
	PeakActive int // most requests in slots at once
}

// CachedRatio is CachedTok ÷ PromptTok (0 without traffic).
func (s Stats) CachedRatio() float64 {
	if s.PromptTok == 0 {
		return 0
	}
	return float64(s.CachedTok) / float64(s.PromptTok)
}

// Server is one simulated inference server. It is an http.Handler; Listen
// also serves it on a loopback port.
type Server struct {
	cfg Config
	// URL is http://127.0.0.1:port after Listen (the provider url is
	// URL + "/v1"); empty for a Server from New.
	URL string
	srv *http.Server

	mu       sync.Mutex
	cache    *cache
	free     int             // free slots
	queue    []chan struct{} // waiters for a slot, oldest first
	active   int
	peak     int
	gate     chan struct{} // non-nil while held: requests in slots wait for it to close
	held     int
	failNext int
	reqs     []Request
	seq      int
}

// New returns a server with cfg (defaults filled in).
func New(cfg Config) *Server {
	if cfg.Slots <= 0 {
		cfg.Slots = 1
	}
	if cfg.OutputTokens <= 0 {
		cfg.OutputTokens = 8
	}
	if cfg.Engine == "" {
		cfg.Engine = LlamaCpp
	}
	if cfg.Model == "" {
		cfg.Model = "kvsim"
	}
	s := &Server{cfg: cfg, free: cfg.Slots}
	if cfg.CacheTokens >= 0 {
		s.cache = newCache(cfg.CacheTokens)
	}
	return s
}

// Listen starts a server with cfg on a free loopback port.
func Listen(cfg Config) (*Server, error) {
	s := New(cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.URL = "http://" + l.Addr().String()
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

// Close releases any Hold and stops a listening server, cutting the
// requests still running.
func (s *Server) Close() {
	s.Release()
	if s.srv != nil {
		_ = s.srv.Close()
	}
}

// Config returns the server's configuration, defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// Hold makes every request that reaches a slot from now on (queued ones
// included) wait there, before its prefill, until Release: the server
// looks busy to a router that counts its in-flight requests. Requests
// already past that point go on.
func (s *Server) Hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate == nil {
		s.gate = make(chan struct{})
	}
}

// Release lets the held requests go on and ends the Hold.
func (s *Server) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
}

// Held is the number of requests waiting in a Hold now.
func (s *Server) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// Active is the number of requests in slots now (held ones included).
func (s *Server) Active() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active
}

// Queued is the number of requests waiting for a slot now.
func (s *Server) Queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// FailNext makes the next n chat requests fail at once with 503, as a
// llama.cpp server that is loading its model answers.
func (s *Server) FailNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext = n
}

// Requests returns a copy of the records, in the order requests ended.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Requests: len(s.reqs), PeakActive: s.peak}
	for _, r := range s.reqs {
		switch r.Status {
		case http.StatusOK:
			st.Served++
			st.PromptTok += r.PromptTokens
			st.CachedTok += r.CachedTokens
		case http.StatusServiceUnavailable:
			st.Failed++
		}
	}
	if s.cache != nil {
		st.Evictions, st.CacheUsed = s.cache.evictedPrompts, s.cache.used
	}
	return st
}

// Reset forgets the records and the peak (the cache stays): a benchmark
// warms the caches, then measures.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs, s.peak = nil, s.active
}

// DropCache empties the KV cache, as a restarted engine has.
func (s *Server) DropCache() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache != nil {
		s.cache.clear()
	}
}

// ServeHTTP answers GET /v1/models and POST /v1/chat/completions.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models"):
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","created":%d,"owned_by":%q}]}`,
			s.cfg.Model, time.Now().Unix(), s.cfg.Engine)
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/chat/completions"):
		s.chat(w, r)
	default:
		writeError(w, http.StatusNotFound, "not_found_error", "File Not Found")
	}
}

// chatRequest is the part of a chat request the server reads.
type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCalls  []toolCall      `json:"tool_calls"`
		ToolCallID string          `json:"tool_call_id"`
	} `json:"messages"`
	Tools         json.RawMessage `json:"tools"`
	Stream        bool            `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           int `json:"max_tokens"`
	MaxCompletionTokens int `json:"max_completion_tokens"`
}

type toolCall struct {
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// promptText renders what the engine tokenizes: each message's role, text,
// tool calls and tool_call_id, in order, then the tools.
func (q *chatRequest) promptText() (string, error) {
	var b strings.Builder
	for i, m := range q.Messages {
		b.WriteString("<|" + m.Role + "|>")
		if err := writeContent(&b, m.Content); err != nil {
			return "", fmt.Errorf("messages[%d].content: %v", i, err)
		}
		for _, tc := range m.ToolCalls {
			b.WriteString("<|call|>" + tc.Function.Name + tc.Function.Arguments)
		}
		if m.ToolCallID != "" {
			b.WriteString("<|id|>" + m.ToolCallID)
		}
		b.WriteString("\n")
	}
	if len(q.Tools) > 0 && string(q.Tools) != "null" {
		b.WriteString("<|tools|>")
		b.Write(q.Tools)
	}
	return b.String(), nil
}

// writeContent appends a message content: a string, or the text of its
// parts (other parts, such as images, count nothing here).
func writeContent(b *strings.Builder, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		b.WriteString(s)
		return nil
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return errors.New("want a string or an array of parts")
	}
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return nil
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	rec := Request{Conv: r.Header.Get(ConvHeader), At: time.Now()}
	var q chatRequest
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = json.Unmarshal(body, &q)
	}
	var prompt string
	if err == nil {
		prompt, err = q.promptText()
	}
	if err == nil && len(q.Messages) == 0 {
		err = errors.New("'messages' must be a non-empty array")
	}
	if err != nil {
		rec.Status = http.StatusBadRequest
		s.record(rec)
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	rec.Stream = q.Stream
	rec.PromptTokens = tokens(prompt)

	s.mu.Lock()
	if s.failNext > 0 {
		s.failNext--
		s.mu.Unlock()
		rec.Status = http.StatusServiceUnavailable
		s.record(rec)
		writeError(w, http.StatusServiceUnavailable, "unavailable_error", "Loading model")
		return
	}
	s.mu.Unlock()

	ctx := r.Context()
	if err := s.acquire(ctx); err != nil {
		rec.Status, rec.Waited = 499, time.Since(rec.At)
		s.record(rec)
		return
	}
	defer s.release()
	if err := s.waitHold(ctx); err != nil {
		rec.Status, rec.Waited = 499, time.Since(rec.At)
		s.record(rec)
		return
	}
	rec.Waited = time.Since(rec.At)

	// Prefill: what the cache does not hold, then the prompt is stored.
	s.mu.Lock()
	common := 0
	if s.cache != nil {
		common = s.cache.lookup(prompt)
	}
	s.mu.Unlock()
	rec.CachedTokens = reused(s.cfg.Engine, common, rec.PromptTokens)
	evaluated := rec.PromptTokens - rec.CachedTokens
	prefill := time.Duration(evaluated) * s.cfg.PrefillPerToken
	if !sleep(ctx, prefill) {
		rec.Status = 499
		s.record(rec)
		return
	}
	s.mu.Lock()
	if s.cache != nil {
		s.cache.store(prompt)
	}
	s.mu.Unlock()

	out := s.cfg.OutputTokens
	for _, m := range []int{q.MaxTokens, q.MaxCompletionTokens} {
		if m > 0 {
			out = min(out, m)
		}
	}
	a := answer{
		id: fmt.Sprintf("chatcmpl-kvsim%d", s.nextSeq()), model: q.Model, created: time.Now().Unix(),
		engine: s.cfg.Engine, prompt: rec.PromptTokens, cached: rec.CachedTokens, evaluated: evaluated,
		output: out, prefill: prefill, decode: time.Duration(out) * s.cfg.DecodePerToken,
	}
	if a.model == "" {
		a.model = s.cfg.Model
	}
	rec.Status = http.StatusOK
	if q.Stream {
		ok := a.stream(ctx, w, s.cfg.DecodePerToken, q.StreamOptions.IncludeUsage, func() { rec.TTFT = time.Since(rec.At) })
		if !ok {
			rec.Status = 499
		}
	} else {
		rec.TTFT = time.Since(rec.At)
		if !sleep(ctx, a.decode) {
			rec.Status = 499
		} else {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(a.completion())
		}
	}
	s.record(rec)
}

func (s *Server) record(rec Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, rec)
}

func (s *Server) nextSeq() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return s.seq
}

// acquire takes a slot, waiting in FIFO order behind earlier requests.
func (s *Server) acquire(ctx context.Context) error {
	s.mu.Lock()
	if s.free > 0 && len(s.queue) == 0 {
		s.free--
		s.started()
		s.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	s.queue = append(s.queue, ch)
	s.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for i, c := range s.queue {
			if c == ch {
				s.queue = append(s.queue[:i], s.queue[i+1:]...)
				s.mu.Unlock()
				return ctx.Err()
			}
		}
		s.mu.Unlock()
		// The slot was handed over as the client left: pass it on.
		s.release()
		return ctx.Err()
	}
}

// started counts a request entering a slot; s.mu is held.
func (s *Server) started() {
	s.active++
	s.peak = max(s.peak, s.active)
}

// release frees a slot: the oldest waiter takes it.
func (s *Server) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	if len(s.queue) > 0 {
		ch := s.queue[0]
		s.queue = s.queue[1:]
		s.started()
		close(ch)
		return
	}
	s.free++
}

// waitHold waits while the server is held.
func (s *Server) waitHold(ctx context.Context) error {
	s.mu.Lock()
	gate := s.gate
	if gate == nil {
		s.mu.Unlock()
		return nil
	}
	s.held++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.held--
		s.mu.Unlock()
	}()
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// writeError answers with llama.cpp's error object.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": status, "message": msg, "type": typ}})
}
