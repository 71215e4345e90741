package llmroute

import (
	"bytes"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// streamErr is how a response body copy ended abnormally. code is set when
// the upstream broke after the client got bytes (the client gets a final
// error event); it is empty when the client itself went away.
type streamErr struct {
	result string
	code   string
	fault  bool // the upstream is to blame: record a failure
}

// errorEventWindow bounds the write of the final error event when
// client_write_timeout is off.
const errorEventWindow = time.Second

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
	sse   bool

	// Write deadlines (client_write_timeout): each write must complete
	// within timeout and before limit (the attempt's request_timeout).
	timeout      time.Duration
	limit        time.Time
	clearBetween bool // HTTP/2: an armed deadline resets the stream even between writes
	deadlineSet  bool
	noDeadline   bool      // the connection cannot take one
	deadlineAt   time.Time // the deadline set, while deadlineSet

	// done: the line that starts the stream's final event (one of shape's
	// markers; [DONE] for chat) has been written. A translated front's
	// final event is its translator's to report (translator.Finished).
	// carry is the end of what was written before, so a marker split over
	// two writes is found too. shape is the native stream's (codec.shape),
	// nil for defaultShape; it also shapes the final error event.
	done     bool
	shape    *streamShape
	carry    [maxMarkerLen + 1]byte
	carryLen int

	mu         sync.Mutex
	hb         *time.Timer
	hbPeriod   time.Duration
	lastWrite  int64 // monoNow of the last write, for the heartbeat
	stopped    bool
	atBoundary bool // the bytes written so far end at an event boundary
	tail       [4]byte

	queued []byte // rewritten events waiting for the end of the read

	// firstWrite is when the first body byte went to the client; usage
	// collects the upstream's token counts when scanUsage (usage.go).
	firstWrite time.Time
	scanUsage  bool
	usage      transform.UsageScanner

	// finish notes a finish_reason in a chat stream, when scanFinish: a
	// stream that ends with neither it nor [DONE] was cut.
	scanFinish bool
	finish     finishScanner
}

// init readies the writer for one response; flush says whether every
// write is flushed at once (streams, bodies of unknown length), sse whether
// the body is an event stream; timeout, limit and clearBetween set up the
// write deadlines.
func (c *clientWriter) init(w http.ResponseWriter, flush, sse bool, timeout time.Duration, limit time.Time, clearBetween bool) {
	c.w, c.rc, c.flush, c.sse, c.atBoundary = w, *http.NewResponseController(w), flush, sse, true
	c.timeout, c.limit, c.clearBetween = timeout, limit, clearBetween
}

// armDeadline sets the write deadline for the next write: timeout from now,
// but no later than limit (zero = none of either).
//
// Between writes on HTTP/1 the deadline stays armed, so it is renewed only
// when less than half of timeout is left (or it was cleared): a stream's
// writes then set a deadline about once per half timeout instead of once
// per event, and each write still has between half and all of timeout to
// complete.
func (c *clientWriter) armDeadline(timeout time.Duration, limit time.Time) {
	if c.noDeadline || timeout <= 0 && limit.IsZero() {
		return
	}
	var d time.Time
	if timeout > 0 {
		now := time.Now()
		if c.deadlineSet && !c.clearBetween && (c.deadlineAt.Equal(limit) || c.deadlineAt.Sub(now) > timeout/2) {
			return
		}
		d = now.Add(timeout)
	} else if c.deadlineSet && c.deadlineAt.Equal(limit) {
		return // only request_timeout bounds writes: set once
	}
	if !limit.IsZero() && (d.IsZero() || limit.Before(d)) {
		d = limit
	}
	if err := c.rc.SetWriteDeadline(d); err != nil {
		c.noDeadline = true // e.g. a test recorder: nothing to bound
		return
	}
	c.deadlineSet, c.deadlineAt = true, d
}

// afterWrite clears the deadline where one left armed would cut a healthy
// stream while the proxy waits for the upstream (HTTP/2).
func (c *clientWriter) afterWrite() {
	if c.clearBetween {
		c.clearDeadline()
	}
}

// clearDeadline removes the write deadline at the end of the exchange, so
// the next request on a kept-alive connection does not inherit it.
func (c *clientWriter) clearDeadline() {
	if c.deadlineSet {
		c.deadlineSet = false
		_ = c.rc.SetWriteDeadline(time.Time{})
	}
}

// doneMarker is the final event of a chat completion stream.
const doneMarker = "data: [DONE]"

// streamShape is how an event stream of one API, passed through as the
// upstream sent it, shows its end and takes the proxy's final error event.
// Each codec has one (codec.shape).
type streamShape struct {
	// markers are the lines that start the stream's final event: once one
	// has reached the client the answer is whole, whatever ends the copy
	// afterwards. An upstream's own error event ends its stream too: the
	// client has the upstream's account of the failure, and a second error
	// event after it would only repeat it. markersEvent says they are
	// `event:` lines whose data follows, so the final event is only
	// complete at the next event boundary (finished).
	markers      [][]byte
	markersEvent bool
	// A stream that ends cleanly without a marker was cut when needFinish
	// and no finish reason was seen either (chat: some servers never send
	// [DONE]), or when needNamedEnd and the stream names its events.
	needFinish, needNamedEnd bool
	// finishKey is the member that carries a chunk's finish reason (nil:
	// chat's "finish_reason").
	finishKey []byte
	// noHeartbeat: the API's clients fail on a comment line, so the stream
	// gets no keepalives.
	noHeartbeat bool
	// crlf: events end in "\r\n\r\n" (Google's framing), and an event the
	// upstream left half-written is closed the same way, since a client
	// splitting on the first blank line of either kind would glue an
	// event ending otherwise to the one before it.
	crlf bool
	// errorEvent appends the proxy's final error event to ev.
	errorEvent func(ev []byte, code, message string) []byte
}

// chatMarkers: data: [DONE], the end of chat and completions streams.
var chatMarkers = [][]byte{[]byte(doneMarker)}

// defaultShape is a stream's shape when the exchange set none: [DONE] and
// OpenAI's error event.
var defaultShape = streamShape{markers: chatMarkers, errorEvent: appendOpenAIErrorEvent}

// maxMarkerLen bounds the markers of every shape (the longest is
// "event: response.incomplete").
const maxMarkerLen = 26

// appendOpenAIErrorEvent appends the final error event in OpenAI's error
// shape, as an unnamed data: event.
func appendOpenAIErrorEvent(ev []byte, code, message string) []byte {
	ev = append(ev, `data: {"error":{"message":`...)
	ev = appendJSONString(ev, message)
	ev = append(ev, `,"type":"upstream_error","code":`...)
	ev = appendJSONString(ev, code)
	return append(ev, "}}\n\n"...)
}

// getShape is the writer's stream shape.
func (c *clientWriter) getShape() *streamShape {
	if c.shape == nil {
		return &defaultShape
	}
	return c.shape
}

// finished reports that the stream's final event has been written whole.
func (c *clientWriter) finished() bool {
	return c.done && (!c.getShape().markersEvent || c.atBoundary)
}

// noteDone looks for the [DONE] event, at a line start, in what is being
// written.
func (c *clientWriter) noteDone(p []byte) {
	if c.done {
		return
	}
	// Across the seam: the end of the previous writes and the start of p.
	var joint [2 * len(c.carry)]byte
	n := copy(joint[:], c.carry[:c.carryLen])
	n += copy(joint[n:], p[:min(len(p), len(c.carry))])
	seamStart := c.carryLen < len(c.carry) // joint begins the stream
	pStart := c.carryLen == 0 || isEOL(c.carry[c.carryLen-1])
	markers := c.getShape().markers
	if hasLineAt(joint[:n], seamStart, markers) || hasLineAt(p, pStart, markers) {
		c.done = true
		return
	}
	// Keep the last len(carry) bytes of everything written.
	if len(p) >= len(c.carry) {
		c.carryLen = copy(c.carry[:], p[len(p)-len(c.carry):])
		return
	}
	// joint[:n] is carry+p here.
	c.carryLen = copy(c.carry[:], joint[max(0, n-len(c.carry)):n])
}

// hasLineAt reports whether b holds one of the markers at the start of a
// line; the start of b counts as one when startOK. It looks only at line
// starts, found with IndexByte: every SSE event starts with "data: " or
// "event: ", so searching for a marker itself stops at every event, and
// this runs on every write of a stream.
func hasLineAt(b []byte, startOK bool, markers [][]byte) bool {
	if startOK && markerAt(b, markers) {
		return true
	}
	for _, eol := range [...]byte{'\n', '\r'} {
		for rest := b; ; {
			k := bytes.IndexByte(rest, eol)
			if k < 0 {
				break
			}
			rest = rest[k+1:]
			if markerAt(rest, markers) {
				return true
			}
		}
	}
	return false
}

// markerAt reports whether b starts with one of the markers.
func markerAt(b []byte, markers [][]byte) bool {
	for _, m := range markers {
		if bytes.HasPrefix(b, m) {
			return true
		}
	}
	return false
}

func isEOL(b byte) bool { return b == '\n' || b == '\r' }

// end completes the sink chain: the client writer holds nothing back.
func (c *clientWriter) end() error { return nil }

func (c *clientWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armDeadline(c.timeout, c.limit)
	defer c.afterWrite()
	if c.firstWrite.IsZero() && len(p) > 0 {
		c.firstWrite = time.Now()
	}
	n, err := c.w.Write(p)
	if err != nil {
		return n, err
	}
	if c.scanUsage {
		c.usage.Write(p)
	}
	if c.flush {
		if err := c.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return n, err
		}
	}
	if c.sse {
		c.noteDone(p)
	}
	if c.scanFinish && !c.finish.seen {
		c.finish.scan(p)
	}
	c.trackBoundary(p)
	if c.hb != nil {
		c.lastWrite = monoNow() // the heartbeat's timer is not reset per write
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
// period. Writes only stamp lastWrite; the timer, when it fires, sleeps
// again for what is left of the period since the last write.
func (c *clientWriter) startHeartbeat(period time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hbPeriod = period
	c.lastWrite = monoNow()
	c.hb = time.AfterFunc(period, c.beat)
}

func (c *clientWriter) beat() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	if quiet := time.Duration(monoNow() - c.lastWrite); quiet < c.hbPeriod {
		c.hb.Reset(c.hbPeriod - quiet)
		return
	}
	c.lastWrite = monoNow()
	if c.atBoundary {
		c.armDeadline(c.timeout, c.limit)
		if _, err := c.w.Write(keepalive); err == nil {
			_ = c.rc.Flush()
		}
		c.afterWrite()
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

// writeError sends the final SSE error event in the stream's shape, after
// closing any event the upstream left half-written.
func (c *clientWriter) writeError(code string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ev []byte
	sh := c.getShape()
	switch {
	case c.atBoundary:
	case sh.crlf:
		ev = append(ev, "\r\n\r\n"...)
	default:
		ev = append(ev, "\n\n"...)
	}
	ev = sh.errorEvent(ev, code, streamErrorMessages[code])
	// Not bounded by request_timeout, which may be what just passed; a
	// client that takes nothing gets errorEventWindow at most.
	timeout := c.timeout
	if timeout <= 0 {
		timeout = errorEventWindow
	}
	c.armDeadline(timeout, time.Time{})
	if _, err := c.w.Write(ev); err == nil {
		_ = c.rc.Flush()
	}
	c.afterWrite()
}

// finishScanner finds a chat chunk's finish reason (a "finish_reason" member
// whose value is a non-empty string) in a stream written to it in pieces;
// with key set, that member instead (Gemini's "finishReason").
// Inside a JSON string every quote is escaped, so the key with its quotes
// can only be a member name. The start of a match cut by the end of a
// piece is kept for the next one.
type finishScanner struct {
	seen    bool
	key     []byte // the member with its quotes; nil: chatFinishKey
	pending []byte
}

var chatFinishKey = []byte(`"finish_reason"`)

// maxFinishPending bounds what is kept of a match cut between pieces (the
// key and the white space after it).
const maxFinishPending = 256

func (f *finishScanner) scan(p []byte) {
	if len(f.pending) > 0 {
		// Rare (a piece ended inside the key or before its value): the
		// copy costs nothing on the common path.
		p = append(f.pending[:len(f.pending):len(f.pending)], p...)
		f.pending = nil
	}
	finishKey := f.key
	if finishKey == nil {
		finishKey = chatFinishKey
	}
	finishTail := finishKey[1:]
	for {
		k := bytes.Index(p, finishTail)
		if k < 0 {
			// The key itself may be cut: keep a tail that starts it.
			for n := min(len(finishKey)-1, len(p)); n > 0; n-- {
				if bytes.HasSuffix(p, finishKey[:n]) {
					f.keep(p[len(p)-n:])
					break
				}
			}
			return
		}
		if k == 0 || p[k-1] != '"' {
			p = p[k+len(finishTail):]
			continue
		}
		rest := p[k+len(finishTail):]
		i := jsonscan.SkipWS(rest, 0)
		if i < len(rest) && rest[i] != ':' {
			p = rest
			continue
		}
		i = jsonscan.SkipWS(rest, i+1)
		if i+1 >= len(rest) {
			f.keep(p[k-1:]) // the value is not all here yet
			return
		}
		if rest[i] == '"' && rest[i+1] != '"' {
			f.seen = true
			return
		}
		p = rest[i:] // null, or an empty string
	}
}

func (f *finishScanner) keep(b []byte) {
	if len(b) <= maxFinishPending {
		f.pending = append([]byte(nil), b...)
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
