package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// Explain, status and the CLI for router models: the rule a request would
// match, its effort and attributes, the weighted first model and the
// chain, checked against where real requests go.

// explainRuleJSON is the rule part of an explanation.
type explainRuleJSON struct {
	Model    string  `json:"model"`
	Choice   *string `json:"choice"`
	Outcome  string  `json:"outcome"`
	Upstream []struct {
		ID string `json:"id"`
	} `json:"upstreams"`
	Rule *struct {
		Name         string            `json:"name"`
		Priority     int               `json:"priority"`
		Effort       string            `json:"effort"`
		EffortSource string            `json:"effort_source"`
		Judge        string            `json:"judge"`
		Attributes   map[string]string `json:"attributes"`
		Unused       []string          `json:"unused_attributes"`
		Chain        []string          `json:"chain"`
		Weighted     *struct {
			First, By, Key string
		} `json:"weighted"`
		Shadow *struct {
			Model    string  `json:"model"`
			Fraction float64 `json:"fraction"`
		} `json:"shadow"`
		NotAllowed string `json:"not_allowed"`
		Candidates []struct {
			Name    string `json:"name"`
			Matched bool   `json:"matched"`
			Why     string `json:"why"`
		} `json:"candidates"`
	} `json:"rule"`
}

func (e explainRuleJSON) upstreams() string {
	var ids []string
	for _, u := range e.Upstream {
		ids = append(ids, u.ID)
	}
	return strings.Join(ids, " ")
}

// seedRules is the seed's example: a Spanish high-effort rule, a billing
// canary with a shadow, a low default and a catch-all; a weighted rule for
// Portuguese that anyone can reach (no key label needed).
var seedRules = []map[string]any{
	obj("name", "spanish-high", "priority", 30, "effort", "high", "match", obj("language", "es"), "use", []string{"gemini-pro", "gpt-4o"}),
	obj("name", "pt-canary", "priority", 26, "match", obj("language", "pt"), "use", []string{"gpt-4o-mini", "gpt-5-mini"}, "weights", []int{50, 50}),
	obj("name", "billing-canary", "priority", 25, "match", obj("team", "billing"), "use", []string{"gpt-4o-mini", "gpt-5-mini"},
		"weights", []int{90, 10}, "shadow", obj("model", "qwen-candidate", "fraction", 0.25)),
	obj("name", "low-default", "priority", 20, "effort", "low", "use", []string{"deepseek-chat", "gpt-4o-mini"}),
	obj("name", "anything-else", "priority", 1, "use", []string{"gpt-4o-mini"}),
}

var seedModels = []string{"gemini-pro", "gpt-4o", "gpt-4o-mini", "gpt-5-mini", "deepseek-chat", "qwen-candidate"}

// startSeedRules starts the seed's rules, with a judge; with keys, every
// request needs one.
func startSeedRules(t *testing.T, withKeys bool) *rulesSetup {
	if !withKeys {
		return startRules(t, seedModels, seedRules, "auto-extra", obj("judge", obj("model", "deepseek-chat")))
	}
	return startRules(t, seedModels, seedRules,
		"auto-extra", obj("judge", obj("model", "deepseek-chat")),
		"keys", []any{
			obj("id", "billing-svc", "secret", "sk-billing", "labels", obj("team", "billing")),
			obj("id", "narrow", "secret", "sk-narrow", "models", []string{"auto", "gpt-4o"}),
		})
}

// explainRule reads GET /llm_route/explain?query and decodes it.
func (s *rulesSetup) explainRule(t *testing.T, query string) explainRuleJSON {
	t.Helper()
	resp := s.p.adminGet("/llm_route/explain?" + query)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("explain %s: HTTP %d: %s", query, resp.StatusCode, body)
	}
	var e explainRuleJSON
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Rule == nil {
		t.Fatalf("explain %s: %v, no rule: %s", query, err, body)
	}
	return e
}

func TestRuleExplain(t *testing.T) {
	s := startSeedRules(t, true)
	for _, c := range []struct {
		query, rule, effort, source, judge, chain, choice string
	}{
		{"model=auto&effort=high&attr=language:es", "spanish-high", "high", "explain", "", "gemini-pro gpt-4o", "u-gemini-pro"},
		{"model=auto:high&attr=language=es", "spanish-high", "high", "suffix", "", "gemini-pro gpt-4o", "u-gemini-pro"},
		{"model=auto:low&effort=high&attr=language=es", "low-default", "low", "suffix", "", "deepseek-chat gpt-4o-mini", "u-deepseek-chat"},
		{"model=auto&effort=xhigh&attr=LANGUAGE=fr", "anything-else", "high", "explain", "", "gpt-4o-mini", "u-gpt-4o-mini"},
		{"model=auto&attr=language=es", "anything-else", "medium", "default", "not consulted", "gpt-4o-mini", "u-gpt-4o-mini"},
	} {
		e := s.explainRule(t, c.query)
		r := e.Rule
		if r.Name != c.rule || r.Effort != c.effort || r.EffortSource != c.source || r.Judge != c.judge ||
			strings.Join(r.Chain, " ") != c.chain || e.Choice == nil || *e.Choice != c.choice || e.Model != "auto" {
			t.Errorf("%s: rule %s, effort %s (%s), judge %q, chain %v, choice %v; want %s, %s (%s), judge %q, chain %s, choice %s",
				c.query, r.Name, r.Effort, r.EffortSource, r.Judge, r.Chain, e.Choice, c.rule, c.effort, c.source, c.judge, c.chain, c.choice)
		}
		// The upstreams walked are the chain's, not every model's.
		if want := "u-" + strings.ReplaceAll(c.chain, " ", " u-"); e.upstreams() != want {
			t.Errorf("%s: upstreams %s, want %s", c.query, e.upstreams(), want)
		}
	}
	// Why the others did not match.
	e := s.explainRule(t, "model=auto&effort=low&attr=language=pt")
	why := map[string]string{}
	for _, c := range e.Rule.Candidates {
		why[c.Name] = fmt.Sprint(c.Matched, " ", c.Why)
	}
	if e.Rule.Name != "pt-canary" || why["spanish-high"] != "false effort high" || why["pt-canary"] != "true " ||
		why["billing-canary"] != "false team absent" || why["low-default"] != "true " {
		t.Errorf("candidates %v, rule %s", why, e.Rule.Name)
	}
	if e := s.explainRule(t, "model=auto&effort=high&attr=language=fr"); len(e.Rule.Candidates) != 5 ||
		e.Rule.Candidates[0].Why != `language "fr" is not es` {
		t.Errorf("candidates %+v", e.Rule.Candidates)
	}

	// A POSTed body: its effort field and metadata, as a request's.
	resp, err := testClient.Post(s.p.admin+"/llm_route/explain", "application/json",
		strings.NewReader(`{"model":"auto","reasoning_effort":"high","metadata":{"language":"es"},"messages":[{"role":"user","content":"hola"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var posted explainRuleJSON
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(b), &posted) != nil || posted.Rule == nil ||
		posted.Rule.Name != "spanish-high" || posted.Rule.EffortSource != "field" || posted.Rule.Attributes["language"] != "es" {
		t.Errorf("POSTed body: %d %s", resp.StatusCode, b)
	}

	// An attribute no rule reads is named, and changes nothing.
	e = s.explainRule(t, "model=auto&effort=high&attr=langauge=es")
	if e.Rule.Name != "anything-else" || strings.Join(e.Rule.Unused, ",") != "langauge" || len(e.Rule.Attributes) != 0 {
		t.Errorf("unknown attribute: rule %s, unused %v, attributes %v", e.Rule.Name, e.Rule.Unused, e.Rule.Attributes)
	}

	// Bad input is a clear 400; a plain model takes no rule parameters.
	for q, code := range map[string]string{
		"model=auto&effort=extreme":        "invalid_effort",
		"model=auto&attr=language":         "invalid_attr",
		"model=auto&attr==es":              "invalid_attr",
		"model=auto&attr=team=billing":     "invalid_attr", // the key's label: only the router sets it
		"model=auto&attr=key=nobody":       "invalid_attr",
		"model=gpt-4o&effort=high":         "not_a_router_model",
		"model=gpt-4o&attr=language=es":    "not_a_router_model",
		"model=auto&effort=high&api=faxes": "invalid_api",
	} {
		expectAPIError(t, s.p.adminGet("/llm_route/explain?"+q), http.StatusBadRequest, code)
	}
	expectAPIError(t, s.p.adminGet("/llm_route/explain?model=auto:turbo"), http.StatusNotFound, "model_not_found")
	if msg := expectAPIError(t, s.p.adminGet("/llm_route/explain?model=auto&attr=team=billing"), http.StatusBadRequest, "invalid_attr"); !strings.Contains(msg, "attr=key=") {
		t.Errorf("owned attribute message %q", msg)
	}

	// A key whose models leave nothing of the chain: the 403 it would get.
	e = s.explainRule(t, "model=auto&effort=low&attr=key=narrow")
	if e.Outcome != "model_not_allowed" || e.Choice != nil || len(e.Rule.Chain) != 0 ||
		e.Rule.NotAllowed != `this API key may use no model of rule "low-default" of model "auto"` {
		t.Errorf("narrow key: outcome %s, choice %v, chain %v, not_allowed %q", e.Outcome, e.Choice, e.Rule.Chain, e.Rule.NotAllowed)
	}
	e = s.explainRule(t, "model=auto&effort=high&attr=key=narrow&attr=language=es")
	if e.Outcome != "upstream" || strings.Join(e.Rule.Chain, " ") != "gpt-4o" || e.upstreams() != "u-gpt-4o" {
		t.Errorf("narrow key, spanish: outcome %s, chain %v, upstreams %s", e.Outcome, e.Rule.Chain, e.upstreams())
	}

	// Explain counts nothing: only the real requests below are counted.
	if n := s.p.metric("llm_proxy_rule_requests_total", "effort", "high", "model", "auto", "rule", "spanish-high"); n != 0 {
		t.Errorf("explain counted %v requests", n)
	}
	for m, up := range s.ups {
		if n := len(up.Calls()); n != 0 {
			t.Errorf("explain reached %s %d times", m, n)
		}
	}
}

// TestRuleExplainWeighted: for a weighted rule, explain's first model for a
// user or a client key is the one real requests with the same user or key
// go to; the user is shown only as its hash.
func TestRuleExplainWeighted(t *testing.T) {
	s := startSeedRules(t, true)
	firsts := map[string]int{}
	for i := range 60 {
		user := fmt.Sprintf("u-%d", i)
		e := s.explainRule(t, "model=auto&attr=key=billing-svc&attr=user="+user)
		w := e.Rule.Weighted
		if e.Rule.Name != "billing-canary" || w == nil || w.By != "user" || len(w.Key) != 8 || e.Rule.Attributes["team"] != "billing" {
			t.Fatalf("%s: rule %s, weighted %+v, attributes %v", user, e.Rule.Name, w, e.Rule.Attributes)
		}
		if e.Rule.Chain[0] != w.First || e.Choice == nil || *e.Choice != "u-"+w.First {
			t.Fatalf("%s: chain %v, choice %v, first %s", user, e.Rule.Chain, e.Choice, w.First)
		}
		firsts[w.First]++
		resp := s.p.chat(fmt.Sprintf(`{"model":"auto","user":%q,"messages":[{"role":"user","content":"hi"}]}`, user),
			"Authorization", "Bearer sk-billing")
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get("X-LLM-Route-Upstream") != "u-"+w.First ||
			resp.Header.Get("X-LLM-Route-Rule") != "billing-canary" {
			t.Fatalf("%s: explain said %s, the request went to %s (%d %s)", user, w.First, resp.Header.Get("X-LLM-Route-Upstream"), resp.StatusCode, b)
		}
	}
	if firsts["gpt-4o-mini"] == 0 || firsts["gpt-5-mini"] == 0 {
		t.Errorf("60 users all on one model: %v", firsts)
	}
	// The key, without a user.
	e := s.explainRule(t, "model=auto&attr=key=billing-svc")
	resp := s.p.chat(chatBody("auto", false), "Authorization", "Bearer sk-billing")
	readAll(t, resp)
	if e.Rule.Weighted.By != "key" || resp.Header.Get("X-LLM-Route-Upstream") != "u-"+e.Rule.Weighted.First {
		t.Errorf("by key: explain %+v, request went to %s", e.Rule.Weighted, resp.Header.Get("X-LLM-Route-Upstream"))
	}
	if e := s.explainRule(t, "model=auto&attr=key=billing-svc&attr=user=u-1"); strings.Contains(fmt.Sprint(e.Rule.Weighted), "u-1") {
		t.Errorf("weighted shows the user: %+v", e.Rule.Weighted)
	}
}

// TestRuleExplainWeightedSession: a session, without user or key: both
// models are reached over 20 sessions, each where explain said; without
// any, explain says the choice is per request.
func TestRuleExplainWeightedSession(t *testing.T) {
	s := startSeedRules(t, false)
	seen := map[string]bool{}
	for i := range 20 {
		sess := fmt.Sprintf("sess-%d", i)
		e := s.explainRule(t, "model=auto&attr=language=pt&session="+url.QueryEscape(sess))
		resp := s.p.chat(chatBody("auto", false), "X-LLM-Attr-Language", "pt", "X-Session-Id", sess)
		readAll(t, resp)
		if e.Rule.Name != "pt-canary" || e.Rule.Weighted.By != "affinity" || resp.Header.Get("X-LLM-Route-Upstream") != "u-"+e.Rule.Weighted.First {
			t.Fatalf("%s: explain %s %+v, request went to %s", sess, e.Rule.Name, e.Rule.Weighted, resp.Header.Get("X-LLM-Route-Upstream"))
		}
		seen[e.Rule.Weighted.First] = true
	}
	if len(seen) != 2 {
		t.Errorf("20 sessions on %v", seen)
	}
	if e := s.explainRule(t, "model=auto&attr=language=pt"); e.Rule.Weighted.By != "none" || e.Rule.Weighted.First != "" {
		t.Errorf("nothing to stick to: %+v", e.Rule.Weighted)
	}
}

// TestCLIExplainRule: `caddy llm-route explain auto --effort high --attr
// language=es` prints the rule line before the table.
func TestCLIExplainRule(t *testing.T) {
	s := startSeedRules(t, true)
	addr := strings.TrimPrefix(s.p.admin, "http://")
	out, err := runCLI(t, "explain", "auto", "--address", addr, "--effort", "high", "--attr", "language=es")
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	for _, want := range []string{"rule spanish-high (priority 30), effort high (explain), chain gemini-pro → gpt-4o\n",
		"attributes: language=es\n", "1  u-gemini-pro", "a request for auto would go to u-gemini-pro"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}
	out, err = runCLI(t, "explain", "auto", "--address", addr, "--attr", "key=billing-svc", "--attr", "user=cli-secret-user", "--attr", "langauge=es")
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	for _, want := range []string{"rule billing-canary (priority 25), effort medium (default)", "attributes: team=billing user=cli-secret-user",
		"weighted: first model gpt-", " for user ", "attribute langauge: no rule of auto reads it",
		"judge not consulted: a request without an effort would ask it"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}
	out, err = runCLI(t, "explain", "auto:low", "--address", addr, "--attr", "key=narrow")
	if err != nil || !strings.Contains(out, `would get 403: this API key may use no model of rule "low-default" of model "auto"`) {
		t.Errorf("explain narrow key: %v\n%s", err, out)
	}
	_, err = runCLI(t, "explain", "auto", "--address", addr, "--effort", "extreme")
	if err == nil || !strings.HasPrefix(err.Error(), "effort must be low, medium or high") {
		t.Errorf("a bad effort: err = %v", err)
	}
	_, err = runCLI(t, "explain", "gpt-4o", "--address", addr, "--effort", "high")
	if err == nil || !strings.Contains(err.Error(), "has no rules") {
		t.Errorf("effort for a plain model: err = %v", err)
	}
}

// TestRuleStatus: the status JSON and page list a router model's rules
// with the requests each took.
func TestRuleStatus(t *testing.T) {
	s := startSeedRules(t, false)
	for range 3 {
		readAll(t, s.p.chat(chatBody("auto:high", false), "X-LLM-Attr-Language", "es"))
	}
	readAll(t, s.p.chat(chatBody("auto", false)))
	resp := s.p.adminGet("/llm_route/status")
	body := readAll(t, resp)
	var st struct {
		Models []struct {
			Name      string   `json:"name"`
			Upstreams []string `json:"upstreams"`
			Rules     []struct {
				Name     string         `json:"name"`
				Priority int            `json:"priority"`
				Effort   string         `json:"effort"`
				Match    map[string]any `json:"match"`
				Use      []string       `json:"use"`
				Weights  []int          `json:"weights"`
				Shadow   map[string]any `json:"shadow"`
				Requests int64          `json:"requests"`
			} `json:"rules"`
		} `json:"models"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range st.Models {
		if m.Name != "auto" {
			if m.Rules != nil {
				t.Errorf("plain model %s has rules", m.Name)
			}
			continue
		}
		for _, r := range m.Rules {
			got = append(got, fmt.Sprintf("%s/%d/%s/%v/%s/%v/%v/%d", r.Name, r.Priority, r.Effort, r.Match, strings.Join(r.Use, ">"), r.Weights, r.Shadow, r.Requests))
		}
	}
	want := []string{
		"spanish-high/30/high/map[language:es]/gemini-pro>gpt-4o/[]/map[]/3",
		"pt-canary/26//map[language:pt]/gpt-4o-mini>gpt-5-mini/[50 50]/map[]/0",
		"billing-canary/25//map[team:billing]/gpt-4o-mini>gpt-5-mini/[90 10]/map[fraction:0.25 model:qwen-candidate]/0",
		"low-default/20/low/map[]/deepseek-chat>gpt-4o-mini/[]/map[]/0",
		"anything-else/1//map[]/gpt-4o-mini/[]/map[]/1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rules in status:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	resp = s.p.adminGet("/llm_route/")
	page := readAll(t, resp)
	for _, want := range []string{`<tr data-model="auto" data-rule="billing-canary">`, `<td class="match">team=billing</td>`,
		`<td class="route">gpt-4o-mini → gpt-5-mini</td>`, `<td class="weights">90/10</td>`, `<td class="shadow">qwen-candidate 25 %</td>`,
		`<td class="effort">any</td>`, `<td class="requests">3</td>`} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %s", want)
		}
	}
	if strings.Contains(page, "no router models") {
		t.Error("the page says there are no router models")
	}
	// Without a router model the table says so, as the script does.
	up := s.ups["gpt-4o"]
	s.p.load(cfg([]map[string]any{obj("id", "p", "url", up.base())}, []map[string]any{obj("id", "u", "provider", "p", "model", "x")},
		[]map[string]any{obj("name", "plain", "upstreams", []string{"u"})}))
	if page := readAll(t, s.p.adminGet("/llm_route/")); !strings.Contains(page, `<tr class="empty"><td colspan="9">no router models</td></tr>`) ||
		strings.Contains(page, "data-rule=") {
		t.Errorf("page without router models:\n%s", page)
	}
}
