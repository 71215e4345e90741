package integration

// Issue #14 items 2 and 3: context-length refusals fail over
// without blame, context_window skips upstreams up front, long-context
// requests hold a provider's long slot.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawAnswer answers every request with code and body as given.
func rawAnswer(code int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-refusal")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	}
}

// contextRefusals are real refusals of the four families, as each server
// sends them.
var contextRefusals = []struct {
	family string
	status int
	body   string
}{
	{"openai", 400, `{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130412 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`},
	{"openai-413", 413, `{"error":{"message":"Request too large for gpt-4o: context_length_exceeded","type":"invalid_request_error","param":null,"code":"context_length_exceeded"}}`},
	{"llama.cpp", 400, `{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5210,"n_ctx":4096}}`},
	{"llama.cpp-old-500", 500, `{"error":{"code":500,"message":"the request exceeds the available context size, try increasing the context size or enable context shift","type":"server_error"}}`},
	{"vllm", 400, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5210 tokens (4210 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}`},
	{"sglang", 400, `{"object":"error","message":"The input (5210 tokens) is longer than the model's context length (4096 tokens).","type":"BadRequestError","param":null,"code":400}`},
	{"anthropic", 400, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210312 tokens > 200000 maximum"}}`},
}

// contextPair is a model over a small upstream (the refusing one, with
// backoff so that blame would show) and a bigger one; both on their own
// providers.
func contextPair(prefix string, small, big *fakeUpstream) map[string]any {
	return cfg(
		[]map[string]any{
			obj("id", prefix+"-ps", "url", small.base(), "backoff", "30s", "probe_interval", "0s", "retries", 2),
			obj("id", prefix+"-pb", "url", big.base(), "backoff", "30s", "probe_interval", "0s"),
		},
		[]map[string]any{
			obj("id", prefix+"-s", "provider", prefix+"-ps", "model", "small"),
			obj("id", prefix+"-b", "provider", prefix+"-pb", "model", "big"),
		},
		[]map[string]any{
			obj("name", prefix, "upstreams", []string{prefix + "-s", prefix + "-b"}),
			obj("name", prefix+"-alone", "upstreams", []string{prefix + "-s"}),
		},
	)
}

// TestContextLengthFailsOver: each family's refusal sends the request to
// the next upstream at once (not retried, even with retries 2), records no
// failure, and with no upstream left the client gets the refusal unchanged.
func TestContextLengthFailsOver(t *testing.T) {
	for i, c := range contextRefusals {
		t.Run(c.family, func(t *testing.T) {
			prefix := fmt.Sprintf("cl%d", i)
			small := newUpstream(t, rawAnswer(c.status, c.body))
			big := newUpstream(t, completion("from the big one"))
			p := startProxy(t, contextPair(prefix, small, big))
			for _, stream := range []bool{false, true} {
				before := len(small.Calls())
				start := time.Now()
				resp := p.chat(chatBody(prefix, stream))
				body := readAll(t, resp)
				t.Logf("%s %d, stream %v: %d from %s after %v", c.family, c.status, stream, resp.StatusCode,
					resp.Header.Get("X-LLM-Route-Upstream"), time.Since(start).Round(time.Millisecond))
				if resp.StatusCode != http.StatusOK || !strings.Contains(body, "from the big one") && !strings.Contains(body, "big") {
					t.Fatalf("stream %v: status %d body %s; want the big upstream's answer", stream, resp.StatusCode, body)
				}
				if got := resp.Header.Get("X-LLM-Route-Upstream"); got != prefix+"-b" {
					t.Errorf("stream %v: answered by %q, want %s-b", stream, got, prefix)
				}
				if n := len(small.Calls()) - before; n != 1 {
					t.Errorf("stream %v: small upstream got %d calls, want 1 (a refusal is not retried)", stream, n)
				}
			}
			if n := len(p.logEntries("context length exceeded, failing over without blame")); n != 2 {
				t.Errorf("%d context-length log entries, want 2", n)
			}
			if v := p.upstreamGauge("fail_streak", prefix+"-s", prefix+"-ps"); v != 0 {
				t.Errorf("fail streak %v, want 0 (a context-length refusal is not a failure)", v)
			}
			if v := p.upstreamGauge("cooling_seconds", prefix+"-s", prefix+"-ps"); v != 0 {
				t.Errorf("small upstream cooling %vs, want 0", v)
			}

			// Nothing left: the refusal itself, status and body unchanged.
			start := time.Now()
			resp := p.chat(chatBody(prefix+"-alone", false))
			body := readAll(t, resp)
			t.Logf("%s %d, no upstream left: %d (the refusal) after %v", c.family, c.status, resp.StatusCode, time.Since(start).Round(time.Millisecond))
			if resp.StatusCode != c.status || body != c.body {
				t.Errorf("alone: got %d %s\nwant %d %s", resp.StatusCode, body, c.status, c.body)
			}
			if got := resp.Header.Get("X-Request-Id"); got != "req-refusal" {
				t.Errorf("alone: x-request-id %q, want the upstream's", got)
			}
		})
	}
}

// TestContextLengthLastUpstreamRefusal: when every upstream refuses, the
// last one's refusal reaches the client unchanged.
func TestContextLengthLastUpstreamRefusal(t *testing.T) {
	first := contextRefusals[0]
	last := contextRefusals[4]
	small := newUpstream(t, rawAnswer(first.status, first.body))
	big := newUpstream(t, rawAnswer(last.status, last.body))
	p := startProxy(t, contextPair("cll", small, big))
	resp := p.chat(chatBody("cll", false))
	body := readAll(t, resp)
	if resp.StatusCode != last.status || body != last.body {
		t.Errorf("got %d %s\nwant the last upstream's %d %s", resp.StatusCode, body, last.status, last.body)
	}
	if len(small.Calls()) != 1 || len(big.Calls()) != 1 {
		t.Errorf("calls: small %d, big %d; want 1 each", len(small.Calls()), len(big.Calls()))
	}
}

// TestContentPolicyNotFailedOver: a 400 content_policy_violation is the
// request's fault: it reaches the client, the next upstream is not tried.
func TestContentPolicyNotFailedOver(t *testing.T) {
	const refusal = `{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","param":null,"code":"content_policy_violation"}}`
	small := newUpstream(t, rawAnswer(http.StatusBadRequest, refusal))
	big := newUpstream(t, nil)
	p := startProxy(t, contextPair("cpv", small, big))
	start := time.Now()
	resp := p.chat(chatBody("cpv", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusBadRequest || body != refusal {
		t.Errorf("got %d %s, want the 400 unchanged", resp.StatusCode, body)
	}
	t.Logf("content_policy_violation 400: %d to the client, not failed over, after %v", resp.StatusCode, time.Since(start).Round(time.Millisecond))
	if n := len(big.Calls()); n != 0 {
		t.Errorf("next upstream got %d calls, want 0", n)
	}
}

// longChat is a chat request whose prompt is about words*1.3 tokens, with
// max_tokens when maxTokens > 0.
func longChat(model string, words, maxTokens int) string {
	text := strings.Repeat("lorem ipsum dolor sit amet ", words/5)
	req := map[string]any{"model": model, "messages": []any{map[string]any{"role": "user", "content": text}}}
	if maxTokens > 0 {
		req["max_tokens"] = maxTokens
	}
	b, _ := json.Marshal(req)
	return string(b)
}

// explainTokens reads GET /llm_route/explain?model=M&tokens=N.
func (p *proxy) explainTokens(model string, tokens int) (explainJSON, string) {
	p.t.Helper()
	resp := p.adminGet(fmt.Sprintf("/llm_route/explain?model=%s&tokens=%d", model, tokens))
	body := readAll(p.t, resp)
	var e explainJSON
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		p.t.Fatalf("explain: %v: %s", err, body)
	}
	return e, body
}

// TestContextWindowSkips: an upstream whose context_window is smaller than
// the estimated prompt plus max_tokens is skipped without a call; with no
// upstream large enough, the proxy answers 400 context_length_exceeded;
// explain shows the verdict.
func TestContextWindowSkips(t *testing.T) {
	small := newUpstream(t, completion("small"))
	big := newUpstream(t, completion("big"))
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "cw-p", "url", small.base()), obj("id", "cw-q", "url", big.base())},
		[]map[string]any{
			obj("id", "cw-s", "provider", "cw-p", "model", "s", "context_window", 1000),
			obj("id", "cw-b", "provider", "cw-q", "model", "b", "context_window", 8000),
		},
		[]map[string]any{
			obj("name", "cw", "upstreams", []string{"cw-s", "cw-b"}),
			obj("name", "cw-small", "upstreams", []string{"cw-s"}),
		},
	))
	ask := func(body string) (string, int) {
		resp := p.chat(body)
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			return b, resp.StatusCode
		}
		return answerText(t, b), resp.StatusCode
	}
	if got, _ := ask(longChat("cw", 50, 0)); got != "small" {
		t.Errorf("a short prompt went to %q, want small", got)
	}
	start := time.Now()
	if got, _ := ask(longChat("cw", 2000, 0)); got != "big" {
		t.Errorf("a ~2600-token prompt went to %q, want big (small's window is 1000)", got)
	}
	t.Logf("prompt above the first upstream's context_window: answered by the big one (no call to the small) after %v", time.Since(start).Round(time.Millisecond))
	if got, _ := ask(longChat("cw", 50, 4000)); got != "big" {
		t.Errorf("a short prompt with max_tokens 4000 went to %q, want big", got)
	}
	smallCalls := len(small.Calls())
	if smallCalls != 1 {
		t.Errorf("small upstream got %d calls, want 1 (skipped up front otherwise)", smallCalls)
	}
	start = time.Now()
	resp := p.chat(longChat("cw-small", 2000, 0))
	msg := expectAPIError(t, resp, http.StatusBadRequest, "context_length_exceeded")
	t.Logf("no context_window large enough: the proxy's 400 context_length_exceeded after %v", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(msg, "tokens") {
		t.Errorf("message %q does not say how many tokens", msg)
	}
	if n := len(small.Calls()); n != smallCalls {
		t.Errorf("small upstream called for a prompt it cannot hold")
	}
	e, raw := p.explainTokens("cw", 3000)
	if e.verdicts() != "cw-s=context cw-b=available" || e.Choice == nil || *e.Choice != "cw-b" {
		t.Errorf("explain tokens=3000: %s", raw)
	}
	if !strings.Contains(raw, `"reason":"context_window"`) {
		t.Errorf("explain gives no context_window reason: %s", raw)
	}
	if e, raw := p.explainTokens("cw-small", 3000); e.Outcome != "context" {
		t.Errorf("explain of a model with no window large enough: %s", raw)
	}
}

// TestLongContextAdmission: above long_context_threshold a request holds
// one of its provider's long_context_capacity slots too: with the one long
// slot taken, the next long request goes to the next upstream (or waits in
// the queue), while a short request still gets the upstream.
func TestLongContextAdmission(t *testing.T) {
	g := newGate()
	local := newUpstream(t, g.handler(completion("local")))
	remote := newUpstream(t, completion("remote"))
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "lc-gpu", "url", local.base(), "long_context_capacity", 1),
			obj("id", "lc-cloud", "url", remote.base()),
		},
		[]map[string]any{
			obj("id", "lc-l", "provider", "lc-gpu", "model", "l", "max_concurrency", 4),
			obj("id", "lc-r", "provider", "lc-cloud", "model", "r"),
		},
		[]map[string]any{
			obj("name", "lc", "upstreams", []string{"lc-l", "lc-r"}),
			obj("name", "lc-q", "upstreams", []string{"lc-l"}, "queue_size", 4, "queue_timeout", "20s"),
		},
		"long_context_threshold", 500,
		"request_timeout", "20s", // a regression ends the held requests, not the test run
	))
	t.Cleanup(g.open)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := p.goChat(ctx, longChat("lc", 2000, 0))
	g.waitArrivals(t, 1)

	// The one long slot is taken: a second long request goes to the cloud.
	resp := p.chat(longChat("lc", 2000, 0))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || answerText(t, body) != "remote" {
		t.Fatalf("second long request: %d %s; want the remote upstream", resp.StatusCode, body)
	}
	e, raw := p.explainTokens("lc", 3000)
	if e.verdicts() != "lc-l=capacity lc-r=available" || !strings.Contains(raw, `"reason":"long_context"`) {
		t.Errorf("explain tokens=3000 with the long slot taken: %s", raw)
	}
	if e, raw := p.explainTokens("lc", 100); e.Choice == nil || *e.Choice != "lc-l" {
		t.Errorf("explain tokens=100 (short): %s", raw)
	}

	// A short request still gets the local upstream (normal slots free).
	short := p.goChat(ctx, longChat("lc", 20, 0))
	g.waitArrivals(t, 1)

	// A long request to the queue-only model waits for the long slot.
	queuedAt := time.Now()
	queued := p.goChat(ctx, longChat("lc-q", 2000, 0))
	eventually(t, 5*time.Second, "the long request queued", func() bool {
		return p.metric("llm_proxy_queue_depth", "model", "lc-q") == 1
	})
	if n := len(local.Calls()); n != 2 {
		t.Errorf("local upstream got %d calls while its long slot was taken, want 2 (the long and the short one)", n)
	}
	g.open()
	openedAt := time.Now()
	for name, ch := range map[string]<-chan result{"held": held, "short": short, "queued": queued} {
		r := await(t, ch)
		if r.status != http.StatusOK || answerText(t, r.body) != "local" {
			t.Errorf("%s: %d %s; want the local upstream", name, r.status, r.body)
		}
	}
	if n := len(local.Calls()); n != 3 {
		t.Errorf("local upstream got %d calls in all, want 3", n)
	}
	t.Logf("long request with the provider's one long slot taken, queue-only model: queued, then 200 from the local upstream; %v in all, %v after the slot was freed",
		time.Since(queuedAt).Round(time.Millisecond), time.Since(openedAt).Round(time.Millisecond))
}

// TestContextLengthTranslatedFront: a Messages request translated to chat
// fails over on the chat upstream's context-length refusal like a chat
// request does, and with nothing left the refusal reaches the client in
// the Messages error shape.
func TestContextLengthTranslatedFront(t *testing.T) {
	refusal := contextRefusals[0]
	small := newUpstream(t, rawAnswer(refusal.status, refusal.body))
	big := newUpstream(t, completion("from the big one"))
	p := startProxy(t, contextPair("clt", small, big))
	post := func(model string) (int, string) {
		body := `{"model":"` + model + `","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
		req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/messages", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Anthropic-Version", "2023-06-01")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, readAll(t, resp)
	}
	code, body := post("clt")
	if code != http.StatusOK || !strings.Contains(body, "from the big one") || !strings.Contains(body, `"type":"message"`) {
		t.Errorf("failover: %d %s; want the big upstream's answer as a Messages message", code, body)
	}
	if len(small.Calls()) != 1 || small.Calls()[0].Path != "/v1/chat/completions" {
		t.Errorf("small upstream calls %v, want one translated chat call", len(small.Calls()))
	}
	code, body = post("clt-alone")
	if code != http.StatusBadRequest || !strings.Contains(body, `"type":"error"`) || !strings.Contains(body, "maximum context length") {
		t.Errorf("alone: %d %s; want the 400 refusal in the Messages error shape", code, body)
	}
}
