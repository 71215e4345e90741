package llmroute

import (
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// streamErr is how a response body copy ended abnormally. code is set when
// the upstream broke after the client got bytes (the client gets a final
// error event); it is empty when the client itself went away.
type streamErr struct {
	result string
	code   string
}

// maxRewriteBody bounds how much of a non-stream response is buffered for
// think-tag rewriting; a larger body passes through untouched.
const maxRewriteBody = 16 << 20

// streamErrorMessages are the texts of the final SSE error event.
var streamErrorMessages = map[string]string{
	codeInterrupted:    "the upstream stream was interrupted before it finished",
	codeStalled:        "the upstream stream stalled and was cut off",
	codeRequestTimeout: "the upstream exchange exceeded request_timeout",
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
	rc    http.ResponseController // a value: one allocation less per request
	flush bool

	mu         sync.Mutex
	hb         *time.Timer
	hbPeriod   time.Duration
	stopped    bool
	atBoundary bool // the bytes written so far end at an event boundary
	tail       [4]byte

	queued []byte // rewritten events waiting for the end of the read
}

// init readies the writer for one response; flush says whether every
// write is flushed at once (streams, bodies of unknown length).
func (c *clientWriter) init(w http.ResponseWriter, flush bool) {
	c.w, c.rc, c.flush, c.atBoundary = w, *http.NewResponseController(w), flush, true
}

// end completes the sink chain: the client writer holds nothing back.
func (c *clientWriter) end() error { return nil }

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
