package integration

// Issue 13 item 2: X-LLM-Route-* headers, x-request-id on the
// proxy's answers, "param": null in its error bodies.

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// twoUpstreams routes model m to gpu (limit 1) then cloud (limit 4, 30 s
// backoff so a failure keeps it cooling for the whole test).
func twoUpstreams(gpu, cloud *fakeUpstream, extra ...any) map[string]any {
	h := obj(
		"providers", []any{
			obj("id", "pg", "url", gpu.base(), "key", "sk-test-secret-1"),
			obj("id", "pc", "url", cloud.base(), "key", "sk-test-secret-2", "backoff", "30s", "probe_interval", "0s"),
		},
		"upstreams", []any{
			obj("id", "gpu", "provider", "pg", "model", "real-model", "max_concurrency", 1),
			obj("id", "cloud", "provider", "pc", "model", "real-model", "max_concurrency", 4),
		},
		"models", []any{obj("name", "m", "upstreams", []string{"gpu", "cloud"})},
	)
	for i := 0; i+1 < len(extra); i += 2 {
		h[extra[i].(string)] = extra[i+1]
	}
	return h
}

func TestRouteHeadersOnAnswers(t *testing.T) {
	gpu := newUpstream(t, completion("from gpu"))
	cloud := newUpstream(t, completion("from cloud"))
	p := startProxy(t, twoUpstreams(gpu, cloud))

	resp := p.chat(`{"model":"m","messages":[]}`)
	readAll(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Route-Upstream") != "gpu" || resp.Header.Get("X-LLM-Route-Attempts") != "1" {
		t.Fatalf("status %d upstream %q attempts %q, want 200 gpu 1", resp.StatusCode,
			resp.Header.Get("X-LLM-Route-Upstream"), resp.Header.Get("X-LLM-Route-Attempts"))
	}
	// The upstream's own x-request-id (the fake sends req-123) reaches the
	// client: it is the one the provider's support can look up.
	if id := resp.Header.Get("X-Request-Id"); id != "req-123" {
		t.Errorf("x-request-id %q, want the upstream's", id)
	}

	// gpu fails: cloud answers on the second attempt.
	gpu.setHandler(status(500))
	resp = p.chat(`{"model":"m","messages":[]}`, "X-Request-Id", "client-id-42")
	readAll(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Route-Upstream") != "cloud" || resp.Header.Get("X-LLM-Route-Attempts") != "2" {
		t.Fatalf("status %d upstream %q attempts %q, want 200 cloud 2", resp.StatusCode,
			resp.Header.Get("X-LLM-Route-Upstream"), resp.Header.Get("X-LLM-Route-Attempts"))
	}

	// A proxy-made answer carries a new id, or the client's.
	resp = p.chat(`{"model":"nope"}`)
	readAll(t, resp)
	if id := resp.Header.Get("X-Request-Id"); resp.StatusCode != 404 || !regexp.MustCompile(`^llmr-[0-9a-f]{32}$`).MatchString(id) {
		t.Errorf("unknown model: status %d x-request-id %q, want 404 and a generated id", resp.StatusCode, id)
	}
	resp = p.chat(`{"model":"nope"}`, "X-Request-Id", "client-id-42")
	readAll(t, resp)
	if id := resp.Header.Get("X-Request-Id"); id != "client-id-42" {
		t.Errorf("x-request-id %q, want the client's", id)
	}
}

func TestRouteHeadersSkippedOn503(t *testing.T) {
	release := make(chan struct{})
	gpu := newUpstream(t, hang(release))
	cloud := newUpstream(t, status(429, "Retry-After", "30"))
	p := startProxy(t, twoUpstreams(gpu, cloud))
	defer close(release)

	// Hold gpu's only slot.
	held := make(chan struct{})
	go func() {
		defer close(held)
		if resp, err := p.post(t.Context(), `{"model":"m","messages":[]}`); err == nil {
			resp.Body.Close()
		}
	}()
	eventually(t, 10*time.Second, "gpu slot held", func() bool { return len(gpu.Calls()) == 1 })

	// cloud refuses for 30 s: nobody is left.
	resp := p.chat(`{"model":"m","messages":[]}`)
	body := readAll(t, resp)
	if resp.StatusCode != 503 {
		t.Fatalf("status %d, want 503: %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("X-LLM-Route-Skipped"); !regexp.MustCompile(`^gpu=busy 1/1, cloud=failed \S+ 429$`).MatchString(got) {
		t.Errorf("skipped %q, want gpu busy and cloud's failure", got)
	}
	if resp.Header.Get("X-LLM-Route-Upstream") != "" || resp.Header.Get("X-LLM-Route-Attempts") != "1" {
		t.Errorf("upstream %q attempts %q on a 503 after one attempt", resp.Header.Get("X-LLM-Route-Upstream"), resp.Header.Get("X-LLM-Route-Attempts"))
	}
	if !strings.Contains(body, `"param":null`) || resp.Header.Get("X-Request-Id") == "" {
		t.Errorf("503 lacks param null or x-request-id: %q %q", body, resp.Header.Get("X-Request-Id"))
	}

	// Now cloud is cooling and gpu still busy: refused without an attempt.
	resp = p.chat(`{"model":"m","messages":[]}`)
	body = readAll(t, resp)
	if resp.StatusCode != 503 {
		t.Fatalf("status %d, want 503: %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("X-LLM-Route-Skipped"); !regexp.MustCompile(`^gpu=busy 1/1, cloud=cooling (29|30)s$`).MatchString(got) {
		t.Errorf("skipped %q, want gpu busy and cloud cooling ~30s", got)
	}
	if a := resp.Header.Get("X-LLM-Route-Attempts"); a != "" {
		t.Errorf("attempts %q on a 503 made before any attempt", a)
	}
}

func TestRouteHeadersOff(t *testing.T) {
	release := make(chan struct{})
	gpu := newUpstream(t, completion("from gpu"))
	cloud := newUpstream(t, hang(release))
	defer close(release)
	p := startProxy(t, twoUpstreams(gpu, cloud, "route_headers", false))

	resp := p.chat(`{"model":"m","messages":[]}`)
	readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for k := range resp.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-llm-route-") {
			t.Errorf("route_headers false, yet %s: %q", k, resp.Header.Get(k))
		}
	}

	// A proxy-made error still carries the request id and param null.
	resp = p.chat(`{"model":"nope","messages":[]}`, "X-Request-Id", "abc")
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("X-Request-Id") != "abc" || !strings.Contains(body, `"param":null`) {
		t.Errorf("unknown model: %d id %q body %s", resp.StatusCode, resp.Header.Get("X-Request-Id"), body)
	}
}

// TestRouteHeadersSkippedForSize: X-LLM-Route-Skipped names the upstreams a
// request was too large for (`id=context_window N`, N its window) and
// those whose provider had no long-context slot free (`id=long_context
// inflight/limit`), in the model's order, next to the other reasons; the
// proxy's own context-length 400 lists every upstream as too small.
func TestRouteHeadersSkippedForSize(t *testing.T) {
	small := newUpstream(t, completion("small"))
	big := newUpstream(t, status(http.StatusInternalServerError))
	g := newGate()
	long := newUpstream(t, g.handler(completion("long")))
	t.Cleanup(g.open)
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "sz-p", "url", small.base()),
			obj("id", "sz-q", "url", big.base(), "backoff", "30s", "probe_interval", "0s"),
			obj("id", "sz-g", "url", long.base(), "long_context_capacity", 1),
		},
		[]map[string]any{
			obj("id", "sz-s", "provider", "sz-p", "model", "s", "context_window", 1000),
			obj("id", "sz-b", "provider", "sz-q", "model", "b", "context_window", 8000),
			obj("id", "sz-l", "provider", "sz-g", "model", "l", "max_concurrency", 4),
		},
		[]map[string]any{
			obj("name", "sz", "upstreams", []string{"sz-s", "sz-b"}),
			obj("name", "sz-small", "upstreams", []string{"sz-s"}),
			obj("name", "sz-long", "upstreams", []string{"sz-s", "sz-l"}, "queue_size", 0),
		},
		"long_context_threshold", 500, "request_timeout", "20s",
	))

	// Too large for sz-s; sz-b fails: a 503 naming both reasons.
	resp := p.chat(longChat("sz", 2000, 0))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503: %s", resp.StatusCode, body)
	}
	if got, want := resp.Header.Get("X-LLM-Route-Skipped"), "sz-s=context_window 1000, sz-b=failed 5xx 500"; got != want {
		t.Errorf("skipped %q, want %q", got, want)
	}
	if n := len(small.Calls()); n != 0 {
		t.Errorf("the small upstream got %d calls for a prompt it cannot hold", n)
	}

	// No upstream large enough: the proxy's 400 says so for each.
	resp = p.chat(longChat("sz-small", 2000, 0))
	expectAPIError(t, resp, http.StatusBadRequest, "context_length_exceeded")
	if got, want := resp.Header.Get("X-LLM-Route-Skipped"), "sz-s=context_window 1000"; got != want {
		t.Errorf("skipped on the context-length 400: %q, want %q", got, want)
	}

	// sz-l's provider has one long slot; a long request holds it, the
	// next one finds sz-s too small and sz-l without a long slot.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := p.goChat(ctx, longChat("sz-long", 2000, 0))
	g.waitArrivals(t, 1)
	start := time.Now()
	resp = p.chat(longChat("sz-long", 2000, 0))
	body = readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503: %s", resp.StatusCode, body)
	}
	if got, want := resp.Header.Get("X-LLM-Route-Skipped"), "sz-s=context_window 1000, sz-l=long_context 1/1"; got != want {
		t.Errorf("skipped with the long slot taken: %q, want %q", got, want)
	}
	t.Logf("long request with the one long-context slot taken, no queue: 503 after %v", time.Since(start).Round(time.Millisecond))
	g.open()
	if r := await(t, held); r.status != http.StatusOK {
		t.Errorf("held long request: %d %s", r.status, r.body)
	}
}

// TestRouteHeadersSkippedAtProviderCapacity: an upstream with slots free
// whose provider is at its capacity is named `id=provider_capacity n/cap`,
// not busy.
func TestRouteHeadersSkippedAtProviderCapacity(t *testing.T) {
	g := newGate()
	up := newUpstream(t, g.handler(completion("held")))
	t.Cleanup(g.open)
	conf := capacityConfig(up, "ua")
	conf["queue_size"] = 0
	p := startProxy(t, conf)
	held := p.goChat(context.Background(), chatBody("a", false))
	g.waitArrivals(t, 1)
	resp := p.chat(chatBody("b", false))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503: %s", resp.StatusCode, body)
	}
	if got, want := resp.Header.Get("X-LLM-Route-Skipped"), "ub=provider_capacity 1/1"; got != want {
		t.Errorf("skipped %q, want %q", got, want)
	}
	g.open()
	if r := await(t, held); r.status != http.StatusOK {
		t.Errorf("held request: %d %s", r.status, r.body)
	}
}
