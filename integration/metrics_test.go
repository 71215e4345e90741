package integration

// Issue #3: the llm_proxy_* metrics at Caddy's admin /metrics, across
// reloads and with two llm_route handlers in one config.

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// scrape fetches the admin /metrics and fails the test unless it is served.
func scrape(t *testing.T, p *proxy) string {
	t.Helper()
	resp, err := testClient.Get(p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("admin /metrics: status %d, %v: %s", resp.StatusCode, err, b)
	}
	return string(b)
}

func TestMetricsFamiliesAndReload(t *testing.T) {
	// The first call fails; everything after it (probes included) succeeds.
	var calls atomic.Int64
	flaky := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			status(500)(w, r)
			return
		}
		completion("recovered")(w, r)
	})
	good := newUpstream(t, nil)
	conf := func(patch bool) map[string]any {
		c := cfg(
			[]map[string]any{
				obj("id", "mp1", "url", flaky.base(), "backoff", "1m", "probe_interval", "50ms"),
				obj("id", "mp2", "url", good.base()),
			},
			[]map[string]any{
				obj("id", "mu1", "provider", "mp1", "model", "x", "max_concurrency", 2),
				obj("id", "mu2", "provider", "mp2", "model", "y"),
			},
			[]map[string]any{obj("name", "mm", "upstreams", []string{"mu1", "mu2"})},
		)
		if patch {
			c["models"] = []any{obj("name", "mm", "upstreams", []string{"mu1", "mu2"}, "patch", obj("v", 2))}
		}
		return c
	}
	p := startProxy(t, conf(false))
	fail0 := p.requests("mm", "mu1", "mp1", "5xx")
	ok0 := p.requests("mm", "mu2", "mp2", "ok")
	probe0 := p.metric("llm_proxy_probe_pings_total", "upstream", "mu1", "provider", "mp1", "result", "ok")

	resp := p.chat(chatBody("mm", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	// mu1 is cooling; the prober finds it healthy again.
	eventually(t, 5*time.Second, "a successful probe", func() bool {
		return p.metric("llm_proxy_probe_pings_total", "upstream", "mu1", "provider", "mp1", "result", "ok")-probe0 >= 1
	})

	text := scrape(t, p)
	for _, fam := range []string{
		"# TYPE llm_proxy_requests_total counter",
		"# TYPE llm_proxy_probe_pings_total counter",
		"# TYPE llm_proxy_upstream_inflight gauge",
		"# TYPE llm_proxy_upstream_fail_streak gauge",
		"# TYPE llm_proxy_upstream_cooling_seconds gauge",
		series("llm_proxy_upstream_inflight", "upstream", "mu1", "provider", "mp1") + " 0",
		series("llm_proxy_upstream_fail_streak", "upstream", "mu1", "provider", "mp1") + " 0",
		series("llm_proxy_upstream_cooling_seconds", "upstream", "mu1", "provider", "mp1") + " 0",
	} {
		if !strings.Contains(text, fam) {
			t.Errorf("admin /metrics lacks %q", fam)
		}
	}
	if got := p.requests("mm", "mu1", "mp1", "5xx") - fail0; got != 1 {
		t.Errorf("5xx on mu1 = %v, want 1", got)
	}
	if got := p.requests("mm", "mu2", "mp2", "ok") - ok0; got != 1 {
		t.Errorf("ok on mu2 = %v, want 1", got)
	}

	// Across a reload the counters continue: same values, then counting on.
	before5xx, beforeOK := p.requests("mm", "mu1", "mp1", "5xx"), p.requests("mm", "mu2", "mp2", "ok")
	beforeOK1 := p.requests("mm", "mu1", "mp1", "ok")
	p.load(conf(true))
	if a, b := p.requests("mm", "mu1", "mp1", "5xx"), p.requests("mm", "mu2", "mp2", "ok"); a != before5xx || b != beforeOK {
		t.Errorf("after reload: 5xx %v ok %v, want %v %v", a, b, before5xx, beforeOK)
	}
	resp = p.chat(chatBody("mm", true))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got := p.requests("mm", "mu1", "mp1", "ok") - beforeOK1; got != 1 {
		t.Errorf("ok on mu1 after reload = %v, want 1 more", got)
	}
	if c := flaky.Calls(); !strings.Contains(string(c[len(c)-1].Body), `"v":2`) {
		t.Errorf("the request after the reload did not use the new config: %s", c[len(c)-1].Body)
	}
	for _, u := range [][2]string{{"mu1", "mp1"}, {"mu2", "mp2"}} {
		if got := p.upstreamGauge("inflight", u[0], u[1]); got != 0 {
			t.Errorf("inflight %s = %v, want 0", u[0], got)
		}
	}
}

func TestTwoHandlersInOneConfig(t *testing.T) {
	g := newGate()
	defer g.open()
	up := newUpstream(t, g.handler(completion("ok")))
	handler := func(model string) map[string]any {
		return llmHandler(cfg(
			[]map[string]any{obj("id", "tp", "url", up.base())},
			// The same upstream id in both handlers: one set of slots.
			[]map[string]any{obj("id", "tu", "provider", "tp", "model", "x", "max_concurrency", 1)},
			[]map[string]any{obj("name", model, "upstreams", []string{"tu"})},
		))
	}
	routes := []any{
		obj("match", []any{obj("path", []string{"/a/*"})}, "handle", []any{handler("ma")}),
		obj("match", []any{obj("path", []string{"/b/*"})}, "handle", []any{handler("mb")}),
	}
	p := startProxy(t, basicConfig(up, 1))
	for i := 0; i < 3; i++ { // load, then reload twice
		if err := p.loadRoutes(routes); err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
	}
	scrape(t, p)

	post := func(path, model string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, p.URL+path, strings.NewReader(chatBody(model, false)))
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	held := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, p.URL+"/a/v1/chat/completions",
			strings.NewReader(chatBody("ma", false)))
		resp, err := testClient.Do(req)
		if err != nil {
			held <- nil
			return
		}
		held <- resp
	}()
	g.waitArrivals(t, 1)
	// Handler B shares the slot that handler A's request holds.
	expectAPIError(t, post("/b/v1/chat/completions", "mb"), http.StatusServiceUnavailable, "all_upstreams_busy")
	// Each handler knows only its own models.
	expectAPIError(t, post("/b/v1/chat/completions", "ma"), http.StatusNotFound, "model_not_found")
	g.open()
	resp := <-held
	if resp == nil {
		t.Fatal("held request failed")
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("held request: %d %s", resp.StatusCode, body)
	}
	resp = post("/b/v1/chat/completions", "mb")
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("handler B: %d %s", resp.StatusCode, body)
	}
	text := scrape(t, p)
	if !strings.Contains(text, series("llm_proxy_requests_total", "model", "mb", "upstream", "tu", "provider", "tp", "result", "ok")) {
		t.Error("handler B's request is not in the metrics")
	}
	if !strings.Contains(text, series("llm_proxy_upstream_inflight", "upstream", "tu", "provider", "tp")+" 0") {
		t.Error("the shared upstream's inflight gauge is missing or not 0")
	}
}
