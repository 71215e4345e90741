package llmroute

import (
	"context"
	"math/rand/v2"
	"net/http"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Same-upstream retries. An attempt's run on one upstream may
// take several exchanges: a 5xx or a connection error before the first
// byte is retried up to `retries` times after a short jittered pause, and a
// 429/503 whose Retry-After is at most `retry_after_wait` is waited out
// once. The run holds the upstream's slot throughout (the request is still
// in flight there), every exchange is counted in llm_proxy_requests_total,
// and only the run's last failure reaches the backoff: a blip that one retry
// absorbs does not cool an upstream that every other request may use.

// Bounds of the jittered pause before a retry: long enough for a restarting
// server or a dropped connection to come back, short enough that a client
// barely notices, and spread so that the requests one blip failed do not
// come back in lockstep.
const (
	retryPauseMin    = 250 * time.Millisecond
	retryPauseJitter = 500 * time.Millisecond
)

// retryRun is the state of one attempt's run on one upstream.
type retryRun struct {
	start   time.Time // when the run began: request_timeout bounds its waits
	retries int       // retries of a 5xx or connection error so far
	waited  bool      // the run's one Retry-After wait is used
	keys    int       // pool keys refused so far (keypool.go)
}

// nextTry decides whether the failed exchange res is tried again on the
// same upstream, and after how long. It never retries what may have reached
// the client (only failovers are retried), a first-byte or request timeout
// (a slow upstream stays slow: fail over), a context-length refusal (the
// same upstream refuses the same prompt), or a status other than 5xx and
// the Retry-After statuses.
func (h *Handler) nextTry(u *upstream, res attemptResult, run *retryRun, now time.Time) (time.Duration, bool) {
	if res.out != outFailover || res.noBlame {
		return 0, false
	}
	if res.retryAfter > 0 && (res.status == http.StatusTooManyRequests || res.status == http.StatusServiceUnavailable) {
		// The upstream named its time: wait it out in place, or cool and
		// fail over at once; a plain retry would only be refused again.
		if run.waited || u.retryWait <= 0 || res.retryAfter > u.retryWait {
			return 0, false
		}
		if h.requestTimeout > 0 && now.Sub(run.start)+res.retryAfter >= h.requestTimeout {
			return 0, false // no time left to use the answer after the wait
		}
		run.waited = true
		return res.retryAfter, true
	}
	switch res.result {
	case result5xx, resultNetErr:
	default:
		return 0, false
	}
	if run.retries >= u.retries {
		return 0, false
	}
	run.retries++
	return retryPauseMin + rand.N(retryPauseJitter), true
}

// pause waits d, or less if the client leaves; it reports whether the wait
// ran to its end.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// exchangeRetrying runs the exchanges of one attempt on t's upstream: the
// first, then the retries tryAgain allows. Every exchange but the last is
// counted there; the last one's result goes back to attempt, which records
// it (metric, backoff, slot) as it records any attempt.
func (h *Handler) exchangeRetrying(w http.ResponseWriter, r *http.Request, rt *route, t *target, body []byte, fr *frontReq) attemptResult {
	run := retryRun{start: time.Now()}
	for {
		// Each exchange is an attempt of its own; the count goes out with
		// the headers of the answer that is used.
		fr.attempts++
		h.setRouteHeaders(w, t, fr.attempts)
		res := h.exchange(w, r, t, body, fr)
		fr.attempts += res.extraAttempts
		if !h.tryAgain(r, rt, t, &res, &run) {
			return res
		}
	}
}

// tryAgain applies the same-upstream rules to a run's call that ended with
// res, for every sender that holds a slot (an attempt's exchanges, a
// continuation): it reports whether the run sends again, after the pause
// nextTry chose. When it does not, res is the run's result: a Retry-After
// that was not waited out cools the upstream now that the run ends on it,
// and a client that left during the pause makes the run cancelled (and
// counted). A call that is tried again is counted here.
func (h *Handler) tryAgain(r *http.Request, rt *route, t *target, res *attemptResult, run *retryRun) bool {
	u := t.up
	now := time.Now()
	if res.keyFault != keyFine {
		return h.nextKey(rt, t, res, run, now)
	}
	wait, again := h.nextTry(u, *res, run, now)
	if !again {
		if res.out == outFailover && res.retryAfter > 0 {
			h.holdRetryAfter(u, res.status, res.retryAfter, now)
		}
		return false
	}
	h.countAttempt(rt, t, *res)
	if c := h.logger.Check(zapcore.InfoLevel, "retrying on the same upstream"); c != nil {
		c.Write(zap.String("model", rt.name), zap.String("upstream", u.ID), zap.String("result", res.result),
			zap.Int("status", res.status), zap.Duration("pause", wait), zap.Bool("retry_after", run.waited && res.retryAfter > 0),
			zap.Int("retry", run.retries))
	}
	if !pause(r.Context(), wait) {
		// The client left while the proxy waited: nothing reached it,
		// and the upstream's blip is not held against it.
		*res = attemptResult{out: outDone, result: resultCancelled, counted: true, api: res.api, mode: res.mode}
		return false
	}
	return true
}

// countAttempt counts one exchange in llm_proxy_requests_total.
func (h *Handler) countAttempt(rt *route, t *target, res attemptResult) {
	if c := t.counters[res.result]; c != nil {
		c.Inc()
	} else {
		h.metrics.requests.WithLabelValues(rt.name, t.up.ID, t.up.Provider, res.result).Inc()
	}
}
