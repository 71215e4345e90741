package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	anthropic "github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
)

// The client secrets of these tests; none may ever appear in a log, an
// error, a metric, the upstream's request or /config.
const (
	secretTeam  = "llmr-team-5ecret-aaaa"
	secretSlow  = "llmr-slow-5ecret-bbbb"
	secretBroke = "llmr-broke-5ecret-cccc"
)

// anyAPI answers every API natively, like a server speaking them all.
func anyAPI(w http.ResponseWriter, r *http.Request) {
	switch p := r.URL.Path; {
	case strings.HasSuffix(p, "/chat/completions"):
		completion("hello")(w, r)
	case strings.HasSuffix(p, "/messages"), strings.HasSuffix(p, "/count_tokens"):
		nativeMessages("hello")(w, r)
	case strings.HasSuffix(p, "/responses"):
		nativeResponses("hello")(w, r)
	default:
		nativeEmbedCompletions(w, r)
	}
}

// keysConfig: model m and model other on one native upstream; keys team
// (secret from the environment, models m and c*), slow (1 rpm) and broke
// (a budget no request fits in).
func keysConfig(t *testing.T, up *fakeUpstream) map[string]any {
	t.Setenv("LLMR_TEAM_KEY", secretTeam)
	t.Setenv("LLMR_SLOW_KEY", secretSlow)
	h := frontsConfig([]*fakeUpstream{up}, []bool{true})
	u := h["upstreams"].([]any)[0].(map[string]any)
	u["price_input"], u["price_output"] = 1000.0, 1000.0
	h["models"] = []any{
		obj("name", "m", "upstreams", []string{"u1"}),
		obj("name", "other", "upstreams", []string{"u1"}),
		obj("name", "chat-small", "upstreams", []string{"u1"}),
	}
	h["keys"] = []any{
		obj("id", "team", "secret", "{env.LLMR_TEAM_KEY}", "models", []string{"m", "c*"}),
		obj("id", "slow", "secret", "{env.LLMR_SLOW_KEY}", "rpm", 1),
		obj("id", "broke", "sha256", sha256Hex(secretBroke), "spend_per_day", 0.000001),
	}
	return h
}

// frontRequest is one request to a front, built to pass every check but
// the key's.
type frontRequest struct {
	name, method, path, body string
	anthropic                bool // errors in Anthropic's shape
	generation               bool // rate and budget apply
}

func frontRequests(model string) []frontRequest {
	return []frontRequest{
		{"chat", "POST", "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":8}`, model), false, true},
		{"messages", "POST", "/v1/messages", fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, model), true, true},
		{"count_tokens", "POST", "/v1/messages/count_tokens", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model), true, false},
		{"responses", "POST", "/v1/responses", fmt.Sprintf(`{"model":%q,"input":"hi","max_output_tokens":8}`, model), false, true},
		{"embeddings", "POST", "/v1/embeddings", fmt.Sprintf(`{"model":%q,"input":"hi"}`, model), false, true},
		{"completions", "POST", "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":8}`, model), false, true},
		{"models", "GET", "/v1/models", "", false, false},
		{"model", "GET", "/v1/models/" + model, "", false, false},
	}
}

// send makes the request with the given auth header (name, value; none
// when name is "").
func (p *proxy) sendFront(fr frontRequest, hdr ...string) *http.Response {
	p.t.Helper()
	var body io.Reader
	if fr.body != "" {
		body = strings.NewReader(fr.body)
	}
	req, err := http.NewRequest(fr.method, p.URL+fr.path, body)
	if err != nil {
		p.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if fr.anthropic {
		req.Header.Set("Anthropic-Version", "2023-06-01")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		p.t.Fatalf("%s: %v", fr.name, err)
	}
	return resp
}

// expectFrontError checks a refusal in the front's error shape and returns
// its Retry-After.
func expectFrontError(t *testing.T, fr frontRequest, resp *http.Response, status int, code, anthropicType string) string {
	t.Helper()
	if !fr.anthropic {
		expectAPIError(t, resp, status, code)
		return resp.Header.Get("Retry-After")
	}
	body := readAll(t, resp)
	var e struct {
		Type  string
		Error struct{ Type, Message, Code string }
	}
	if resp.StatusCode != status || json.Unmarshal([]byte(body), &e) != nil || e.Type != "error" ||
		e.Error.Type != anthropicType || e.Error.Code != code || e.Error.Message == "" {
		t.Fatalf("%s: status %d body %s; want %d %s/%s in Anthropic's shape", fr.name, resp.StatusCode, body, status, anthropicType, code)
	}
	return resp.Header.Get("Retry-After")
}

// TestKeysRefusalsEveryFront: each client-key refusal through a real HTTP
// client on every front, in that front's error shape, with Retry-After
// where it applies; a good key is served and its secret never reaches the
// upstream.
func TestKeysRefusalsEveryFront(t *testing.T) {
	up := newUpstream(t, anyAPI)
	p := startProxy(t, keysConfig(t, up))

	for _, fr := range frontRequests("m") {
		t.Run(fr.name, func(t *testing.T) {
			// 401: none, unknown, malformed.
			expectFrontError(t, fr, p.sendFront(fr), 401, "invalid_api_key", "authentication_error")
			expectFrontError(t, fr, p.sendFront(fr, "Authorization", "Bearer nope"), 401, "invalid_api_key", "authentication_error")
			expectFrontError(t, fr, p.sendFront(fr, "X-Api-Key", secretTeam+"x"), 401, "invalid_api_key", "authentication_error")
			expectFrontError(t, fr, p.sendFront(fr, "Authorization", "Basic "+secretTeam), 401, "invalid_api_key", "authentication_error")

			// Served, by either header.
			for _, h := range [][]string{{"Authorization", "Bearer " + secretTeam}, {"X-Api-Key", secretTeam}} {
				resp := p.sendFront(fr, h...)
				if body := readAll(t, resp); resp.StatusCode != 200 {
					t.Fatalf("with %s: status %d %s", h[0], resp.StatusCode, body)
				}
			}
		})
	}
	// 403: a model outside the key's list, on every front that names one.
	for _, fr := range frontRequests("other") {
		if fr.name == "models" {
			continue
		}
		t.Run(fr.name+"/403", func(t *testing.T) {
			expectFrontError(t, fr, p.sendFront(fr, "Authorization", "Bearer "+secretTeam), 403, "model_not_allowed", "permission_error")
		})
	}
	// 429 rate and 429 budget, on the generation fronts.
	for _, fr := range frontRequests("m") {
		if !fr.generation {
			continue
		}
		t.Run(fr.name+"/429", func(t *testing.T) {
			// slow: 1 rpm, burst 1 — its one request this minute is spent by
			// the first front; every later one is refused.
			resp := p.sendFront(fr, "Authorization", "Bearer "+secretSlow)
			if resp.StatusCode == 200 {
				readAll(t, resp)
				resp = p.sendFront(fr, "Authorization", "Bearer "+secretSlow)
			}
			ra := expectFrontError(t, fr, resp, 429, "rate_limit_exceeded", "rate_limit_error")
			if n := atoi(ra); n < 1 || n > 60 {
				t.Fatalf("rate Retry-After = %q, want 1..60", ra)
			}
			ra = expectFrontError(t, fr, p.sendFront(fr, "X-Api-Key", secretBroke), 429, "insufficient_quota", "rate_limit_error")
			if n := atoi(ra); n < 1 || n > 86400 || time.Duration(n)*time.Second > untilUTCMidnight()+2*time.Second {
				t.Fatalf("budget Retry-After = %q, want the time to the next UTC midnight (%v)", ra, untilUTCMidnight())
			}
		})
	}

	// The upstream never saw a client secret, in any header.
	for _, c := range up.Calls() {
		for name, vals := range c.Header {
			for _, v := range vals {
				for _, s := range []string{secretTeam, secretSlow, secretBroke} {
					if strings.Contains(v, s) {
						t.Fatalf("upstream got the client key in %s", name)
					}
				}
			}
		}
	}
	if len(up.Calls()) == 0 {
		t.Fatal("nothing reached the upstream")
	}
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func atoi(s string) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		return -1
	}
	return n
}

func untilUTCMidnight() time.Duration {
	now := time.Now().UTC()
	return time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC).Sub(now)
}

// TestKeysSDKs: the OpenAI and Anthropic SDKs read each refusal as the
// status and code they know.
func TestKeysSDKs(t *testing.T) {
	up := newUpstream(t, anyAPI)
	p := startProxy(t, keysConfig(t, up))
	oc := func(key string) openai.Client {
		return openai.NewClient(ooption.WithBaseURL(p.URL+"/v1"), ooption.WithAPIKey(key), ooption.WithMaxRetries(0), ooption.WithHTTPClient(testClient))
	}
	ac := func(key string) anthropic.Client {
		return anthropic.NewClient(aoption.WithBaseURL(p.URL), aoption.WithAPIKey(key), aoption.WithMaxRetries(0), aoption.WithHTTPClient(testClient))
	}
	chat := func(c openai.Client, model string) error {
		_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: model,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(8)})
		return err
	}
	msg := func(c anthropic.Client, model string) error {
		_, err := c.Messages.New(context.Background(), anthropic.MessageNewParams{Model: anthropic.Model(model), MaxTokens: 8,
			Messages: []anthropic.MessageParam{userText("hi")}})
		return err
	}
	oCheck := func(err error, status int, code string) {
		t.Helper()
		var e *openai.Error
		if !errors.As(err, &e) || e.StatusCode != status || e.Code != code {
			t.Fatalf("openai: err = %v, want %d %s", err, status, code)
		}
	}
	aCheck := func(err error, status int) {
		t.Helper()
		var e *anthropic.Error
		if !errors.As(err, &e) || e.StatusCode != status {
			t.Fatalf("anthropic: err = %v, want %d", err, status)
		}
	}
	if err := chat(oc(secretTeam), "m"); err != nil {
		t.Fatalf("good key: %v", err)
	}
	if err := msg(ac(secretTeam), "m"); err != nil {
		t.Fatalf("good key (x-api-key): %v", err)
	}
	oCheck(chat(oc("wrong"), "m"), 401, "invalid_api_key")
	aCheck(msg(ac("wrong"), "m"), 401)
	oCheck(chat(oc(secretTeam), "other"), 403, "model_not_allowed")
	aCheck(msg(ac(secretTeam), "other"), 403)
	_ = chat(oc(secretSlow), "m")
	oCheck(chat(oc(secretSlow), "m"), 429, "rate_limit_exceeded")
	aCheck(msg(ac(secretSlow), "m"), 429)
	oCheck(chat(oc(secretBroke), "m"), 429, "insufficient_quota")
	aCheck(msg(ac(secretBroke), "m"), 429)

	// The model list shows the key's models only, in both shapes.
	team, slow := oc(secretTeam), oc(secretSlow)
	page, err := team.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "m,chat-small" {
		t.Fatalf("team's models = %v, want m, chat-small", ids)
	}
	ateam := ac(secretTeam)
	apage, err := ateam.Models.List(context.Background(), anthropic.ModelListParams{})
	if err != nil {
		t.Fatal(err)
	}
	ids = ids[:0]
	for _, m := range apage.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "m,chat-small" {
		t.Fatalf("team's models (Anthropic) = %v", ids)
	}
	page, err = slow.Models.List(context.Background())
	if err != nil || len(page.Data) != 3 {
		t.Fatalf("a key without models lists every model: %+v %v", page, err)
	}
	wrong := oc("wrong")
	_, err = wrong.Models.List(context.Background())
	oCheck(err, 401, "invalid_api_key")
}

// gatedUsage holds each request until the gate opens, then answers a
// chat completion reporting prompt and completion tokens.
func gatedUsage(g *gate, prompt, completion int) http.HandlerFunc {
	return g.handler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			prompt, completion, prompt+completion)
	})
}

// keyStatus reads one key's entry of GET /llm_route/status.
func (p *proxy) keyStatus(id string) map[string]any {
	p.t.Helper()
	resp, err := testClient.Get(p.admin + "/llm_route/status")
	if err != nil {
		p.t.Fatal(err)
	}
	var snap struct{ Keys []map[string]any }
	if err := json.Unmarshal([]byte(readAll(p.t, resp)), &snap); err != nil {
		p.t.Fatal(err)
	}
	for _, k := range snap.Keys {
		if k["id"] == id {
			return k
		}
	}
	p.t.Fatalf("key %q not in the status: %+v", id, snap.Keys)
	return nil
}

// parallelBudget sends n requests at once with max_tokens 1000 against a
// budget sized for ten, holding every admitted one at the upstream until
// the others have been answered, so no settlement can make room early.
func parallelBudget(t *testing.T, id string, key map[string]any, price float64) (p *proxy, served, refused int) {
	g := newGate()
	up := newUpstream(t, gatedUsage(g, 20, 1000))
	t.Cleanup(g.open) // before the upstream closes (LIFO), so a failing test does not hang on held requests
	h := basicConfig(up, 0)
	h["upstreams"].([]any)[0].(map[string]any)["price_output"] = price
	key["id"], key["secret"] = id, secretTeam
	h["keys"] = []any{key}
	p = startProxy(t, h)

	const n = 200
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1000}`
	var ok, quota, other atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := p.post(context.Background(), body, "Authorization", "Bearer "+secretTeam)
			if err != nil {
				other.Add(1)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == 200:
				ok.Add(1)
			case resp.StatusCode == 429 && strings.Contains(string(b), `"insufficient_quota"`) && resp.Header.Get("Retry-After") != "":
				quota.Add(1)
			default:
				other.Add(1)
			}
		}()
	}
	eventually(t, 60*time.Second, "every request beyond the budget refused", func() bool { return quota.Load()+other.Load() >= n-10 })
	g.waitArrivals(t, 10)
	if extra := len(up.Calls()); extra > 10 {
		t.Fatalf("%d requests reached the upstream, budget is for 10", extra)
	}
	g.open()
	wg.Wait()
	if other.Load() != 0 {
		t.Fatalf("%d answers neither 200 nor 429 insufficient_quota", other.Load())
	}
	return p, int(ok.Load()), int(quota.Load())
}

// TestKeysSpendConcurrency: 200 parallel requests against spend_per_day
// sized for 10 → exactly 10 served, the rest 429, the spend never above
// the budget.
func TestKeysSpendConcurrency(t *testing.T) {
	const ID = "spender"
	// $1000 per million output tokens: max_tokens 1000 reserves $1; the
	// budget holds 10.5 of them.
	p, served, refused := parallelBudget(t, "spender", obj("spend_per_day", 10.5), 1000)
	if served != 10 || refused != 190 {
		t.Fatalf("served %d refused %d, want 10 and 190", served, refused)
	}
	k := p.keyStatus(ID)
	if spend := k["spend_today_usd"].(float64); spend > 10.5 || spend < 9.99 {
		t.Fatalf("spend today %v, want 10 (at most the 10.5 budget)", spend)
	}
	if k["reserved_usd"].(float64) != 0 || k["reserved_tokens"].(float64) != 0 {
		t.Fatalf("reservations left after every request ended: %+v", k)
	}
	if got := p.metric("llm_proxy_key_spend_usd_total", "key", ID); got < 9.99 || got > 10.01 {
		t.Fatalf("llm_proxy_key_spend_usd_total = %v, want 10", got)
	}
	if got := p.metric("llm_proxy_key_requests_total", "key", ID, "model", "m", "result", "insufficient_quota"); got != 190 {
		t.Fatalf("insufficient_quota count = %v", got)
	}
	if got := p.metric("llm_proxy_key_requests_total", "key", ID, "model", "m", "result", "ok"); got != 10 {
		t.Fatalf("ok count = %v", got)
	}
	t.Logf("spend: served %d, refused %d, spend $%.2f of $10.50", served, refused, k["spend_today_usd"])
}

// TestKeysTokensConcurrency: the same against tokens_per_day.
func TestKeysTokensConcurrency(t *testing.T) {
	const ID = "tokener"
	// Each request reserves its estimated prompt (a few dozen tokens) plus
	// 1000; 10 fit in 10 500, 11 do not.
	p, served, refused := parallelBudget(t, "tokener", obj("tokens_per_day", 10500), 0)
	if served != 10 || refused != 190 {
		t.Fatalf("served %d refused %d, want 10 and 190", served, refused)
	}
	k := p.keyStatus(ID)
	if tok := k["tokens_today"].(float64); tok != 10*1020 {
		t.Fatalf("tokens today %v, want 10 × 1020 reported", tok)
	}
	if got := p.metric("llm_proxy_key_tokens_total", "key", ID, "type", "output"); got != 10000 {
		t.Fatalf("llm_proxy_key_tokens_total output = %v", got)
	}
	t.Logf("tokens: served %d, refused %d, tokens %v of 10500", served, refused, k["tokens_today"])
}

// TestKeysGCRA: rpm 120 (one per 0.5 s) with burst 5: five at once pass,
// the sixth is refused with Retry-After; then a client asking every 50 ms
// for 4 s gets about one every 0.5 s — never more than the rate allows,
// and (with a margin for a loaded machine) not much fewer.
func TestKeysGCRA(t *testing.T) {
	up := newUpstream(t, completion("ok"))
	h := basicConfig(up, 0)
	h["keys"] = []any{obj("id", "k", "secret", secretTeam, "rpm", 120, "burst", 5)}
	p := startProxy(t, h)
	ask := func() (int, string) {
		resp := p.chat(chatBody("m", false), "Authorization", "Bearer "+secretTeam)
		readAll(t, resp)
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	// Burst: the first five always pass (time only adds room); a sixth
	// asked within the first interval is refused for about 0.5 s.
	start := time.Now()
	for i := 0; i < 5; i++ {
		if s, _ := ask(); s != 200 {
			t.Fatalf("burst request %d: %d", i+1, s)
		}
	}
	s, ra := ask()
	if time.Since(start) < 450*time.Millisecond && (s != 429 || ra != "1") {
		t.Fatalf("6th at once: %d Retry-After %q, want 429 and 1", s, ra)
	}
	// Spend whatever room a slow machine earned meanwhile, so the window
	// below starts right after a refusal (no room left).
	for i := 0; s == 200; i++ {
		if i > 50 {
			t.Fatal("never refused")
		}
		s, _ = ask()
	}

	// Steady phase: count what passes in a window of a few seconds.
	const window = 4 * time.Second
	t0 := time.Now()
	admitted := 0
	for time.Since(t0) < window {
		if s, _ := ask(); s == 200 {
			admitted++
		} else if s != 429 {
			t.Fatalf("status %d", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(t0)
	// GCRA admits at most elapsed/T + 1 in any window once the burst is
	// spent (T = 0.5 s); polling every 50 ms finds all but the last.
	most := int(elapsed/(500*time.Millisecond)) + 1
	if admitted > most || admitted < most/2 {
		t.Fatalf("admitted %d in %v, want about %d (at most %d)", admitted, elapsed, most-1, most)
	}
	t.Logf("steady: %d admitted in %v (rate allows %d)", admitted, elapsed, most)
}

// TestKeysCheaperFallback: the first upstream's worst case would cross the
// daily budget, so the cheaper second one serves; once the cheap one cannot
// either, 429.
func TestKeysCheaperFallback(t *testing.T) {
	dear := newUpstream(t, completion("dear"))
	cheap := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":"cheap"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":100,"total_tokens":110}}`)
	})
	h := cfg(
		[]map[string]any{obj("id", "p1", "url", dear.base()), obj("id", "p2", "url", cheap.base())},
		[]map[string]any{obj("id", "dear", "provider", "p1", "model", "x", "price_output", 100.0),
			obj("id", "cheap", "provider", "p2", "model", "y", "price_output", 1.0)},
		[]map[string]any{obj("name", "m", "upstreams", []string{"dear", "cheap"})},
		// max_tokens 1000: dear reserves $0.10, cheap $0.001.
		"keys", []any{obj("id", "k", "secret", secretTeam, "spend_per_day", 0.05)})
	p := startProxy(t, h)
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1000}`
	for i := 0; i < 3; i++ {
		resp := p.chat(body, "Authorization", "Bearer "+secretTeam)
		if b := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(b, "cheap") || resp.Header.Get("X-LLM-Route-Upstream") != "cheap" {
			t.Fatalf("status %d upstream %q body %s", resp.StatusCode, resp.Header.Get("X-LLM-Route-Upstream"), b)
		}
	}
	if len(dear.Calls()) != 0 {
		t.Fatalf("the expensive upstream was sent %d requests", len(dear.Calls()))
	}
	// Each cheap answer cost 100 × $1/M = $0.0001; 0.05 leaves room for
	// hundreds. A budget below cheap's worst case refuses outright.
	h["keys"] = []any{obj("id", "k", "secret", secretTeam, "spend_per_day", 0.0009)}
	p.load(h)
	resp := p.chat(body, "Authorization", "Bearer "+secretTeam)
	expectAPIError(t, resp, 429, "insufficient_quota")
	if len(dear.Calls())+len(cheap.Calls()) != 3 {
		t.Fatal("a refused request reached an upstream")
	}
}

// TestKeysReload: a reload that changes limits keeps the counters of keys
// it keeps, a removed key stops working at once, an added one works.
func TestKeysReload(t *testing.T) {
	up := newUpstream(t, completion("ok")) // reports 3 + 1 tokens
	h := basicConfig(up, 0)
	h["keys"] = []any{
		obj("id", "a", "secret", "llmr-a-5ecret", "tokens_per_day", 100000),
		obj("id", "b", "secret", "llmr-b-5ecret"),
	}
	p := startProxy(t, h)
	for i := 0; i < 5; i++ {
		if resp := p.chat(chatBody("m", false), "Authorization", "Bearer llmr-a-5ecret"); resp.StatusCode != 200 {
			t.Fatalf("a: %d %s", resp.StatusCode, readAll(t, resp))
		} else {
			readAll(t, resp)
		}
	}
	if got := p.keyStatus("a")["tokens_today"].(float64); got != 20 {
		t.Fatalf("a used %v tokens, want 5 × 4", got)
	}
	// Reload: a's limit is cut to what it already used, b goes, c comes.
	h["keys"] = []any{
		obj("id", "a", "secret", "llmr-a-5ecret", "tokens_per_day", 20),
		obj("id", "c", "secret", "llmr-c-5ecret"),
	}
	p.load(h)
	expectAPIError(t, p.chat(chatBody("m", false), "Authorization", "Bearer llmr-b-5ecret"), 401, "invalid_api_key")
	if got := p.keyStatus("a")["tokens_today"].(float64); got != 20 {
		t.Fatalf("a's counter after the reload %v, want 20", got)
	}
	expectAPIError(t, p.chat(chatBody("m", false), "Authorization", "Bearer llmr-a-5ecret"), 429, "insufficient_quota")
	if resp := p.chat(chatBody("m", false), "Authorization", "Bearer llmr-c-5ecret"); resp.StatusCode != 200 {
		t.Fatalf("c: %d", resp.StatusCode)
	} else {
		readAll(t, resp)
	}
	// Raising the limit again serves a, counting on from 20.
	h["keys"].([]any)[0].(map[string]any)["tokens_per_day"] = 100000
	p.load(h)
	if resp := p.chat(chatBody("m", false), "Authorization", "Bearer llmr-a-5ecret"); resp.StatusCode != 200 {
		t.Fatalf("a after raising: %d", resp.StatusCode)
	} else {
		readAll(t, resp)
	}
	if got := p.keyStatus("a")["tokens_today"].(float64); got != 24 {
		t.Fatalf("a's counter %v, want 24", got)
	}
	// b's series left with b; a's continue.
	if m := p.metrics(); strings.Contains(m, `key="b"`) || !strings.Contains(m, `llm_proxy_key_requests_total{key="a",model="m",result="ok"} 6`) {
		t.Fatalf("key series after the reloads:\n%s", grepLines(m, "llm_proxy_key_"))
	}
	// Removing every key opens the API again.
	delete(h, "keys")
	p.load(h)
	if resp := p.chat(chatBody("m", false)); resp.StatusCode != 200 {
		t.Fatalf("without keys: %d", resp.StatusCode)
	} else {
		readAll(t, resp)
	}
}

// TestKeysConfigErrors: validation names the entry.
func TestKeysConfigErrors(t *testing.T) {
	up := newUpstream(t, completion("ok"))
	p := startProxy(t, basicConfig(up, 0))
	for _, c := range []struct {
		keys []any
		want string
	}{
		{[]any{obj("id", "a", "secret", "s1"), obj("id", "a", "secret", "s2")}, `key "a": duplicate id`},
		{[]any{obj("id", "a", "secret", "s1"), obj("id", "b", "secret", "s1")}, `key "b": the same secret as another key`},
		{[]any{obj("id", "a", "sha256", "abc")}, `key "a": sha256 must be 64 hex digits`},
		{[]any{obj("id", "a")}, `key "a": secret or sha256 is required`},
		{[]any{obj("id", "a", "secret", "s", "sha256", sha256Hex("s"))}, `key "a": set secret or sha256, not both`},
		{[]any{obj("id", "a", "secret", "s", "rpm", -1)}, `key "a": rpm must not be negative`},
		{[]any{obj("id", "a", "secret", "s", "spend_per_day", -0.5)}, `key "a": spend_per_day must not be negative`},
		{[]any{obj("secret", "s")}, `keys[0]: id is required`},
		{[]any{obj("id", "a", "secret", "{env.LLMR_UNSET_KEY}")}, `key "a": secret is empty`},
		{[]any{obj("id", "a", "secret", "s", "rpm", "x")}, `keys[0] "a": rpm: want int64`},
	} {
		h := basicConfig(up, 0)
		h["keys"] = c.keys
		err := p.loadErr(h)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("keys %v: err = %v, want it to contain %q", c.keys, err, c.want)
		}
	}
	h := basicConfig(up, 0)
	h["upstreams"].([]any)[0].(map[string]any)["price_input"] = -1
	if err := p.loadErr(h); err == nil || !strings.Contains(err.Error(), `upstream "u1": prices must not be negative`) {
		t.Errorf("negative price: %v", err)
	}
	// A pattern that matches no model loads, with a warning naming it.
	h = basicConfig(up, 0)
	h["keys"] = []any{obj("id", "a", "secret", "s", "models", []string{"gpt-*"})}
	p.load(h)
	if w := p.logEntries("key model pattern matches no model"); len(w) == 0 || w[0]["pattern"] != "gpt-*" || w[0]["key"] != "a" {
		t.Fatalf("warning %v", w)
	}
}

// TestKeysSecretNeverLeaks: the secrets appear in no log line (the access
// log included, which prints X-Api-Key), no error, no metric, no /config
// output and no upstream request.
func TestKeysSecretNeverLeaks(t *testing.T) {
	up := newUpstream(t, anyAPI)
	p := startProxy(t, keysConfig(t, up))
	// Turn the access log on.
	var full map[string]any
	if err := json.Unmarshal(p.config(keysConfig(t, up)), &full); err != nil {
		t.Fatal(err)
	}
	full["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["srv0"].(map[string]any)["logs"] = map[string]any{}
	// Caddy clones the request for its access log before any handler
	// runs, so deleting X-Api-Key in the handler cannot keep it out of
	// that line; the README's log filter does (Authorization Caddy
	// redacts itself).
	full["logging"].(map[string]any)["logs"].(map[string]any)["default"].(map[string]any)["encoder"] = map[string]any{
		"format": "filter", "fields": map[string]any{"request>headers>X-Api-Key": map[string]any{"filter": "delete"}}}
	b, _ := json.Marshal(full)
	if err := loadCaddy(t, b); err != nil {
		t.Fatal(err)
	}
	var bodies []string
	for _, model := range []string{"m", "other", "nope"} {
		for _, fr := range frontRequests(model) {
			for _, s := range []string{secretTeam, secretSlow, secretBroke, secretTeam + "x"} {
				for _, h := range [][]string{{"Authorization", "Bearer " + s}, {"X-Api-Key", s}} {
					resp := p.sendFront(fr, h...)
					bodies = append(bodies, readAll(t, resp))
					for k, v := range resp.Header {
						bodies = append(bodies, k+": "+strings.Join(v, ","))
					}
				}
			}
		}
	}
	cfgResp, err := testClient.Get(p.admin + "/config/")
	if err != nil {
		t.Fatal(err)
	}
	status, err := testClient.Get(p.admin + "/llm_route/status")
	if err != nil {
		t.Fatal(err)
	}
	places := map[string]string{
		"logs":    p.logs(),
		"answers": strings.Join(bodies, "\n"),
		"metrics": p.metrics(),
		"/config": readAll(t, cfgResp),
		"status":  readAll(t, status),
	}
	var upstream strings.Builder
	for _, c := range up.Calls() {
		fmt.Fprintf(&upstream, "%v %s\n", c.Header, c.Body)
	}
	places["upstream"] = upstream.String()
	if !strings.Contains(places["logs"], `"uri":"/v1/chat/completions"`) {
		t.Fatal("the access log is not on: the check below would prove nothing")
	}
	if !strings.Contains(places["logs"], `"llm_route_key":"team"`) {
		t.Error("the access log does not name the key id")
	}
	if !strings.Contains(places["metrics"], `llm_proxy_key_requests_total{key="team"`) {
		t.Fatal("no key metrics")
	}
	for where, text := range places {
		for _, s := range []string{secretTeam, secretSlow, secretBroke, "5ecret"} {
			if strings.Contains(text, s) {
				t.Errorf("%s contains a client secret (%s)", where, s)
			}
		}
	}
}

// TestKeysReadmeExample loads the README's key example as written and
// checks what it promises: no key 401, the team's key on a model outside
// its list 403, its model list its two models.
func TestKeysReadmeExample(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "## Client keys")
	if !ok {
		t.Fatal("README has no client keys section")
	}
	_, block, ok := strings.Cut(sec, "```caddyfile\n")
	if !ok {
		t.Fatal("no caddyfile block")
	}
	block, _, _ = strings.Cut(block, "```")
	t.Setenv("TEAM_WEB_KEY", "llmr-readme-5ecret")
	t.Setenv("OPENAI_API_KEY", "sk-test-secret-readme")
	p := &proxy{t: t, port: freePort(t), aport: freePort(t)}
	p.URL = fmt.Sprintf("http://127.0.0.1:%d", p.port)
	site := fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n}\n:%d {\n%s}\n", p.aport, p.port, block)
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site), nil)
	if err != nil {
		t.Fatalf("the README example does not adapt: %v", err)
	}
	if err := loadCaddy(t, cfgJSON); err != nil {
		t.Fatalf("the README example does not load: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	expectAPIError(t, p.chat(chatBody("coder", false)), 401, "invalid_api_key")
	expectAPIError(t, p.chat(chatBody("research", false), "Authorization", "Bearer llmr-readme-5ecret"), 403, "model_not_allowed")
	req, _ := http.NewRequest("GET", p.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer llmr-readme-5ecret")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); !strings.Contains(body, `"id":"coder"`) || !strings.Contains(body, `"id":"chat"`) || strings.Contains(body, "research") {
		t.Fatalf("models for the key: %s", body)
	}
}

// grepLines returns the lines of text containing sub.
func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestKeysReleaseOnFailureAndCancel: a failed attempt's reservation is
// released before the next upstream's is taken, only the answer's usage is
// charged, and a client that leaves while its request is held at the
// upstream gets its reservation back.
func TestKeysReleaseOnFailureAndCancel(t *testing.T) {
	broken := newUpstream(t, status(500))
	g := newGate()
	good := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("X-Test"), "hold") {
			g.handler(completion("late"))(w, r)
			return
		}
		completion("ok")(w, r) // reports 3 + 1 tokens
	})
	t.Cleanup(g.open)
	h := cfg(
		[]map[string]any{obj("id", "p1", "url", broken.base(), "forward_headers", []string{"X-Test"}),
			obj("id", "p2", "url", good.base(), "forward_headers", []string{"X-Test"})},
		[]map[string]any{obj("id", "broken", "provider", "p1", "model", "x"), obj("id", "good", "provider", "p2", "model", "y")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"broken", "good"})},
		// max_tokens 1000 + the prompt estimate: one reservation at a time fits.
		"keys", []any{obj("id", "rel", "secret", secretTeam, "tokens_per_day", 1500)})
	p := startProxy(t, h)
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1000}`
	resp := p.chat(body, "Authorization", "Bearer "+secretTeam)
	if b := readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get("X-LLM-Route-Upstream") != "good" {
		t.Fatalf("failover: %d %s", resp.StatusCode, b)
	}
	if k := p.keyStatus("rel"); k["tokens_today"].(float64) != 4 || k["reserved_tokens"].(float64) != 0 {
		t.Fatalf("after a failover: %v, want the answer's 4 tokens and nothing reserved", k)
	}

	// Held at the upstream, the request's reservation shows; the client
	// leaves; it is released, nothing is charged.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := p.post(ctx, body, "Authorization", "Bearer "+secretTeam, "X-Test", "hold"); err == nil {
			resp.Body.Close()
		}
	}()
	g.waitArrivals(t, 1)
	if k := p.keyStatus("rel"); k["reserved_tokens"].(float64) < 1000 {
		t.Fatalf("while held: %v, want its reservation", k)
	}
	// A second request finds no room while the first holds its reservation.
	expectAPIError(t, p.chat(body, "Authorization", "Bearer "+secretTeam), 429, "insufficient_quota")
	cancel()
	<-done
	eventually(t, 10*time.Second, "the cancelled request's reservation released", func() bool {
		k := p.keyStatus("rel")
		return k["reserved_tokens"].(float64) == 0 && k["tokens_today"].(float64) == 4
	})
	resp = p.chat(body, "Authorization", "Bearer "+secretTeam)
	if b := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("after the release: %d %s", resp.StatusCode, b)
	}
}
