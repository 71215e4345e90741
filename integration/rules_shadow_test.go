package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Shadow traffic: a rule's shadow copies a share of its requests to a
// candidate model, on the side. Each test here has the router model
// "auto" whose rules use "m-main" and shadow to "m-cand"; every plain
// model has its own provider and fake upstream ("u-<model>").

// shadowSetup is a running proxy with one fake upstream per plain model.
type shadowSetup struct {
	p   *proxy
	ups map[string]*fakeUpstream
}

// shadowModel is one plain model of a shadow test: its upstream's
// behaviour and extra upstream fields, and extra model fields.
type shadowModel struct {
	name     string
	behave   http.HandlerFunc
	upstream map[string]any
	model    map[string]any
}

// shadowConfig builds the handler config: the plain models, the router
// model "auto" with rules, and extra handler fields.
func (s *shadowSetup) shadowConfig(t *testing.T, models []shadowModel, rules []map[string]any, extra ...any) map[string]any {
	t.Helper()
	var provs, ups, ms []map[string]any
	for _, m := range models {
		up := s.ups[m.name]
		if up == nil {
			up = newUpstream(t, m.behave)
			s.ups[m.name] = up
		}
		provs = append(provs, obj("id", "p-"+m.name, "url", up.base()))
		u := obj("id", "u-"+m.name, "provider", "p-"+m.name, "model", "real-"+m.name)
		for k, v := range m.upstream {
			u[k] = v
		}
		ups = append(ups, u)
		mo := obj("name", m.name, "upstreams", []string{"u-" + m.name})
		for k, v := range m.model {
			mo[k] = v
		}
		ms = append(ms, mo)
	}
	return cfg(provs, ups, append(ms, obj("name", "auto", "rules", rules)), extra...)
}

func startShadow(t *testing.T, models []shadowModel, rules []map[string]any, extra ...any) *shadowSetup {
	t.Helper()
	s := &shadowSetup{ups: map[string]*fakeUpstream{}}
	s.p = startProxy(t, s.shadowConfig(t, models, rules, extra...))
	return s
}

// shadowRule is a catch-all rule to m-main shadowed to m-cand.
func shadowRule(fraction float64) map[string]any {
	return obj("name", "all", "use", []string{"m-main"}, "shadow", obj("model", "m-cand", "fraction", fraction))
}

// shadowCount is llm_proxy_shadow_requests_total of m-cand for a result.
func (s *shadowSetup) shadowCount(result string) float64 {
	return s.p.metric("llm_proxy_shadow_requests_total", "model", "m-cand", "result", result)
}

// shadowTotal sums llm_proxy_shadow_requests_total of m-cand over results.
func (s *shadowSetup) shadowTotal() float64 {
	return s.sumSeries(`llm_proxy_shadow_requests_total{model="m-cand",`)
}

// sumSeries sums the samples whose line starts with prefix.
func (s *shadowSetup) sumSeries(prefix string) float64 {
	var sum float64
	for _, line := range strings.Split(s.p.metrics(), "\n") {
		if strings.HasPrefix(line, prefix) {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// answerWith is a completion with the given text and usage, streamed
// (with usage in the last chunk) when the request asks.
func answerWith(text string, in, out int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if isStream(r) {
			events := sseChunks(text)
			usage := fmt.Sprintf(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", in, out, in+out)
			events = append(events[:len(events)-1], usage, events[len(events)-1])
			writeStream(w, events, 0)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, text, in, out, in+out)
	}
}

// TestShadowFraction: fraction 0.25 over 400 requests sends exactly 100
// copies (the share is strided, not sampled), each once; the client's
// model gets all 400.
func TestShadowFraction(t *testing.T) {
	s := startShadow(t, []shadowModel{{name: "m-main"}, {name: "m-cand"}}, []map[string]any{shadowRule(0.25)})
	for i := 0; i < 400; i++ {
		resp := s.p.chat(chatBody("auto", false))
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, b)
		}
	}
	// The copies end on their own goroutines: wait for the hundredth.
	for end := time.Now().Add(10 * time.Second); s.shadowTotal() < 100 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if got, total := s.shadowCount("ok"), s.shadowTotal(); got != 100 || total != 100 {
		t.Errorf(`%v shadow copies counted (%v with result="ok"), want exactly 100 of 400`, total, got)
	}
	if got := len(s.ups["m-cand"].Calls()); got != 100 {
		t.Errorf("the shadow model's upstream got %d requests, want exactly 100 of 400", got)
	}
	if got := len(s.ups["m-main"].Calls()); got != 400 {
		t.Errorf("the client's model got %d requests, want 400", got)
	}
}

// TestShadowAnswerUnchanged: the client's answer, streamed or not, is
// byte for byte the same with and without a shadow, though the shadow
// answers something else; the shadow gets the client's request.
func TestShadowAnswerUnchanged(t *testing.T) {
	rules := []map[string]any{
		obj("name", "shadowed", "priority", 10, "match", obj("variant", "a"), "use", []string{"m-main"},
			"shadow", obj("model", "m-cand", "fraction", 1)),
		obj("name", "plain", "use", []string{"m-main"}),
	}
	s := startShadow(t, []shadowModel{{name: "m-main", behave: answerWith("the main answer", 3, 4)},
		{name: "m-cand", behave: answerWith("SHADOW ANSWER, never seen", 50, 60)}}, rules)
	const prompt = `{"model":"auto","messages":[{"role":"user","content":"compare me"}],"stream":%v}`
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(prompt, stream)
		with := s.p.chat(body, "X-LLM-Attr-Variant", "a")
		withBody := readAll(t, with)
		without := s.p.chat(body)
		withoutBody := readAll(t, without)
		if with.StatusCode != http.StatusOK || without.StatusCode != http.StatusOK {
			t.Fatalf("stream %v: status %d and %d", stream, with.StatusCode, without.StatusCode)
		}
		if got := with.Header.Get("X-LLM-Route-Rule"); got != "shadowed" {
			t.Fatalf("stream %v: rule %q, want shadowed", stream, got)
		}
		if withBody != withoutBody {
			t.Errorf("stream %v: the answer differs with a shadow:\nwith:    %q\nwithout: %q", stream, withBody, withoutBody)
		}
		if strings.Contains(withBody, "SHADOW") {
			t.Errorf("stream %v: the shadow's answer reached the client: %q", stream, withBody)
		}
		for _, h := range []string{"Content-Type", "X-Llm-Route-Upstream", "X-Llm-Route-Attempts", "Content-Length"} {
			if a, b := with.Header.Get(h), without.Header.Get(h); a != b {
				t.Errorf("stream %v: header %s = %q with a shadow, %q without", stream, h, a, b)
			}
		}
	}
	eventually(t, 10*time.Second, "both shadow copies counted", func() bool { return s.shadowTotal() >= 2 })
	calls := s.ups["m-cand"].Calls()
	if len(calls) != 2 {
		t.Fatalf("the shadow got %d requests, want 2 (the shadowed rule's only)", len(calls))
	}
	for _, c := range calls {
		if !strings.Contains(string(c.Body), `"compare me"`) || !strings.Contains(string(c.Body), `"model":"real-m-cand"`) {
			t.Errorf("the shadow's request is not the client's, for its model: %s", c.Body)
		}
	}
}

// TestShadowNeverDelays: with the shadow upstream holding every request
// for the whole test, every client answer (streamed or not) completes,
// and not one shadow copy has ended when it does. 16 copies run at once;
// the rest are dropped, and counted.
func TestShadowNeverDelays(t *testing.T) {
	g := newGate()
	s := startShadow(t, []shadowModel{{name: "m-main"}, {name: "m-cand", behave: g.handler(completion("late"))}},
		[]map[string]any{shadowRule(1)}, "request_timeout", "20s")
	t.Cleanup(g.open) // first: nothing is left waiting at the upstream
	for i := 0; i < 20; i++ {
		stream := i < 2
		resp := s.p.chat(chatBody("auto", stream))
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
		}
		if stream && !strings.Contains(body, "data: [DONE]") || !stream && !strings.Contains(body, `"hello"`) {
			t.Fatalf("request %d: incomplete answer: %q", i, body)
		}
		if i < 16 {
			g.waitArrivals(t, 1) // its copy is (or gets) held at the shadow
		}
		for _, res := range []string{"ok", "5xx", "timeout", "cancelled", "net_err"} {
			if n := s.shadowCount(res); n != 0 {
				t.Fatalf("request %d: a shadow copy ended (%s) before the client's answer came back: the client waited for it", i, res)
			}
		}
	}
	if got := s.shadowCount("dropped"); got != 4 {
		t.Errorf(`shadow result="dropped" = %v, want 4 (16 copies held, 20 requests)`, got)
	}
	if got := s.ups["m-cand"].inflight.Load(); got != 16 {
		t.Errorf("the shadow upstream holds %d requests, want 16", got)
	}
}

// TestShadowNeverQueues: a shadow takes a slot only if one is free at
// once and no client waits anywhere: with its upstream's one slot held by
// a client, or with a client queued on another model, the copy is not
// sent (busy), and a queued client still gets the slot that frees.
func TestShadowNeverQueues(t *testing.T) {
	candGate, slowGate := newGate(), newGate()
	t.Cleanup(candGate.open)
	t.Cleanup(slowGate.open)
	s := startShadow(t, []shadowModel{
		{name: "m-main"},
		{name: "m-cand", behave: candGate.handler(completion("cand")), upstream: obj("max_concurrency", 1),
			model: obj("queue_size", 4)},
		{name: "m-slow", behave: slowGate.handler(completion("slow")), upstream: obj("max_concurrency", 1),
			model: obj("queue_size", 4)},
	}, []map[string]any{shadowRule(1)})
	ctx := context.Background()

	// The shadow model's one slot is a client's; another client queues.
	holder := s.p.goChat(ctx, chatBody("m-cand", false))
	candGate.waitArrivals(t, 1)
	queued := s.p.goChat(ctx, chatBody("m-cand", false))
	eventually(t, 5*time.Second, "a client queued on m-cand", func() bool {
		return s.p.metric("llm_proxy_queue_depth", "model", "m-cand") == 1
	})
	resp := s.p.chat(chatBody("auto", false))
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	eventually(t, 5*time.Second, "the copy counted", func() bool { return s.shadowTotal() >= 1 })
	if got := s.shadowCount("busy"); got != 1 {
		t.Errorf(`shadow result="busy" = %v, want 1`, got)
	}
	candGate.open()
	for _, ch := range []<-chan result{holder, queued} {
		if r := await(t, ch); r.status != http.StatusOK {
			t.Fatalf("client of m-cand: status %d: %s", r.status, r.body)
		}
	}
	if got := len(s.ups["m-cand"].Calls()); got != 2 {
		t.Errorf("m-cand's upstream got %d requests, want 2 (its clients only)", got)
	}

	// A free slot on the shadow's upstream, but a client waits on another
	// model: the copy yields all the same.
	slowHolder := s.p.goChat(ctx, chatBody("m-slow", false))
	slowGate.waitArrivals(t, 1)
	slowQueued := s.p.goChat(ctx, chatBody("m-slow", false))
	eventually(t, 5*time.Second, "a client queued on m-slow", func() bool {
		return s.p.metric("llm_proxy_queue_depth", "model", "m-slow") == 1
	})
	resp = s.p.chat(chatBody("auto", false))
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	eventually(t, 5*time.Second, "the second copy counted", func() bool { return s.shadowTotal() >= 2 })
	if got := s.shadowCount("busy"); got != 2 {
		t.Errorf(`shadow result="busy" = %v, want 2: a copy took a free slot while a client was queued`, got)
	}
	if got := len(s.ups["m-cand"].Calls()); got != 2 {
		t.Errorf("m-cand's upstream got %d requests, want still 2", got)
	}
	slowGate.open()
	for _, ch := range []<-chan result{slowHolder, slowQueued} {
		if r := await(t, ch); r.status != http.StatusOK {
			t.Fatalf("client of m-slow: status %d: %s", r.status, r.body)
		}
	}
}

// TestShadowNoRetryNoFailover: a shadow upstream that fails gets exactly
// one call, though its provider retries 5xx and the shadow model has a
// second upstream; it is not blamed (no failure streak, no cooling); the
// client is served.
func TestShadowNoRetryNoFailover(t *testing.T) {
	bad, good := newUpstream(t, status(http.StatusInternalServerError)), newUpstream(t, nil)
	main := newUpstream(t, nil)
	h := cfg(
		[]map[string]any{obj("id", "p-bad", "url", bad.base(), "retries", 2, "backoff", "30s"),
			obj("id", "p-good", "url", good.base()), obj("id", "p-main", "url", main.base())},
		[]map[string]any{obj("id", "u-bad", "provider", "p-bad", "model", "cand"),
			obj("id", "u-good", "provider", "p-good", "model", "cand"), obj("id", "u-main", "provider", "p-main", "model", "main")},
		[]map[string]any{obj("name", "m-cand", "upstreams", []string{"u-bad", "u-good"}),
			obj("name", "m-main", "upstreams", []string{"u-main"}),
			obj("name", "auto", "rules", []map[string]any{shadowRule(1)})})
	s := &shadowSetup{p: startProxy(t, h)}
	resp := s.p.chat(chatBody("auto", false))
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	eventually(t, 10*time.Second, "the copy counted", func() bool { return s.shadowTotal() >= 1 })
	if got := s.shadowCount("5xx"); got != 1 {
		t.Errorf(`shadow result="5xx" = %v, want 1`, got)
	}
	if got := len(bad.Calls()); got != 1 {
		t.Errorf("the failing shadow upstream got %d calls, want exactly 1 (no retry)", got)
	}
	if got := len(good.Calls()); got != 0 {
		t.Errorf("the shadow model's second upstream got %d calls, want 0 (no failover)", got)
	}
	if got := s.p.upstreamGauge("fail_streak", "u-bad", "p-bad"); got != 0 {
		t.Errorf("u-bad fail_streak = %v, want 0: a shadow's failure must not count", got)
	}
	if got := s.p.upstreamGauge("cooling_seconds", "u-bad", "p-bad"); got != 0 {
		t.Errorf("u-bad cooling_seconds = %v, want 0: a shadow's failure must not cool an upstream", got)
	}
	if n := s.sumSeries(`llm_proxy_requests_total{model="m-cand",`); n != 0 {
		t.Errorf("the shadow copy is counted as %v client attempts in llm_proxy_requests_total", n)
	}
}

// TestShadowNotInKeyUsage: a key whose rate and token budget leave room
// for its own requests only is never charged for their shadow copies,
// which report 100 times the tokens; the shadow's tokens are in
// llm_proxy_tokens_total, under the shadow model.
func TestShadowNotInKeyUsage(t *testing.T) {
	s := startShadow(t, []shadowModel{{name: "m-main", behave: answerWith("ok", 3, 1)},
		{name: "m-cand", behave: answerWith("big", 1000, 1000)}},
		[]map[string]any{shadowRule(1)},
		"keys", []any{obj("id", "tight", "secret", "sk-tight", "rpm", 5, "burst", 5, "tokens_per_day", 200)})
	body := `{"model":"auto","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`
	for i := 0; i < 5; i++ {
		resp := s.p.chat(body, "Authorization", "Bearer sk-tight")
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d of the key's 5: status %d: %s", i+1, resp.StatusCode, b)
		}
		// Each copy ends (and reports its tokens) before the next request.
		want := float64(i + 1)
		eventually(t, 10*time.Second, "the copy counted", func() bool { return s.shadowTotal() >= want })
	}
	if got := s.shadowCount("ok"); got != 5 {
		t.Fatalf(`shadow result="ok" = %v, want 5`, got)
	}
	for typ, want := range map[string]float64{"input": 15, "output": 5} {
		if got := s.p.metric("llm_proxy_key_tokens_total", "key", "tight", "type", typ); got != want {
			t.Errorf("llm_proxy_key_tokens_total{type=%q} = %v, want %v (the client's answers only)", typ, got, want)
		}
	}
	for typ, want := range map[string]float64{"input": 5000, "output": 5000} {
		got := s.p.metric("llm_proxy_tokens_total", "model", "m-cand", "upstream", "u-m-cand", "provider", "p-m-cand", "type", typ)
		if got != want {
			t.Errorf("llm_proxy_tokens_total of the shadow, type %q = %v, want %v", typ, got, want)
		}
	}
	if n := s.sumSeries(`llm_proxy_requests_total{model="m-cand",`) + s.sumSeries(`llm_proxy_key_requests_total{key="tight",model="m-cand",`); n != 0 {
		t.Errorf("the shadow copies are counted as %v client requests", n)
	}
	// The key's sixth request is over its rate: its own five used it all.
	resp := s.p.chat(body, "Authorization", "Bearer sk-tight")
	readAll(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("the key's sixth request: status %d, want 429 (the rate counts the key's own requests)", resp.StatusCode)
	}
}

// TestShadowComparedLog: each copy sent writes one "shadow compared" line
// with both answers' model, upstream, status, result, tokens, latency and
// time to first token, and never a body; the metric counts the result.
func TestShadowComparedLog(t *testing.T) {
	s := startShadow(t, []shadowModel{{name: "m-main", behave: answerWith("MAIN-ANSWER-TEXT", 3, 4)},
		{name: "m-cand", behave: answerWith("SHADOW-ANSWER-TEXT", 7, 9)}},
		[]map[string]any{shadowRule(1)})
	resp := s.p.chat(`{"model":"auto:high","messages":[{"role":"user","content":"PROMPT-MARKER"}]}`)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	// The line is written when the later of the two answers ends.
	eventually(t, 10*time.Second, "a comparison line", func() bool { return len(s.p.logEntries("shadow compared")) >= 1 })
	eventually(t, 10*time.Second, "the copy counted", func() bool { return s.shadowCount("ok") == 1 })
	lines := s.p.logEntries("shadow compared")
	if len(lines) != 1 {
		t.Fatalf("%d shadow compared lines, want 1", len(lines))
	}
	e := lines[0]
	want := map[string]any{
		"model": "auto", "rule": "all", "effort": "high (suffix)", "request_id": resp.Header.Get("X-Request-Id"),
		"main_model": "m-main", "main_upstream": "u-m-main", "main_status": 200.0, "main_result": "ok",
		"main_input_tokens": 3.0, "main_output_tokens": 4.0,
		"shadow_model": "m-cand", "shadow_upstream": "u-m-cand", "shadow_status": 200.0, "shadow_result": "ok",
		"shadow_input_tokens": 7.0, "shadow_output_tokens": 9.0, "same_status": true,
	}
	for k, v := range want {
		if e[k] != v {
			t.Errorf("%s = %v, want %v", k, e[k], v)
		}
	}
	for _, k := range []string{"main_latency", "main_ttft", "shadow_latency", "shadow_ttft"} {
		if d, ok := e[k].(float64); !ok || d <= 0 {
			t.Errorf("%s = %v, want a positive duration", k, e[k])
		}
	}
	for _, line := range strings.Split(s.p.logs(), "\n") {
		if strings.Contains(line, "shadow compared") {
			for _, body := range []string{"PROMPT-MARKER", "MAIN-ANSWER-TEXT", "SHADOW-ANSWER-TEXT"} {
				if strings.Contains(line, body) {
					t.Errorf("the comparison line carries a body (%s): %s", body, line)
				}
			}
		}
	}

	// A failing shadow: its status and result, and same_status false.
	s.ups["m-cand"].setHandler(status(http.StatusServiceUnavailable))
	resp = s.p.chat(chatBody("auto", false))
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	eventually(t, 10*time.Second, "a second line", func() bool { return len(s.p.logEntries("shadow compared")) >= 2 })
	eventually(t, 10*time.Second, "the failed copy counted", func() bool { return s.shadowCount("5xx") == 1 })
	lines = s.p.logEntries("shadow compared")
	if len(lines) != 2 {
		t.Fatalf("%d shadow compared lines, want 2", len(lines))
	}
	e = lines[1]
	for k, v := range map[string]any{"effort": "medium (default)", "main_status": 200.0, "shadow_status": 503.0,
		"shadow_result": "5xx", "same_status": false} {
		if e[k] != v {
			t.Errorf("failed copy: %s = %v, want %v", k, e[k], v)
		}
	}

	// The client's stream cut after it started (the response is
	// aborted): its answer is "interrupted".
	s.ups["m-cand"].setHandler(answerWith("SHADOW-ANSWER-TEXT", 7, 9))
	s.ups["m-main"].setHandler(resetAfter(sseChunks("one two three")[:2]))
	resp, err := s.p.post(context.Background(), chatBody("auto", true))
	if err == nil {
		_, _ = io.ReadAll(resp.Body) // cut: an error is expected
		resp.Body.Close()
	}
	eventually(t, 10*time.Second, "a third line", func() bool { return len(s.p.logEntries("shadow compared")) >= 3 })
	lines = s.p.logEntries("shadow compared")
	if len(lines) != 3 {
		t.Fatalf("%d shadow compared lines, want 3", len(lines))
	}
	e = lines[2]
	for k, v := range map[string]any{"main_result": "interrupted", "main_status": 0.0, "shadow_result": "ok",
		"shadow_status": 200.0, "same_status": false} {
		if e[k] != v {
			t.Errorf("cut client stream: %s = %v, want %v", k, e[k], v)
		}
	}
}

// TestShadowSkipped: a request the shadow model cannot take (here, larger
// than its upstream's context window) is not copied, and counted skipped;
// the client is served.
func TestShadowSkipped(t *testing.T) {
	s := startShadow(t, []shadowModel{{name: "m-main"}, {name: "m-cand", upstream: obj("context_window", 100)}},
		[]map[string]any{shadowRule(1)})
	resp := s.p.chat(`{"model":"auto","messages":[{"role":"user","content":"hi"}],"max_tokens":500}`)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	eventually(t, 10*time.Second, "the copy counted", func() bool { return s.shadowTotal() >= 1 })
	if got := s.shadowCount("skipped"); got != 1 {
		t.Errorf(`shadow result="skipped" = %v, want 1`, got)
	}
	if got := len(s.ups["m-cand"].Calls()); got != 0 {
		t.Errorf("the shadow upstream got %d requests, want 0", got)
	}
	if n := len(s.p.logEntries("shadow compared")); n != 0 {
		t.Errorf("%d comparison lines for a copy never sent, want 0", n)
	}
}

// TestShadowCancelledOnReload: a reload cancels a copy still waiting for
// its answer; the old handler waits for it, so when the reload returns the
// copy has ended (counted as cancelled, and logged) and the shadow
// upstream sees the request go away.
func TestShadowCancelledOnReload(t *testing.T) {
	g := newGate()
	s := &shadowSetup{ups: map[string]*fakeUpstream{}}
	models := []shadowModel{{name: "m-main"}, {name: "m-cand", behave: g.handler(completion("late"))}}
	conf := s.shadowConfig(t, models, []map[string]any{shadowRule(1)})
	s.p = startProxy(t, conf)
	t.Cleanup(g.open) // first: nothing is left waiting at the upstream
	resp := s.p.chat(chatBody("auto", false))
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	g.waitArrivals(t, 1)
	if got := s.shadowTotal(); got != 0 {
		t.Fatalf("the held copy is counted already (%v)", got)
	}
	s.p.load(conf)
	if got := s.shadowCount("cancelled"); got != 1 {
		t.Errorf(`right after the reload, shadow result="cancelled" = %v, want 1: the old handler left its copy running`, got)
	}
	eventually(t, 5*time.Second, "the comparison line", func() bool { return len(s.p.logEntries("shadow compared")) >= 1 })
	lines := s.p.logEntries("shadow compared")
	if len(lines) != 1 || lines[0]["shadow_result"] != "cancelled" || lines[0]["main_result"] != "ok" {
		t.Errorf("comparison lines after the reload: %v, want one with shadow_result cancelled", lines)
	}
	eventually(t, 5*time.Second, "the shadow upstream's request gone", func() bool { return s.ups["m-cand"].inflight.Load() == 0 })
}

// TestShadowSeriesFollowTheLoadedConfig: a shadow model's series exist at 0
// from the start, one per result, and go when a reload removes the shadow.
func TestShadowSeriesFollowTheLoadedConfig(t *testing.T) {
	s := &shadowSetup{ups: map[string]*fakeUpstream{}}
	models := []shadowModel{{name: "m-main"}, {name: "m-cand"}}
	s.p = startProxy(t, s.shadowConfig(t, models, []map[string]any{shadowRule(0.5)}))
	text := scrape(t, s.p)
	if got := len(seriesLines(text, "llm_proxy_shadow_requests_total{")); got != 12 {
		t.Errorf("%d shadow series at the start, want 12 (one per result):\n%s", got, strings.Join(seriesLines(text, "shadow_requests"), "\n"))
	}
	if _, ok := s.p.metricValue(`llm_proxy_shadow_requests_total{model="m-cand",result="busy"}`); !ok {
		t.Errorf("the busy series of m-cand is missing before any request")
	}
	s.p.load(s.shadowConfig(t, models, []map[string]any{obj("name", "all", "use", []string{"m-main"})}))
	if stale := seriesLines(scrape(t, s.p), "llm_proxy_shadow_requests_total{"); len(stale) > 0 {
		t.Errorf("series of a removed shadow remain:\n%s", strings.Join(stale, "\n"))
	}
}
