package integration

// Issue #14 items 1 and 6: same-upstream retries, Retry-After
// waits, the stream_idle_timeout default. Fake upstreams misbehave the way
// real ones do: a 429 with Retry-After, a single 500, a reset connection.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// firstThen answers the first n calls with fault and every later one with
// then.
func firstThen(n int64, fault, then http.HandlerFunc) http.HandlerFunc {
	var calls atomic.Int64
	return func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= n {
			fault(w, r)
			return
		}
		then(w, r)
	}
}

// answerText returns a non-stream completion's message content.
func answerText(t testing.TB, body string) string {
	t.Helper()
	var c struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &c); err != nil || len(c.Choices) == 0 {
		t.Fatalf("not a completion: %v: %s", err, body)
	}
	return c.Choices[0].Message.Content
}

// retryPair is a model over two upstreams on two providers: first (with
// the given provider settings) and a healthy spare.
func retryPair(prefix string, first, spare *fakeUpstream, firstProvider ...any) map[string]any {
	prov := append([]any{"id", prefix + "-p1", "url", first.base(), "backoff", "30s", "probe_interval", "0s"}, firstProvider...)
	return cfg(
		[]map[string]any{
			obj(prov...),
			obj("id", prefix+"-p2", "url", spare.base()),
		},
		[]map[string]any{
			obj("id", prefix+"-a", "provider", prefix+"-p1", "model", "a", "max_concurrency", 1),
			obj("id", prefix+"-b", "provider", prefix+"-p2", "model", "b"),
		},
		[]map[string]any{obj("name", prefix, "upstreams", []string{prefix + "-a", prefix + "-b"})},
	)
}

// TestRetryAfterWaitedOut: a 429 with Retry-After 2 within retry_after_wait
// 5s is waited out on the same upstream, which then answers; one request,
// no failover, no cooling. A Retry-After of 30 s fails over at once and
// cools the upstream.
func TestRetryAfterWaitedOut(t *testing.T) {
	first := newUpstream(t, nil)
	spare := newUpstream(t, completion("from the spare"))
	p := startProxy(t, retryPair("ra", first, spare, "retry_after_wait", "5s"))

	t.Run("Retry-After 2 waited", func(t *testing.T) {
		first.setHandler(firstThen(1, status(http.StatusTooManyRequests, "Retry-After", "2"), completion("from the first")))
		rate := p.requests("ra", "ra-a", "ra-p1", "429")
		oks := p.requests("ra", "ra-a", "ra-p1", "ok")
		start := time.Now()
		resp := p.chat(chatBody("ra", false))
		body := readAll(t, resp)
		elapsed := time.Since(start)
		if resp.StatusCode != http.StatusOK || answerText(t, body) != "from the first" {
			t.Fatalf("status %d body %s; want the first upstream's answer", resp.StatusCode, body)
		}
		if elapsed < 1800*time.Millisecond || elapsed > 4500*time.Millisecond {
			t.Errorf("answered after %v; want the 2 s Retry-After waited out (≥ 1.8 s, well under 5 s)", elapsed)
		}
		if n := len(first.Calls()); n != 2 {
			t.Errorf("first upstream got %d calls, want 2 (the 429, then the retry)", n)
		}
		if n := len(spare.Calls()); n != 0 {
			t.Errorf("spare got %d calls, want 0 (no failover)", n)
		}
		if got := resp.Header.Get("X-LLM-Route-Upstream"); got != "ra-a" {
			t.Errorf("X-LLM-Route-Upstream = %q, want ra-a", got)
		}
		if got := resp.Header.Get("X-LLM-Route-Attempts"); got != "2" {
			t.Errorf("X-LLM-Route-Attempts = %q, want 2 (the 429, then the retry after the wait)", got)
		}
		t.Logf("429 Retry-After 2 waited out: 200 from the same upstream after %v", elapsed.Round(time.Millisecond))
		if d := p.requests("ra", "ra-a", "ra-p1", "429") - rate; d != 1 {
			t.Errorf("429 counted %v times, want 1 (every attempt counts)", d)
		}
		if d := p.requests("ra", "ra-a", "ra-p1", "ok") - oks; d != 1 {
			t.Errorf("ok counted %v times, want 1", d)
		}
		if c := p.upstreamGauge("cooling_seconds", "ra-a", "ra-p1"); c != 0 {
			t.Errorf("first upstream cooling %vs after the wait succeeded, want 0", c)
		}
		if len(p.logEntries("retrying on the same upstream")) == 0 {
			t.Error("no retry log entry")
		}
	})

	t.Run("Retry-After 30 fails over at once", func(t *testing.T) {
		first.setHandler(status(http.StatusTooManyRequests, "Retry-After", "30"))
		before := len(first.Calls())
		start := time.Now()
		resp := p.chat(chatBody("ra", false))
		body := readAll(t, resp)
		elapsed := time.Since(start)
		if resp.StatusCode != http.StatusOK || answerText(t, body) != "from the spare" {
			t.Fatalf("status %d body %s; want the spare's answer", resp.StatusCode, body)
		}
		if elapsed > 1500*time.Millisecond {
			t.Errorf("failover took %v; a Retry-After above retry_after_wait must fail over at once", elapsed)
		}
		if n := len(first.Calls()) - before; n != 1 {
			t.Errorf("first upstream got %d calls, want 1 (no wait, no retry)", n)
		}
		if got := resp.Header.Get("X-LLM-Route-Attempts"); got != "2" {
			t.Errorf("X-LLM-Route-Attempts = %q, want 2 (the 429, then the spare)", got)
		}
		t.Logf("429 Retry-After 30 (above retry_after_wait): 200 from the spare after %v", elapsed.Round(time.Millisecond))
		if c := p.upstreamGauge("cooling_seconds", "ra-a", "ra-p1"); c < 25 {
			t.Errorf("first upstream cooling %vs, want about the 30 s it asked for", c)
		}
	})
}

// TestRetryAfterWaitBoundedByRequestTimeout: a Retry-After within
// retry_after_wait but beyond what is left of request_timeout fails over
// at once.
func TestRetryAfterWaitBoundedByRequestTimeout(t *testing.T) {
	first := newUpstream(t, status(http.StatusServiceUnavailable, "Retry-After", "3"))
	spare := newUpstream(t, completion("from the spare"))
	conf := retryPair("rb", first, spare, "retry_after_wait", "10s")
	conf["request_timeout"] = "2s"
	p := startProxy(t, conf)
	start := time.Now()
	resp := p.chat(chatBody("rb", false))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || answerText(t, body) != "from the spare" {
		t.Fatalf("status %d body %s; want the spare's answer", resp.StatusCode, body)
	}
	if elapsed := time.Since(start); elapsed > 1500*time.Millisecond {
		t.Errorf("took %v; a wait request_timeout cannot cover must not be started", elapsed)
	}
	if n := len(first.Calls()); n != 1 {
		t.Errorf("first upstream got %d calls, want 1", n)
	}
}

// TestRetryAfterWaitEndsWhenClientLeaves: the client giving up during a
// Retry-After wait ends it at once and frees the slot.
func TestRetryAfterWaitEndsWhenClientLeaves(t *testing.T) {
	first := newUpstream(t, status(http.StatusTooManyRequests, "Retry-After", "8"))
	spare := newUpstream(t, nil)
	p := startProxy(t, retryPair("rc", first, spare, "retry_after_wait", "10s"))
	ctx, cancel := context.WithCancel(context.Background())
	done := p.goChat(ctx, chatBody("rc", false))
	eventually(t, 5*time.Second, "the first upstream's 429", func() bool { return len(first.Calls()) == 1 })
	eventually(t, 5*time.Second, "the wait holding the slot", func() bool {
		return p.upstreamGauge("inflight", "rc-a", "rc-p1") == 1
	})
	left := time.Now()
	cancel()
	select {
	case <-done: // the client's own error: it cancelled
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled request did not end")
	}
	eventually(t, 2*time.Second, "the slot freed after the client left", func() bool {
		return p.upstreamGauge("inflight", "rc-a", "rc-p1") == 0
	})
	if d := time.Since(left); d > 2*time.Second {
		t.Errorf("slot freed %v after the client left, want at once", d)
	}
	if n := len(first.Calls()); n != 1 {
		t.Errorf("first upstream got %d calls, want 1 (no retry after the client left)", n)
	}
	if n := len(spare.Calls()); n != 0 {
		t.Errorf("spare got %d calls, want 0", n)
	}
}

// TestRetrySameUpstream: with retries 1, a single 500 or a single reset
// connection is retried on the same upstream after a short pause, and the
// client gets that upstream's answer; the blip leaves no backoff. Without
// retries (the default) the same 500 fails over.
func TestRetrySameUpstream(t *testing.T) {
	for _, c := range []struct {
		name, result string
		fault        http.HandlerFunc
	}{
		{"500 once", "5xx", status(http.StatusInternalServerError)},
		{"reset once", "net_err", resetsConnection},
	} {
		t.Run(c.name, func(t *testing.T) {
			prefix := "rr" + strings.ReplaceAll(c.name[:3], " ", "")
			for _, stream := range []bool{false, true} {
				first := newUpstream(t, firstThen(1, c.fault, completion("from the first")))
				spare := newUpstream(t, completion("from the spare"))
				p := startProxy(t, retryPair(prefix, first, spare, "retries", 1))
				faults := p.requests(prefix, prefix+"-a", prefix+"-p1", c.result)
				oks := p.requests(prefix, prefix+"-a", prefix+"-p1", "ok")
				start := time.Now()
				resp := p.chat(chatBody(prefix, stream))
				body := readAll(t, resp)
				elapsed := time.Since(start)
				if resp.StatusCode != http.StatusOK || !strings.Contains(body, "first") || strings.Contains(body, "spare") {
					t.Fatalf("stream %v: status %d body %s; want the first upstream's answer", stream, resp.StatusCode, body)
				}
				if n := len(first.Calls()); n != 2 {
					t.Errorf("stream %v: first upstream got %d calls, want 2", stream, n)
				}
				if n := len(spare.Calls()); n != 0 {
					t.Errorf("stream %v: spare got %d calls, want 0", stream, n)
				}
				if got := resp.Header.Get("X-LLM-Route-Attempts"); got != "2" {
					t.Errorf("stream %v: X-LLM-Route-Attempts = %q, want 2 (the fault, then the retry)", stream, got)
				}
				if got := resp.Header.Get("X-LLM-Route-Upstream"); got != prefix+"-a" {
					t.Errorf("stream %v: X-LLM-Route-Upstream = %q, want %s-a", stream, got, prefix)
				}
				t.Logf("%s, stream %v: 200 from the same upstream after %v", c.name, stream, elapsed.Round(time.Millisecond))
				if elapsed < 250*time.Millisecond {
					t.Errorf("stream %v: answered after %v; the retry pauses at least 250 ms", stream, elapsed)
				}
				if d := p.requests(prefix, prefix+"-a", prefix+"-p1", c.result) - faults; d != 1 {
					t.Errorf("stream %v: result %s counted %v times, want 1", stream, c.result, d)
				}
				if d := p.requests(prefix, prefix+"-a", prefix+"-p1", "ok") - oks; d != 1 {
					t.Errorf("stream %v: ok counted %v times, want 1", stream, d)
				}
				if v := p.upstreamGauge("fail_streak", prefix+"-a", prefix+"-p1"); v != 0 {
					t.Errorf("stream %v: fail streak %v, want 0 (a retried blip is not a failure)", stream, v)
				}
				if v := p.upstreamGauge("cooling_seconds", prefix+"-a", prefix+"-p1"); v != 0 {
					t.Errorf("stream %v: cooling %vs, want 0", stream, v)
				}
			}
		})
	}

	t.Run("default retries 0 fails over", func(t *testing.T) {
		first := newUpstream(t, firstThen(1, status(http.StatusInternalServerError), completion("from the first")))
		spare := newUpstream(t, completion("from the spare"))
		p := startProxy(t, retryPair("rd", first, spare))
		resp := p.chat(chatBody("rd", false))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK || answerText(t, body) != "from the spare" {
			t.Fatalf("status %d body %s; want the spare's answer", resp.StatusCode, body)
		}
		if n := len(first.Calls()); n != 1 {
			t.Errorf("first upstream got %d calls, want 1", n)
		}
		if got := resp.Header.Get("X-LLM-Route-Attempts"); got != "2" {
			t.Errorf("X-LLM-Route-Attempts = %q, want 2 (the 500, then the spare)", got)
		}
	})
}

// TestRetriesExhausted: an upstream that keeps failing is tried 1+retries
// times, then the request fails over; only the last failure goes into the
// backoff (one step: a 1 s cooling, fail streak 1).
func TestRetriesExhausted(t *testing.T) {
	first := newUpstream(t, status(http.StatusBadGateway))
	spare := newUpstream(t, completion("from the spare"))
	p := startProxy(t, retryPair("re", first, spare, "retries", 2))
	resp := p.chat(chatBody("re", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || answerText(t, body) != "from the spare" {
		t.Fatalf("status %d body %s; want the spare's answer", resp.StatusCode, body)
	}
	if got := resp.Header.Get("X-LLM-Route-Attempts"); got != "4" {
		t.Errorf("X-LLM-Route-Attempts = %q, want 4 (1 + retries 2 on the first, then the spare)", got)
	}
	if n := len(first.Calls()); n != 3 {
		t.Errorf("first upstream got %d calls, want 3 (1 + retries 2)", n)
	}
	if d := p.requests("re", "re-a", "re-p1", "5xx"); d != 3 {
		t.Errorf("5xx counted %v times, want 3 (every attempt counts)", d)
	}
	if v := p.upstreamGauge("fail_streak", "re-a", "re-p1"); v != 1 {
		t.Errorf("fail streak %v, want 1 (only the run's last failure)", v)
	}
	if c := p.upstreamGauge("cooling_seconds", "re-a", "re-p1"); c <= 0 || c > 1.01 {
		t.Errorf("cooling %vs, want the first backoff step (≤ 1 s)", c)
	}
}

// TestRetryNeverOnFirstByteTimeout: a first-byte timeout fails over even
// with retries.
func TestRetryNeverOnFirstByteTimeout(t *testing.T) {
	first := newUpstream(t, hang(nil))
	spare := newUpstream(t, nil)
	p := startProxy(t, retryPair("rt", first, spare, "retries", 3, "first_byte_timeout", "300ms"))
	resp := p.chat(chatBody("rt", true))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if n := len(first.Calls()); n != 1 {
		t.Errorf("silent upstream got %d calls, want 1 (a first-byte timeout is never retried)", n)
	}
}

// TestStreamIdleTimeoutDefault: without a setting, the effective
// stream_idle_timeout in the start-up summary is 30s.
func TestStreamIdleTimeoutDefault(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "sid-p", "url", up.base())},
		[]map[string]any{obj("id", "sid-u", "provider", "sid-p", "model", "x")},
		[]map[string]any{obj("name", "sid", "upstreams", []string{"sid-u"})},
	))
	var got any
	eventually(t, 5*time.Second, "the start-up summary", func() bool {
		for _, e := range p.logEntries("llm_route configured") {
			eff, _ := e["effective"].(map[string]any)
			if u, ok := eff["sid-u"].(map[string]any); ok {
				got = u["stream_idle_timeout"]
				return true
			}
		}
		return false
	})
	if got != "30s" {
		t.Errorf("effective stream_idle_timeout = %#v, want \"30s\"", got)
	}
}
