package integration

// A stream continuation follows the rules of every other attempt: a
// context-length refusal hands on to the next upstream without blame, and a
// Retry-After within retry_after_wait is waited out on the same upstream.

import (
	"net/http"
	"testing"
	"time"
)

// resumeThree is model "m" (resume on) over a (cut after 40 tokens), b (the
// continuation upstream under test, with backoff so that blame would show,
// and its extra fields) and c (a deterministic spare).
func resumeThree(a, b, c *fakeUpstream, bFields ...any) map[string]any {
	conf := resumeConfig(a, b, "30s", append([]any{"backoff", "30s"}, bFields...)...)
	conf["providers"] = append(conf["providers"].([]map[string]any), obj("id", "pc", "url", c.base(), "probe_interval", "0s"))
	conf["upstreams"] = append(conf["upstreams"].([]map[string]any), obj("id", "c", "provider", "pc", "model", "real-c"))
	conf["models"] = []map[string]any{obj("name", "m", "upstreams", []string{"a", "b", "c"}, "resume", "on")}
	return conf
}

// TestResumeContextLengthHandsOn: the continuation upstream refuses the
// prompt as too long (a 400, and llama.cpp's older 500); the continuation
// goes on to the next upstream at once, without a replay of the same
// prompt, and the refusing upstream is not backed off.
func TestResumeContextLengthHandsOn(t *testing.T) {
	for _, c := range []struct {
		name   string
		status int
		body   string
	}{
		{"openai 400", contextRefusals[0].status, contextRefusals[0].body},
		{"llama.cpp 500", contextRefusals[3].status, contextRefusals[3].body},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newUpstream(t, faultChunkedCut(firstEvents(40)))
			b := newUpstream(t, rawAnswer(c.status, c.body))
			third := newUpstream(t, deterministic(resumeModel{"chatcmpl-third", 333, "real-c"}, false, 1))
			p := startProxy(t, resumeThree(a, b, third))
			start := time.Now()
			countResumed(t, p)
			t.Logf("cut after 40 tokens, next upstream refuses the prompt as too long (%d): the third finishes after %v",
				c.status, time.Since(start).Round(time.Millisecond))
			if n := len(b.Calls()); n != 1 {
				t.Errorf("refusing upstream got %d calls, want 1 (the same prompt is not replayed there)", n)
			}
			calls := third.Calls()
			if len(calls) != 1 {
				t.Fatalf("third upstream got %d calls, want 1", len(calls))
			}
			wantPrefill(t, calls[0], 40)
			var logged bool
			for _, e := range p.logEntries("context length exceeded, failing over without blame") {
				logged = logged || e["upstream"] == "b" && e["to"] == "c"
			}
			if !logged {
				t.Error("no context-length log entry from b to c")
			}
			if v := p.upstreamGauge("fail_streak", "b", "pb"); v != 0 {
				t.Errorf("refusing upstream's fail streak %v, want 0 (a context-length refusal is not a failure)", v)
			}
			if v := p.upstreamGauge("cooling_seconds", "b", "pb"); v != 0 {
				t.Errorf("refusing upstream cooling %vs, want 0", v)
			}
			faultEventually(t, 30*time.Second, "slots free", func() bool {
				return p.upstreamGauge("inflight", "a", "pa") == 0 && p.upstreamGauge("inflight", "b", "pb") == 0 &&
					p.upstreamGauge("inflight", "c", "pc") == 0
			})
		})
	}
}

// TestResumeRetryAfterWaited: the continuation upstream answers 429 with
// Retry-After 1, within its retry_after_wait; the continuation waits it
// out there (keepalives go on meanwhile) and that upstream finishes the
// stream; the spare after it is never asked and nothing cools.
func TestResumeRetryAfterWaited(t *testing.T) {
	a := newUpstream(t, faultChunkedCut(firstEvents(40)))
	b := newUpstream(t, firstThen(1, status(http.StatusTooManyRequests, "Retry-After", "1"), deterministic(resumeB, false, 1)))
	spare := newUpstream(t, deterministic(resumeModel{"chatcmpl-third", 333, "real-c"}, false, 1))
	p := startProxy(t, resumeThree(a, b, spare, "retry_after_wait", "5s"))
	rate0, ok0 := p.requests("m", "b", "pb", "429"), p.requests("m", "b", "pb", "ok")
	start := time.Now()
	body := countResumed(t, p)
	elapsed := time.Since(start)
	t.Logf("cut after 40 tokens, next upstream 429 Retry-After 1: waited out there, one whole stream after %v", elapsed.Round(time.Millisecond))
	if n := len(spare.Calls()); n != 0 {
		t.Errorf("spare got %d calls, want 0 (the Retry-After is waited out on b)", n)
	}
	calls := b.Calls()
	if len(calls) != 2 {
		t.Fatalf("continuation upstream got %d calls, want 2 (the 429, then the continuation after the wait)", len(calls))
	}
	wantPrefill(t, calls[1], 40) // after the wait
	if elapsed < 900*time.Millisecond {
		t.Errorf("answered after %v, want the 1 s Retry-After waited out", elapsed)
	}
	// heartbeat_interval is 100ms and the fakes answer at once: the
	// keepalives are the wait's. A few suffice to show the client was not
	// left silent.
	if _, n := faultStripKeepalives(t, body); n < 3 {
		t.Errorf("%d keepalives during the 1 s wait, want the client kept alive (heartbeat_interval 100ms)", n)
	}
	if d := p.requests("m", "b", "pb", "429") - rate0; d != 1 {
		t.Errorf("429 counted %v times on b, want 1", d)
	}
	if d := p.requests("m", "b", "pb", "ok") - ok0; d != 1 {
		t.Errorf("ok counted %v times on b, want 1", d)
	}
	if v := p.upstreamGauge("cooling_seconds", "b", "pb"); v != 0 {
		t.Errorf("b cooling %vs after the wait succeeded, want 0", v)
	}
	var retried bool
	for _, e := range p.logEntries("retrying on the same upstream") {
		retried = retried || e["upstream"] == "b" && e["retry_after"] == true
	}
	if !retried {
		t.Error("no log entry of the Retry-After retry on b")
	}
}
