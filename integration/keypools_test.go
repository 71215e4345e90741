package integration

// Provider key pools: a provider's `keys` rotate, a key the provider
// refuses cools by why (auth, quota, rate) and the request is sent again at
// once with another key, only an empty pool fails the upstream over; a
// caller may bring its own key (client_key_header). The fake upstreams
// answer with the error bodies OpenAI, Anthropic and OpenRouter send.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// poolKeys are the keys of the tests' pools: distinctive, so a scan finds
// any copy of them.
var poolKeys = []string{"sk-pool-A-7f3c9e1b2d4a6c8e", "sk-pool-B-0a9b8c7d6e5f4a3b", "sk-pool-C-1122334455667788"}

// Real error bodies of the providers.
const (
	openAIInvalidKey = `{"error":{"message":"Incorrect API key provided: sk-pool-*****6c8e. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`
	openAIQuota      = `{"error":{"message":"You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`
	openAIRate       = `{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-abc on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
	anthropicCredit  = `{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}`
	openRouter402    = `{"error":{"code":402,"message":"Insufficient credits. Add more using https://openrouter.ai/settings/credits"}}`
)

// keyOf is the key a request to a fake upstream carried, from either auth
// header.
func keyOf(r *http.Request) string {
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return k
	}
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// keyed answers by the request's key: behave[key] when there is one, else a
// completion naming the key's index.
type keyed struct {
	mu     sync.Mutex
	behave map[string]http.HandlerFunc
}

func (k *keyed) set(key string, h http.HandlerFunc) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.behave == nil {
		k.behave = map[string]http.HandlerFunc{}
	}
	k.behave[key] = h
}

func (k *keyed) handler(w http.ResponseWriter, r *http.Request) {
	key := keyOf(r)
	k.mu.Lock()
	h := k.behave[key]
	k.mu.Unlock()
	if h == nil {
		h = completion("served")
	}
	h(w, r)
}

// errorBody answers code with body and the given headers.
func errorBody(code int, body string, hdr ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
}

// keyIndexes are the indexes (in poolKeys) of the keys of the calls.
func keyIndexes(calls []upstreamCall) []int {
	out := make([]int, 0, len(calls))
	for _, c := range calls {
		k := c.Header.Get("X-Api-Key")
		if k == "" {
			k = strings.TrimPrefix(c.Header.Get("Authorization"), "Bearer ")
		}
		idx := -1
		for i, pk := range poolKeys {
			if pk == k {
				idx = i
			}
		}
		out = append(out, idx)
	}
	return out
}

// poolStatus is the status answer's part the tests read.
type poolStatus struct {
	Upstreams []upstreamJSON `json:"upstreams"`
	Providers []struct {
		ID   string `json:"id"`
		Keys []struct {
			Index       int     `json:"index"`
			Fingerprint string  `json:"fingerprint"`
			State       string  `json:"state"`
			Cooldown    float64 `json:"cooldown_seconds"`
		} `json:"keys"`
	} `json:"providers"`
}

func (p *proxy) poolStatus() (poolStatus, string) {
	p.t.Helper()
	_, raw := p.status()
	var s poolStatus
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		p.t.Fatal(err)
	}
	return s, raw
}

// keyState is the state and cooldown of a provider's key in the status.
func (s poolStatus) keyState(provider string, index int) (string, float64) {
	for _, p := range s.Providers {
		if p.ID == provider {
			for _, k := range p.Keys {
				if k.Index == index {
					return k.State, k.Cooldown
				}
			}
		}
	}
	return "absent", 0
}

func (s poolStatus) upstream(id string) upstreamJSON {
	for _, u := range s.Upstreams {
		if u.ID == id {
			return u
		}
	}
	return upstreamJSON{}
}

// poolConfig is a model m on upstream up (provider pool, with keys and the
// given settings) then fb (provider fallback, its own key).
func poolConfig(pool, fallback *fakeUpstream, keys []string, settings ...any) map[string]any {
	pp := obj("id", "pool", "url", pool.base(), "keys", keys, "backoff", "30s", "probe_interval", "0s")
	for i := 0; i+1 < len(settings); i += 2 {
		pp[settings[i].(string)] = settings[i+1]
	}
	return cfg(
		[]map[string]any{pp, obj("id", "fallback", "url", fallback.base(), "key", "sk-fallback-own-9d8c7b6a")},
		[]map[string]any{obj("id", "up", "provider", "pool", "model", "x"), obj("id", "fb", "provider", "fallback", "model", "y")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"up", "fb"})},
	)
}

// captured is everything a test saw, for the key scan.
type captured struct {
	mu    sync.Mutex
	texts []string
}

func (c *captured) add(s string) {
	c.mu.Lock()
	c.texts = append(c.texts, s)
	c.mu.Unlock()
}

// chat sends a request and keeps its answer (status line, headers, body).
func (c *captured) chat(t *testing.T, p *proxy, hdr ...string) (int, string) {
	t.Helper()
	resp := p.chat(chatBody("m", false), hdr...)
	body := readAll(t, resp)
	var b strings.Builder
	for k, vv := range resp.Header {
		fmt.Fprintf(&b, "%s: %s\n", k, strings.Join(vv, ", "))
	}
	c.add(b.String() + body)
	return resp.StatusCode, body
}

// scan fails the test if any secret appears in what was captured, the
// proxy's log, its metrics or its status answer.
func (c *captured) scan(t *testing.T, p *proxy, secrets ...string) {
	t.Helper()
	_, status := p.status()
	texts := append([]string{p.logs(), p.metrics(), status}, c.texts...)
	names := []string{"log", "metrics", "status"}
	for i, text := range texts {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				what := "response"
				if i < len(names) {
					what = names[i]
				}
				t.Errorf("the key %.12s… appears in the %s", s, what)
			}
		}
	}
}

func TestKeyPoolRoundRobinCyclesExactly(t *testing.T) {
	pool := newUpstream(t, nil)
	fb := newUpstream(t, nil)
	p := startProxy(t, poolConfig(pool, fb, poolKeys, "key_rotation", "round_robin"))
	var c captured
	for range 9 {
		if code, body := c.chat(t, p); code != http.StatusOK {
			t.Fatalf("HTTP %d: %s", code, body)
		}
	}
	got := keyIndexes(pool.Calls())
	for i, k := range got {
		if k != i%3 {
			t.Fatalf("keys in order %v, want 0 1 2 repeating", got)
		}
	}
	c.scan(t, p, poolKeys...)
	// A reload without the pool drops its key series.
	p.load(basicConfig(pool, 0))
	if m := p.metrics(); strings.Contains(m, `llm_proxy_provider_key_requests_total{key="0",provider="pool"`) {
		t.Errorf("the removed pool's key series are still exported")
	}
}

func TestKeyPoolRandomSpreadsEvenly(t *testing.T) {
	pool := newUpstream(t, nil)
	fb := newUpstream(t, nil)
	p := startProxy(t, poolConfig(pool, fb, poolKeys))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	defer client.CloseIdleConnections()
	const n, workers = 3000, 6
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= n {
				resp, err := client.Post(p.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", false)))
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("HTTP %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	count := map[int]int{}
	for _, k := range keyIndexes(pool.Calls()) {
		count[k]++
	}
	for i := range poolKeys {
		if count[i] < 900 || count[i] > 1100 {
			t.Errorf("key %d took %d of %d requests, want 1000 ± 100 (all: %v)", i, count[i], n, count)
		}
	}
	if len(fb.Calls()) != 0 {
		t.Errorf("the fallback got %d calls", len(fb.Calls()))
	}
}

func TestKeyPoolLeastUsedEvensOutAKeyThatCameBack(t *testing.T) {
	var k keyed
	k.set(poolKeys[0], errorBody(http.StatusUnauthorized, openAIInvalidKey))
	pool := newUpstream(t, k.handler)
	fb := newUpstream(t, nil)
	p := startProxy(t, poolConfig(pool, fb, poolKeys[:2], "key_rotation", "least_used", "key_cooldown_auth", "2s"))
	var c captured
	// Key 0 (least used, first) is refused and cools 2 s; key 1 serves
	// this request and the next nine.
	for range 10 {
		if code, body := c.chat(t, p); code != http.StatusOK {
			t.Fatalf("HTTP %d: %s", code, body)
		}
	}
	if got := keyIndexes(pool.Calls()); got[0] != 0 || strings.Count(fmt.Sprint(got), "0") != 1 {
		t.Fatalf("keys %v: want key 0 once (refused), then key 1", got)
	}
	k.set(poolKeys[0], nil) // the key works again
	eventually(t, 5*time.Second, "key 0 back", func() bool {
		s, _ := p.poolStatus()
		st, _ := s.keyState("pool", 0)
		return st == "ok"
	})
	before := len(pool.Calls())
	for range 9 {
		if code, body := c.chat(t, p); code != http.StatusOK {
			t.Fatalf("HTTP %d: %s", code, body)
		}
	}
	// Key 0 has 1 use, key 1 has 10: key 0 takes the next nine.
	if got := keyIndexes(pool.Calls()[before:]); fmt.Sprint(got) != "[0 0 0 0 0 0 0 0 0]" {
		t.Errorf("after key 0 came back: keys %v, want key 0 nine times (it catches up)", got)
	}
	c.scan(t, p, poolKeys...)
}

// Each refusal of a key cools that key for its category; the request is
// served by the next key at once, without failover and without backing the
// upstream off.
func TestKeyPoolCooldownByCategory(t *testing.T) {
	for _, tc := range []struct {
		name     string
		auth     string // provider auth
		refuse   http.HandlerFunc
		min, max float64 // key 0's cooldown_seconds right after
		result   string  // llm_proxy_provider_key_requests_total result of key 0
	}{
		{"401 auth", "", errorBody(http.StatusUnauthorized, openAIInvalidKey), 1, 2, "auth"},
		{"403 auth", "", errorBody(http.StatusForbidden, `{"error":{"message":"Project does not have access to model","type":"invalid_request_error","code":"model_not_found"}}`), 1, 2, "auth"},
		{"429 Retry-After 7", "", errorBody(http.StatusTooManyRequests, openAIRate, "Retry-After", "7"), 6, 7, "rate"},
		{"429 without Retry-After", "", errorBody(http.StatusTooManyRequests, openAIRate), 2, 3, "rate"},
		{"429 insufficient_quota", "", errorBody(http.StatusTooManyRequests, openAIQuota), 3590, 3600, "quota"},
		{"Anthropic credit balance", "x-api-key", errorBody(http.StatusBadRequest, anthropicCredit, "Request-Id", "req_011"), 3590, 3600, "quota"},
		{"OpenRouter 402", "", errorBody(http.StatusPaymentRequired, openRouter402), 3590, 3600, "quota"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var k keyed
			k.set(poolKeys[0], tc.refuse)
			pool := newUpstream(t, k.handler)
			fb := newUpstream(t, nil)
			conf := poolConfig(pool, fb, poolKeys, "key_rotation", "round_robin", "key_cooldown_auth", "2s", "key_cooldown_rate", "3s")
			if tc.auth != "" {
				conf["providers"].([]map[string]any)[0]["auth"] = tc.auth
			}
			p := startProxy(t, conf)
			// The counters live on across the tests of this process.
			keyCount := func(key, result string) float64 {
				return p.metric("llm_proxy_provider_key_requests_total", "key", key, "provider", "pool", "result", result)
			}
			refused0, ok1 := keyCount("0", tc.result), keyCount("1", "ok")
			var c captured
			code, body := c.chat(t, p)
			if code != http.StatusOK || !strings.Contains(body, "served") {
				t.Fatalf("HTTP %d: %s", code, body)
			}
			if got := keyIndexes(pool.Calls()); fmt.Sprint(got) != "[0 1]" {
				t.Fatalf("keys tried %v, want [0 1]: key 0 refused, key 1 at once", got)
			}
			if n := len(fb.Calls()); n != 0 {
				t.Errorf("the next upstream got %d calls: a key refusal failed over", n)
			}
			s, raw := p.poolStatus()
			st, cd := s.keyState("pool", 0)
			if st != "cooling" || cd <= tc.min || cd > tc.max {
				t.Errorf("key 0: %s %.1fs, want cooling in (%v, %v]: %s", st, cd, tc.min, tc.max, raw)
			}
			if st, _ := s.keyState("pool", 1); st != "ok" {
				t.Errorf("key 1: %s, want ok", st)
			}
			if u := s.upstream("up"); u.CoolingSeconds != 0 || u.FailStreak != 0 {
				t.Errorf("upstream backed off for a key refusal: cooling %.1fs, fail_streak %d", u.CoolingSeconds, u.FailStreak)
			}
			if v := keyCount("0", tc.result) - refused0; v != 1 {
				t.Errorf("key 0 %s refusals counted %v, want 1", tc.result, v)
			}
			if v := keyCount("1", "ok") - ok1; v != 1 {
				t.Errorf("key 1 ok counted %v, want 1", v)
			}
			// The next requests skip key 0 while it cools.
			for range 4 {
				c.chat(t, p)
			}
			for _, k := range keyIndexes(pool.Calls()[2:]) {
				if k == 0 {
					t.Fatalf("a cooling key was used: %v", keyIndexes(pool.Calls()))
				}
			}
			lines := p.logEntries("provider key cooling")
			if len(lines) != 1 || lines[0]["key"] != float64(0) || lines[0]["reason"] != tc.result {
				t.Errorf("cooling log lines %v, want one naming key 0 and %s", lines, tc.result)
			}
			if tc.result == "auth" {
				// The auth cooldown (2 s here) ends: key 0 is used again.
				k.set(poolKeys[0], nil)
				eventually(t, 5*time.Second, "key 0 back", func() bool {
					s, _ := p.poolStatus()
					st, _ := s.keyState("pool", 0)
					return st == "ok"
				})
				before := len(pool.Calls())
				for range 3 {
					c.chat(t, p)
				}
				if got := keyIndexes(pool.Calls()[before:]); !strings.Contains(fmt.Sprint(got), "0") {
					t.Errorf("key 0 not used after its cooldown: %v", got)
				}
			}
			c.scan(t, p, poolKeys...)
		})
	}
}

// Every key refused: the upstream counts one failure, fails over, and cools
// until the first key comes back (its Retry-After).
func TestKeyPoolAllKeysDownFailsOverAndCoolsUpstream(t *testing.T) {
	var k keyed
	k.set(poolKeys[0], errorBody(http.StatusTooManyRequests, openAIRate, "Retry-After", "9"))
	k.set(poolKeys[1], errorBody(http.StatusTooManyRequests, openAIRate, "Retry-After", "5"))
	pool := newUpstream(t, k.handler)
	fb := newUpstream(t, completion("fallback"))
	p := startProxy(t, poolConfig(pool, fb, poolKeys[:2], "key_rotation", "round_robin"))
	var c captured
	code, body := c.chat(t, p)
	if code != http.StatusOK || !strings.Contains(body, "fallback") {
		t.Fatalf("HTTP %d: %s", code, body)
	}
	if got := keyIndexes(pool.Calls()); fmt.Sprint(got) != "[0 1]" {
		t.Errorf("keys tried %v, want [0 1]", got)
	}
	if n := len(fb.Calls()); n != 1 {
		t.Errorf("fallback calls %d, want 1", n)
	}
	s, raw := p.poolStatus()
	u := s.upstream("up")
	if u.CoolingSeconds <= 4 || u.CoolingSeconds > 5 || u.FailStreak != 1 {
		t.Errorf("upstream: cooling %.1fs fail_streak %d, want (4, 5] s (key 1's Retry-After) and one failure: %s",
			u.CoolingSeconds, u.FailStreak, raw)
	}
	// While it cools, requests go straight to the fallback.
	c.chat(t, p)
	if n := len(pool.Calls()); n != 2 {
		t.Errorf("the cooling upstream got %d calls, want 2", n)
	}
	if v := p.requests("m", "up", "pool", "429"); v != 2 {
		t.Errorf("llm_proxy_requests_total up 429 = %v, want 2 (each key's exchange)", v)
	}
	c.scan(t, p, poolKeys...)
}

// The closing note's picture: a pool of three keys, key 0 rate-limited
// (Retry-After 30), key 1 dead (401), key 2 serving. The status answer and
// the metric text are logged (go test -v) and scanned for the keys.
func TestKeyPoolStatusAndMetricsOfAMixedPool(t *testing.T) {
	var k keyed
	k.set(poolKeys[0], errorBody(http.StatusTooManyRequests, openAIRate, "Retry-After", "30"))
	k.set(poolKeys[1], errorBody(http.StatusUnauthorized, openAIInvalidKey))
	pool := newUpstream(t, k.handler)
	fb := newUpstream(t, nil)
	p := startProxy(t, poolConfig(pool, fb, poolKeys, "key_rotation", "round_robin"))
	var c captured
	for range 3 {
		if code, body := c.chat(t, p); code != http.StatusOK {
			t.Fatalf("HTTP %d: %s", code, body)
		}
	}
	s, raw := p.poolStatus()
	var st struct {
		Providers []json.RawMessage `json:"providers"`
	}
	_ = json.Unmarshal([]byte(raw), &st)
	t.Logf("status providers[0]: %s", st.Providers[0])
	for _, line := range strings.Split(p.metrics(), "\n") {
		if strings.HasPrefix(line, "llm_proxy_provider_key_requests_total{") && !strings.HasSuffix(line, " 0") {
			t.Logf("metric: %s", line)
		}
	}
	for _, l := range p.logEntries("provider key cooling") {
		t.Logf("log: key %v reason %v cooling %v", l["key"], l["reason"], l["cooling"])
	}
	if l := p.logEntries("retrying with another provider key"); len(l) != 2 || l[0]["key"] != "0" || l[1]["key"] != "1" {
		t.Errorf("retry log lines %v, want key 0 then key 1", l)
	}
	for _, l := range p.logEntries("request completed") {
		if l["key"] != "2" {
			t.Errorf("request completed names key %v, want 2 (the key that answered)", l["key"])
		}
	}
	want := map[int]string{0: "cooling", 1: "cooling", 2: "ok"}
	for i, w := range want {
		if got, _ := s.keyState("pool", i); got != w {
			t.Errorf("key %d: %s, want %s", i, got, w)
		}
	}
	if _, cd := s.keyState("pool", 0); cd <= 29 || cd > 30 {
		t.Errorf("key 0 cooldown %.1f, want its Retry-After (30 s)", cd)
	}
	if _, cd := s.keyState("pool", 1); cd <= 86000 {
		t.Errorf("key 1 cooldown %.1f, want the auth cooldown (24 h)", cd)
	}
	c.scan(t, p, poolKeys...)
}

// A caller's own key (client_key_header) goes to that provider only; the
// next provider gets its own key; the header reaches no upstream, even one
// that lists it in forward_headers; a refusal of the caller's key cools
// neither a pool key nor the upstream.
func TestKeyPoolBringYourOwnKey(t *testing.T) {
	const callerKey = "sk-caller-own-5e4d3c2b1a09"
	own := newUpstream(t, status(http.StatusInternalServerError))
	other := newUpstream(t, completion("other"))
	conf := cfg(
		[]map[string]any{
			obj("id", "own", "url", own.base(), "keys", poolKeys[:2], "client_key_header", "X-Provider-Key", "backoff", "30s", "probe_interval", "0s"),
			obj("id", "other", "url", other.base(), "key", "sk-other-op-4b3a29180716", "forward_headers", []string{"X-Provider-Key"}),
		},
		[]map[string]any{obj("id", "uo", "provider", "own", "model", "x"), obj("id", "ux", "provider", "other", "model", "y")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"uo", "ux"})},
	)
	p := startProxy(t, conf)
	failedBefore := p.metric("llm_proxy_provider_key_requests_total", "key", "0", "provider", "own", "result", "failed") +
		p.metric("llm_proxy_provider_key_requests_total", "key", "1", "provider", "own", "result", "failed")
	var c captured
	// The first provider fails (500): the request goes on to the other.
	code, body := c.chat(t, p, "X-Provider-Key", callerKey)
	if code != http.StatusOK || !strings.Contains(body, "other") {
		t.Fatalf("HTTP %d: %s", code, body)
	}
	oc, xc := own.Calls(), other.Calls()
	if len(oc) != 1 || len(xc) != 1 {
		t.Fatalf("calls own %d other %d, want 1 and 1", len(oc), len(xc))
	}
	if got := oc[0].Header.Get("Authorization"); got != "Bearer "+callerKey {
		t.Errorf("own provider got Authorization %q, want the caller's key", got)
	}
	if got := xc[0].Header.Get("Authorization"); got != "Bearer sk-other-op-4b3a29180716" {
		t.Errorf("other provider got Authorization %q, want its own key", got)
	}
	for _, call := range append(oc, xc...) {
		if v, ok := call.Header["X-Provider-Key"]; ok {
			t.Errorf("an upstream got X-Provider-Key: %q", v)
		}
		for name, vv := range call.Header {
			if name != "Authorization" && strings.Contains(strings.Join(vv, " "), callerKey) {
				t.Errorf("an upstream got the caller's key in %s", name)
			}
		}
	}
	if v := p.metric("llm_proxy_provider_key_requests_total", "key", "0", "provider", "own", "result", "failed") +
		p.metric("llm_proxy_provider_key_requests_total", "key", "1", "provider", "own", "result", "failed"); v != failedBefore {
		t.Errorf("the caller's own key counted as a pool key: %v", v)
	}

	// The caller's key refused (401): neither the upstream nor a pool key
	// cools for it.
	own2 := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if keyOf(r) == callerKey {
			errorBody(http.StatusUnauthorized, openAIInvalidKey)(w, r)
			return
		}
		completion("pool")(w, r)
	})
	conf2 := cfg(
		[]map[string]any{
			obj("id", "own2", "url", own2.base(), "keys", poolKeys[:2], "client_key_header", "X-Provider-Key", "backoff", "30s", "probe_interval", "0s"),
			obj("id", "other", "url", other.base(), "key", "sk-other-op-4b3a29180716"),
		},
		[]map[string]any{obj("id", "uo2", "provider", "own2", "model", "x"), obj("id", "ux", "provider", "other", "model", "y")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"uo2", "ux"})},
	)
	p.load(conf2)
	code, body = c.chat(t, p, "X-Provider-Key", callerKey)
	if code != http.StatusOK || !strings.Contains(body, "other") {
		t.Fatalf("refused own key: HTTP %d: %s", code, body)
	}
	s, raw := p.poolStatus()
	if u := s.upstream("uo2"); u.CoolingSeconds != 0 || u.FailStreak != 0 {
		t.Errorf("the caller's refused key cooled the upstream: %s", raw)
	}
	for i := range 2 {
		if st, _ := s.keyState("own2", i); st != "ok" {
			t.Errorf("pool key %d %s after the caller's key was refused", i, st)
		}
	}
	// Without the header, the pool's keys are used.
	code, body = c.chat(t, p)
	if code != http.StatusOK || !strings.Contains(body, "pool") {
		t.Fatalf("without the header: HTTP %d: %s", code, body)
	}
	if got := keyIndexes(own2.Calls()[1:]); got[0] < 0 {
		t.Errorf("without the header the provider got no pool key: %v", got)
	}
	c.scan(t, p, append([]string{callerKey}, poolKeys...)...)
}

// Two Caddy processes on one Redis: a key one of them cooled is skipped by
// the other.
func TestKeyPoolCooldownSharedThroughRedis(t *testing.T) {
	rs := startRedis(t)
	var k keyed
	k.set(poolKeys[0], errorBody(http.StatusTooManyRequests, openAIRate, "Retry-After", "30"))
	pool := newUpstream(t, k.handler)
	fb := newUpstream(t, nil)
	conf := poolConfig(pool, fb, poolKeys, "key_rotation", "round_robin")
	conf["state"] = obj("backend", "redis", "address", rs.addr, "prefix", "kp:")
	a := startInstance(t, conf)
	b := startInstance(t, conf)
	waitHealthy(t, a, true)
	waitHealthy(t, b, true)

	resp := a.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("instance a: %d %s", resp.StatusCode, body)
	}
	if got := keyIndexes(pool.Calls()); fmt.Sprint(got) != "[0 1]" {
		t.Fatalf("instance a tried keys %v, want [0 1]", got)
	}
	eventually(t, 5*time.Second, "instance b sees key 0 cooling", func() bool {
		s, _ := b.poolStatus()
		st, cd := s.keyState("pool", 0)
		return st == "cooling" && cd > 20
	})
	before := len(pool.Calls())
	for range 6 {
		resp := b.chat(chatBody("m", false))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("instance b: %d %s", resp.StatusCode, body)
		}
	}
	got := keyIndexes(pool.Calls()[before:])
	for _, i := range got {
		if i == 0 {
			t.Fatalf("instance b used the key instance a cooled: %v", got)
		}
	}
	if len(got) != 6 {
		t.Errorf("instance b's calls %v, want 6", got)
	}
	var c captured
	c.scan(t, a.proxy, poolKeys...)
	c.scan(t, b.proxy, poolKeys...)
}

// Bad key pool settings are provision errors that name the provider.
func TestKeyPoolConfigErrors(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 0))
	for _, tc := range []struct {
		provider map[string]any
		want     string
	}{
		{obj("key", "sk-a", "keys", []string{"sk-b", "sk-c"}), `provider "bad": key and keys are both set`},
		{obj("keys", []string{"sk-b"}, "key_rotation", "weighted"), `provider "bad": key_rotation: "weighted" is not random, round_robin or least_used`},
		{obj("keys", []string{"sk-b"}, "key_cooldown_rate", "0s"), `provider "bad": key_cooldown_rate must be positive`},
		{obj("keys", []string{"sk-b", "sk-b"}), `provider "bad": keys[1] is the same key as keys[0]`},
		{obj("keys", []string{"sk-b", "{env.LLM_ROUTE_UNSET_KEY_FOR_TEST}"}), `provider "bad": keys[1] resolves to empty`},
		{obj("keys", []string{"sk-b"}, "client_key_header", "User-Agent"), `provider "bad": client_key_header "User-Agent" names a header the proxy forwards`},
	} {
		prov := obj("id", "bad", "url", up.base())
		for k, v := range tc.provider {
			prov[k] = v
		}
		err := p.loadErr(cfg([]map[string]any{prov}, []map[string]any{obj("id", "u", "provider", "bad", "model", "x")},
			[]map[string]any{obj("name", "m", "upstreams", []string{"u"})}))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one containing %q", err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "sk-b") {
			t.Errorf("the error shows a key: %v", err)
		}
	}
}

// A caller's own key and Caddy's access log: Caddy copies the request for
// its access line before any handler runs, so taking the header out in the
// handler cannot keep it from that line; the log filter the key pool docs
// give does. With it, the key is in no log line, answer, metric or status.
func TestKeyPoolOwnKeyKeptOutOfTheAccessLog(t *testing.T) {
	const callerKey = "sk-caller-own-access-7c6b5a4d3e2f"
	up := newUpstream(t, completion("own"))
	conf := cfg(
		[]map[string]any{obj("id", "own", "url", up.base(), "keys", poolKeys[:2], "client_key_header", "X-Provider-Key", "probe_interval", "0s")},
		[]map[string]any{obj("id", "uo", "provider", "own", "model", "x")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"uo"})},
	)
	p := startProxy(t, conf)
	var full map[string]any
	if err := json.Unmarshal(p.config(conf), &full); err != nil {
		t.Fatal(err)
	}
	full["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["srv0"].(map[string]any)["logs"] = map[string]any{}
	full["logging"].(map[string]any)["logs"].(map[string]any)["default"].(map[string]any)["encoder"] = map[string]any{
		"format": "filter", "fields": map[string]any{"request>headers>X-Provider-Key": map[string]any{"filter": "delete"}}}
	b, _ := json.Marshal(full)
	if err := loadCaddy(t, b); err != nil {
		t.Fatal(err)
	}
	var c captured
	if code, body := c.chat(t, p, "X-Provider-Key", callerKey); code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", code, body)
	}
	if got := up.Calls()[0].Header.Get("Authorization"); got != "Bearer "+callerKey {
		t.Fatalf("the provider got Authorization %q, want the caller's key", got)
	}
	if !strings.Contains(p.logs(), `"uri":"/v1/chat/completions"`) {
		t.Fatal("the access log is not on: the check below would prove nothing")
	}
	c.scan(t, p, callerKey)
}

// A rate limit's Retry-After cools a key, and through the key the upstream
// once every key cools, no longer than retry_after_max: an upstream's
// Retry-After never holds it longer than that setting, pool or not.
func TestKeyPoolRetryAfterBoundedByRetryAfterMax(t *testing.T) {
	var k keyed
	k.set(poolKeys[0], errorBody(http.StatusTooManyRequests, openAIRate, "Retry-After", "86400"))
	k.set(poolKeys[1], errorBody(http.StatusTooManyRequests, openAIRate, "Retry-After", "86400"))
	pool := newUpstream(t, k.handler)
	fb := newUpstream(t, completion("fallback"))
	conf := poolConfig(pool, fb, poolKeys[:2], "key_rotation", "round_robin")
	conf["retry_after_max"] = "20s"
	p := startProxy(t, conf)
	var c captured
	if code, body := c.chat(t, p); code != http.StatusOK || !strings.Contains(body, "fallback") {
		t.Fatalf("HTTP %d: %s", code, body)
	}
	s, raw := p.poolStatus()
	for i := range 2 {
		if st, cd := s.keyState("pool", i); st != "cooling" || cd > 20 {
			t.Errorf("key %d: %s %.1fs, want cooling at most retry_after_max (20s): %s", i, st, cd, raw)
		}
	}
	if u := s.upstream("up"); u.CoolingSeconds <= 0 || u.CoolingSeconds > 20 {
		t.Errorf("upstream cooling %.1fs, want at most retry_after_max (20s): %s", u.CoolingSeconds, raw)
	}
}

// Concurrent requests that find every key refused together are one
// exhaustion of the pool: the upstream counts one failure and cools until
// the first key comes back, not a backoff doubled once per request.
func TestKeyPoolConcurrentExhaustionCountsOneFailure(t *testing.T) {
	keys := []string{"sk-pool-X-5a4b3c2d1e0f9a8b", "sk-pool-Y-6b5c4d3e2f1a0b9c", "sk-pool-Z-7c6d5e4f3a2b1c0d"}
	var k keyed
	for _, key := range keys {
		k.set(key, func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(20 * time.Millisecond) // the refusals cross in flight
			errorBody(http.StatusTooManyRequests, openAIRate, "Retry-After", "30")(w, r)
		})
	}
	pool := newUpstream(t, k.handler)
	fb := newUpstream(t, completion("fallback"))
	p := startProxy(t, poolConfig(pool, fb, keys, "key_rotation", "round_robin", "backoff", "1h"))
	var chans []<-chan result
	for range 12 {
		chans = append(chans, p.goChat(context.Background(), chatBody("m", false)))
	}
	for _, ch := range chans {
		if r := <-ch; r.err != nil || r.status != http.StatusOK || !strings.Contains(r.body, "fallback") {
			t.Fatalf("HTTP %d %v: %s", r.status, r.err, r.body)
		}
	}
	s, raw := p.poolStatus()
	u := s.upstream("up")
	if u.FailStreak != 1 || u.CoolingSeconds <= 25 || u.CoolingSeconds > 30 {
		t.Errorf("upstream: fail_streak %d cooling %.1fs, want one failure and cooling until the first key is back (25, 30] s: %s",
			u.FailStreak, u.CoolingSeconds, raw)
	}
	if u.Inflight != 0 {
		t.Errorf("upstream inflight %d after every request ended", u.Inflight)
	}
	var c captured
	c.scan(t, p, keys...)
}
