package llmroute

import (
	"net/http"
	"testing"
	"time"
)

func TestNextTry(t *testing.T) {
	h := &Handler{requestTimeout: 10 * time.Second}
	u := &upstream{retries: 1, retryWait: 5 * time.Second}
	fail := func(result string, status int, ra time.Duration) attemptResult {
		return attemptResult{out: outFailover, result: result, status: status, retryAfter: ra}
	}
	now := time.Now()
	for _, c := range []struct {
		name  string
		res   attemptResult
		want  bool
		pause time.Duration // exact pause, when not jittered
	}{
		{"500", fail(result5xx, 500, 0), true, 0},
		{"connection error", fail(resultNetErr, 0, 0), true, 0},
		{"first-byte timeout", fail(resultTimeout, 0, 0), false, 0},
		{"429 without Retry-After", fail(result429, 429, 0), false, 0},
		{"402", fail(result402, 402, 0), false, 0},
		{"401", fail(resultAuthErr, 401, 0), false, 0},
		{"429 Retry-After 2s", fail(result429, 429, 2*time.Second), true, 2 * time.Second},
		{"503 Retry-After 5s", fail(result5xx, 503, 5*time.Second), true, 5 * time.Second},
		{"429 Retry-After 6s", fail(result429, 429, 6*time.Second), false, 0},
		{"503 Retry-After 30s with retries left", fail(result5xx, 503, 30*time.Second), false, 0},
		{"context refusal", attemptResult{out: outFailover, result: result4xx, status: 400, noBlame: true}, false, 0},
		{"answered", attemptResult{out: outDone, result: result4xx, status: 400}, false, 0},
	} {
		run := retryRun{start: now}
		d, again := h.nextTry(u, c.res, &run, now)
		if again != c.want {
			t.Errorf("%s: again = %v, want %v", c.name, again, c.want)
			continue
		}
		switch {
		case !again:
		case c.pause > 0 && d != c.pause:
			t.Errorf("%s: pause %v, want the Retry-After %v", c.name, d, c.pause)
		case c.pause == 0 && (d < retryPauseMin || d >= retryPauseMin+retryPauseJitter):
			t.Errorf("%s: pause %v, want within [250ms, 750ms)", c.name, d)
		}
	}

	// retries bound the plain retries; the Retry-After wait is its own,
	// once per run, and works with retries 0.
	run := retryRun{start: now}
	if _, again := h.nextTry(u, fail(result5xx, 500, 0), &run, now); !again {
		t.Fatal("first retry refused")
	}
	if _, again := h.nextTry(u, fail(result5xx, 500, 0), &run, now); again {
		t.Error("a second retry with retries 1")
	}
	none := &upstream{retryWait: 5 * time.Second}
	run = retryRun{start: now}
	if _, again := h.nextTry(none, fail(result429, 429, time.Second), &run, now); !again {
		t.Error("Retry-After wait refused with retries 0")
	}
	if _, again := h.nextTry(none, fail(result429, 429, time.Second), &run, now); again {
		t.Error("a second Retry-After wait in one run")
	}
	// What is left of request_timeout bounds the wait.
	run = retryRun{start: now.Add(-8 * time.Second)}
	if _, again := h.nextTry(u, fail(result429, http.StatusTooManyRequests, 3*time.Second), &run, now); again {
		t.Error("a 3 s wait with 2 s of request_timeout left")
	}
}
