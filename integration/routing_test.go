package integration

// Issue #3: slot accounting, failover and backoff, through a real Caddy.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestRoutingFirstFreeUpstreamInOrder(t *testing.T) {
	ga, gb, gc := newGate(), newGate(), newGate()
	defer ga.open()
	defer gb.open()
	defer gc.open()
	a := newUpstream(t, ga.handler(completion("from a")))
	b := newUpstream(t, gb.handler(completion("from b")))
	c := newUpstream(t, gc.handler(completion("from c")))
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "pa", "url", a.base(), "max_concurrency", 5),
			obj("id", "pb", "url", b.base(), "max_concurrency", 2),
			obj("id", "pc", "url", c.base()),
		},
		[]map[string]any{
			obj("id", "ua", "provider", "pa", "model", "x", "max_concurrency", 1), // own limit wins over 5
			obj("id", "ub", "provider", "pb", "model", "x"),                       // inherits 2
			obj("id", "uc", "provider", "pc", "model", "x", "max_concurrency", 1),
		},
		[]map[string]any{obj("name", "m", "upstreams", []string{"ua", "ub", "uc"})},
	))
	ctx := context.Background()
	var pending []<-chan result
	// Each request goes to the first upstream with a free slot, in order.
	for _, want := range []*gate{ga, gb, gb, gc} {
		pending = append(pending, p.goChat(ctx, chatBody("m", false)))
		want.waitArrivals(t, 1)
	}
	for _, g := range []struct {
		up   string
		prov string
		want float64
	}{{"ua", "pa", 1}, {"ub", "pb", 2}, {"uc", "pc", 1}} {
		if got := p.upstreamGauge("inflight", g.up, g.prov); got != g.want {
			t.Errorf("inflight %s = %v, want %v", g.up, got, g.want)
		}
	}
	if n := len(a.Calls()) + len(b.Calls()) + len(c.Calls()); n != 4 {
		t.Fatalf("upstream calls = %d, want 4", n)
	}

	// Everything is full: 503 busy, and no counter is touched.
	before := llmMetrics(p)
	msg := expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")
	if msg != "all upstreams busy" {
		t.Errorf("message = %q", msg)
	}
	if after := llmMetrics(p); after != before {
		t.Errorf("a busy rejection changed the metrics:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if n := len(a.Calls()) + len(b.Calls()) + len(c.Calls()); n != 4 {
		t.Errorf("the busy request reached an upstream: %d calls", n)
	}
	rejected := p.logEntries("request refused")
	if len(rejected) != 1 || rejected[0]["reason"] != "busy" || rejected[0]["level"] != "info" {
		t.Fatalf("refusal log entries %v, want one INFO entry with reason busy", rejected)
	}
	if slots, _ := json.Marshal(rejected[0]["slots"]); string(slots) != `[{"inflight":1,"limit":1,"upstream":"ua"},{"inflight":2,"limit":2,"upstream":"ub"},{"inflight":1,"limit":1,"upstream":"uc"}]` {
		t.Errorf("busy log entry lacks the slot state: %s", slots)
	}

	okBefore := p.requests("m", "ub", "pb", "ok")
	ga.open()
	gb.open()
	gc.open()
	for _, ch := range pending {
		if r := await(t, ch); r.status != http.StatusOK {
			t.Errorf("held request: status %d: %s", r.status, r.body)
		}
	}
	if got := p.requests("m", "ub", "pb", "ok") - okBefore; got != 2 {
		t.Errorf("ok results on ub = %v, want 2", got)
	}
	for _, u := range [][2]string{{"ua", "pa"}, {"ub", "pb"}, {"uc", "pc"}} {
		if got := p.upstreamGauge("inflight", u[0], u[1]); got != 0 {
			t.Errorf("inflight %s = %v after the requests ended", u[0], got)
		}
	}
}

// llmMetrics returns the llm_proxy_requests_total and per-upstream gauge
// lines of the metrics text.
func llmMetrics(p *proxy) string {
	var b strings.Builder
	for _, line := range strings.Split(p.metrics(), "\n") {
		if strings.HasPrefix(line, "llm_proxy_requests_total{") || strings.HasPrefix(line, "llm_proxy_upstream_inflight{") ||
			strings.HasPrefix(line, "llm_proxy_upstream_fail_streak{") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func TestBusyUnderLoadNeverExceedsTheLimit(t *testing.T) {
	const total, limit = 200, 3
	g := newGate()
	defer g.open()
	up := newUpstream(t, g.handler(completion("ok")))
	p := startProxy(t, basicConfig(up, limit))

	results := make(chan result, total)
	ctx := context.Background()
	for i := 0; i < total; i++ {
		go func() { results <- <-p.goChat(ctx, chatBody("m", false)) }()
	}
	// While the upstream holds its 3, every other request is turned away.
	g.waitArrivals(t, limit)
	busy := 0
	for busy < total-limit {
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("request: %v", r.err)
			}
			if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, `"code":"all_upstreams_busy"`) {
				t.Fatalf("while the upstream is held: status %d body %s", r.status, r.body)
			}
			busy++
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d busy answers", busy)
		}
	}
	if got := p.upstreamGauge("inflight", "u1", "p1"); got != limit {
		t.Errorf("inflight = %v, want %d", got, limit)
	}
	g.open()
	for i := 0; i < limit; i++ {
		r := <-results
		if r.err != nil || r.status != http.StatusOK {
			t.Errorf("held request: status %d err %v body %s", r.status, r.err, r.body)
		}
	}
	if peak := up.peak.Load(); peak != limit {
		t.Errorf("upstream peak concurrency = %d, want %d", peak, limit)
	}
	if n := len(up.Calls()); n != limit {
		t.Errorf("upstream calls = %d, want %d", n, limit)
	}
	eventually(t, 2*time.Second, "inflight back to 0", func() bool {
		return p.upstreamGauge("inflight", "u1", "p1") == 0
	})
}

// sendsHeadersOnly answers 200 with SSE headers and then nothing.
func sendsHeadersOnly(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
	<-r.Context().Done()
}

// resetsConnection kills the TCP connection before answering.
func resetsConnection(w http.ResponseWriter, r *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	conn.Close()
}

func TestFailover(t *testing.T) {
	good := newUpstream(t, nil)
	cases := []struct {
		name   string
		behave http.HandlerFunc // nil: nothing listens (connection refused)
		stream bool
		result string
		status int
	}{
		{"500", status(500), false, "5xx", 500},
		{"503", status(503), false, "5xx", 503},
		{"502 stream", status(502), true, "5xx", 502},
		{"429", status(429), false, "429", 429},
		{"402", status(402), false, "402", 402},
		{"refused", nil, false, "net_err", 0},
		{"reset", resetsConnection, false, "net_err", 0},
		{"headers but no body", sendsHeadersOnly, true, "timeout", 0},
		{"no headers", hang(nil), true, "timeout", 0},
	}
	providers := []map[string]any{obj("id", "good", "url", good.base())}
	upstreams := []map[string]any{obj("id", "good-u", "provider", "good", "model", "good-model")}
	var models []map[string]any
	bad := make(map[string]*fakeUpstream)
	for i, tc := range cases {
		url := closedURL(t)
		if tc.behave != nil {
			bad[tc.name] = newUpstream(t, tc.behave)
			url = bad[tc.name].base()
		}
		id := fmt.Sprintf("bad%d", i)
		providers = append(providers, obj("id", id, "url", url, "first_byte_timeout", "300ms"))
		upstreams = append(upstreams, obj("id", id+"-u", "provider", id, "model", "bad-model"))
		models = append(models, obj("name", "m"+id, "upstreams", []string{id + "-u", "good-u"}))
	}
	p := startProxy(t, cfg(providers, upstreams, models))

	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("bad%d", i)
			model := "m" + id
			failBefore := p.requests(model, id+"-u", id, tc.result)
			okBefore := p.requests(model, "good-u", "good", "ok")
			goodCalls := len(good.Calls())

			resp := p.chat(chatBody(model, tc.stream))
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if tc.stream && !strings.HasSuffix(body, "data: [DONE]\n\n") || !tc.stream && !strings.Contains(body, `"hello"`) {
				t.Errorf("client did not get the second upstream's answer: %s", body)
			}
			if f := bad[tc.name]; f != nil && len(f.Calls()) != 1 {
				t.Errorf("failing upstream calls = %d, want 1", len(f.Calls()))
			}
			if n := len(good.Calls()) - goodCalls; n != 1 {
				t.Errorf("second upstream calls = %d, want 1", n)
			}
			if got := p.requests(model, id+"-u", id, tc.result) - failBefore; got != 1 {
				t.Errorf("result %q on the failing upstream counted %v times, want 1", tc.result, got)
			}
			if got := p.requests(model, "good-u", "good", "ok") - okBefore; got != 1 {
				t.Errorf("ok on the second upstream counted %v times, want 1", got)
			}
			if got := p.upstreamGauge("fail_streak", id+"-u", id); got != 1 {
				t.Errorf("fail_streak = %v, want 1", got)
			}
			var found bool
			for _, e := range p.logEntries("failover") {
				if e["from"] == id+"-u" && e["to"] == "good-u" && e["result"] == tc.result {
					found = true
				}
			}
			if !found {
				t.Errorf("no failover log entry from %s-u with result %s", id, tc.result)
			}
		})
	}
}

func TestNoFailoverOnClientErrors(t *testing.T) {
	good := newUpstream(t, nil)
	for _, code := range []int{400, 404, 422} { // 401/403 fail over: TestUpstreamAuthErrors
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d stream=%v", code, stream), func(t *testing.T) {
				upstreamBody := fmt.Sprintf(`{"error":{"message":"bad request %d: max_tokens too large","type":"invalid_request_error","param":"max_tokens","code":null}}`, code)
				bad := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json; charset=utf-8")
					w.Header().Set("X-Request-Id", "req-4xx")
					w.WriteHeader(code)
					fmt.Fprint(w, upstreamBody)
				})
				p := startProxy(t, cfg(
					[]map[string]any{
						obj("id", "pbad", "url", bad.base(), "backoff", "10s"),
						obj("id", "pgood", "url", good.base()),
					},
					[]map[string]any{
						obj("id", "ubad", "provider", "pbad", "model", "x"),
						obj("id", "ugood", "provider", "pgood", "model", "y"),
					},
					[]map[string]any{obj("name", "m", "upstreams", []string{"ubad", "ugood"})},
				))
				goodCalls := len(good.Calls())
				before := p.requests("m", "ubad", "pbad", "4xx")
				resp := p.chat(chatBody("m", stream))
				body := readAll(t, resp)
				if resp.StatusCode != code || body != upstreamBody {
					t.Errorf("client got %d %s, want the upstream's %d %s", resp.StatusCode, body, code, upstreamBody)
				}
				if ct := resp.Header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
					t.Errorf("Content-Type = %q", ct)
				}
				if id := resp.Header.Get("X-Request-Id"); id != "req-4xx" {
					t.Errorf("X-Request-Id = %q", id)
				}
				if n := len(good.Calls()) - goodCalls; n != 0 {
					t.Errorf("failed over on %d: second upstream got %d calls", code, n)
				}
				if got := p.requests("m", "ubad", "pbad", "4xx") - before; got != 1 {
					t.Errorf("4xx counted %v times", got)
				}
				// Not the upstream's fault: no failure, no cooling.
				if s, c := p.upstreamGauge("fail_streak", "ubad", "pbad"), p.upstreamGauge("cooling_seconds", "ubad", "pbad"); s != 0 || c != 0 {
					t.Errorf("fail_streak %v cooling %v after a %d", s, c, code)
				}
			})
		}
	}
}

func TestAllUpstreamsFailed(t *testing.T) {
	e500 := newUpstream(t, status(500))
	e429 := newUpstream(t, status(429))
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "p500", "url", e500.base(), "key", "sk-test-secret-500"),
			obj("id", "pdown", "url", closedURL(t), "key", "sk-test-secret-down"),
			obj("id", "p429", "url", e429.base(), "key", "sk-test-secret-429"),
		},
		[]map[string]any{
			obj("id", "u500", "provider", "p500", "model", "x"),
			obj("id", "udown", "provider", "pdown", "model", "x"),
			obj("id", "u429", "provider", "p429", "model", "x"),
		},
		[]map[string]any{obj("name", "m", "upstreams", []string{"u500", "udown", "u429"})},
	))
	msg := expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_failed")
	if msg != "all upstreams failed" {
		t.Errorf("message = %q", msg)
	}
	if len(e500.Calls()) != 1 || len(e429.Calls()) != 1 {
		t.Errorf("calls: 500 → %d, 429 → %d; want 1 each", len(e500.Calls()), len(e429.Calls()))
	}
	var entry map[string]any
	eventually(t, 2*time.Second, "the refusal's log entry", func() bool {
		if es := p.logEntries("request refused"); len(es) == 1 && es[0]["reason"] == "all_failed" {
			entry = es[0]
			return true
		}
		return false
	})
	attempts, _ := json.Marshal(entry["attempts"])
	// (re-encoded from the parsed log line, so keys come sorted)
	want := `[{"result":"5xx","status":500,"upstream":"u500"},{"result":"net_err","upstream":"udown"},{"result":"429","status":429,"upstream":"u429"}]`
	if string(attempts) != want {
		t.Errorf("logged attempts\n got %s\nwant %s", attempts, want)
	}
	if logs := p.logs(); strings.Contains(logs, "sk-test-secret") {
		t.Error("a provider key appears in the log")
	}
}

// TestBackoffDoublesCapsAndResets drives one upstream's own backoff with
// concurrent requests whose outcomes the test releases one by one, so no
// wall-clock waiting is needed: failures cool 1 s, 2 s, then the cap (3 s);
// a success resets the count.
func TestBackoffDoublesCapsAndResets(t *testing.T) {
	s := newScript()
	up := newUpstream(t, s.handler)
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "p1", "url", up.base())},
		[]map[string]any{obj("id", "u1", "provider", "p1", "model", "x", "max_concurrency", 4,
			"backoff", "3s", "probe_interval", "0s")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"u1"})},
	))
	ctx := context.Background()
	results := make(chan result, 8)
	for i := 0; i < 4; i++ {
		go func() { results <- <-p.goChat(ctx, chatBody("m", false)) }()
	}
	s.waitArrivals(t, 4)
	gauges := func() (streak, cooling float64) {
		return p.upstreamGauge("fail_streak", "u1", "p1"), p.upstreamGauge("cooling_seconds", "u1", "p1")
	}
	// applied returns the cooling periods the "backoff applied" log
	// entries report, in seconds: exact values, no clock involved.
	applied := func() []float64 {
		var out []float64
		for _, e := range p.logEntries("backoff applied") {
			if e["upstream"] == "u1" {
				d, _ := e["cooling"].(float64)
				out = append(out, d)
			}
		}
		return out
	}
	var periods []float64
	fail := func(wantStreak, wantPeriod float64) {
		t.Helper()
		s.answer(t, status(500))
		r := await(t, results)
		if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "all_upstreams_failed") {
			t.Fatalf("failed attempt: status %d body %s", r.status, r.body)
		}
		periods = append(periods, wantPeriod)
		streak, cooling := gauges()
		if streak != wantStreak || cooling <= 0 || cooling > wantPeriod {
			t.Errorf("after failure %v: fail_streak %v cooling %v, want %v and (0, %v]", wantStreak, streak, cooling, wantStreak, wantPeriod)
		}
		eventually(t, 2*time.Second, "the backoff log entry", func() bool { return len(applied()) == len(periods) })
		if got := applied(); fmt.Sprint(got) != fmt.Sprint(periods) {
			t.Errorf("backoff periods applied %v, want %v", got, periods)
		}
	}
	fail(1, 1)
	fail(2, 2)
	fail(3, 3) // 4 s capped at 3 s

	// Cooling: the upstream gets nothing and the client is told when to
	// come back.
	resp := p.chat(chatBody("m", false))
	msg := expectAPIError(t, resp, http.StatusServiceUnavailable, "all_upstreams_cooling")
	if msg != "all upstreams cooling, retry in 3s" || resp.Header.Get("Retry-After") != "3" {
		t.Errorf("cooling answer: message %q, Retry-After %q", msg, resp.Header.Get("Retry-After"))
	}
	if n := len(up.Calls()); n != 4 {
		t.Errorf("a cooling upstream was called: %d calls", n)
	}

	// The fourth request, admitted before the failures, succeeds: reset.
	s.answer(t, completion("ok"))
	if r := await(t, results); r.status != http.StatusOK {
		t.Fatalf("success: status %d body %s", r.status, r.body)
	}
	if streak, cooling := gauges(); streak != 0 || cooling != 0 {
		t.Errorf("after a success: fail_streak %v cooling %v, want 0 0", streak, cooling)
	}
	// A new failure starts again at 1 s.
	go func() { results <- <-p.goChat(ctx, chatBody("m", false)) }()
	s.waitArrivals(t, 1)
	fail(1, 1)
}

func TestBackoffScopes(t *testing.T) {
	good := newUpstream(t, nil)
	failing := newUpstream(t, status(500))
	sibling := newUpstream(t, nil)
	p := startProxy(t, cfg(
		[]map[string]any{
			// Shared: one counter for the whole provider.
			obj("id", "shared", "url", failing.base(), "backoff", "1m", "probe_interval", "0s"),
			obj("id", "shared-ok", "url", sibling.base(), "backoff", "1m", "probe_interval", "0s"),
			obj("id", "good", "url", good.base()),
		},
		[]map[string]any{
			obj("id", "s1", "provider", "shared", "model", "x"),
			// s2 shares the provider (and its server) with s1; once s1
			// fails, s2 must be skipped without being called.
			obj("id", "s2", "provider", "shared", "model", "y"),
			// own: o1 has its own counter, o2 uses its provider's.
			obj("id", "o1", "provider", "shared-ok", "model", "x", "backoff", "1m"),
			obj("id", "o2", "provider", "shared-ok", "model", "y"),
			obj("id", "g", "provider", "good", "model", "z"),
		},
		[]map[string]any{
			obj("name", "shared-model", "upstreams", []string{"s1", "s2", "g"}),
			obj("name", "s2-only", "upstreams", []string{"s2"}),
			obj("name", "own-model", "upstreams", []string{"o1", "o2", "g"}),
		},
	))

	t.Run("provider scope cools the sibling", func(t *testing.T) {
		goodCalls := len(good.Calls())
		resp := p.chat(chatBody("shared-model", false))
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		if n := len(failing.Calls()); n != 1 {
			t.Errorf("s1 and s2 share a server; calls = %d, want 1 (s2 skipped)", n)
		}
		if n := len(good.Calls()) - goodCalls; n != 1 {
			t.Errorf("g calls = %d, want 1", n)
		}
		if c := p.upstreamGauge("cooling_seconds", "s2", "shared"); c <= 0 {
			t.Errorf("s2 cooling = %v, want > 0 after s1 failed", c)
		}
		expectAPIError(t, p.chat(chatBody("s2-only", false)), http.StatusServiceUnavailable, "all_upstreams_cooling")
		if n := len(failing.Calls()); n != 1 {
			t.Errorf("a cooling sibling was called: %d calls", n)
		}
		// The failure is counted on s1 only.
		if s1, s2 := p.upstreamGauge("fail_streak", "s1", "shared"), p.upstreamGauge("fail_streak", "s2", "shared"); s1 != 1 || s2 != 0 {
			t.Errorf("fail_streak s1 %v s2 %v, want 1 0", s1, s2)
		}
	})

	t.Run("upstream scope leaves the sibling alone", func(t *testing.T) {
		sibling.setHandler(func(w http.ResponseWriter, r *http.Request) {
			var req struct{ Model string }
			_ = json.NewDecoder(r.Body).Decode(&req)
			if req.Model == "x" { // o1
				status(500)(w, r)
				return
			}
			completion("from o2")(w, r)
		})
		goodCalls := len(good.Calls())
		resp := p.chat(chatBody("own-model", false))
		if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "from o2") {
			t.Fatalf("status %d: %s (want o2's answer)", resp.StatusCode, body)
		}
		if n := len(good.Calls()) - goodCalls; n != 0 {
			t.Errorf("g calls = %d, want 0", n)
		}
		if c := p.upstreamGauge("cooling_seconds", "o1", "shared-ok"); c <= 0 {
			t.Errorf("o1 cooling = %v, want > 0", c)
		}
		if c := p.upstreamGauge("cooling_seconds", "o2", "shared-ok"); c != 0 {
			t.Errorf("o2 cooling = %v, want 0: o1's own backoff must not touch the provider's", c)
		}
		// o1 is skipped now; o2 keeps serving.
		resp = p.chat(chatBody("own-model", false))
		if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "from o2") {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	})
}

func TestAllCoolingRetryAfter(t *testing.T) {
	// Both upstreams ask to come back later; the client is told the sooner.
	a := newUpstream(t, status(429, "Retry-After", "7"))
	b := newUpstream(t, status(503, "Retry-After", "4"))
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "pa", "url", a.base()),                                            // no backoff: Retry-After alone
			obj("id", "pb", "url", b.base(), "backoff", "1m", "probe_interval", "50ms"), // a probe must not end it
		},
		[]map[string]any{
			obj("id", "ua", "provider", "pa", "model", "x"),
			obj("id", "ub", "provider", "pb", "model", "x"),
		},
		[]map[string]any{obj("name", "m", "upstreams", []string{"ua", "ub"})},
	))
	expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_failed")
	b.setHandler(nil) // healthy again: a probe would succeed
	for i := 0; i < 2; i++ {
		resp := p.chat(chatBody("m", false))
		msg := expectAPIError(t, resp, http.StatusServiceUnavailable, "all_upstreams_cooling")
		if msg != "all upstreams cooling, retry in 4s" || resp.Header.Get("Retry-After") != "4" {
			t.Errorf("message %q Retry-After %q, want 4s", msg, resp.Header.Get("Retry-After"))
		}
		if i == 0 {
			time.Sleep(300 * time.Millisecond) // several probe intervals
		}
	}
	if n := len(b.Calls()); n != 1 {
		t.Errorf("an upstream held by Retry-After was probed or called: %d calls", n)
	}
}

func TestProberBringsUpstreamBack(t *testing.T) {
	s := newScript()
	up := newUpstream(t, s.handler)
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "p1", "url", up.base(), "key", "sk-test-secret-probe",
			"patch", obj("provider", obj("order", []string{"a"})))},
		[]map[string]any{obj("id", "u1", "provider", "p1", "model", "real-x", "max_concurrency", 3,
			"backoff", "1m", "probe_interval", "100ms", "patch", obj("temperature", 0))},
		[]map[string]any{obj("name", "m", "upstreams", []string{"u1"}, "patch", obj("model_layer", true))},
	))
	// Three failures: cooling 1 s + 2 s + 4 s = until 4 s from now.
	ctx := context.Background()
	results := make(chan result, 3)
	for i := 0; i < 3; i++ {
		go func() { results <- <-p.goChat(ctx, chatBody("m", false)) }()
	}
	s.waitArrivals(t, 3)
	okBefore := p.metric("llm_proxy_probe_pings_total", "upstream", "u1", "provider", "p1", "result", "ok")
	failBefore := p.metric("llm_proxy_probe_pings_total", "upstream", "u1", "provider", "p1", "result", "fail")
	for i := 0; i < 3; i++ {
		s.answer(t, status(500))
		await(t, results)
	}
	coolingAtStart := p.upstreamGauge("cooling_seconds", "u1", "p1")
	if coolingAtStart <= 3 {
		t.Fatalf("cooling = %v, want > 3 s after three failures", coolingAtStart)
	}

	// The first probes fail: nothing changes.
	s.waitArrivals(t, 1)
	s.answer(t, status(503))
	s.waitArrivals(t, 1)
	s.answer(t, status(500))
	eventually(t, 2*time.Second, "two failed probes counted", func() bool {
		return p.metric("llm_proxy_probe_pings_total", "upstream", "u1", "provider", "p1", "result", "fail")-failBefore == 2
	})
	if streak, cooling := p.upstreamGauge("fail_streak", "u1", "p1"), p.upstreamGauge("cooling_seconds", "u1", "p1"); streak != 3 || cooling > coolingAtStart {
		t.Errorf("after failed probes: fail_streak %v cooling %v (was %v); a failed probe must not extend backoff", streak, cooling, coolingAtStart)
	}

	// The next probe succeeds: back in the pool long before the 4 s pass.
	s.waitArrivals(t, 1)
	s.answer(t, completion("4"))
	eventually(t, 2*time.Second, "a successful probe", func() bool {
		return p.metric("llm_proxy_probe_pings_total", "upstream", "u1", "provider", "p1", "result", "ok")-okBefore == 1
	})
	if streak, cooling := p.upstreamGauge("fail_streak", "u1", "p1"), p.upstreamGauge("cooling_seconds", "u1", "p1"); streak != 0 || cooling != 0 {
		t.Errorf("after the probe: fail_streak %v cooling %v, want 0 0", streak, cooling)
	}
	pending := p.goChat(ctx, chatBody("m", false))
	s.waitArrivals(t, 1)
	s.answer(t, completion("back"))
	if r := await(t, pending); r.status != http.StatusOK || !strings.Contains(r.body, "back") {
		t.Fatalf("after the probe: status %d body %s", r.status, r.body)
	}

	calls := up.Calls()
	if len(calls) != 3+3+1 {
		t.Fatalf("calls = %d, want 3 requests, 3 probes, 1 request", len(calls))
	}
	// The probe, with provider and upstream patches, not the model's.
	const wantProbe = `{"model":"real-x","messages":[{"role":"user","content":"2+2=?"}],"max_tokens":4,"stream":true,"provider":{"order":["a"]},"temperature":0}`
	for _, c := range calls[3:6] {
		if string(c.Body) != wantProbe {
			t.Errorf("probe body\n got %s\nwant %s", c.Body, wantProbe)
		}
		if c.Header.Get("Authorization") != "Bearer sk-test-secret-probe" || c.Path != "/v1/chat/completions" {
			t.Errorf("probe: Authorization %q path %s", c.Header.Get("Authorization"), c.Path)
		}
	}
	if n := len(p.logEntries("probe answered, upstream back in the pool")); n != 1 {
		t.Errorf("probe success log entries = %d, want 1", n)
	}
}

// TestFailoverWhenErrorBodyStalls: an upstream that answers 503 and then
// never finishes its error body must not hold the failover until
// request_timeout (5 min by default).
func TestFailoverWhenErrorBodyStalls(t *testing.T) {
	bad := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"overloaded`)
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
	})
	good := newUpstream(t, nil)
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "pb", "url", bad.base()), obj("id", "pg", "url", good.base())},
		[]map[string]any{obj("id", "ub", "provider", "pb", "model", "x"), obj("id", "ug", "provider", "pg", "model", "y")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"ub", "ug"})},
	))
	before := p.requests("m", "ub", "pb", "5xx")
	// The deadline is far below request_timeout and far above the proxy's
	// short drain window.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	plain, stream := p.goChat(ctx, chatBody("m", false)), p.goChat(ctx, chatBody("m", true))
	for _, ch := range []<-chan result{plain, stream} {
		if r := await(t, ch); r.status != http.StatusOK {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
	}
	if got := p.requests("m", "ub", "pb", "5xx") - before; got != 2 {
		t.Errorf("5xx counted %v times, want 2", got)
	}
}

// TestProbeBypassesSlots: a cooling upstream whose only slot is taken is
// still probed (the probe takes no slot), and its success ends the cooling
// of the whole provider-wide backoff scope.
func TestProbeBypassesSlots(t *testing.T) {
	hold, failing := newGate(), newGate()
	defer hold.open()
	defer failing.open()
	probes := make(chan string, 16)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		var req struct{ Model string }
		_ = json.Unmarshal(body, &req)
		switch {
		case strings.Contains(string(body), "2+2=?"):
			probes <- req.Model
			completion("4")(w, r)
		case req.Model == "u-model":
			hold.handler(completion("held"))(w, r)
		default:
			failing.handler(status(500))(w, r)
		}
	})
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "pp", "url", up.base(), "backoff", "1m", "probe_interval", "100ms")},
		[]map[string]any{
			obj("id", "U", "provider", "pp", "model", "u-model", "max_concurrency", 1),
			obj("id", "F", "provider", "pp", "model", "f-model", "probe_interval", "0s"), // never probed
		},
		[]map[string]any{
			obj("name", "mu", "upstreams", []string{"U"}),
			obj("name", "mf", "upstreams", []string{"F"}),
		},
	))
	ctx := context.Background()
	held := p.goChat(ctx, chatBody("mu", false))
	hold.waitArrivals(t, 1)
	// Three failures of the sibling at once: the provider cools 4 s.
	var fails []<-chan result
	for i := 0; i < 3; i++ {
		fails = append(fails, p.goChat(ctx, chatBody("mf", false)))
	}
	failing.waitArrivals(t, 3)
	failing.open()
	for _, ch := range fails {
		await(t, ch)
	}
	if c := p.upstreamGauge("cooling_seconds", "U", "pp"); c <= 3 {
		t.Fatalf("U cooling = %v, want > 3 s (shared with F)", c)
	}
	select {
	case model := <-probes:
		if model != "u-model" {
			t.Fatalf("probed %q, want u-model (F has probing off)", model)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the cooling upstream was not probed while its only slot was taken")
	}
	eventually(t, 2*time.Second, "the shared cooling ended by U's probe", func() bool {
		return p.upstreamGauge("cooling_seconds", "F", "pp") == 0 && p.upstreamGauge("cooling_seconds", "U", "pp") == 0
	})
	if got := p.upstreamGauge("inflight", "U", "pp"); got != 1 {
		t.Errorf("U inflight = %v during the probe, want 1: a probe takes no slot", got)
	}
	hold.open()
	if r := await(t, held); r.status != http.StatusOK {
		t.Fatalf("held request: %d %s", r.status, r.body)
	}
	eventually(t, time.Second, "U inflight 0", func() bool { return p.upstreamGauge("inflight", "U", "pp") == 0 })
}
