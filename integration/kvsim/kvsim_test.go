package kvsim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCommonTokensCountsWholeTokens(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"abcdefgh", "abcdefgh", 2},
		{"abcdefg", "abcdefg", 2}, // equal texts: the short last token too
		{"abcdefgh", "abcdefgX", 1},
		{"abcd", "abcdefgh", 1},
		{"abcdef", "abcdefgh", 1}, // the 2-byte tail is not a whole shared token
		{"Xbcd", "abcd", 0},
	} {
		if got := commonTokens(tc.a, tc.b); got != tc.want {
			t.Errorf("commonTokens(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// A prompt reuses its longest common prefix with any stored prompt, and a
// longer prompt of the same history replaces the shorter one.
func TestCacheLongestPrefix(t *testing.T) {
	c := newCache(0)
	sys := strings.Repeat("s", 400) // 100 tokens
	a1 := sys + strings.Repeat("a", 200)
	b1 := sys + strings.Repeat("b", 400)
	c.store(a1)
	c.store(b1)
	if got := c.lookup(sys + strings.Repeat("c", 80)); got != 100 {
		t.Errorf("a new conversation reuses %d tokens, want the 100 of the shared system prompt", got)
	}
	if got := c.lookup(b1 + "more"); got != 200 {
		t.Errorf("b's next turn reuses %d tokens, want its whole previous prompt (200)", got)
	}
	a2 := a1 + strings.Repeat("x", 40)
	if got := c.lookup(a2); got != 150 {
		t.Errorf("a's next turn reuses %d tokens, want 150", got)
	}
	c.store(a2)
	if c.lru.Len() != 2 || c.used != tokens(a2)+tokens(b1) {
		t.Errorf("after a's next turn: %d prompts, %d tokens; want a1 replaced by a2 (2 prompts, %d tokens)",
			c.lru.Len(), c.used, tokens(a2)+tokens(b1))
	}
}

// The least recently used prompt goes first; a lookup counts as a use.
func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	c := newCache(250)
	a, b, d := strings.Repeat("a", 400), strings.Repeat("b", 400), strings.Repeat("d", 400) // 100 tokens each
	c.store(a)
	c.store(b)
	c.lookup(a + "next") // a used again: b is now the oldest
	c.store(d)
	if c.lookup(b) != 0 {
		t.Error("b survived; it was the least recently used")
	}
	if c.lookup(a) != 100 || c.lookup(d) != 100 {
		t.Error("a or d was evicted; b should have gone")
	}
	if c.evictedPrompts != 1 || c.evictedTokens != 100 || c.used != 200 {
		t.Errorf("evicted %d prompts / %d tokens, %d used; want 1 / 100, 200", c.evictedPrompts, c.evictedTokens, c.used)
	}
	c.store(strings.Repeat("z", 1200)) // 300 tokens: larger than the cache
	if c.lookup(strings.Repeat("z", 1200)) != 0 || c.used != 200 {
		t.Error("a prompt larger than the capacity was kept or pushed the others out")
	}
}

func TestReusedLeavesTheLastTokenAndVLLMBlocks(t *testing.T) {
	if got := reused(LlamaCpp, 100, 100); got != 99 {
		t.Errorf("llama.cpp fully cached 100-token prompt: reused %d, want 99", got)
	}
	if got := reused(VLLM, 100, 200); got != 96 {
		t.Errorf("vLLM 100 common tokens: reused %d, want 96 (whole 16-token blocks)", got)
	}
	if got := reused(None, 0, 1); got != 0 {
		t.Errorf("nothing cached: reused %d", got)
	}
}

// chatBody is a request of the given messages (pairs of role, content).
func chatBody(stream bool, kv ...string) string {
	var msgs []map[string]any
	for i := 0; i+1 < len(kv); i += 2 {
		msgs = append(msgs, map[string]any{"role": kv[i], "content": kv[i+1]})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "stream": stream,
		"stream_options": map[string]any{"include_usage": true}})
	return string(b)
}

func post(t *testing.T, url, conv, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if conv != "" {
		req.Header.Set(ConvHeader, conv)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// sseData returns the data payloads of an SSE body, checking the framing.
func sseData(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	blank := true
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			blank = true
		case strings.HasPrefix(line, "data: ") && blank:
			out = append(out, strings.TrimPrefix(line, "data: "))
			blank = false
		default:
			t.Fatalf("bad SSE line %q", line)
		}
	}
	return out
}

// Each engine reports the reused tokens in its own shape, streaming or not.
func TestReportingShapes(t *testing.T) {
	sys := strings.Repeat("s", 800)
	for _, engine := range []Engine{LlamaCpp, VLLM, None} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%v", engine, stream), func(t *testing.T) {
				s := New(Config{Engine: engine, OutputTokens: 3})
				ts := httptest.NewServer(s)
				defer ts.Close()
				readAll(t, post(t, ts.URL, "", chatBody(false, "system", sys, "user", "one")))
				body := chatBody(stream, "system", sys, "user", "one", "assistant", "tok tok tok ", "user", "two")
				prompt := tokens("<|system|>" + sys + "\n<|user|>one\n<|assistant|>tok tok tok \n<|user|>two\n")
				cachedWant := tokens("<|system|>"+sys+"\n<|user|>one\n") - 1 // the stored prompt, less its last token
				if engine == VLLM {
					cachedWant -= cachedWant % 16
				}
				resp := post(t, ts.URL, "", body)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				var final map[string]any
				content := ""
				if stream {
					if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
						t.Errorf("Content-Type %q", ct)
					}
					data := sseData(t, resp.Body)
					resp.Body.Close()
					if len(data) != 1+3+2+1 || data[len(data)-1] != "[DONE]" {
						t.Fatalf("want role, 3 tokens, finish, usage, [DONE]; got %d events: %q", len(data), data)
					}
					for _, d := range data[:len(data)-1] {
						var c struct {
							Choices []struct {
								Delta struct{ Content string }
							}
						}
						if err := json.Unmarshal([]byte(d), &c); err != nil {
							t.Fatal(err)
						}
						for _, ch := range c.Choices {
							content += ch.Delta.Content
						}
					}
					_ = json.Unmarshal([]byte(data[len(data)-2]), &final)
					if ch := final["choices"].([]any); len(ch) != 0 {
						t.Errorf("the usage chunk has choices %v", ch)
					}
				} else {
					if err := json.NewDecoder(resp.Body).Decode(&final); err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					content = final["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
				}
				if content != "tok tok tok " {
					t.Errorf("content %q", content)
				}
				usage := final["usage"].(map[string]any)
				if int(usage["prompt_tokens"].(float64)) != prompt {
					t.Errorf("prompt_tokens %v, want %d", usage["prompt_tokens"], prompt)
				}
				details, hasDetails := usage["prompt_tokens_details"].(map[string]any)
				timings, hasTimings := final["timings"].(map[string]any)
				switch engine {
				case None:
					if hasDetails || hasTimings {
						t.Errorf("Ollama reports no reuse; got %v", final)
					}
				case VLLM:
					if hasTimings || int(details["cached_tokens"].(float64)) != cachedWant {
						t.Errorf("vLLM: want cached_tokens %d and no timings; got %v", cachedWant, final)
					}
				case LlamaCpp:
					if !hasDetails || int(details["cached_tokens"].(float64)) != cachedWant {
						t.Errorf("llama.cpp cached_tokens: want %d; got %v", cachedWant, usage)
					}
					if !hasTimings || int(timings["cache_n"].(float64)) != cachedWant ||
						int(timings["prompt_n"].(float64)) != prompt-cachedWant || int(timings["predicted_n"].(float64)) != 3 {
						t.Errorf("llama.cpp timings: want cache_n %d prompt_n %d; got %v", cachedWant, prompt-cachedWant, timings)
					}
				}
				recs := s.Requests()
				if last := recs[len(recs)-1]; last.CachedTokens != cachedWant || last.PromptTokens != prompt || last.Stream != stream {
					t.Errorf("record %+v", last)
				}
			})
		}
	}
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The first byte waits for the prefill of what the cache lacks: a cold
// prompt takes at least its tokens × PrefillPerToken, its next turn far
// less.
func TestPrefillTimeFollowsTheCache(t *testing.T) {
	s := New(Config{PrefillPerToken: time.Millisecond, OutputTokens: 1})
	ts := httptest.NewServer(s)
	defer ts.Close()
	sys := strings.Repeat("s", 1200) // ~300 tokens
	readAll(t, post(t, ts.URL, "a", chatBody(true, "system", sys, "user", "one")))
	readAll(t, post(t, ts.URL, "a", chatBody(true, "system", sys, "user", "one", "assistant", "x", "user", "two")))
	recs := s.Requests()
	cold, warm := recs[0], recs[1]
	if cold.Conv != "a" || cold.CachedTokens != 0 || cold.TTFT < time.Duration(cold.PromptTokens)*time.Millisecond {
		t.Errorf("cold turn %+v: want no reuse and TTFT ≥ %d ms", cold, cold.PromptTokens)
	}
	if warm.CachedTokens < cold.PromptTokens-1 || warm.TTFT >= cold.TTFT {
		t.Errorf("warm turn %+v after cold %+v: want its previous prompt reused and a sooner first byte", warm, cold)
	}
	if st := s.Stats(); st.Served != 2 || st.CachedTok != warm.CachedTokens || st.PromptTok != cold.PromptTokens+warm.PromptTokens {
		t.Errorf("stats %+v", st)
	}
}

// With one slot, requests wait inside the server and are served in
// arrival order; a held server keeps its slot busy until Release; a queued
// client that leaves gives up its place.
func TestSlotsQueueFIFOAndHold(t *testing.T) {
	s := New(Config{Slots: 1, OutputTokens: 1})
	ts := httptest.NewServer(s)
	defer ts.Close()
	s.Hold()
	var wg sync.WaitGroup
	send := func(conv string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			readAll(t, post(t, ts.URL, conv, chatBody(false, "user", conv)))
		}()
	}
	send("r0")
	waitFor(t, "the first request held", func() bool { return s.Held() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	leaver := make(chan struct{})
	go func() {
		defer close(leaver)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/chat/completions", strings.NewReader(chatBody(false, "user", "gone")))
		req.Header.Set(ConvHeader, "gone")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "the leaver queued", func() bool { return s.Queued() == 1 })
	for i := 1; i <= 3; i++ {
		send(fmt.Sprintf("r%d", i))
		waitFor(t, "request queued", func() bool { return s.Queued() == i+1 })
	}
	cancel()
	<-leaver
	waitFor(t, "the leaver out of the queue", func() bool { return s.Queued() == 3 })
	if s.Active() != 1 {
		t.Errorf("active %d while held, want 1", s.Active())
	}
	s.Release()
	wg.Wait()
	var order []string
	for _, r := range s.Requests() {
		if r.Status == http.StatusOK {
			order = append(order, r.Conv)
		} else if r.Conv != "gone" || r.Status != 499 {
			t.Errorf("unexpected record %+v", r)
		}
	}
	if strings.Join(order, ",") != "r0,r1,r2,r3" {
		t.Errorf("served in order %v, want r0..r3 as they arrived", order)
	}
	if s.Active() != 0 || s.Queued() != 0 || s.Stats().PeakActive != 1 {
		t.Errorf("after all: active %d queued %d peak %d; want 0, 0, 1", s.Active(), s.Queued(), s.Stats().PeakActive)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// FailNext answers 503 like a loading llama.cpp, then serves again; bad
// requests get 400; /v1/models lists the model.
func TestFailNextBadRequestAndModels(t *testing.T) {
	s, err := Listen(Config{Model: "qwen"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.FailNext(2)
	for i, want := range []int{503, 503, 200} {
		resp := post(t, s.URL, "", chatBody(false, "user", "hi"))
		body := readAll(t, resp)
		if resp.StatusCode != want {
			t.Errorf("request %d: status %d, want %d", i, resp.StatusCode, want)
		}
		if want == 503 && !strings.Contains(body, `"Loading model"`) {
			t.Errorf("503 body %s", body)
		}
	}
	for _, body := range []string{`{`, `{"messages":[]}`, `{"messages":[{"role":"user","content":5}]}`} {
		if resp := post(t, s.URL, "", body); resp.StatusCode != 400 {
			t.Errorf("%s: status %d, want 400", body, resp.StatusCode)
		} else {
			readAll(t, resp)
		}
	}
	resp, err := http.Get(s.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); !strings.Contains(body, `"id":"qwen"`) {
		t.Errorf("models: %s", body)
	}
	if st := s.Stats(); st.Failed != 2 || st.Served != 1 || st.Requests != 6 {
		t.Errorf("stats %+v", st)
	}
}

// The prompt text covers roles, text parts, tool calls and ids, and tools.
func TestPromptTextOfToolTurns(t *testing.T) {
	var q chatRequest
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]},
	{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{\"p\":1}"}}]},
	{"role":"tool","tool_call_id":"c1","content":"data"}],"tools":[{"type":"function"}]}`
	if err := json.Unmarshal([]byte(body), &q); err != nil {
		t.Fatal(err)
	}
	got, err := q.promptText()
	want := "<|user|>hi\n<|assistant|><|call|>read{\"p\":1}\n<|tool|>data<|id|>c1\n<|tools|>[{\"type\":\"function\"}]"
	if err != nil || got != want {
		t.Errorf("prompt text %q (%v), want %q", got, err, want)
	}
}
