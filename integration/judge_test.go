package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// The judge (experimental): a router model's judge model guesses the
// effort of a request that pins none. Here "auto" routes each effort to
// its own model (m-low, m-medium, m-high) and asks the judge model "clf",
// whose fake upstream u-clf answers the judge's question as each test
// scripts (every call it sees is a judge question, unless a test sends a
// client request to clf itself).

type judgeSetup struct{ rulesSetup }

// startJudge starts the proxy: deadline is the judge's ("" for the
// default; tests that expect answers give a generous one, so that a loaded
// machine never makes an answer late), limits gives an upstream's max_concurrency
// (by model), extra adds handler fields. clf's provider has a backoff, so
// a judge failure that fed it would show.
func startJudge(t *testing.T, deadline string, limits map[string]int, extra ...any) *judgeSetup {
	t.Helper()
	s := &judgeSetup{rulesSetup{ups: map[string]*fakeUpstream{}}}
	var provs, ups, ms []map[string]any
	for _, m := range []string{"m-low", "m-medium", "m-high", "clf"} {
		up := newUpstream(t, nil)
		s.ups[m] = up
		p := obj("id", "p-"+m, "url", up.base())
		if m == "clf" {
			p["backoff"], p["probe_interval"] = "30s", "0s"
		}
		provs = append(provs, p)
		u := obj("id", "u-"+m, "provider", "p-"+m, "model", "real-"+m)
		if n := limits[m]; n > 0 {
			u["max_concurrency"] = n
		}
		ups = append(ups, u)
		ms = append(ms, obj("name", m, "upstreams", []string{"u-" + m}))
	}
	j := obj("model", "clf")
	if deadline != "" {
		j["deadline"] = deadline
	}
	ms = append(ms, obj("name", "auto", "rules", effortRules, "judge", j))
	s.p = startProxy(t, cfg(provs, ups, ms, extra...))
	return s
}

// judgeCount is llm_proxy_judge_total of auto for one result.
func (s *judgeSetup) judgeCount(result string) float64 {
	return s.p.metric("llm_proxy_judge_total", "model", "auto", "result", result)
}

// judgeAsked is the judge question the judge upstream saw: its body.
type judgeAsked struct {
	Model     string `json:"model"`
	Stream    bool   `json:"stream"`
	MaxTokens int    `json:"max_tokens"`
	Messages  []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
}

func (s *judgeSetup) asked(t *testing.T) []judgeAsked {
	t.Helper()
	var out []judgeAsked
	for _, c := range s.ups["clf"].Calls() {
		var q judgeAsked
		if err := json.Unmarshal(c.Body, &q); err != nil {
			t.Fatalf("judge request is not JSON: %v: %s", err, c.Body)
		}
		if !strings.HasSuffix(c.Path, "/chat/completions") {
			t.Errorf("judge request went to %s", c.Path)
		}
		out = append(out, q)
	}
	return out
}

// TestJudgeAnswerPicksRule: a request that pins no effort, on each front,
// streamed or not, asks the judge; its clean answer picks the rule (source
// judge). The question is the fixed one over the last user message with
// text, its first 4 KiB; case, surrounding white space, a final period and
// a leading think block are forgiven. The judge's tokens count under the
// judge model, and it is no client attempt.
func TestJudgeAnswerPicksRule(t *testing.T) {
	s := startJudge(t, "5s", nil)
	clf := s.ups["clf"]
	clf.setHandler(completion("high"))
	for _, f := range ruleFronts {
		for _, stream := range []bool{false, true} {
			resp := s.send(t, f, stream, f.body("auto", stream, ""))
			expectRoute(t, resp, "r-high", "high (judge)", "m-high")
		}
	}
	asked := s.asked(t)
	if len(asked) != 6 {
		t.Fatalf("judge asked %d times, want 6", len(asked))
	}
	for _, q := range asked {
		if q.Model != "real-clf" || q.Stream || q.MaxTokens <= 0 || len(q.Messages) != 2 ||
			q.Messages[0].Role != "system" || !strings.Contains(q.Messages[0].Content, "low, medium or high") ||
			q.Messages[1].Role != "user" || q.Messages[1].Content != "hi" {
			t.Fatalf("judge question: %+v", q)
		}
	}
	if n := s.judgeCount("high"); n != 6 {
		t.Errorf("llm_proxy_judge_total{result=high} = %v, want 6", n)
	}

	// The last user message with text, parts joined; a tool-result-only
	// turn is skipped.
	texts := []struct {
		f    ruleFront
		body string
		want string
	}{
		{ruleFronts[0], `{"model":"auto","messages":[{"role":"user","content":"first"},{"role":"assistant","content":"ok"},` +
			`{"role":"user","content":[{"type":"text","text":"second"},{"type":"image_url","image_url":{"url":"data:,"}},{"type":"text","text":"part \"q\""}]}]}`,
			"second\npart \"q\""},
		{ruleFronts[1], `{"model":"auto","max_tokens":64,"messages":[{"role":"user","content":[{"type":"text","text":"fix the bug"}]},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"read","input":{}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"file"}]}]}`,
			"fix the bug"},
		{ruleFronts[2], `{"model":"auto","input":[{"role":"user","content":[{"type":"input_text","text":"plan it"}]},` +
			`{"type":"function_call_output","call_id":"c1","output":"x"}]}`,
			"plan it"},
	}
	for _, c := range texts {
		before := len(clf.Calls())
		resp := s.send(t, c.f, false, c.body)
		expectRoute(t, resp, "r-high", "high (judge)", "m-high")
		asked = s.asked(t)
		if len(asked) != before+1 {
			t.Fatalf("%s: judge asked %d times, want %d", c.f.name, len(asked), before+1)
		}
		if got := asked[before].Messages[1].Content; got != c.want {
			t.Errorf("%s: judge got %q, want %q", c.f.name, got, c.want)
		}
	}
	// Gemini: the last user turn's text parts (the name carries no effort
	// here: the path's model is the router model itself).
	before := len(clf.Calls())
	resp := s.p.do(http.MethodPost, "/v1beta/models/auto:generateContent",
		`{"contents":[{"role":"user","parts":[{"text":"gem q"}]}]}`, "Content-Type", "application/json")
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("gemini: %d %s", resp.StatusCode, b)
	}
	expectRoute(t, resp, "r-high", "high (judge)", "m-high")
	if asked = s.asked(t); len(asked) != before+1 || asked[before].Messages[1].Content != "gem q" {
		t.Errorf("gemini: judge asked %d times (want %d), last %+v", len(asked), before+1, asked[len(asked)-1])
	}

	// A long message is cut to 4 KiB, whole characters only.
	long := strings.Repeat("é", 5000)
	resp = s.send(t, ruleFronts[0], false, fmt.Sprintf(`{"model":"auto","messages":[{"role":"user","content":%q}]}`, long))
	expectRoute(t, resp, "r-high", "high (judge)", "m-high")
	asked = s.asked(t)
	if got := asked[len(asked)-1].Messages[1].Content; len(got) > 4096 || len(got) < 4000 || !utf8.ValidString(got) || !strings.HasPrefix(long, got) {
		t.Errorf("long message: judge got %d bytes (valid UTF-8 %v)", len(got), utf8.ValidString(got))
	}

	// Forgiven: case, white space, a final period, a leading think block.
	for _, a := range []struct{ answer, effort string }{
		{"  High\n", "high"}, {"medium.", "medium"}, {"<think>short one</think>\nLOW", "low"},
	} {
		clf.setHandler(completion(a.answer))
		resp := s.send(t, ruleFronts[0], false, chatBody("auto", false))
		expectRoute(t, resp, "r-"+a.effort, a.effort+" (judge)", "m-"+a.effort)
	}

	calls := float64(len(clf.Calls()))
	if n := s.p.metric("llm_proxy_tokens_total", "model", "clf", "upstream", "u-clf", "provider", "p-clf", "type", "input"); n != 3*calls {
		t.Errorf("judge input tokens = %v, want %v (3 per question)", n, 3*calls)
	}
	if n := s.p.requests("clf", "u-clf", "p-clf", "ok"); n != 0 {
		t.Errorf("llm_proxy_requests_total for the judge = %v, want 0 (not a client attempt)", n)
	}
	if n := s.p.upstreamGauge("inflight", "u-clf", "p-clf"); n != 0 {
		t.Errorf("judge upstream inflight = %v after the answers, want 0", n)
	}
}

// TestJudgeUnclearAnswerIsMedium: an answer that is not one clean word, or
// a failing judge, leaves the request at medium (source default), and the
// request is served; a judge failure never cools the judge's upstream.
func TestJudgeUnclearAnswerIsMedium(t *testing.T) {
	s := startJudge(t, "5s", nil)
	clf := s.ups["clf"]
	notJSON := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("high"))
	}
	cases := []struct {
		name   string
		answer http.HandlerFunc
		result string
	}{
		{"very high", completion("very high"), "unparsable"},
		{"very hard", completion("very hard"), "unparsable"},
		{"json", completion(`{"effort":"high"}`), "unparsable"},
		{"sentence", completion("High. The request needs care."), "unparsable"},
		{"not json", notJSON, "unparsable"},
		{"500", status(http.StatusInternalServerError), "error"},
		{"429", status(http.StatusTooManyRequests, "Retry-After", "30"), "error"},
		{"400", status(http.StatusBadRequest), "error"},
	}
	want := map[string]float64{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clf.setHandler(c.answer)
			for _, f := range ruleFronts {
				resp := s.send(t, f, true, f.body("auto", true, ""))
				expectRoute(t, resp, "r-medium", "medium (default)", "m-medium")
				want[c.result]++
			}
		})
	}
	for _, r := range []string{"unparsable", "error"} {
		if n := s.judgeCount(r); n != want[r] {
			t.Errorf("llm_proxy_judge_total{result=%s} = %v, want %v", r, n, want[r])
		}
	}
	if n := len(clf.Calls()); n != 3*len(cases) {
		t.Errorf("judge asked %d times, want %d (once per request, never retried)", n, 3*len(cases))
	}
	// Its upstream is not cooling: clients of clf itself are served.
	if n := s.p.upstreamGauge("fail_streak", "u-clf", "p-clf"); n != 0 {
		t.Errorf("judge upstream fail_streak = %v, want 0", n)
	}
	if n := s.p.upstreamGauge("cooling_seconds", "u-clf", "p-clf"); n != 0 {
		t.Errorf("judge upstream cooling = %v s, want 0", n)
	}
	clf.setHandler(nil)
	resp := s.p.chat(chatBody("clf", false))
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get("X-LLM-Route-Upstream") != "u-clf" {
		t.Errorf("client request to clf after judge failures: %d %s", resp.StatusCode, b)
	}
}

// TestJudgeLateIsMedium: a judge that answers after its deadline, or
// never, leaves the request at medium (source default); the request is
// served, later by about the deadline at most, and the judge's request is
// cancelled and its slot freed.
func TestJudgeLateIsMedium(t *testing.T) {
	const deadline = 250 * time.Millisecond
	s := startJudge(t, deadline.String(), nil)
	clf := s.ups["clf"]
	slow := func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(300 * time.Millisecond):
			completion("high")(w, r)
		case <-r.Context().Done():
		}
	}
	release := make(chan struct{})
	defer close(release)
	n := 0
	for _, c := range []struct {
		name   string
		answer http.HandlerFunc
	}{{"after 300ms", slow}, {"hanging", hang(release)}} {
		clf.setHandler(c.answer)
		for _, f := range ruleFronts {
			for _, stream := range []bool{false, true} {
				// The client gives up well after the bound, so that a
				// request the judge holds fails here rather than hangs.
				ctx, cancel := context.WithTimeout(context.Background(), deadline+5*time.Second)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.p.URL+f.path, strings.NewReader(f.body("auto", stream, "")))
				req.Header.Set("Content-Type", "application/json")
				start := time.Now()
				resp, err := testClient.Do(req)
				if err != nil {
					cancel()
					t.Fatalf("%s %s stream=%v: no answer within %v: %v", c.name, f.name, stream, deadline+5*time.Second, err)
				}
				b := readAll(t, resp)
				took := time.Since(start)
				cancel()
				if resp.StatusCode != http.StatusOK || !strings.Contains(b, map[bool]string{false: `"usage"`, true: f.end}[stream]) {
					t.Fatalf("%s %s stream=%v: %d %s", c.name, f.name, stream, resp.StatusCode, b)
				}
				expectRoute(t, resp, "r-medium", "medium (default)", "m-medium")
				if took > deadline+2*time.Second {
					t.Errorf("%s %s stream=%v: request took %v with a %v judge deadline", c.name, f.name, stream, took, deadline)
				}
				n++
			}
		}
	}
	if got := s.judgeCount("late"); got != float64(n) {
		t.Errorf("llm_proxy_judge_total{result=late} = %v, want %d", got, n)
	}
	eventually(t, 5*time.Second, "judge requests cancelled and their slots freed", func() bool {
		return clf.inflight.Load() == 0 && s.p.upstreamGauge("inflight", "u-clf", "p-clf") == 0
	})
	if n := s.p.upstreamGauge("fail_streak", "u-clf", "p-clf"); n != 0 {
		t.Errorf("judge upstream fail_streak = %v after late answers, want 0", n)
	}
}

// TestJudgeNotAskedWhenEffortPinned: a name suffix or a body field gives
// the effort, and the judge is never asked; nor is it for a request
// without user text.
func TestJudgeNotAskedWhenEffortPinned(t *testing.T) {
	s := startJudge(t, "", nil)
	s.ups["clf"].setHandler(completion("high"))
	fields := map[string]string{"chat": `,"reasoning_effort":"low"`, "responses": `,"reasoning":{"effort":"low"}`,
		"messages": `,"thinking":{"type":"enabled","budget_tokens":1024}`}
	for _, f := range ruleFronts {
		for _, stream := range []bool{false, true} {
			expectRoute(t, s.send(t, f, stream, f.body("auto:low", stream, "")), "r-low", "low (suffix)", "m-low")
			expectRoute(t, s.send(t, f, stream, f.body("auto", stream, fields[f.name])), "r-low", "low (field)", "m-low")
		}
	}
	if n := len(s.ups["clf"].Calls()); n != 0 {
		t.Errorf("judge asked %d times for pinned requests, want 0", n)
	}
	// Every result's series exists from the start, at 0.
	for _, r := range []string{"low", "medium", "high", "late", "error", "unparsable", "busy", "empty", "cancelled"} {
		v, ok := s.p.metricValue(series("llm_proxy_judge_total", "model", "auto", "result", r))
		if !ok || v != 0 {
			t.Errorf("llm_proxy_judge_total{result=%s} = %v (present %v), want 0", r, v, ok)
		}
	}
	// No user text (an image only): nothing to judge, not asked.
	resp := s.send(t, ruleFronts[0], false, `{"model":"auto","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]}`)
	expectRoute(t, resp, "r-medium", "medium (default)", "m-medium")
	if n := len(s.ups["clf"].Calls()); n != 0 {
		t.Errorf("judge asked %d times for a request without text, want 0", n)
	}
	if n := s.judgeCount("empty"); n != 1 {
		t.Errorf("llm_proxy_judge_total{result=empty} = %v, want 1", n)
	}
}

// TestJudgeBusyIsNotWaitedFor: the judge takes a slot only when one is
// free at once and no client waits in a queue. With its upstream's one
// slot held by a client, or with a client queued (for another model), the
// request goes on at once at medium (source default), the judge not asked.
func TestJudgeBusyIsNotWaitedFor(t *testing.T) {
	s := startJudge(t, "5s", map[string]int{"clf": 1, "m-low": 1}, "queue_size", 4, "queue_timeout", "20s")
	clf := s.ups["clf"]
	held := newGate()
	defer held.open()
	clf.setHandler(held.handler(completion("client answer")))
	bg := s.p.goChat(context.Background(), chatBody("clf", false))
	held.waitArrivals(t, 1)

	start := time.Now()
	resp := s.send(t, ruleFronts[0], false, chatBody("auto", false))
	expectRoute(t, resp, "r-medium", "medium (default)", "m-medium")
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("request took %v with the judge's slot held (judge deadline 5s): it waited", took)
	}
	if n := len(clf.Calls()); n != 1 {
		t.Errorf("judge upstream saw %d requests, want 1 (the client's)", n)
	}
	if n := s.judgeCount("busy"); n != 1 {
		t.Errorf("llm_proxy_judge_total{result=busy} = %v, want 1", n)
	}
	held.open()
	if r := await(t, bg); r.status != http.StatusOK {
		t.Fatalf("client request to clf: %d %s", r.status, r.body)
	}

	// clf is free now, but a client waits in m-low's queue.
	lowGate := newGate()
	defer lowGate.open()
	s.ups["m-low"].setHandler(lowGate.handler(completion("low answer")))
	clf.setHandler(completion("high"))
	first := s.p.goChat(context.Background(), chatBody("m-low", false))
	lowGate.waitArrivals(t, 1)
	second := s.p.goChat(context.Background(), chatBody("m-low", false))
	eventually(t, 5*time.Second, "a client queued for m-low", func() bool {
		return s.p.metric("llm_proxy_queue_depth", "model", "m-low") == 1
	})
	resp = s.send(t, ruleFronts[0], false, chatBody("auto", false))
	expectRoute(t, resp, "r-medium", "medium (default)", "m-medium")
	if n := len(clf.Calls()); n != 1 {
		t.Errorf("judge asked while a client was queued (%d calls to its upstream, want 1)", n)
	}
	if n := s.judgeCount("busy"); n != 2 {
		t.Errorf("llm_proxy_judge_total{result=busy} = %v, want 2", n)
	}
	lowGate.open()
	for _, ch := range []<-chan result{first, second} {
		if r := await(t, ch); r.status != http.StatusOK {
			t.Errorf("queued m-low request: %d %s", r.status, r.body)
		}
	}
	// Nobody waits: the judge is asked again.
	resp = s.send(t, ruleFronts[0], false, chatBody("auto", false))
	expectRoute(t, resp, "r-high", "high (judge)", "m-high")
}

// TestJudgeAndClientKeys: a key that may use the router model gets the
// judge's answer even if it may not use the judge model itself (the judge
// is the router's, not the client's); a key that may not use the router
// model is refused without a question to the judge.
func TestJudgeAndClientKeys(t *testing.T) {
	keys := []any{
		obj("id", "auto-only", "secret", "sk-auto", "models", []string{"auto", "m-*"}), // not clf
		obj("id", "plain-only", "secret", "sk-plain", "models", []string{"m-*"}),
	}
	s := startJudge(t, "5s", nil, "keys", keys)
	clf := s.ups["clf"]
	clf.setHandler(completion("high"))
	resp := s.send(t, ruleFronts[0], false, chatBody("auto", false), "Authorization", "Bearer sk-auto")
	expectRoute(t, resp, "r-high", "high (judge)", "m-high")
	if n := len(clf.Calls()); n != 1 {
		t.Fatalf("judge asked %d times for a key that may use auto, want 1", n)
	}
	expectAPIError(t, s.p.chat(chatBody("auto", false), "Authorization", "Bearer sk-plain"), http.StatusForbidden, "model_not_allowed")
	if n := len(clf.Calls()); n != 1 {
		t.Errorf("judge asked for a key that may not use auto (%d calls, want 1)", n)
	}
}
