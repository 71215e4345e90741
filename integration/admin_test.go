package integration

// Issue #13 items 1 and 6: the admin API's status and explain, read through
// Caddy's own admin listener while real requests hold slots, cool
// upstreams and wait in queues.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The admin answers as a client sees them (field names checked by decoding
// into these and by the raw-key checks below).
type statusJSON struct {
	Upstreams []upstreamJSON `json:"upstreams"`
	Providers []struct {
		ID        string   `json:"id"`
		Inflight  int64    `json:"inflight"`
		Capacity  *int64   `json:"capacity"`
		Upstreams []string `json:"upstreams"`
	} `json:"providers"`
	Models []struct {
		Name       string   `json:"name"`
		Upstreams  []string `json:"upstreams"`
		QueueDepth int      `json:"queue_depth"`
		QueueSize  int      `json:"queue_size"`
	} `json:"models"`
	Sessions       int     `json:"sessions"`
	ConfigLoadedAt *string `json:"config_loaded_at"`
}

type upstreamJSON struct {
	ID             string  `json:"id"`
	Provider       string  `json:"provider"`
	Model          string  `json:"model"`
	Inflight       int64   `json:"inflight"`
	Limit          *int64  `json:"limit"`
	CoolingSeconds float64 `json:"cooling_seconds"`
	CoolingReason  *string `json:"cooling_reason"`
	FailStreak     int64   `json:"fail_streak"`
	LastFailureAt  *string `json:"last_failure_at"`
	Draining       bool    `json:"draining"`
	Probes         struct {
		OK   int64 `json:"ok"`
		Fail int64 `json:"fail"`
	} `json:"probes"`
}

type explainJSON struct {
	Model      string  `json:"model"`
	Choice     *string `json:"choice"`
	Outcome    string  `json:"outcome"`
	QueueDepth int     `json:"queue_depth"`
	Upstreams  []struct {
		ID      string `json:"id"`
		Verdict string `json:"verdict"`
		Detail  string `json:"detail"`
	} `json:"upstreams"`
}

// adminGet fetches an admin path and returns the response (body unread).
func (p *proxy) adminGet(path string) *http.Response {
	p.t.Helper()
	resp, err := testClient.Get(p.admin + path)
	if err != nil {
		p.t.Fatalf("GET admin %s: %v", path, err)
	}
	return resp
}

// status reads GET /llm_route/status.
func (p *proxy) status() (statusJSON, string) {
	p.t.Helper()
	resp := p.adminGet("/llm_route/status")
	body := readAll(p.t, resp)
	if resp.StatusCode != http.StatusOK {
		p.t.Fatalf("status: HTTP %d: %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		p.t.Errorf("status Content-Type = %q", ct)
	}
	var s statusJSON
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		p.t.Fatalf("status is not JSON: %v: %s", err, body)
	}
	return s, body
}

// explain reads GET /llm_route/explain?model=M.
func (p *proxy) explain(model string) explainJSON {
	p.t.Helper()
	resp := p.adminGet("/llm_route/explain?model=" + model)
	body := readAll(p.t, resp)
	if resp.StatusCode != http.StatusOK {
		p.t.Fatalf("explain %s: HTTP %d: %s", model, resp.StatusCode, body)
	}
	var e explainJSON
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		p.t.Fatalf("explain is not JSON: %v: %s", err, body)
	}
	return e
}

// verdicts renders an explanation as "id=verdict" pairs, for comparisons.
func (e explainJSON) verdicts() string {
	var parts []string
	for _, u := range e.Upstreams {
		parts = append(parts, u.ID+"="+u.Verdict)
	}
	return strings.Join(parts, " ")
}

// upstream finds an upstream's row in a status answer.
func (s statusJSON) upstream(t testing.TB, id string) upstreamJSON {
	t.Helper()
	for _, u := range s.Upstreams {
		if u.ID == id {
			return u
		}
	}
	t.Fatalf("status has no upstream %q", id)
	return upstreamJSON{}
}

func (s statusJSON) hasUpstream(id string) bool {
	for _, u := range s.Upstreams {
		if u.ID == id {
			return true
		}
	}
	return false
}

func reason(r *string) string {
	if r == nil {
		return "null"
	}
	return *r
}

// visibility is a running proxy with one upstream of each kind the status
// page has to show: a held slot, a failure backoff, two Retry-After holds
// (in a backoff scope and without one) and a free one.
type visibility struct {
	p       *proxy
	gate    *gate
	flaky   *gate
	held    <-chan result // the request holding "held"'s only slot
	cancel  context.CancelFunc
	limited *fakeUpstream
}

// startVisibility starts it; next builds handlers placed after llm_route on
// the site (they may need the proxy's ports).
func startVisibility(t *testing.T, next ...func(*proxy) any) *visibility {
	t.Helper()
	v := &visibility{gate: newGate(), flaky: newGate()}
	heldUp := newUpstream(t, v.gate.handler(completion("held answer")))
	flakyUp := newUpstream(t, v.flaky.handler(status(500)))
	v.limited = newUpstream(t, status(429, "Retry-After", "120"))
	freeUp := newUpstream(t, nil)
	handler := cfg(
		[]map[string]any{
			obj("id", "p-held", "url", heldUp.base(), "key", "sk-test-secret-1"),
			obj("id", "p-flaky", "url", flakyUp.base(), "backoff", "5m", "probe_interval", "1s"),
			obj("id", "p-limited", "url", v.limited.base(), "backoff", "5m", "probe_interval", "0s"),
			obj("id", "p-own", "url", v.limited.base()),
			obj("id", "p-free", "url", freeUp.base()),
		},
		[]map[string]any{
			obj("id", "held", "provider", "p-held", "model", "real-held", "max_concurrency", 1),
			obj("id", "flaky", "provider", "p-flaky", "model", "real-flaky"),
			obj("id", "limited", "provider", "p-limited", "model", "real-limited", "max_concurrency", 4),
			obj("id", "own", "provider", "p-own", "model", "real-own"),
			obj("id", "free", "provider", "p-free", "model", "real-free", "max_concurrency", 2),
		},
		[]map[string]any{
			obj("name", "chat", "upstreams", []string{"held"}, "queue_size", 2, "queue_timeout", "30s"),
			obj("name", "flaky", "upstreams", []string{"flaky"}),
			obj("name", "limited", "upstreams", []string{"limited"}),
			obj("name", "own", "upstreams", []string{"own"}),
			obj("name", "mixed", "upstreams", []string{"limited", "held", "free"}),
		},
		// A pool no model names yet: the status and the page list it.
		"pools", []map[string]any{obj("id", "pair", "upstreams", []string{"free", "own"})},
	)
	v.p = startProxy(t, handler)
	if len(next) > 0 {
		for _, n := range next {
			v.p.next = append(v.p.next, n(v.p))
		}
		v.p.load(handler) // before any request: nothing is in flight yet
	}
	t.Cleanup(func() { v.gate.open(); v.flaky.open() })

	// Five concurrent failures: the backoff doubles to 16 s (1, 2, 4, 8, 16).
	var fails []<-chan result
	for range 5 {
		fails = append(fails, v.p.goChat(context.Background(), chatBody("flaky", false)))
	}
	v.flaky.waitArrivals(t, 5)
	v.flaky.open()
	for _, ch := range fails {
		if r := await(t, ch); r.status != http.StatusServiceUnavailable {
			t.Fatalf("flaky request: status %d, want 503: %s", r.status, r.body)
		}
	}
	// A 429 with Retry-After: 120 s, in a backoff scope and without one.
	for _, m := range []string{"limited", "own"} {
		if resp := v.p.chat(chatBody(m, false)); readAll(t, resp) == "" || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s request: status %d, want 503", m, resp.StatusCode)
		}
	}
	// Hold the only slot of "held".
	ctx, cancel := context.WithCancel(context.Background())
	v.cancel = cancel
	t.Cleanup(cancel)
	v.held = v.p.goChat(ctx, chatBody("chat", false))
	v.gate.waitArrivals(t, 1)
	return v
}

// TestAdminStatusReflectsLiveState checks every field the status answer documents
// against slots, backoffs and holds made by real requests.
func TestAdminStatusReflectsLiveState(t *testing.T) {
	v := startVisibility(t)
	s, raw := v.p.status()

	// Raw member names, null included (a pointer decoding hides absence).
	for _, key := range []string{`"upstreams":[`, `"providers":[`, `"models":[`, `"sessions":`, `"config_loaded_at":"`,
		`"limit":null`, `"cooling_reason":null`, `"capacity":null`, `"draining":false`, `"queue_depth":`} {
		if !strings.Contains(raw, key) {
			t.Errorf("status lacks %s: %s", key, raw)
		}
	}
	if s.ConfigLoadedAt == nil {
		t.Fatal("config_loaded_at is null with a running config")
	}
	if loaded, err := time.Parse(time.RFC3339Nano, *s.ConfigLoadedAt); err != nil || time.Since(loaded) > time.Minute || time.Since(loaded) < 0 {
		t.Errorf("config_loaded_at = %s (%v), want a moment ago", *s.ConfigLoadedAt, err)
	}

	held := s.upstream(t, "held")
	if held.Provider != "p-held" || held.Model != "real-held" || held.Inflight != 1 || held.Limit == nil || *held.Limit != 1 ||
		held.CoolingReason != nil || held.CoolingSeconds != 0 || held.FailStreak != 0 || held.Draining {
		t.Errorf("held = %+v, want p-held/real-held 1/1 in use, not cooling", held)
	}

	flaky := s.upstream(t, "flaky")
	if reason(flaky.CoolingReason) != "failure" || flaky.FailStreak != 5 {
		t.Errorf("flaky: reason %s streak %d, want failure after 5", reason(flaky.CoolingReason), flaky.FailStreak)
	}
	if flaky.CoolingSeconds < 8 || flaky.CoolingSeconds > 16 {
		t.Errorf("flaky cooling_seconds = %v, want the 16 s period (minus the time the test took)", flaky.CoolingSeconds)
	}
	if flaky.LastFailureAt == nil {
		t.Error("flaky last_failure_at is null after failures")
	}
	if flaky.Limit != nil {
		t.Errorf("flaky limit = %d, want null (unlimited)", *flaky.Limit)
	}

	for _, id := range []string{"limited", "own"} {
		u := s.upstream(t, id)
		if reason(u.CoolingReason) != "retry_after" || u.CoolingSeconds < 100 || u.CoolingSeconds > 120 {
			t.Errorf("%s: reason %s cooling %v, want retry_after ≈120 s", id, reason(u.CoolingReason), u.CoolingSeconds)
		}
	}
	free := s.upstream(t, "free")
	if free.Inflight != 0 || *free.Limit != 2 || free.CoolingReason != nil {
		t.Errorf("free = %+v, want 0/2, available", free)
	}

	provInflight := map[string]int64{}
	for _, pr := range s.Providers {
		provInflight[pr.ID] = pr.Inflight
		if pr.Capacity != nil {
			t.Errorf("provider %s capacity = %d, want null", pr.ID, *pr.Capacity)
		}
	}
	if len(s.Providers) != 5 || provInflight["p-held"] != 1 || provInflight["p-free"] != 0 {
		t.Errorf("providers inflight = %v, want 5 providers, p-held 1", provInflight)
	}
	var models []string
	for _, m := range s.Models {
		models = append(models, m.Name+"="+strings.Join(m.Upstreams, ","))
	}
	if got := strings.Join(models, " "); got != "chat=held flaky=flaky limited=limited own=own mixed=limited,held,free" {
		t.Errorf("models = %s", got)
	}

	// The prober keeps failing on flaky (the gate is open: it answers 500).
	eventually(t, 15*time.Second, "a failed probe on flaky in the status", func() bool {
		s, _ := v.p.status()
		return s.upstream(t, "flaky").Probes.Fail >= 1
	})

	// Releasing the slot shows at once.
	v.gate.open()
	if r := await(t, v.held); r.status != http.StatusOK {
		t.Fatalf("held request: %d %s", r.status, r.body)
	}
	eventually(t, 5*time.Second, "held back to 0/1", func() bool {
		s, _ := v.p.status()
		return s.upstream(t, "held").Inflight == 0
	})
}

// TestAdminExplainVerdicts checks the per-upstream verdicts and the choice.
func TestAdminExplainVerdicts(t *testing.T) {
	v := startVisibility(t)

	e := v.p.explain("mixed")
	if e.Model != "mixed" || e.Choice == nil || *e.Choice != "free" || e.Outcome != "upstream" ||
		e.verdicts() != "limited=cooling held=busy free=available" {
		t.Fatalf("explain mixed = %+v", e)
	}
	if d := e.Upstreams[0].Detail; !strings.Contains(d, "retry_after") || !strings.HasPrefix(d, "cooling 1") {
		t.Errorf("limited detail = %q, want cooling ≈120s (retry_after)", d)
	}
	if d := e.Upstreams[1].Detail; !strings.Contains(d, "1/1") {
		t.Errorf("held detail = %q, want 1/1", d)
	}
	if d := e.Upstreams[2].Detail; !strings.Contains(d, "would take it") || !strings.Contains(d, "0/2") {
		t.Errorf("free detail = %q", d)
	}

	if e := v.p.explain("chat"); e.Choice != nil || e.Outcome != "queue" || e.verdicts() != "held=busy" {
		t.Errorf("explain chat = %+v, want held busy, the request would queue", e)
	}
	if e := v.p.explain("flaky"); e.Choice != nil || e.Outcome != "cooling" || !strings.Contains(e.Upstreams[0].Detail, "failure") {
		t.Errorf("explain flaky = %+v, want cooling (failure)", e)
	}

	// The request explain predicted goes where it said.
	resp := v.p.chat(chatBody("mixed", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "hello") {
		t.Errorf("mixed request: %d %s, want the free upstream's answer", resp.StatusCode, body)
	}

	// Errors: unknown model is the OpenAI 404; bad input is a 400.
	expectAPIError(t, v.p.adminGet("/llm_route/explain?model=nope"), http.StatusNotFound, "model_not_found")
	expectAPIError(t, v.p.adminGet("/llm_route/explain"), http.StatusBadRequest, "missing_model")
	expectAPIError(t, v.p.adminGet("/llm_route/explain?model=chat&tokens=lots"), http.StatusBadRequest, "invalid_tokens")
	resp = v.p.adminGet("/llm_route/explain?model=chat&tokens=5000")
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"tokens":5000`) {
		t.Errorf("explain with tokens: %d %s", resp.StatusCode, body)
	}
}

// adminLLMMetrics is the llm_proxy_ part of a scrape (Caddy's own admin metrics
// count the admin requests themselves).
func adminLLMMetrics(p *proxy) string {
	var keep []string
	for _, line := range strings.Split(p.metrics(), "\n") {
		if strings.HasPrefix(line, "llm_proxy_") && !strings.HasPrefix(line, "llm_proxy_upstream_cooling_seconds") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// TestAdminReadsChangeNothing: explain, status and the page claim no slot,
// admit no waiter and touch no counter, even with a request queued.
func TestAdminReadsChangeNothing(t *testing.T) {
	v := startVisibility(t)
	queued := v.p.goChat(context.Background(), chatBody("chat", false))
	eventually(t, 5*time.Second, "one request queued", func() bool {
		s, _ := v.p.status()
		for _, m := range s.Models {
			if m.Name == "chat" {
				return m.QueueDepth == 1
			}
		}
		return false
	})

	// cooling_seconds and last_failure move on their own; compare the rest.
	stable := func(s statusJSON) string {
		for i := range s.Upstreams {
			s.Upstreams[i].CoolingSeconds = 0
			s.Upstreams[i].Probes.OK, s.Upstreams[i].Probes.Fail = 0, 0
		}
		b, _ := json.Marshal(s)
		return string(b)
	}
	before, _ := v.p.status()
	metricsBefore := adminLLMMetrics(v.p)
	for range 20 {
		for _, m := range []string{"chat", "mixed", "flaky", "limited", "own"} {
			v.p.explain(m)
		}
		readAll(t, v.p.adminGet("/llm_route/"))
		v.p.status()
	}
	after, _ := v.p.status()
	if a, b := stable(after), stable(before); a != b {
		t.Errorf("status changed across explain/status/page reads:\nbefore %s\nafter  %s", b, a)
	}
	// Probe counters may move (the prober runs); everything else must not.
	dropProbes := func(s string) string {
		var keep []string
		for _, l := range strings.Split(s, "\n") {
			if !strings.HasPrefix(l, "llm_proxy_probe_pings_total") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	if a, b := dropProbes(adminLLMMetrics(v.p)), dropProbes(metricsBefore); a != b {
		t.Errorf("llm_proxy_ metrics changed across admin reads:\nbefore\n%s\nafter\n%s", b, a)
	}
	if s, _ := v.p.status(); s.upstream(t, "held").Inflight != 1 {
		t.Error("the held slot changed hands during the reads")
	}

	// The queued request still gets the slot when it frees.
	v.gate.open()
	for _, ch := range []<-chan result{v.held, queued} {
		if r := await(t, ch); r.status != http.StatusOK {
			t.Errorf("request: %d %s", r.status, r.body)
		}
	}
}

// TestAdminStatusShowsDrainingUpstream: an upstream a reload removed stays in
// the status, draining, until its last request ends.
func TestAdminStatusShowsDrainingUpstream(t *testing.T) {
	g := newGate()
	up := newUpstream(t, g.handler(completion("late")))
	other := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 1))
	defer g.open()
	held := p.goChat(context.Background(), chatBody("m", false))
	g.waitArrivals(t, 1)

	p.load(cfg([]map[string]any{obj("id", "p2", "url", other.base())},
		[]map[string]any{obj("id", "u2", "provider", "p2", "model", "x")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"u2"})}))
	s, _ := p.status()
	u1 := s.upstream(t, "u1")
	if !u1.Draining || u1.Inflight != 1 || u1.Provider != "p1" {
		t.Errorf("u1 after the reload = %+v, want draining with 1 in flight", u1)
	}
	if s.upstream(t, "u2").Draining {
		t.Error("u2 of the new config is marked draining")
	}
	if len(s.Models) != 1 || s.Models[0].Name != "m" || strings.Join(s.Models[0].Upstreams, ",") != "u2" {
		t.Errorf("models after the reload = %+v, want only the new config's m → u2", s.Models)
	}

	g.open()
	if r := await(t, held); r.status != http.StatusOK {
		t.Fatalf("draining request: %d %s", r.status, r.body)
	}
	eventually(t, 5*time.Second, "u1 to leave the status once drained", func() bool {
		s, _ := p.status()
		return !s.hasUpstream("u1")
	})
}

// TestAdminOnlyOnAdminListener: the site port does not answer the admin
// paths; the admin listener does, with its origin check in force.
func TestAdminOnlyOnAdminListener(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 1))
	p.next = []any{obj("handler", "static_response", "status_code", 404, "body", "site")}
	p.load(basicConfig(up, 1))
	for _, path := range []string{"/llm_route/status", "/llm_route/explain?model=m", "/llm_route/"} {
		resp := p.get(path)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusNotFound || body != "site" {
			t.Errorf("site port %s: %d %q, want the site's own 404", path, resp.StatusCode, body)
		}
		resp = p.adminGet(path)
		body = readAll(t, resp)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "u1") {
			t.Errorf("admin %s: %d %q", path, resp.StatusCode, body)
		}
	}
	// A foreign origin is refused by Caddy's admin checks before ours.
	req, _ := http.NewRequest(http.MethodGet, p.admin+"/llm_route/status", nil)
	req.Header.Set("Origin", "http://evil.example")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusForbidden || strings.Contains(body, "u1") {
		t.Errorf("foreign origin: %d %s, want 403", resp.StatusCode, body)
	}
	// Writes are not served.
	resp, err = testClient.Post(p.admin+"/llm_route/status", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if readAll(t, resp); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST status: %d, want 405", resp.StatusCode)
	}
}

// TestAdminPageRendersWithoutScript: the page is complete HTML from the
// server (readable with JavaScript off), under a strict CSP, and its assets
// are served beside it.
func TestAdminPageRendersWithoutScript(t *testing.T) {
	v := startVisibility(t)
	resp := v.p.adminGet("/llm_route/")
	page := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("page: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.HasPrefix(csp, "default-src 'self'") {
		t.Errorf("CSP = %q", csp)
	}
	for _, want := range []string{
		`<tr data-upstream="held"`, `<span class="slot-count">1/1</span>`,
		`<tr data-upstream="limited" class="cooling-row">`, `(retry_after)</td>`,
		`<tr data-upstream="flaky" class="cooling-row">`, `(failure)</td>`,
		`<td class="fail-streak">5</td>`, `<span class="slot-count">0/∞</span>`,
		`<tr data-model="chat">`, `0 waiting (of 2)`, `held → free`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	for _, banned := range []string{"<style", "style=", "<script>", "onclick", "http://", "https://"} {
		if strings.Contains(page, banned) {
			t.Errorf("page contains %q, which a strict CSP or self-containment forbids", banned)
		}
	}
	for path, ctype := range map[string]string{"/llm_route/page.js": "text/javascript", "/llm_route/page.css": "text/css"} {
		resp := v.p.adminGet(path)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), ctype) || len(body) < 100 {
			t.Errorf("%s: %d %s (%d bytes)", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
		}
	}
	if resp := v.p.adminGet("/llm_route/nothing"); readAll(t, resp) == "" || resp.StatusCode != http.StatusNotFound {
		t.Errorf("/llm_route/nothing: %d, want 404", resp.StatusCode)
	}
}
