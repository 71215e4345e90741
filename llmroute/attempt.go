package llmroute

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// outcome tells the failover loop what to do after an attempt.
type outcome int

const (
	// outDone: a response (or its start) reached the client; stop.
	outDone outcome = iota
	// outFailover: the attempt failed before anything reached the client;
	// try the next upstream.
	outFailover
)

// Metric results of an attempt (label `result` of llm_proxy_requests_total).
const (
	resultOK        = "ok"
	result4xx       = "4xx"
	result429       = "429"
	result402       = "402"
	result5xx       = "5xx"
	resultNetErr    = "net_err"
	resultTimeout   = "timeout"
	resultCancelled = "cancelled"
)

// allResults lists every result label.
var allResults = []string{resultOK, result4xx, result429, result402, result5xx, resultNetErr, resultTimeout, resultCancelled}

// attemptResult is what one attempt reports to the failover loop.
type attemptResult struct {
	out    outcome
	result string
	status int
	// abort: the response was cut after it started; the handler must abort
	// the connection once the attempt is recorded.
	abort bool
}

// Reasons a stream can end abnormally after its first byte reached the
// client; they become the `code` of the final SSE error event.
const (
	codeInterrupted    = "stream_interrupted"
	codeStalled        = "stream_stalled"
	codeRequestTimeout = "request_timeout"
)

// attempt sends the request to one upstream whose slot the caller has
// claimed, and either hands the response to the client or reports a failure
// that may fail over. The slot is released, and the outcome recorded, exactly
// once on every path, panics included.
func (h *Handler) attempt(w http.ResponseWriter, r *http.Request, rt *route, t *target, body []byte, stream bool) (res attemptResult) {
	start := time.Now()
	recorded := false
	defer func() {
		if p := recover(); p != nil {
			if !recorded {
				if res.result == "" {
					res.result = resultNetErr
				}
				h.finish(rt, t, res, start)
			}
			panic(p)
		}
	}()
	res = h.exchange(w, r, t, body, stream)
	h.finish(rt, t, res, start)
	recorded = true
	if res.abort {
		// The upstream broke after the client got bytes; the error event is
		// out. Abort the response so it is never mistaken for complete.
		panic(http.ErrAbortHandler)
	}
	return res
}

// exchange does the HTTP work of an attempt.
func (h *Handler) exchange(w http.ResponseWriter, r *http.Request, t *target, body []byte, stream bool) attemptResult {
	u := t.up
	// The outgoing body is not pooled: the transport may still be writing it
	// after RoundTrip returns. Wrapped as NopCloser(*bytes.Reader), net/http
	// knows it is in memory and sends headers and body in one write.
	out, err := transform.RewriteRequest(make([]byte, 0, len(body)+512), body, &t.edit)
	if err != nil {
		errBadJSON.write(w)
		return attemptResult{out: outDone, result: result4xx, status: http.StatusBadRequest}
	}
	reqBody := io.NopCloser(bytes.NewReader(out))

	ctx, cancel := h.attemptContext(r.Context())
	defer cancel()
	w8 := &watchdog{cancel: cancel}
	if stream && u.firstByte > 0 {
		w8.arm(u.firstByte, codeFirstByte)
	}
	defer w8.stop()

	resp, err := u.transport.RoundTrip(h.upstreamRequest(ctx, r, u, out, reqBody))
	if err != nil {
		return h.classifyError(r, u, w8, ctx, err)
	}
	defer resp.Body.Close()

	if failoverStatus(resp.StatusCode) {
		h.noteRetryAfter(u, resp, time.Now())
		// Never wait long for a failed answer's body: an upstream that sends
		// error headers and then stalls must not hold up the failover until
		// request_timeout. When the window passes, the attempt is cancelled
		// and the connection dropped instead of reused.
		w8.arm(drainTimeout, codeDrain)
		drain(resp.Body)
		w8.stop()
		return attemptResult{out: outFailover, result: statusResult(resp.StatusCode), status: resp.StatusCode}
	}

	// For streams the first body byte must arrive before anything is sent to
	// the client, so that a silent upstream can still fail over.
	copyBuf := getCopyBuf()
	defer putCopyBuf(copyBuf)
	var first []byte
	var firstErr error
	if stream {
		n, rerr := readSome(resp.Body, *copyBuf)
		w8.stop()
		if n == 0 && rerr != nil && rerr != io.EOF {
			return h.classifyError(r, u, w8, ctx, rerr)
		}
		first, firstErr = (*copyBuf)[:n], rerr
	}

	if resp.StatusCode < 300 {
		u.recordSuccess(time.Now())
	}
	res := attemptResult{out: outDone, result: statusResult(resp.StatusCode), status: resp.StatusCode}
	// The client gets the upstream's status and headers (x-request-id, its
	// Content-Type, a 400's status), minus hop-by-hop ones.
	h.writeResponseHeader(w, resp, u, t)
	if serr := h.copyResponse(w, r, ctx, resp, u, first, firstErr, *copyBuf, w8); serr != nil {
		res.result = serr.result
		res.abort = serr.code != ""
	}
	return res
}

// codeFirstByte marks a watchdog that fired before the first byte.
const codeFirstByte = "first_byte"

// codeDrain marks a watchdog that fired while a failed response's body was
// being drained; drainTimeout is that window.
const (
	codeDrain    = "drain"
	drainTimeout = time.Second
)

// watchdog cancels an attempt when its timer fires and remembers why. One
// timer serves both windows of a stream: first byte, then idle.
type watchdog struct {
	cancel context.CancelFunc
	timer  *time.Timer
	period time.Duration          // owned by the request goroutine
	reason atomic.Pointer[string] // why the armed window would fire
	fired  atomic.Pointer[string] // why it did fire
}

// arm (re)starts the timer for d with the given reason.
func (w *watchdog) arm(d time.Duration, reason string) {
	w.period = d
	w.reason.Store(&reason)
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.fire)
		return
	}
	w.timer.Reset(d)
}

// kick restarts an armed timer: the upstream just sent something.
func (w *watchdog) kick() {
	if w.timer != nil && w.period > 0 {
		w.timer.Reset(w.period)
	}
}

// pause holds an armed timer while the proxy writes to the client: time
// spent waiting for a slow client is not upstream silence, and must not cut
// the stream or count against the upstream. kick re-arms it.
func (w *watchdog) pause() {
	if w.timer != nil && w.period > 0 {
		w.timer.Stop()
	}
}

func (w *watchdog) fire() {
	w.fired.Store(w.reason.Load())
	w.cancel()
}

// stop disarms the timer until the next arm.
func (w *watchdog) stop() {
	if w.timer != nil {
		w.timer.Stop()
		w.period = 0
	}
}

// firedFor returns why the watchdog fired, or "".
func (w *watchdog) firedFor() string {
	if p := w.fired.Load(); p != nil {
		return *p
	}
	return ""
}

// classifyError turns a transport error before anything reached the client
// into a result.
func (h *Handler) classifyError(r *http.Request, u *upstream, w8 *watchdog, ctx context.Context, err error) attemptResult {
	switch {
	case r.Context().Err() != nil:
		return attemptResult{out: outDone, result: resultCancelled}
	case w8.firedFor() == codeFirstByte:
		if c := h.logger.Check(zapcore.WarnLevel, "first byte timeout, failing over"); c != nil {
			c.Write(zap.String("upstream", u.id), zap.Duration("first_byte_timeout", u.firstByte))
		}
		return attemptResult{out: outFailover, result: resultTimeout}
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return attemptResult{out: outFailover, result: resultTimeout}
	}
	if c := h.logger.Check(zapcore.WarnLevel, "upstream connection failed"); c != nil {
		c.Write(zap.String("upstream", u.id), zap.String("error", redactError(err)))
	}
	return attemptResult{out: outFailover, result: resultNetErr}
}

// finish releases the slot and records the attempt: metric, backoff, log.
func (h *Handler) finish(rt *route, t *target, res attemptResult, start time.Time) {
	u := t.up
	n := u.state.release()
	now := time.Now()
	if res.out == outFailover || res.result == resultNetErr || res.result == resultTimeout {
		u.recordFailure(now, h.logger)
	}
	if c := t.counters[res.result]; c != nil {
		c.Inc()
	} else {
		h.metrics.requests.WithLabelValues(rt.name, u.id, u.provider, res.result).Inc()
	}
	if c := h.logger.Check(zapcore.InfoLevel, "request completed"); c != nil {
		c.Write(zap.String("model", rt.name), zap.String("upstream", u.id), zap.String("provider", u.provider),
			zap.String("result", res.result), zap.Int("status", res.status), zap.Duration("duration", now.Sub(start)),
			zap.Int64("slot_released", n), limitField(u.limit))
	}
}

// recordSuccess resets the failure streak and ends the backoff.
func (u *upstream) recordSuccess(now time.Time) {
	u.state.failStreak.Store(0)
	if u.backoff != nil {
		u.backoff.recordSuccess(now)
	}
}

// recordFailure counts a failure and starts (or doubles) the cooling.
func (u *upstream) recordFailure(now time.Time, logger *zap.Logger) {
	u.state.failStreak.Add(1)
	if u.backoff == nil {
		return
	}
	d := u.backoff.recordFailure(now)
	if c := logger.Check(zapcore.InfoLevel, "backoff applied"); c != nil {
		c.Write(zap.String("upstream", u.id), zap.String("scope", u.backoffScope), zap.Duration("cooling", d))
	}
}

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

// drain reads a little of a failed response so the connection can be reused,
// then the caller closes it.
func drain(body io.Reader) {
	_, _ = io.CopyN(io.Discard, body, 64<<10)
}

// readSome reads until it gets at least one byte or an error.
func readSome(r io.Reader, buf []byte) (int, error) {
	for i := 0; i < 100; i++ {
		n, err := r.Read(buf)
		if n > 0 || err != nil {
			return n, err
		}
	}
	return 0, io.ErrNoProgress
}

// hopHeaders are hop-by-hop headers (RFC 9110 §7.6.1) and framing headers
// that the transport sets itself.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Te", "Trailer",
	"Transfer-Encoding", "Upgrade", "Content-Length", "Host", "Expect"}

// upstreamRequest builds the outgoing request: the client's headers minus
// credentials and hop-by-hop ones, the provider's key and static headers,
// and the session header.
func (h *Handler) upstreamRequest(ctx context.Context, r *http.Request, u *upstream, out []byte, body io.ReadCloser) *http.Request {
	hdr := make(http.Header, len(r.Header)+4)
	for k, vv := range r.Header {
		if !forwardable(k) {
			continue
		}
		hdr[k] = vv // read-only from here on: sharing the slices is safe
	}
	for _, name := range r.Header["Connection"] {
		for _, f := range splitComma(name) {
			delete(hdr, http.CanonicalHeaderKey(f))
		}
	}
	if u.think != transform.ThinkOff {
		// The response is rewritten, so it must come uncompressed.
		hdr.Set("Accept-Encoding", "identity")
	}
	hdr.Set("Content-Type", "application/json")
	if u.auth != "" {
		hdr["Authorization"] = []string{u.auth}
	}
	for _, kv := range u.headers {
		hdr.Set(kv[0], kv[1])
	}
	if u.sessionHdr != "" {
		hdr.Set(u.sessionHdr, sessions.ID(out))
	}
	req := http.Request{
		Method:        http.MethodPost,
		URL:           u.target,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        hdr,
		Body:          body,
		ContentLength: int64(len(out)),
		Host:          u.target.Host,
	}
	return req.WithContext(ctx) // one allocation: req itself stays on the stack
}

// forwardable reports whether a client request header may go upstream:
// not a credential, not hop-by-hop.
func forwardable(k string) bool {
	switch k {
	case "Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key",
		"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Te", "Trailer",
		"Transfer-Encoding", "Upgrade", "Content-Length", "Host", "Expect":
		return false
	}
	return true
}

func splitComma(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// writeResponseHeader copies the upstream's status and headers, minus
// hop-by-hop ones.
func (h *Handler) writeResponseHeader(w http.ResponseWriter, resp *http.Response, u *upstream, t *target) {
	dst := w.Header()
	for k, vv := range resp.Header {
		dst[k] = vv
	}
	for _, name := range resp.Header.Values("Connection") {
		for _, f := range splitComma(name) {
			dst.Del(f)
		}
	}
	for _, k := range hopHeaders {
		if k != "Content-Length" {
			delete(dst, k)
		}
	}
	if u.think != transform.ThinkOff && resp.StatusCode < 300 {
		// The body may change length.
		delete(dst, "Content-Length")
	}
	w.WriteHeader(resp.StatusCode)
}

// isEventStream reports a text/event-stream response.
func isEventStream(resp *http.Response) bool {
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}

// redactError renders a transport error without URLs that could carry
// credentials.
func redactError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + " " + redactURL(ue.URL) + ": " + ue.Err.Error()
	}
	return err.Error()
}

// bytesPool recycles outgoing request bodies.
var bytesPool = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

func getBytes() *[]byte { return bytesPool.Get().(*[]byte) }

func putBytes(b *[]byte) {
	if cap(*b) > maxPooledBuffer {
		return
	}
	*b = (*b)[:0]
	bytesPool.Put(b)
}

// copy buffers for response bodies.
var copyBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func getCopyBuf() *[]byte  { return copyBufPool.Get().(*[]byte) }
func putCopyBuf(b *[]byte) { copyBufPool.Put(b) }
