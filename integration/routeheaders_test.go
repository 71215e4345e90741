package integration

// Issue 13 item 2 (SPEC §14): X-LLM-Route-* headers, x-request-id on the
// proxy's answers, "param": null in its error bodies.

import (
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
