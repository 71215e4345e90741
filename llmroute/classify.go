package llmroute

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// failoverStatus reports statuses that count as upstream failures. 401 and
// 403 are among them: the client's credentials never go
// upstream, so a refusal is about the operator's key, and another upstream
// may well take the request.
func failoverStatus(code int) bool {
	return code >= 500 || code == http.StatusTooManyRequests || code == http.StatusPaymentRequired ||
		authStatus(code)
}

// authStatus reports an upstream refusing the operator's credentials.
func authStatus(code int) bool {
	return code == http.StatusUnauthorized || code == http.StatusForbidden
}

// statusResult maps a response status to its metric result.
func statusResult(code int) string {
	switch {
	case code == http.StatusTooManyRequests:
		return result429
	case code == http.StatusPaymentRequired:
		return result402
	case authStatus(code):
		return resultAuthErr
	case code >= 500:
		return result5xx
	case code >= 400:
		return result4xx
	}
	return resultOK
}

// retryAfterOf reads an upstream's Retry-After (seconds or HTTP date) or
// retry-after-ms on a 429/503; 0 when there is none.
func retryAfterOf(resp *http.Response, now time.Time) time.Duration {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		return 0
	}
	d, ok := parseRetryAfter(resp.Header, now)
	if !ok || d <= 0 {
		return 0
	}
	return d
}

// holdRetryAfter honours a Retry-After d that was not waited out: the
// upstream cools, in its backoff scope or alone, for at least that long,
// bounded by retry_after_max.
func (h *Handler) holdRetryAfter(u *upstream, status int, d time.Duration, now time.Time) {
	d = min(d, h.retryAfterMax)
	if u.backoff != nil {
		u.backoff.holdFor(now, d)
	} else {
		u.state.holdUntil(now.Add(d).UnixNano())
		if f := activeFleet.Load(); f != nil {
			f.shareHold(u.id, d)
		}
	}
	if c := h.logger.Check(zapcore.InfoLevel, "upstream asked to retry later"); c != nil {
		c.Write(zap.String("upstream", u.id), zap.Int("status", status), zap.Duration("cooling", d))
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

// maxAuthLog bounds how much of a 401/403 body goes to the log.
const maxAuthLog = 1 << 10

// drainFailed drains a failed response like drain. A 401/403's body says
// why the operator's key was refused; the client never sees it (it could
// name the account), so its head goes to the log, with anything
// key-shaped redacted.
func (h *Handler) drainFailed(u *upstream, resp *http.Response) {
	if !authStatus(resp.StatusCode) {
		drain(resp.Body)
		return
	}
	var head [maxAuthLog]byte
	n, _ := io.ReadFull(resp.Body, head[:])
	drain(resp.Body)
	if c := h.logger.Check(zapcore.WarnLevel, "upstream refused the provider key"); c != nil {
		c.Write(zap.String("upstream", u.id), zap.String("provider", u.provider), zap.Int("status", resp.StatusCode),
			zap.String("body", redactSecrets(string(head[:n]), u.auth)))
	}
}

// keyShaped matches what API keys and bearer tokens look like (sk-…,
// sk-ant-…, AIza…, "Bearer …", long opaque tokens), so an upstream that
// echoes a key in its error never puts it in the log.
var keyShaped = regexp.MustCompile(`(?i)(bearer\s+)[^\s"',]+|\b(sk|rk|pk)[-_][A-Za-z0-9_\-*.]{6,}|\bAIza[A-Za-z0-9_\-]{10,}|\b[A-Za-z0-9_\-]{32,}\b`)

// redactSecrets removes the provider key (auth is "Bearer <key>" or "") and
// anything key-shaped from s.
func redactSecrets(s, auth string) string {
	if key := strings.TrimPrefix(auth, "Bearer "); key != "" {
		s = strings.ReplaceAll(s, key, "[redacted]")
	}
	return keyShaped.ReplaceAllStringFunc(s, func(m string) string {
		if len(m) > 7 && strings.EqualFold(m[:7], "bearer ") {
			return m[:7] + "[redacted]"
		}
		return "[redacted]"
	})
}
