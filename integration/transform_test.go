package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// miniMaxEvents is a MiniMax-style stream: reasoning inside content, the
// tags split across chunks at awkward offsets, an escaped '<', CRLF framing
// and a keepalive comment.
var miniMaxEvents = []string{
	`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"MiniMax-M1","choices":[{"index":0,"delta":{"role":"assistant","content":"<thi"},"finish_reason":null}]}` + "\r\n\r\n",
	`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"MiniMax-M1","choices":[{"index":0,"delta":{"content":"nk>Let me add: 2+2"},"finish_reason":null}]}` + "\r\n\r\n",
	": keepalive\r\n\r\n",
	`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"MiniMax-M1","choices":[{"index":0,"delta":{"content":" is 4.\u003c/thi"},"finish_reason":null}]}` + "\r\n\r\n",
	`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"MiniMax-M1","choices":[{"index":0,"delta":{"content":"nk>The answer is 4."},"finish_reason":null}]}` + "\r\n\r\n",
	`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"MiniMax-M1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}` + "\r\n\r\n",
	"data: [DONE]\r\n\r\n",
}

// thinkConfig routes model m to an upstream with the given think_tags mode.
func thinkConfig(up *fakeUpstream, mode string) map[string]any {
	cfg := basicConfig(up, 0)
	cfg["providers"] = []any{map[string]any{"id": "p1", "url": up.base(), "think_tags": mode}}
	return cfg
}

// collect decodes the data events of a stream into content and reasoning.
func collect(t *testing.T, events []string) (content, reasoning string, sawUsage bool) {
	t.Helper()
	for _, d := range events {
		if d == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content          *string `json:"content"`
					ReasoningContent *string `json:"reasoning_content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(d), &chunk); err != nil {
			t.Fatalf("event is not JSON: %q: %v", d, err)
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content != nil {
				content += *c.Delta.Content
			}
			if c.Delta.ReasoningContent != nil {
				reasoning += *c.Delta.ReasoningContent
			}
		}
		if len(chunk.Usage) > 0 {
			sawUsage = true
		}
	}
	return content, reasoning, sawUsage
}

func streamUpstream(t *testing.T, events []string) *fakeUpstream {
	return newUpstream(t, func(w http.ResponseWriter, r *http.Request) { writeStream(w, events, 0) })
}

func TestThinkTagsSplitStream(t *testing.T) {
	up := streamUpstream(t, miniMaxEvents)
	p := startProxy(t, thinkConfig(up, "split"))
	resp := p.chat(`{"model":"m","stream":true,"messages":[{"role":"user","content":"2+2?"}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events := readSSE(t, resp.Body)
	resp.Body.Close()
	content, reasoning, usage := collect(t, events)
	if content != "The answer is 4." {
		t.Errorf("content = %q", content)
	}
	if reasoning != "Let me add: 2+2 is 4." {
		t.Errorf("reasoning = %q", reasoning)
	}
	if !usage {
		t.Error("usage chunk lost")
	}
	if events[len(events)-1] != "[DONE]" {
		t.Errorf("last event %q, want [DONE]", events[len(events)-1])
	}
	for _, e := range events {
		if strings.Contains(e, "think>") || strings.Contains(e, `\u003c/thi`) || strings.Contains(e, `"<thi`) {
			t.Errorf("tag fragment leaked: %s", e)
		}
	}
}

func TestThinkTagsStripStream(t *testing.T) {
	up := streamUpstream(t, miniMaxEvents)
	p := startProxy(t, thinkConfig(up, "strip"))
	resp := p.chat(`{"model":"m","stream":true,"messages":[{"role":"user","content":"2+2?"}]}`)
	events := readSSE(t, resp.Body)
	resp.Body.Close()
	content, reasoning, _ := collect(t, events)
	if content != "The answer is 4." || reasoning != "" {
		t.Errorf("content %q reasoning %q", content, reasoning)
	}
}

// TestThinkTagsOffIsByteForByte: with think_tags off the client reads
// exactly the bytes the upstream wrote, CRLFs, comments and tags included.
func TestThinkTagsOffIsByteForByte(t *testing.T) {
	up := streamUpstream(t, miniMaxEvents)
	p := startProxy(t, thinkConfig(up, "off"))
	resp := p.chat(`{"model":"m","stream":true,"messages":[{"role":"user","content":"2+2?"}]}`)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Join(miniMaxEvents, ""); string(got) != want {
		t.Errorf("stream changed:\n got %q\nwant %q", got, want)
	}
}

// TestThinkTagsDeepSeekUntouched: a stream that already carries
// reasoning_content passes split mode byte for byte.
func TestThinkTagsDeepSeekUntouched(t *testing.T) {
	events := []string{
		`data: {"id":"d1","object":"chat.completion.chunk","created":1,"model":"deepseek-reasoner","choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":"Think"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		`data: {"id":"d1","object":"chat.completion.chunk","created":1,"model":"deepseek-reasoner","choices":[{"index":0,"delta":{"content":"4"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		"data: [DONE]\n\n",
	}
	up := streamUpstream(t, events)
	p := startProxy(t, thinkConfig(up, "split"))
	resp := p.chat(`{"model":"m","stream":true,"messages":[{"role":"user","content":"2+2?"}]}`)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := strings.Join(events, ""); string(got) != want {
		t.Errorf("stream changed:\n got %q\nwant %q", got, want)
	}
}

func TestThinkTagsSplitNonStream(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"MiniMax-M1","choices":[{"index":0,"message":{"role":"assistant","content":"<think>plan</think>Answer"},"finish_reason":"stop"}]}`)
	})
	p := startProxy(t, thinkConfig(up, "split"))
	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"q"}]}`)
	body := readAll(t, resp)
	var out struct {
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Content          string `json:"content"`
				ReasoningContent string `json:"reasoning_content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if out.Choices[0].Message.Content != "Answer" || out.Choices[0].Message.ReasoningContent != "plan" {
		t.Errorf("got %s", body)
	}
	if out.Model != "MiniMax-M1" {
		t.Errorf("response model changed: %q", out.Model)
	}
	if cl := resp.Header.Get("Content-Length"); cl != "" && cl != itoa(len(body)) {
		t.Errorf("Content-Length %s for a %d-byte body", cl, len(body))
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestReasoningBackfill: OpenRouter-style assistant history gets the native
// field the provider wants; other messages are untouched.
func TestReasoningBackfill(t *testing.T) {
	up := newUpstream(t, nil)
	cfg := basicConfig(up, 0)
	cfg["providers"] = []any{map[string]any{"id": "p1", "url": up.base(), "reasoning_field": "reasoning_content"}}
	p := startProxy(t, cfg)
	body := `{"model":"m","messages":[` +
		`{"role":"user","content":"a"},` +
		`{"role":"assistant","content":"b","reasoning":"r1"},` +
		`{"role":"user","content":"c"},` +
		`{"role":"assistant","content":"d","reasoning_details":[{"type":"reasoning.text","text":"x"},{"type":"reasoning.encrypted","data":"zz"},{"text":"y"}]},` +
		`{"role":"assistant","content":"e","reasoning_content":"kept","reasoning":"other"},` +
		`{"role":"assistant","content":"f"},` +
		`{"role":"tool","content":"g","reasoning":"not mine"}]}`
	readAll(t, p.chat(body))
	calls := up.Calls()
	if len(calls) != 1 {
		t.Fatalf("calls %d", len(calls))
	}
	want := `{"model":"real-model","messages":[` +
		`{"role":"user","content":"a"},` +
		`{"role":"assistant","content":"b","reasoning":"r1","reasoning_content":"r1"},` +
		`{"role":"user","content":"c"},` +
		`{"role":"assistant","content":"d","reasoning_details":[{"type":"reasoning.text","text":"x"},{"type":"reasoning.encrypted","data":"zz"},{"text":"y"}],"reasoning_content":"x\ny"},` +
		`{"role":"assistant","content":"e","reasoning_content":"kept","reasoning":"other"},` +
		`{"role":"assistant","content":"f"},` +
		`{"role":"tool","content":"g","reasoning":"not mine"}]}`
	if got := string(calls[0].Body); got != want {
		t.Errorf("upstream body:\n got %s\nwant %s", got, want)
	}
}

// TestSessionHeader: a three-turn conversation keeps its session id, a
// second conversation gets another, and the client's own value is replaced.
func TestSessionHeader(t *testing.T) {
	up := newUpstream(t, nil)
	cfg := basicConfig(up, 0)
	cfg["providers"] = []any{map[string]any{"id": "p1", "url": up.base(), "session_header": "x-opencode-session"}}
	p := startProxy(t, cfg)

	turn1 := `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Plan a trip to Rome"}]}`
	turn2 := `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Plan a trip to Rome"},{"role":"assistant","content":"Day 1: Colosseum"},{"role":"user","content":"And day 2?"}]}`
	turn3 := `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Plan a trip to Rome"},{"role":"assistant","content":"Day 1: Colosseum","reasoning":"history echoes differ"},{"role":"user","content":"And day 2?"},{"role":"assistant","content":"Vatican"},{"role":"user","content":"Day 3?"}]}`
	other := `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Write a haiku"}]}`
	for _, b := range []string{turn1, turn2, turn3} {
		readAll(t, p.chat(b, "X-Opencode-Session", "client-value"))
	}
	readAll(t, p.chat(other))
	calls := up.Calls()
	ids := make([]string, len(calls))
	for i, c := range calls {
		ids[i] = c.Header.Get("X-Opencode-Session")
		if ids[i] == "" || ids[i] == "client-value" {
			t.Fatalf("call %d: session header %q", i, ids[i])
		}
	}
	if ids[0] != ids[1] || ids[1] != ids[2] {
		t.Errorf("one conversation got several ids: %v", ids[:3])
	}
	if ids[3] == ids[0] {
		t.Errorf("a different conversation got the same id %s", ids[3])
	}
}
