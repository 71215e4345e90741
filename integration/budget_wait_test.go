package integration

// A budget rules out upstreams, not requests: a budgeted key whose worst
// case fits only the free local upstream waits for it while it is busy,
// rather than being refused because the dearer cloud upstream behind it
// does not fit. And a refusal says what did not fit.

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// budgetWaitConfig is a model over a free local upstream (price 0, one
// slot) and a cloud upstream whose worst case at the default 4,096 output
// tokens ($20/M output: about $0.082) is above the key's $0.05 a day.
func budgetWaitConfig(local, cloud *fakeUpstream, queueSize int) map[string]any {
	return cfg(
		[]map[string]any{obj("id", "gpu", "url", local.base()), obj("id", "openrouter", "url", cloud.base())},
		[]map[string]any{obj("id", "local", "provider", "gpu", "model", "qwen", "max_concurrency", 1),
			obj("id", "cloud", "provider", "openrouter", "model", "big", "price_input", 5.0, "price_output", 20.0)},
		[]map[string]any{obj("name", "m", "upstreams", []string{"local", "cloud"})},
		"queue_size", queueSize, "queue_timeout", "30s",
		"keys", []any{obj("id", "team", "secret", secretTeam, "spend_per_day", 0.05)})
}

// TestBudgetWaitsForLocal: the local slot is held by a slow request; the
// second request of the same budgeted key waits in the queue and is
// served by local once the first ends, and the cloud upstream its budget
// cannot pay for is never sent anything.
func TestBudgetWaitsForLocal(t *testing.T) {
	g := newGate()
	local := newUpstream(t, gatedUsage(g, 10, 5))
	t.Cleanup(g.open)
	cloud := newUpstream(t, completion("cloud"))
	p := startProxy(t, budgetWaitConfig(local, cloud, 4))

	ctx := context.Background()
	first := p.goKeyChat(ctx, chatBody("m", false))
	g.waitArrivals(t, 1)
	second := p.goKeyChat(ctx, chatBody("m", false))
	for deadline := time.Now().Add(10 * time.Second); p.queueDepth("m") != 1; time.Sleep(5 * time.Millisecond) {
		select {
		case r := <-second:
			t.Fatalf("the second request was answered while local was busy: %d %s (want it queued)", r.status, r.body)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the second request did not queue")
		}
	}
	g.open()
	for i, ch := range []<-chan result{first, second} {
		r := await(t, ch)
		if r.status != http.StatusOK || r.header.Get("X-LLM-Route-Upstream") != "local" {
			t.Fatalf("request %d: status %d upstream %q body %s (want 200 from local)", i+1, r.status,
				r.header.Get("X-LLM-Route-Upstream"), r.body)
		}
	}
	if n := len(cloud.Calls()); n != 0 {
		t.Fatalf("the cloud upstream the budget cannot pay for got %d requests", n)
	}
	if n := len(local.Calls()); n != 2 {
		t.Fatalf("local got %d requests, want 2", n)
	}
}

// TestBudgetBusyNotRefused: without a queue, the same request gets the
// busy 503 (local is busy; the budget did not refuse it), whose
// X-LLM-Route-Skipped says the cloud upstream is out of the budget.
func TestBudgetBusyNotRefused(t *testing.T) {
	g := newGate()
	local := newUpstream(t, gatedUsage(g, 10, 5))
	t.Cleanup(g.open)
	cloud := newUpstream(t, completion("cloud"))
	p := startProxy(t, budgetWaitConfig(local, cloud, 0))

	first := p.goKeyChat(context.Background(), chatBody("m", false))
	g.waitArrivals(t, 1)
	resp := p.chat(chatBody("m", false), "Authorization", "Bearer "+secretTeam)
	expectAPIError(t, resp, http.StatusServiceUnavailable, "all_upstreams_busy")
	if got := resp.Header.Get("X-LLM-Route-Skipped"); got != "local=busy 1/1, cloud=budget" {
		t.Errorf("X-LLM-Route-Skipped = %q", got)
	}
	g.open()
	if r := await(t, first); r.status != http.StatusOK {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	if n := len(cloud.Calls()); n != 0 {
		t.Fatalf("cloud got %d requests", n)
	}
}

// TestBudgetRefusalSaysWhatDidNotFit: with nothing spent, a request whose
// cheapest worst case is above the whole budget is refused with words
// that say so: the worst case, its tokens and prices, what is left, and
// the max_tokens that would fit.
func TestBudgetRefusalSaysWhatDidNotFit(t *testing.T) {
	cloud := newUpstream(t, completion("cloud"))
	h := cfg(
		[]map[string]any{obj("id", "openrouter", "url", cloud.base())},
		[]map[string]any{obj("id", "cloud", "provider", "openrouter", "model", "big", "price_input", 5.0, "price_output", 20.0)},
		[]map[string]any{obj("name", "m", "upstreams", []string{"cloud"})},
		"keys", []any{obj("id", "team", "secret", secretTeam, "spend_per_day", 0.05)})
	p := startProxy(t, h)
	// The body is 57 bytes: an estimated 15 prompt tokens ($0.000075 at
	// $5/M); 4,096 output tokens at $20/M are $0.08192. What fits in
	// $0.05 once the body also carries a max_tokens (up to 8 tokens more
	// by the estimate): (0.05 - 23 × 0.000005) / 0.00002 = 2494.
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	if len(body) != 57 {
		t.Fatalf("body is %d bytes; the figures below assume 57", len(body))
	}
	resp := p.chat(body, "Authorization", "Bearer "+secretTeam)
	msg := expectAPIError(t, resp, http.StatusTooManyRequests, "insufficient_quota")
	t.Logf("refusal: %s", msg)
	for _, want := range []string{
		"spend_per_day",
		`"cloud"`,
		"$0.081995",        // the worst case: 15 × $5/M + 4096 × $20/M
		"15 prompt tokens", // its tokens
		"4096 output tokens",
		"$5/M", "$20/M", // its prices
		"$0.05 of the $0.05", // left of the budget (nothing spent)
		"max_tokens of at most 2494",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal lacks %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "used up") {
		t.Errorf("refusal says the budget is used up with nothing spent: %s", msg)
	}
	if n := len(cloud.Calls()); n != 0 {
		t.Fatalf("a refused request reached the upstream")
	}
	// Following the hint is served.
	ok := p.chat(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2494}`, "Authorization", "Bearer "+secretTeam)
	if b := readAll(t, ok); ok.StatusCode != http.StatusOK {
		t.Fatalf("max_tokens 2494: %d %s", ok.StatusCode, b)
	}
}

// goKeyChat is goChat with the team key.
func (p *proxy) goKeyChat(ctx context.Context, body string) <-chan result {
	return p.goChat(ctx, body, "Authorization", "Bearer "+secretTeam)
}

// TestBudgetRefusalTokens: the same for tokens_per_day: the worst case in
// tokens, what is left, the max_tokens that fits.
func TestBudgetRefusalTokens(t *testing.T) {
	up := newUpstream(t, completion("ok"))
	h := basicConfig(up, 0)
	h["keys"] = []any{obj("id", "team", "secret", secretTeam, "tokens_per_day", 1000)}
	p := startProxy(t, h)
	// 57 bytes: 15 prompt tokens; 4096 output tokens; 1000 - 15 - 8 = 977.
	msg := expectAPIError(t, p.chat(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "Authorization", "Bearer "+secretTeam),
		http.StatusTooManyRequests, "insufficient_quota")
	for _, want := range []string{"tokens_per_day", "is 4111 tokens (15 prompt tokens and 4096 output tokens", "1000 of the 1000 tokens_per_day is left",
		"max_tokens of at most 977"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal lacks %q: %s", want, msg)
		}
	}
	ok := p.chat(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":977}`, "Authorization", "Bearer "+secretTeam)
	if b := readAll(t, ok); ok.StatusCode != http.StatusOK {
		t.Fatalf("max_tokens 977: %d %s", ok.StatusCode, b)
	}
}
