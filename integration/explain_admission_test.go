package integration

// Explain predicts what admission does: for each case below, the outcome
// GET /llm_route/explain gives is then checked against what a real request
// gets.

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// coolFor puts the model's only upstream into a Retry-After cooling of a
// minute: one request gets its 429 (and the proxy's 503).
func coolFor(t *testing.T, p *proxy, model string) {
	t.Helper()
	resp := p.chat(chatBody(model, false))
	if b := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("cooling request: %d %s", resp.StatusCode, b)
	}
}

// TestExplainCoolingWithoutQueueTimeout: every upstream cooling, a queue
// with room and no queue_timeout (0: wait until the client goes away). A
// request waits for the cooling to end, so explain must say "queue", not
// "cooling".
func TestExplainCoolingWithoutQueueTimeout(t *testing.T) {
	up := newUpstream(t, status(http.StatusTooManyRequests, "Retry-After", "60"))
	p := startProxy(t, queueConfig(up, 1, 4, "0s"))
	coolFor(t, p, "m")

	e := p.explain("m")
	if e.verdicts() != "u1=cooling" || e.Outcome != "queue" {
		t.Errorf("explain = %+v, want u1 cooling and outcome queue (queue_timeout 0 waits)", e)
	}
	// What admission really does: the request waits in the queue.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := p.goChat(ctx, chatBody("m", false))
	for deadline := time.Now().Add(10 * time.Second); p.queueDepth("m") != 1; time.Sleep(5 * time.Millisecond) {
		select {
		case r := <-waiting:
			t.Fatalf("request answered %d %s, want it queued", r.status, r.body)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the request did not queue")
		}
	}
	cancel()
	<-waiting
}

// TestExplainCoolingBeyondQueueTimeout: the same with a queue_timeout
// shorter than the cooling: a request gets the cooling 503 at once, and
// explain says "cooling".
func TestExplainCoolingBeyondQueueTimeout(t *testing.T) {
	up := newUpstream(t, status(http.StatusTooManyRequests, "Retry-After", "60"))
	p := startProxy(t, queueConfig(up, 1, 4, "2s"))
	coolFor(t, p, "m")

	if e := p.explain("m"); e.verdicts() != "u1=cooling" || e.Outcome != "cooling" {
		t.Errorf("explain = %+v, want outcome cooling", e)
	}
	expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_cooling")
}

// TestExplainCoolingQueueFull: every upstream cooling, no queue_timeout,
// and the queue full: admission answers queue_full (it checks the cooling
// against the queue_timeout first, and there is none), so explain says
// "busy", not "cooling".
func TestExplainCoolingQueueFull(t *testing.T) {
	up := newUpstream(t, status(http.StatusTooManyRequests, "Retry-After", "60"))
	p := startProxy(t, queueConfig(up, 1, 1, "0s"))
	coolFor(t, p, "m")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := p.goChat(ctx, chatBody("m", false))
	eventually(t, 10*time.Second, "one request queued", func() bool { return p.queueDepth("m") == 1 })

	if e := p.explain("m"); e.Outcome != "busy" || e.QueueDepth != 1 {
		t.Errorf("explain = %+v, want outcome busy (the queue is full)", e)
	}
	expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "queue_full")
	cancel()
	<-waiting
}
