package llmroute

import (
	"bytes"
	"encoding/json"
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
//
// So are 404 and 405: the model name and the path an upstream is sent come
// from the config, not from the client, so an upstream that has no such
// endpoint or model is misconfigured (a provider url without /v1, a model
// name the server does not have), and another upstream may serve.
func failoverStatus(code int) bool {
	return code >= 500 || code == http.StatusTooManyRequests || code == http.StatusPaymentRequired ||
		authStatus(code) || notFoundStatus(code)
}

// notFoundStatus reports an upstream without the endpoint or model asked.
func notFoundStatus(code int) bool {
	return code == http.StatusNotFound || code == http.StatusMethodNotAllowed
}

// clientsNotFound reports a 404 about something the client named rather
// than the config: its OpenAI-shaped error names a parameter other than
// model (a previous_response_id, a file id, a max_tokens the server
// rejects this way), or a code ending in _not_found other than
// model_not_found. That 404 is the request's fault: it goes back to the
// client unchanged, like any other 4xx, and cools nothing (else a client
// repeating a stale id could keep every upstream cooling).
func clientsNotFound(status int, head []byte) bool {
	if status != http.StatusNotFound {
		return false
	}
	var e struct {
		Error struct {
			Param any `json:"param"`
			Code  any `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(head, &e) != nil {
		return false // a plain "404 page not found": the url is wrong
	}
	if p, ok := e.Error.Param.(string); ok && p != "" && p != "model" {
		return true
	}
	c, _ := e.Error.Code.(string)
	return strings.HasSuffix(c, "_not_found") && c != "model_not_found"
}

// peekNotFound reads the head of a 404's body and puts it back, for
// clientsNotFound.
func (c *call) peekNotFound() []byte {
	if c.resp.StatusCode != http.StatusNotFound {
		return nil
	}
	return c.peekBody()
}

// peekBody reads the head of a failed answer's body, bounded in size and,
// like a drain, in time (an error answer that stalls must not hold up the
// failover), and puts it back in front of the body, so an answer that is
// then passed on reaches the client whole.
func (c *call) peekBody() []byte {
	if c.peeked {
		return c.head
	}
	resp := c.resp
	c.w8.arm(drainTimeout, codeDrain)
	head, _ := io.ReadAll(io.LimitReader(resp.Body, maxRefusalPeek))
	c.w8.stop()
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	c.head, c.peeked = head, true
	return head
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
	u.led.Hold(&u.Upstream, now, d)
	if c := h.logger.Check(zapcore.InfoLevel, "upstream asked to retry later"); c != nil {
		c.Write(zap.String("upstream", u.ID), zap.Int("status", status), zap.Duration("cooling", d))
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

// maxAuthLog bounds how much of a failed answer's body goes to the log.
const maxAuthLog = 1 << 10

// drainFailed drains a failed response like drain. The body of a 401/403
// says why the operator's key was refused, that of a 404/405 what the
// upstream does not have; the client never sees either (it could name the
// account), so its head goes to the log, with anything key-shaped
// redacted.
func (c *call) drainFailed() {
	u, resp := c.u, c.resp
	if !authStatus(resp.StatusCode) && !notFoundStatus(resp.StatusCode) {
		drain(resp.Body)
		return
	}
	var head [maxAuthLog]byte
	n, _ := io.ReadFull(resp.Body, head[:])
	drain(resp.Body)
	body := redactSecrets(string(head[:n]), u.auth)
	if c.auth != nil {
		body = redactSecrets(body, c.auth[0])
	}
	if notFoundStatus(resp.StatusCode) {
		if ce := c.log.Check(zapcore.ErrorLevel, "upstream has no such endpoint"); ce != nil {
			tried := u.url
			if resp.Request != nil && resp.Request.URL != nil {
				tried = resp.Request.URL.String()
			}
			ce.Write(zap.String("upstream", u.ID), zap.String("provider", u.Provider), zap.Int("status", resp.StatusCode),
				zap.String("url", redactURL(tried)), zap.String("body", body),
				zap.String("hint", notFoundHint(u.base, u.model, head[:n])))
		}
		return
	}
	if ce := c.log.Check(zapcore.WarnLevel, "upstream refused the provider key"); ce != nil {
		ce.Write(zap.String("upstream", u.ID), zap.String("provider", u.Provider), zap.Int("status", resp.StatusCode),
			zap.String("body", body), c.keyField())
	}
}

// keyField names the call's key in a log line: a pool key's index, or
// "own" for a caller's own key; nothing for the provider's one key.
func (c *call) keyField() zap.Field {
	switch {
	case c.key != nil:
		return zap.Int("key", c.key.index)
	case c.ownKey:
		return zap.String("key", "own")
	}
	return zap.Skip()
}

// notFoundHint says what to check when an upstream answers 404/405: the
// model name, when its answer speaks of a model (Ollama, vLLM and OpenAI
// name the model they do not have), else the provider url (base), which
// must be the API root the endpoint paths are appended to (…/v1).
func notFoundHint(base, model string, body []byte) string {
	if model != "" && bytes.Contains(bytes.ToLower(body), []byte("model")) {
		return "the upstream does not know model " + strconv.Quote(model) +
			": check the upstream's model name (Ollama: is it pulled? llama.cpp, vLLM: the name it serves)"
	}
	return pathHint(base)
}

// pathHint says what to check when a provider url does not serve the API
// paths.
func pathHint(base string) string {
	if !strings.HasSuffix(base, "/v1") {
		return "does the provider url end in /v1? (" + redactURL(base+"/v1") + ")"
	}
	return "check the provider url: the endpoint paths are appended to it (" + redactURL(base) + ")"
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
