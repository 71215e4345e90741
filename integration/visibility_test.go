package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
)

// TestRouteHeaders: a proxied answer names the upstream that answered and
// the attempt count; after a failover both are the last attempt's.
func TestRouteHeaders(t *testing.T) {
	bad := newUpstream(t, status(500))
	good := newUpstream(t, completion("hi"))
	cfg := map[string]any{
		"providers": []any{
			map[string]any{"id": "pa", "url": bad.base()},
			map[string]any{"id": "pb", "url": good.base()},
		},
		"upstreams": []any{
			map[string]any{"id": "ua", "provider": "pa", "model": "x"},
			map[string]any{"id": "ub", "provider": "pb", "model": "x"},
		},
		"models": []any{map[string]any{"name": "m", "upstreams": []string{"ua", "ub"}}},
	}
	p := startProxy(t, cfg)
	resp := p.chat(chatBody("m", false))
	readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status = %d", resp.StatusCode)
	}
	if got := resp.Header.Get("X-LLM-Route-Upstream"); got != "ub" {
		t.Errorf("X-LLM-Route-Upstream = %q, want ub", got)
	}
	if got := resp.Header.Get("X-LLM-Route-Attempts"); got != "2" {
		t.Errorf("X-LLM-Route-Attempts = %q, want 2", got)
	}
	if got := resp.Header.Get("X-LLM-Route-Skipped"); got != "" {
		t.Errorf("X-LLM-Route-Skipped on a success = %q", got)
	}

	// route_headers false removes them.
	cfg["route_headers"] = false
	p.load(cfg)
	resp = p.chat(chatBody("m", false))
	readAll(t, resp)
	for _, h := range []string{"X-LLM-Route-Upstream", "X-LLM-Route-Attempts"} {
		if got := resp.Header.Get(h); got != "" {
			t.Errorf("route_headers false: %s = %q", h, got)
		}
	}
}

// TestRouteHeadersSkipped: the proxy's own 503s say why each upstream was
// passed over, and carry the client's x-request-id (or a new one) and
// "param": null in the error body.
func TestRouteHeadersSkipped(t *testing.T) {
	g := newGate()
	busy := newUpstream(t, g.handler(completion("slow")))
	t.Cleanup(g.open)
	cfg := map[string]any{
		"providers": []any{map[string]any{"id": "p1", "url": busy.base()}},
		"upstreams": []any{map[string]any{"id": "gpu", "provider": "p1", "model": "x", "max_concurrency": 1}},
		"models":    []any{map[string]any{"name": "m", "upstreams": []string{"gpu"}}},
	}
	p := startProxy(t, cfg)
	pending := p.goChat(context.Background(), chatBody("m", false))
	g.waitArrivals(t, 1)

	resp := p.chat(chatBody("m", false), "X-Request-Id", "client-id-42")
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status = %d, body %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("X-LLM-Route-Skipped"); got != "gpu=busy 1/1" {
		t.Errorf("X-LLM-Route-Skipped = %q, want %q", got, "gpu=busy 1/1")
	}
	if got := resp.Header.Get("X-Request-Id"); got != "client-id-42" {
		t.Errorf("x-request-id = %q, want the client's", got)
	}
	var e struct {
		Error map[string]json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatal(err)
	}
	if p, ok := e.Error["param"]; !ok || string(p) != "null" {
		t.Errorf("error body lacks \"param\": null: %s", body)
	}

	// Without the client's id the proxy makes one.
	resp = p.chat(chatBody("m", false))
	readAll(t, resp)
	if id := resp.Header.Get("X-Request-Id"); len(id) < 16 {
		t.Errorf("new x-request-id = %q, want a generated id", id)
	}
	g.open()
	if r := await(t, pending); r.err != nil {
		t.Fatal(r.err)
	}

	// A failed upstream is listed with its result and status.
	fail := newUpstream(t, status(502))
	cfg = map[string]any{
		"providers": []any{map[string]any{"id": "p1", "url": fail.base()}},
		"upstreams": []any{map[string]any{"id": "cloud", "provider": "p1", "model": "x"}},
		"models":    []any{map[string]any{"name": "m", "upstreams": []string{"cloud"}}},
	}
	p.load(cfg)
	resp = p.chat(chatBody("m", false))
	readAll(t, resp)
	if got := resp.Header.Get("X-LLM-Route-Skipped"); got != "cloud=5xx 502" {
		t.Errorf("after a failed attempt X-LLM-Route-Skipped = %q", got)
	}
}

// usageUpstream answers with usage: a body's usage object, or a stream's
// final usage chunk (stream_options.include_usage).
func usageUpstream(w http.ResponseWriter, r *http.Request) {
	const usage = `"usage":{"prompt_tokens":11,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":5},"completion_tokens_details":{"reasoning_tokens":2}}`
	if isStream(r) {
		events := sseChunks("hello there")
		last := events[len(events)-1]
		events = append(events[:len(events)-1],
			`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[],`+usage+"}\n\n", last)
		writeStream(w, events, 0)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],` + usage + `}`))
}

// TestUsageAndLatencyMetrics: tokens are counted from a non-stream body and
// from a stream's usage chunk; TTFT, duration and overhead are observed,
// and the "request completed" log entry carries tokens and ttft.
func TestUsageAndLatencyMetrics(t *testing.T) {
	up := newUpstream(t, usageUpstream)
	p := startProxy(t, basicConfig(up, 4))
	// The overhead histogram has no labels: other tests in this process
	// add to it too.
	overhead0 := p.metric("llm_proxy_overhead_seconds_count")
	for _, stream := range []bool{false, true} {
		resp := p.chat(chatBody("m", stream))
		readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("stream=%v: status %d", stream, resp.StatusCode)
		}
	}
	for typ, want := range map[string]float64{"input": 22, "output": 14, "cached_input": 10, "reasoning": 4} {
		if got := p.metric("llm_proxy_tokens_total", "model", "m", "upstream", "u1", "provider", "p1", "type", typ); got != want {
			t.Errorf("tokens %s = %v, want %v", typ, got, want)
		}
	}
	if got := p.metric("llm_proxy_time_to_first_token_seconds_count", "model", "m", "upstream", "u1", "provider", "p1"); got != 2 {
		t.Errorf("ttft count = %v, want 2", got)
	}
	if got := p.metric("llm_proxy_request_duration_seconds_count", "model", "m", "upstream", "u1", "provider", "p1", "result", "ok"); got != 2 {
		t.Errorf("duration count = %v, want 2", got)
	}
	if got := p.metric("llm_proxy_overhead_seconds_count") - overhead0; got != 2 {
		t.Errorf("overhead count = %v, want 2", got)
	}
	entries := p.logEntries("request completed")
	if len(entries) != 2 {
		t.Fatalf("request completed entries = %d", len(entries))
	}
	for _, e := range entries {
		if e["input_tokens"] != float64(11) || e["output_tokens"] != float64(7) {
			t.Errorf("log entry tokens = %v/%v, want 11/7", e["input_tokens"], e["output_tokens"])
		}
		if ttft, ok := e["ttft"].(float64); !ok || ttft <= 0 {
			t.Errorf("log entry ttft = %v", e["ttft"])
		}
	}
}
