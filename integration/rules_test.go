package integration

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
)

// Router models: a model with rules instead of upstreams. Each plain model
// here has its own fake upstream, "u-<model>", so X-LLM-Route-Upstream
// names the model a request reached.

// rulesSetup starts a proxy with one chat-only fake upstream per plain
// model and the router model "auto" with rules; extra adds handler fields
// (and "auto-extra" adds fields to the router model).
type rulesSetup struct {
	p   *proxy
	ups map[string]*fakeUpstream
}

func startRules(t *testing.T, models []string, rules []map[string]any, extra ...any) *rulesSetup {
	t.Helper()
	s := &rulesSetup{ups: map[string]*fakeUpstream{}}
	var provs, ups, ms []map[string]any
	for _, m := range models {
		up := newUpstream(t, nil)
		s.ups[m] = up
		provs = append(provs, obj("id", "p-"+m, "url", up.base()))
		ups = append(ups, obj("id", "u-"+m, "provider", "p-"+m, "model", "real-"+m))
		ms = append(ms, obj("name", m, "upstreams", []string{"u-" + m}))
	}
	router := obj("name", "auto", "rules", rules)
	var handlerExtra []any
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i] == "auto-extra" {
			for k, v := range extra[i+1].(map[string]any) {
				router[k] = v
			}
			continue
		}
		handlerExtra = append(handlerExtra, extra[i], extra[i+1])
	}
	s.p = startProxy(t, cfg(provs, ups, append(ms, router), handlerExtra...))
	return s
}

// front is one client API: its path, a request body for model with the
// extra top-level members, and the marker of its stream's last event.
type ruleFront struct {
	name, path string
	body       func(model string, stream bool, extra string) string
	end        string
}

var ruleFronts = []ruleFront{
	{"chat", "/v1/chat/completions", func(m string, s bool, x string) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"stream":%v%s}`, m, s, x)
	}, "[DONE]"},
	{"messages", "/v1/messages", func(m string, s bool, x string) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":64,"messages":[{"role":"user","content":"hi"}],"stream":%v%s}`, m, s, x)
	}, `"type":"message_stop"`},
	{"responses", "/v1/responses", func(m string, s bool, x string) string {
		return fmt.Sprintf(`{"model":%q,"input":"hi","stream":%v%s}`, m, s, x)
	}, `"type":"response.completed"`},
}

// send posts body to the front and checks the answer is whole: a 200
// and, for a stream, its last event. It returns the response (body read).
func (s *rulesSetup) send(t *testing.T, f ruleFront, stream bool, body string, hdr ...string) *http.Response {
	t.Helper()
	resp := s.p.do(http.MethodPost, f.path, body, append([]string{"Content-Type", "application/json"}, hdr...)...)
	if !stream {
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", f.name, resp.StatusCode, b)
		}
		return resp
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s stream: status %d: %s", f.name, resp.StatusCode, readAll(t, resp))
	}
	data := readSSE(t, resp.Body)
	if len(data) == 0 || !strings.Contains(data[len(data)-1], f.end) {
		t.Fatalf("%s stream incomplete: %q", f.name, data)
	}
	return resp
}

// expectRoute checks the rule, effort header and the model reached.
func expectRoute(t *testing.T, resp *http.Response, rule, effort, model string) {
	t.Helper()
	if got := resp.Header.Get("X-LLM-Route-Rule"); got != rule {
		t.Errorf("X-LLM-Route-Rule = %q, want %q", got, rule)
	}
	if got := resp.Header.Get("X-LLM-Route-Effort"); got != effort {
		t.Errorf("X-LLM-Route-Effort = %q, want %q", got, effort)
	}
	if got := resp.Header.Get("X-LLM-Route-Upstream"); got != "u-"+model {
		t.Errorf("X-LLM-Route-Upstream = %q, want u-%s", got, model)
	}
}

// effortRules: one catch-all rule per effort, each to its own model.
var effortRules = []map[string]any{
	obj("name", "r-low", "effort", "low", "use", []string{"m-low"}),
	obj("name", "r-medium", "effort", "medium", "use", []string{"m-medium"}),
	obj("name", "r-high", "effort", "high", "use", []string{"m-high"}),
}

// TestRuleEffortSources: each front's own effort field, and its absence,
// picks the rule of that effort, streamed or not; the effort header names
// the source, and the completion log carries the rule, effort and model.
func TestRuleEffortSources(t *testing.T) {
	s := startRules(t, []string{"m-low", "m-medium", "m-high"}, effortRules)
	cases := map[string][]struct {
		extra, effort, source string
	}{
		"chat": {
			{`,"reasoning_effort":"low"`, "low", "field"},
			{`,"reasoning_effort":"minimal"`, "low", "field"},
			{`,"reasoning_effort":"none"`, "low", "field"},
			{`,"reasoning_effort":"medium"`, "medium", "field"},
			{`,"reasoning_effort":"high"`, "high", "field"},
			{`,"reasoning_effort":"xhigh"`, "high", "field"},
			{`,"reasoning_effort":"extreme"`, "medium", "default"},
			{``, "medium", "default"},
		},
		"responses": {
			{`,"reasoning":{"effort":"high"}`, "high", "field"},
			{`,"reasoning":{"effort":"minimal","summary":"auto"}`, "low", "field"},
			{`,"reasoning":{"summary":"auto"}`, "medium", "default"},
			{``, "medium", "default"},
		},
		"messages": {
			{`,"output_config":{"effort":"high"}`, "high", "field"},
			{`,"output_config":{"effort":"low"}`, "low", "field"},
			{`,"thinking":{"type":"enabled","budget_tokens":1024}`, "low", "field"},
			{`,"thinking":{"type":"enabled","budget_tokens":4096}`, "medium", "field"},
			{`,"thinking":{"type":"enabled","budget_tokens":16383}`, "medium", "field"},
			{`,"thinking":{"type":"enabled","budget_tokens":16384}`, "high", "field"},
			{`,"thinking":{"type":"disabled"}`, "medium", "default"},
			{``, "medium", "default"},
		},
	}
	for _, f := range ruleFronts {
		for _, stream := range []bool{false, true} {
			for _, c := range cases[f.name] {
				t.Run(fmt.Sprintf("%s/stream=%v/%s", f.name, stream, c.extra), func(t *testing.T) {
					resp := s.send(t, f, stream, f.body("auto", stream, c.extra))
					expectRoute(t, resp, "r-"+c.effort, c.effort+" ("+c.source+")", "m-"+c.effort)
				})
			}
		}
	}
	logs := s.p.logEntries("request completed")
	if len(logs) == 0 {
		t.Fatal("no completion log")
	}
	last := logs[len(logs)-1] // responses, streamed, no field
	if last["model"] != "auto" || last["rule"] != "r-medium" || last["effort"] != "medium (default)" || last["chain_model"] != "m-medium" {
		t.Errorf("completion log: model %v rule %v effort %v chain_model %v", last["model"], last["rule"], last["effort"], last["chain_model"])
	}
	// The chain's attempts count under the model that served them.
	if n := s.p.requests("m-high", "u-m-high", "p-m-high", "ok"); n == 0 {
		t.Errorf("llm_proxy_requests_total for m-high = %v", n)
	}
	if n := s.p.metric("llm_proxy_rule_requests_total", "effort", "high", "model", "auto", "rule", "r-high"); n != 2*(2+1+2) {
		t.Errorf("llm_proxy_rule_requests_total{rule=r-high} = %v, want 10", n)
	}
}

// TestRuleSuffixWinsOverField: `auto:low` pins low on every front, whatever
// the body asks; an unknown suffix is an unknown model; a plain model whose
// name has a colon is served as itself.
func TestRuleSuffixWinsOverField(t *testing.T) {
	s := startRules(t, []string{"m-low", "m-medium", "m-high", "qwen3:8b"}, effortRules)
	fields := map[string]string{"chat": `,"reasoning_effort":"high"`, "responses": `,"reasoning":{"effort":"high"}`,
		"messages": `,"output_config":{"effort":"high"}`}
	for _, f := range ruleFronts {
		for _, stream := range []bool{false, true} {
			resp := s.send(t, f, stream, f.body("auto:low", stream, fields[f.name]))
			expectRoute(t, resp, "r-low", "low (suffix)", "m-low")
			resp = s.send(t, f, stream, f.body("auto:high", stream, ""))
			expectRoute(t, resp, "r-high", "high (suffix)", "m-high")
		}
	}
	expectAPIError(t, s.p.chat(chatBody("auto:turbo", false)), http.StatusNotFound, "model_not_found")
	expectAPIError(t, s.p.chat(chatBody("m-low:high", false)), http.StatusNotFound, "model_not_found")
	resp := s.p.chat(chatBody("qwen3:8b", false))
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get("X-LLM-Route-Upstream") != "u-qwen3:8b" ||
		resp.Header.Get("X-LLM-Route-Rule") != "" {
		t.Fatalf("plain model qwen3:8b: %d %s, headers %v", resp.StatusCode, b, resp.Header)
	}
}

// TestRuleRouterSetAttributesCannotBeForged: the key's labels and its id
// are the router's: a client's X-LLM-Attr-Team or metadata.team cannot
// override the key's team label, a key without that label cannot set it
// either (the name is the router's), and X-LLM-Attr-Key is ignored.
func TestRuleRouterSetAttributesCannotBeForged(t *testing.T) {
	rules := []map[string]any{
		obj("name", "pay", "priority", 50, "match", obj("team", "payments"), "use", []string{"m-pay"}),
		obj("name", "bill", "priority", 40, "match", obj("team", "billing"), "use", []string{"m-bill"}),
		obj("name", "other-key", "priority", 30, "match", obj("key", "other"), "use", []string{"m-other"}),
		obj("name", "any", "use", []string{"m-any"}),
	}
	keys := []any{
		obj("id", "billing-svc", "secret", "sk-billing", "labels", obj("team", "billing")),
		obj("id", "plain", "secret", "sk-plain"),
		obj("id", "other", "secret", "sk-other"),
	}
	s := startRules(t, []string{"m-pay", "m-bill", "m-other", "m-any"}, rules, "keys", keys)
	chat := ruleFronts[0]
	forged := `,"metadata":{"team":"payments","key":"other"}`
	resp := s.send(t, chat, false, chat.body("auto", false, forged), "Authorization", "Bearer sk-billing",
		"X-LLM-Attr-Team", "payments", "X-LLM-Attr-Key", "other")
	expectRoute(t, resp, "bill", "medium (default)", "m-bill")

	resp = s.send(t, chat, false, chat.body("auto", false, `,"metadata":{"team":"billing"}`), "Authorization", "Bearer sk-plain",
		"X-LLM-Attr-Team", "billing", "X-LLM-Attr-Key", "other")
	expectRoute(t, resp, "any", "medium (default)", "m-any")

	// The positive control: the key's own id matches.
	resp = s.send(t, chat, false, chat.body("auto", false, ""), "Authorization", "Bearer sk-other")
	expectRoute(t, resp, "other-key", "medium (default)", "m-other")

	// Messages: the same through metadata.
	msgs := ruleFronts[1]
	resp = s.send(t, msgs, true, msgs.body("auto", true, forged), "Authorization", "Bearer sk-billing", "X-LLM-Attr-Team", "payments")
	expectRoute(t, resp, "bill", "medium (default)", "m-bill")
}

// TestRuleMatching: attributes from metadata, user and X-LLM-Attr-*
// headers (a header overrides the body), a list of values, a rule with two
// attributes needs both, priorities and ties, and the catch-all.
func TestRuleMatching(t *testing.T) {
	rules := []map[string]any{
		obj("name", "es", "priority", 10, "match", obj("language", []string{"es", "pt"}), "use", []string{"m-es"}),
		obj("name", "es-code", "priority", 20, "match", obj("language", "es", "task", "code"), "use", []string{"m-code"}),
		obj("name", "tie-a", "priority", 5, "match", obj("team", "x"), "use", []string{"m-a"}),
		obj("name", "tie-b", "priority", 5, "match", obj("team", "x"), "use", []string{"m-b"}),
		obj("name", "vip", "priority", 30, "match", obj("user", "u-7"), "use", []string{"m-vip"}),
		obj("name", "anything-else", "priority", 1, "use", []string{"m-any"}),
	}
	s := startRules(t, []string{"m-es", "m-code", "m-a", "m-b", "m-vip", "m-any"}, rules)
	chat, msgs, resps := ruleFronts[0], ruleFronts[1], ruleFronts[2]
	for _, c := range []struct {
		name  string
		f     ruleFront
		extra string
		hdr   []string
		rule  string
		model string
	}{
		{"metadata", chat, `,"metadata":{"language":"es"}`, nil, "es", "m-es"},
		{"list value", chat, `,"metadata":{"language":"pt"}`, nil, "es", "m-es"},
		{"no match", chat, `,"metadata":{"language":"fr"}`, nil, "anything-else", "m-any"},
		{"header", chat, ``, []string{"X-LLM-Attr-Language", "pt"}, "es", "m-es"},
		{"header overrides metadata", resps, `,"metadata":{"language":"fr"}`, []string{"X-LLM-Attr-Language", "es"}, "es", "m-es"},
		{"two attributes", chat, `,"metadata":{"language":"es"}`, []string{"X-LLM-Attr-Task", "code"}, "es-code", "m-code"},
		{"one of two", chat, `,"metadata":{"task":"code"}`, nil, "anything-else", "m-any"},
		{"tie: first listed", chat, `,"metadata":{"team":"x"}`, nil, "tie-a", "m-a"},
		{"escaped value", chat, `,"metadata":{"language":"\u0065s"}`, nil, "es", "m-es"},
		{"non-string value", chat, `,"metadata":{"language":["es"]}`, nil, "anything-else", "m-any"},
		{"chat user", chat, `,"user":"u-7"`, nil, "vip", "m-vip"},
		{"responses user", resps, `,"user":"u-7"`, nil, "vip", "m-vip"},
		{"messages user_id", msgs, `,"metadata":{"user_id":"u-7"}`, nil, "vip", "m-vip"},
		{"user header", chat, `,"user":"u-8"`, []string{"X-LLM-Attr-User", "u-7"}, "vip", "m-vip"},
		{"nothing: catch-all", chat, ``, nil, "anything-else", "m-any"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := s.send(t, c.f, false, c.f.body("auto", false, c.extra), c.hdr...)
			expectRoute(t, resp, c.rule, "medium (default)", c.model)
		})
	}
	if n := s.p.metric("llm_proxy_rule_requests_total", "effort", "medium", "model", "auto", "rule", "anything-else"); n != 4 {
		t.Errorf(`llm_proxy_rule_requests_total{rule="anything-else",effort="medium"} = %v, want 4`, n)
	}
	// Every effort a rule can take has its series from the start.
	if _, ok := s.p.metricValue(`llm_proxy_rule_requests_total{effort="high",model="auto",rule="tie-b"}`); !ok {
		t.Error("no series for an unused rule")
	}
}

// canaryRules: 90 % of users first to m-a, 10 % to m-b, each with the
// other as its fallback.
var canaryRules = []map[string]any{
	obj("name", "canary", "use", []string{"m-a", "m-b"}, "weights", []int{90, 10}),
}

// TestRuleWeightsSplit: [90, 10] over 2,000 distinct users sends 10 % of
// them to the second model first. The choice is a hash of the user name,
// so the count is fixed; the tolerance is what a fair 10 % coin would
// meet 99.99 % of the time (4 standard deviations: sqrt(2000·0.1·0.9) ≈
// 13.4, so 200 ± 54).
func TestRuleWeightsSplit(t *testing.T) {
	s := startRules(t, []string{"m-a", "m-b"}, canaryRules)
	const users = 2000
	for i := range users {
		resp := s.p.chat(fmt.Sprintf(`{"model":"auto","user":"u-%d","messages":[{"role":"user","content":"hi"}]}`, i))
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get("X-LLM-Route-Rule") != "canary" {
			t.Fatalf("user %d: %d %s", i, resp.StatusCode, b)
		}
	}
	a, b := len(s.ups["m-a"].Calls()), len(s.ups["m-b"].Calls())
	if a+b != users {
		t.Fatalf("calls %d + %d, want %d", a, b, users)
	}
	tol := 4 * math.Sqrt(users*0.1*0.9)
	if math.Abs(float64(b)-users*0.1) > tol {
		t.Fatalf("canary got %d of %d users, want %d ± %.0f", b, users, users/10, tol)
	}
	t.Logf("canary: %d of %d users (%.1f %%)", b, users, 100*float64(b)/users)
}

// TestRuleWeightsSticky: each user always reaches the same model, and so
// does a client key without a user, and a session without either.
func TestRuleWeightsSticky(t *testing.T) {
	s := startRules(t, []string{"m-a", "m-b"}, canaryRules,
		"keys", []any{obj("id", "k1", "secret", "sk-1"), obj("id", "k2", "secret", "sk-2"), obj("id", "k3", "secret", "sk-3")})
	first := map[string]string{}
	check := func(who, body string, hdr ...string) {
		t.Helper()
		resp := s.p.chat(body, hdr...)
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", who, resp.StatusCode, b)
		}
		got := resp.Header.Get("X-LLM-Route-Upstream")
		if f, ok := first[who]; ok && f != got {
			t.Fatalf("%s went to %s, then to %s", who, f, got)
		}
		first[who] = got
	}
	seen := map[string]bool{}
	for round := 0; round < 20; round++ {
		for u := 0; u < 50; u++ {
			check(fmt.Sprintf("user u-%d", u), fmt.Sprintf(`{"model":"auto","user":"u-%d","messages":[{"role":"user","content":"hi"}]}`, u),
				"Authorization", "Bearer sk-1")
		}
		for k := 1; k <= 3; k++ {
			check(fmt.Sprintf("key k%d", k), chatBody("auto", false), "Authorization", fmt.Sprintf("Bearer sk-%d", k))
		}
		for sess := 0; sess < 5; sess++ {
			check(fmt.Sprintf("session %d", sess), chatBody("auto", false), "Authorization", "Bearer sk-1",
				"X-Session-Id", fmt.Sprintf("s-%d", sess), "X-LLM-Attr-Ignored", "x")
		}
	}
	for _, v := range first {
		seen[v] = true
	}
	if !seen["u-m-a"] || !seen["u-m-b"] {
		t.Fatalf("50 users all on one model: %v", first)
	}
}

// TestRuleWeightsFallback: when a user's first model fails, the rest of
// use serves the request, under the same rule.
func TestRuleWeightsFallback(t *testing.T) {
	s := startRules(t, []string{"m-a", "m-b"}, canaryRules)
	// Find a user of each model while both work.
	users := map[string]string{}
	for i := 0; len(users) < 2 && i < 1000; i++ {
		resp := s.p.chat(fmt.Sprintf(`{"model":"auto","user":"u-%d","messages":[{"role":"user","content":"hi"}]}`, i))
		readAll(t, resp)
		users[resp.Header.Get("X-LLM-Route-Upstream")] = fmt.Sprintf("u-%d", i)
	}
	for failing, other := range map[string]string{"m-a": "m-b", "m-b": "m-a"} {
		s.ups[failing].setHandler(status(http.StatusServiceUnavailable))
		s.ups[other].setHandler(nil)
		resp := s.p.chat(fmt.Sprintf(`{"model":"auto","user":%q,"messages":[{"role":"user","content":"hi"}]}`, users["u-"+failing]))
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s failing: %d %s", failing, resp.StatusCode, b)
		}
		if got := resp.Header.Get("X-LLM-Route-Upstream"); got != "u-"+other {
			t.Errorf("%s failing: served by %s, want u-%s", failing, got, other)
		}
		if got := resp.Header.Get("X-LLM-Route-Attempts"); got != "2" {
			t.Errorf("%s failing: attempts %q, want 2", failing, got)
		}
		if got := resp.Header.Get("X-LLM-Route-Rule"); got != "canary" {
			t.Errorf("%s failing: rule %q", failing, got)
		}
	}
}

// TestRuleConfigErrors: a router model's mistakes are refused at load,
// naming the model and the rule.
func TestRuleConfigErrors(t *testing.T) {
	s := startRules(t, []string{"m-a", "m-b"}, canaryRules)
	base := func(rules []map[string]any, extra ...any) map[string]any {
		up := s.ups["m-a"]
		return cfg([]map[string]any{obj("id", "p", "url", up.base())},
			[]map[string]any{obj("id", "u", "provider", "p", "model", "x")},
			[]map[string]any{obj("name", "a", "upstreams", []string{"u"}), obj("name", "b", "upstreams", []string{"u"}),
				obj("name", "auto", "rules", rules)}, extra...)
	}
	catchAll := obj("name", "any", "use", []string{"a"})
	for _, c := range []struct {
		name string
		h    map[string]any
		want string
	}{
		{"unknown model", base([]map[string]any{catchAll, obj("name", "x", "use", []string{"gemini-pro"})}), `model "auto": rule "x": use: unknown model "gemini-pro"`},
		{"weights", base([]map[string]any{obj("name", "x", "use", []string{"a", "b"}, "weights", []int{1})}), `model "auto": rule "x": weights: want one per model in use (2), got 1`},
		{"no catch-all", base([]map[string]any{obj("name", "x", "effort", "low", "use", []string{"a"})}),
			`model "auto": no rule without match covers effort medium: a medium request could match no rule`},
		{"label key", base([]map[string]any{catchAll}, "keys", []any{obj("id", "k", "secret", "s", "labels", obj("key", "x"))}), `key "k": labels: "key" is set by the router`},
		{"label case", base([]map[string]any{catchAll}, "keys", []any{obj("id", "k", "secret", "s", "labels", obj("Team", "x"))}), `key "k": labels: name "Team" must be lower-case`},
		{"judge without chat", func() map[string]any {
			h := base([]map[string]any{catchAll})
			h["providers"] = []map[string]any{obj("id", "p", "url", s.ups["m-a"].base()), obj("id", "pe", "url", s.ups["m-a"].base(), "apis", []string{"embeddings"})}
			h["upstreams"] = []map[string]any{obj("id", "u", "provider", "p", "model", "x"), obj("id", "ue", "provider", "pe", "model", "e")}
			h["models"] = append(h["models"].([]map[string]any), obj("name", "clf", "upstreams", []string{"ue"}))
			h["models"].([]map[string]any)[2]["judge"] = obj("model", "clf")
			return h
		}(), `model "auto": judge: model "clf" has no upstream that serves chat`},
		{"match type", base([]map[string]any{obj("name", "x", "use", []string{"a"}, "match", obj("team", 3))}), `want a string or a list of strings`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := s.p.loadErr(c.h)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("load error %v\nwant it to contain %s", err, c.want)
			}
		})
	}
}

// TestRuleSeriesFollowTheLoadedConfig: a reload that removes a rule drops
// its llm_proxy_rule_requests_total series; the kept rule's stay.
func TestRuleSeriesFollowTheLoadedConfig(t *testing.T) {
	up := newUpstream(t, nil)
	conf := func(rules ...map[string]any) map[string]any {
		return cfg([]map[string]any{obj("id", "p", "url", up.base())},
			[]map[string]any{obj("id", "u", "provider", "p", "model", "x")},
			[]map[string]any{obj("name", "a", "upstreams", []string{"u"}), obj("name", "auto", "rules", rules)})
	}
	keep := obj("name", "keep", "use", []string{"a"})
	gone := obj("name", "gone", "priority", 5, "match", obj("team", "x"), "use", []string{"a"})
	p := startProxy(t, conf(keep, gone))
	resp := p.chat(chatBody("auto", false), "X-LLM-Attr-Team", "x")
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get("X-LLM-Route-Rule") != "gone" {
		t.Fatalf("%d %s %v", resp.StatusCode, b, resp.Header)
	}
	if n := p.metric("llm_proxy_rule_requests_total", "effort", "medium", "model", "auto", "rule", "gone"); n != 1 {
		t.Fatalf("rule gone counted %v", n)
	}
	p.load(conf(keep))
	text := scrape(t, p)
	if stale := seriesLines(text, `rule="gone"`); len(stale) > 0 {
		t.Errorf("series of a removed rule remain:\n%s", strings.Join(stale, "\n"))
	}
	if len(seriesLines(text, `rule="keep"`)) != 3 {
		t.Errorf("the kept rule's series (one per effort) are not all there:\n%s", strings.Join(seriesLines(text, "rule_requests"), "\n"))
	}
}

// TestRuleChainKeyFiltered: a key's models list filters a router model's
// chains: a model it may not use is never reached (the next one serves),
// a chain with no model left is a 403, and GET /v1/models with a key lists
// only the router models it may use, never a suffixed name.
func TestRuleChainKeyFiltered(t *testing.T) {
	rules := []map[string]any{
		obj("name", "only-a", "priority", 5, "match", obj("team", "x"), "use", []string{"m-a"}),
		obj("name", "canary", "use", []string{"m-a", "m-b"}, "weights", []int{50, 50}),
	}
	keys := []any{
		obj("id", "limited", "secret", "sk-limited", "models", []string{"auto", "m-b"}),
		obj("id", "plain-only", "secret", "sk-plain", "models", []string{"m-*"}),
	}
	s := startRules(t, []string{"m-a", "m-b"}, rules, "keys", keys)
	for i := 0; i < 40; i++ {
		resp := s.p.chat(fmt.Sprintf(`{"model":"auto","user":"u-%d","messages":[{"role":"user","content":"hi"}]}`, i),
			"Authorization", "Bearer sk-limited")
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get("X-LLM-Route-Upstream") != "u-m-b" {
			t.Fatalf("user %d: %d %s, upstream %q", i, resp.StatusCode, b, resp.Header.Get("X-LLM-Route-Upstream"))
		}
	}
	if n := len(s.ups["m-a"].Calls()); n != 0 {
		t.Fatalf("the key reached m-a %d times", n)
	}
	msg := expectAPIError(t, s.p.chat(chatBody("auto", false), "Authorization", "Bearer sk-limited", "X-LLM-Attr-Team", "x"),
		http.StatusForbidden, "model_not_allowed")
	if msg != `this API key may use no model of rule "only-a" of model "auto"` {
		t.Errorf("message %q", msg)
	}
	expectAPIError(t, s.p.chat(chatBody("auto:high", false), "Authorization", "Bearer sk-plain"), http.StatusForbidden, "model_not_allowed")

	list := func(secret string) string {
		resp := s.p.do(http.MethodGet, "/v1/models", "", "Authorization", "Bearer "+secret)
		return readAll(t, resp)
	}
	if l := list("sk-limited"); !strings.Contains(l, `"id":"auto"`) || strings.Contains(l, `"m-a"`) || strings.Contains(l, "auto:") {
		t.Errorf("limited key's model list %s", l)
	}
	if l := list("sk-plain"); strings.Contains(l, `"auto"`) || !strings.Contains(l, `"m-a"`) {
		t.Errorf("plain-only key's model list %s", l)
	}
}

// TestRuleCountTokens: Claude Code asks count_tokens with the model name it
// sends its messages with, suffix included: a router model answers it.
func TestRuleCountTokens(t *testing.T) {
	s := startRules(t, []string{"m-low", "m-medium", "m-high"}, effortRules)
	for _, model := range []string{"auto", "auto:high"} {
		resp := s.p.do(http.MethodPost, "/v1/messages/count_tokens",
			fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello there"}]}`, model), "Content-Type", "application/json")
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(b, `"input_tokens"`) {
			t.Errorf("%s: %d %s", model, resp.StatusCode, b)
		}
	}
}

// TestRuleRefusalLog: when every model of the chain fails, the refusal's
// log line names the rule, and the answer carries the rule headers.
func TestRuleRefusalLog(t *testing.T) {
	s := startRules(t, []string{"m-low", "m-medium", "m-high"}, effortRules)
	s.ups["m-high"].setHandler(status(http.StatusInternalServerError))
	resp := s.p.chat(chatBody("auto:high", false))
	expectAPIError(t, resp, http.StatusServiceUnavailable, "all_upstreams_failed")
	if resp.Header.Get("X-LLM-Route-Rule") != "r-high" || resp.Header.Get("X-LLM-Route-Effort") != "high (suffix)" {
		t.Errorf("refusal headers %v", resp.Header)
	}
	var found bool
	for _, e := range s.p.logEntries("request refused") {
		found = found || e["model"] == "auto" && e["rule"] == "r-high"
	}
	if !found {
		t.Errorf("no refusal line with the rule: %v", s.p.logEntries("request refused"))
	}
}
