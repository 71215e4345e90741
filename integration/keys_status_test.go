package integration

import (
	"fmt"
	"math"
	"net/http"
	"testing"
)

// The status shows what a key without any limit used, as it does for a
// budgeted one: the tokens the upstream reported (the same the key's
// token metrics count) and their price.
func TestKeysStatusCountsKeysWithoutLimits(t *testing.T) {
	up := newUpstream(t, usageAnswer(400, 500))
	p := startProxy(t, persistConfig(up))
	for range 2 {
		if code, body := keyedChat(t, p, "llmr-free-5ecret"); code != http.StatusOK {
			t.Fatalf("request: %d %s", code, body)
		}
	}
	in, out := p.metric("llm_proxy_key_tokens_total", "key", "free", "type", "input"), p.metric("llm_proxy_key_tokens_total", "key", "free", "type", "output")
	if in != 800 || out != 1000 {
		t.Fatalf("token metrics of the key: input %v, output %v; want 800 and 1000", in, out)
	}
	wantKeyUsage(t, p, "free", "two requests of a key without limits", in+out, 0.038, 0.038)
}

// The same under state redis: the status reads the fleet's accounting,
// which counts a key without limits too.
func TestFleetKeyStatusCountsKeysWithoutLimits(t *testing.T) {
	rs := startRedis(t)
	up := newUpstream(t, usageAnswer(20, 1000))
	conf := fleetKeyConfig(up, rs.addr, obj())
	conf["state"].(map[string]any)["timeout"] = "2s" // a loaded machine must not fall back
	p := startProxy(t, conf)
	waitHealthy(t, p, true)
	for range 2 {
		if code, body := keyedChat(t, p, secretTeam); code != http.StatusOK {
			t.Fatalf("request: %d %s", code, body)
		}
	}
	wantKeyUsage(t, p, "k", "two requests of a key without limits", 2040, 2, 2)
}

// usageAnswer answers a chat completion reporting prompt and completion
// tokens.
func usageAnswer(prompt, completion int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			prompt, completion, prompt+completion)
	}
}

// persistConfig: model m on an upstream priced $10/M input and $30/M
// output that reports 400 + 500 tokens ($0.019) per answer; key "budget"
// has 1,000 tokens a day and $100 a month, key "free" no limit.
func persistConfig(up *fakeUpstream) map[string]any {
	h := basicConfig(up, 0)
	u := h["upstreams"].([]any)[0].(map[string]any)
	u["price_input"], u["price_output"] = 10.0, 30.0
	h["keys"] = []any{
		obj("id", "budget", "secret", "llmr-budget-5ecret", "tokens_per_day", 1000, "spend_per_month", 100),
		obj("id", "free", "secret", "llmr-free-5ecret"),
	}
	return h
}

// keyedChat sends a chat request of model m with max_tokens 100 and the
// given client secret, and returns its status and body.
func keyedChat(t *testing.T, p *proxy, secret string) (int, string) {
	t.Helper()
	resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`, "Authorization", "Bearer "+secret)
	return resp.StatusCode, readAll(t, resp)
}

// wantKeyUsage checks a key's tokens_today, spend_today_usd and
// spend_month_usd in the status.
func wantKeyUsage(t *testing.T, p *proxy, id, when string, tokens, today, month float64) {
	t.Helper()
	k := p.keyStatus(id)
	got := [3]float64{k["tokens_today"].(float64), k["spend_today_usd"].(float64), k["spend_month_usd"].(float64)}
	want := [3]float64{tokens, today, month}
	for i := range got {
		if math.Abs(got[i]-want[i]) > 1e-9 {
			t.Fatalf("%s: key %s used %v tokens, $%v today, $%v this month; want %v, $%v, $%v",
				when, id, got[0], got[1], got[2], want[0], want[1], want[2])
		}
	}
}
