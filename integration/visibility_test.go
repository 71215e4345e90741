package integration

import (
	"net/http"
	"testing"
	"time"
)

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
	// An attempt records its metrics just after the client read its last
	// byte: wait for both.
	eventually(t, 5*time.Second, "both requests recorded", func() bool {
		return p.metric("llm_proxy_request_duration_seconds_count", "model", "m", "upstream", "u1", "provider", "p1", "result", "ok") == 2
	})
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
