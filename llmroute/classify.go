package llmroute

import (
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// failoverStatus reports statuses that count as upstream failures.
func failoverStatus(code int) bool {
	return code >= 500 || code == http.StatusTooManyRequests || code == http.StatusPaymentRequired
}

// statusResult maps a response status to its metric result.
func statusResult(code int) string {
	switch {
	case code == http.StatusTooManyRequests:
		return result429
	case code == http.StatusPaymentRequired:
		return result402
	case code >= 500:
		return result5xx
	case code >= 400:
		return result4xx
	}
	return resultOK
}

// noteRetryAfter honours an upstream's Retry-After (seconds or HTTP date) or
// retry-after-ms on 429/503: the upstream cools, in its backoff scope or
// alone, for at least that long, bounded by retry_after_max.
func (h *Handler) noteRetryAfter(u *upstream, resp *http.Response, now time.Time) {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		return
	}
	d, ok := parseRetryAfter(resp.Header, now)
	if !ok || d <= 0 {
		return
	}
	d = min(d, h.retryAfterMax)
	if u.backoff != nil {
		u.backoff.holdFor(now, d)
	} else {
		until := now.Add(d).UnixNano()
		for {
			cur := u.state.coolUntil.Load()
			if cur >= until || u.state.coolUntil.CompareAndSwap(cur, until) {
				break
			}
		}
	}
	if c := h.logger.Check(zapcore.InfoLevel, "upstream asked to retry later"); c != nil {
		c.Write(zap.String("upstream", u.id), zap.Int("status", resp.StatusCode), zap.Duration("cooling", d))
	}
}

// parseRetryAfter reads retry-after-ms, then Retry-After in seconds or as an
// HTTP date.
func parseRetryAfter(hdr http.Header, now time.Time) (time.Duration, bool) {
	if v := hdr.Get("Retry-After-Ms"); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := hdr.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		if secs < 0 || secs > 1e9 {
			return 0, false
		}
		return time.Duration(secs * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return t.Sub(now), true
	}
	return 0, false
}
