package llmroute

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// streamErr is how a response body copy ended abnormally. code is set when
// the upstream broke after the client got bytes (the client gets a final
// error event); it is empty when the client itself went away.
type streamErr struct {
	result string
	code   string
}

// copyResponse sends the upstream response body to the client: byte for
// byte, or through the think-tag rewriter. first holds bytes already read
// (streams read their first chunk before committing), firstErr the error
// that came with them.
func (h *Handler) copyResponse(w http.ResponseWriter, r *http.Request, ctx context.Context, resp *http.Response,
	u *upstream, first []byte, firstErr error, buf []byte, w8 *watchdog) *streamErr {
	sse := isEventStream(resp)
	rewrite := u.think != transform.ThinkOff && resp.StatusCode < 300 && identityEncoded(resp)
	if u.think != transform.ThinkOff && resp.StatusCode < 300 && !identityEncoded(resp) {
		if c := h.logger.Check(zapcore.WarnLevel, "compressed upstream response, think_tags not applied"); c != nil {
			c.Write(zap.String("upstream", u.id), zap.String("content_encoding", resp.Header.Get("Content-Encoding")))
		}
	}
	if rewrite && !sse {
		return h.copyCompletion(w, r, resp, u, first, firstErr)
	}

	// Heartbeats and the final error event are plain-text SSE: spliced into
	// a compressed stream (passed through untouched) they would corrupt it,
	// so such a stream gets neither; a cut one is only aborted.
	plainSSE := sse && identityEncoded(resp)
	out := &clientWriter{w: w, rc: http.NewResponseController(w), flush: sse || resp.ContentLength < 0, atBoundary: true}
	if sse {
		if h.heartbeat > 0 && plainSSE {
			out.startHeartbeat(h.heartbeat)
		}
		if u.streamIdle > 0 {
			w8.arm(u.streamIdle, codeStalled)
		}
	}
	defer out.stop()

	var sink io.Writer = out
	var rw *transform.StreamRewriter
	if rewrite {
		rw = getRewriter(u.think, out.queueEvent)
		rw.SetMaxEventSize(int(h.maxRewrite))
		defer h.putRewriter(u, rw)
		sink = batch{rw, out}
	}
	err := pump(sink, resp.Body, first, firstErr, buf, w8)
	if err == nil && rw != nil {
		err = rw.Close()
		if err == nil {
			err = out.writeQueued()
		}
	}
	if err == nil {
		return nil
	}
	return h.streamFailure(w, r, ctx, u, out, plainSSE, err, w8)
}

// pump copies first, then the rest of body, kicking the idle watchdog on
// every read. The watchdog is paused while a write to the client blocks (a
// slow client), so only upstream silence counts as a stall.
func pump(dst io.Writer, body io.Reader, first []byte, firstErr error, buf []byte, w8 *watchdog) error {
	if len(first) > 0 {
		w8.pause()
		_, err := dst.Write(first)
		w8.kick()
		if err != nil {
			return errClientWrite{err}
		}
	}
	if firstErr != nil {
		if firstErr == io.EOF {
			return nil
		}
		return firstErr
	}
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			w8.pause()
			_, err := dst.Write(buf[:n])
			w8.kick()
			if err != nil {
				return errClientWrite{err}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// errClientWrite wraps a failed write to the client.
type errClientWrite struct{ error }

// streamFailure classifies a body copy that did not end cleanly and, when
// the upstream is at fault on an event stream, sends the final error event.
func (h *Handler) streamFailure(w http.ResponseWriter, r *http.Request, ctx context.Context, u *upstream,
	out *clientWriter, sse bool, err error, w8 *watchdog) *streamErr {
	var cw errClientWrite
	if errors.As(err, &cw) || r.Context().Err() != nil {
		return &streamErr{result: resultCancelled}
	}
	se := &streamErr{result: resultNetErr, code: codeInterrupted}
	switch {
	case w8.firedFor() == codeStalled:
		se.result, se.code = resultTimeout, codeStalled
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		se.result, se.code = resultTimeout, codeRequestTimeout
	}
	if c := h.logger.Check(zapcore.WarnLevel, "upstream response broke off"); c != nil {
		c.Write(zap.String("upstream", u.id), zap.String("reason", se.code), zap.String("error", redactError(err)))
	}
	if sse {
		out.writeError(se.code)
	}
	return se
}

// streamErrorMessages are the texts of the final SSE error event.
var streamErrorMessages = map[string]string{
	codeInterrupted:    "the upstream stream was interrupted before it finished",
	codeStalled:        "the upstream stream stalled and was cut off",
	codeRequestTimeout: "the upstream exchange exceeded request_timeout",
}

// copyCompletion rewrites think tags in a non-stream completion.
func (h *Handler) copyCompletion(w http.ResponseWriter, r *http.Request, resp *http.Response, u *upstream, first []byte, firstErr error) *streamErr {
	bb := getBuffer()
	defer putBuffer(bb)
	bb.Write(first)
	if firstErr == nil {
		if _, err := bb.ReadFrom(io.LimitReader(resp.Body, h.maxRewrite+1)); err != nil {
			if r.Context().Err() != nil {
				return &streamErr{result: resultCancelled}
			}
			// Nothing was written yet, but the status is: abort.
			return &streamErr{result: resultNetErr, code: codeInterrupted}
		}
	}
	body := bb.Bytes()
	if int64(len(body)) > h.maxRewrite {
		// Too big to rewrite: pass it on as it is.
		h.warnTooBig(u, 1)
		if _, err := w.Write(body); err != nil {
			return &streamErr{result: resultCancelled}
		}
		if _, err := io.Copy(w, resp.Body); err != nil {
			return &streamErr{result: resultNetErr, code: codeInterrupted}
		}
		return nil
	}
	outBuf := getBytes()
	defer putBytes(outBuf)
	rewritten, changed := transform.RewriteCompletion((*outBuf)[:0], body, u.think)
	if changed {
		body = rewritten
		*outBuf = rewritten[:0]
	}
	if _, err := w.Write(body); err != nil {
		return &streamErr{result: resultCancelled}
	}
	return nil
}

// identityEncoded reports a response body that is not compressed.
func identityEncoded(resp *http.Response) bool {
	ce := resp.Header.Get("Content-Encoding")
	return ce == "" || ce == "identity"
}

// clientWriter writes to the client, flushing when the response streams,
// and sends SSE heartbeat comments while the upstream is silent. Writes from
// the copy loop and the heartbeat timer are serialised, and a heartbeat is
// only sent between two events, never inside one.
type clientWriter struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	flush bool

	mu         sync.Mutex
	hb         *time.Timer
	hbPeriod   time.Duration
	stopped    bool
	atBoundary bool // the bytes written so far end at an event boundary
	tail       [4]byte

	queued []byte // rewritten events waiting for the end of the read
}

func (c *clientWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.w.Write(p)
	if err != nil {
		return n, err
	}
	if c.flush {
		if err := c.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return n, err
		}
	}
	c.trackBoundary(p)
	if c.hb != nil {
		c.hb.Reset(c.hbPeriod)
	}
	return n, nil
}

// queueEvent is the emit callback of the stream rewriter. Events completed by
// one upstream read are collected and sent with one write and one flush when
// the read is processed (batch.Write): they arrived together, so nothing
// waits, and the syscalls per event drop several-fold.
func (c *clientWriter) queueEvent(ev []byte) error {
	c.queued = append(c.queued, ev...)
	return nil
}

// writeQueued sends the collected events.
func (c *clientWriter) writeQueued() error {
	if len(c.queued) == 0 {
		return nil
	}
	_, err := c.Write(c.queued)
	c.queued = c.queued[:0]
	return err
}

// batch feeds one upstream read to the rewriter, then sends what it emitted.
type batch struct {
	rw  *transform.StreamRewriter
	out *clientWriter
}

func (b batch) Write(p []byte) (int, error) {
	n, err := b.rw.Write(p)
	if err != nil {
		return n, err
	}
	return n, b.out.writeQueued()
}

// trackBoundary remembers whether the output ends with a blank line (LF,
// CR or CRLF line endings).
func (c *clientWriter) trackBoundary(p []byte) {
	if len(p) >= 4 {
		copy(c.tail[:], p[len(p)-4:])
	} else {
		copy(c.tail[:], c.tail[len(p):])
		copy(c.tail[4-len(p):], p)
	}
	t := c.tail
	c.atBoundary = t[2] == '\n' && t[3] == '\n' || t[2] == '\r' && t[3] == '\r' ||
		t == [4]byte{'\r', '\n', '\r', '\n'}
}

var keepalive = []byte(": keepalive\n\n")

// startHeartbeat sends a keepalive comment whenever nothing was written for
// period.
func (c *clientWriter) startHeartbeat(period time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hbPeriod = period
	c.hb = time.AfterFunc(period, c.beat)
}

func (c *clientWriter) beat() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	if c.atBoundary {
		if _, err := c.w.Write(keepalive); err == nil {
			_ = c.rc.Flush()
		}
	}
	c.hb.Reset(c.hbPeriod)
}

// stop ends the heartbeat; no write happens after it returns.
func (c *clientWriter) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	if c.hb != nil {
		c.hb.Stop()
	}
}

// writeError sends the final SSE error event, after closing any event the
// upstream left half-written.
func (c *clientWriter) writeError(code string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ev []byte
	if !c.atBoundary {
		ev = append(ev, "\n\n"...)
	}
	ev = append(ev, `data: {"error":{"message":`...)
	ev = appendJSONString(ev, streamErrorMessages[code])
	ev = append(ev, `,"type":"upstream_error","code":`...)
	ev = appendJSONString(ev, code)
	ev = append(ev, "}}\n\n"...)
	if _, err := c.w.Write(ev); err == nil {
		_ = c.rc.Flush()
	}
}

// rewriterPool recycles stream rewriters and their buffers.
var rewriterPool sync.Pool

func getRewriter(mode transform.ThinkMode, emit func([]byte) error) *transform.StreamRewriter {
	if rw, ok := rewriterPool.Get().(*transform.StreamRewriter); ok {
		rw.Reset(mode, emit)
		return rw
	}
	return transform.NewStreamRewriter(mode, emit)
}

func putRewriter(rw *transform.StreamRewriter) {
	rw.Reset(transform.ThinkOff, nil) // drop the emit closure
	rewriterPool.Put(rw)
}
