package llmroute

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// exchange carries one attempt's HTTP work from the request going upstream
// to the last byte written to the client, so the steps below share state
// instead of passing it along.
//
// The response flows upstream body → copy loop → sink → clientWriter. The
// sink is a chain: the think rewriter today, a front's translator (chat →
// Messages / Responses) later, each a stage that writes into the next and
// ends in the clientWriter. A non-stream body that must change as a whole
// goes through body instead: it is buffered, transformed, then written.
type exchange struct {
	// call sends the request and reads the answer's start (call.go): its
	// h, u, r, ctx, watchdog, resp and first bytes are the exchange's.
	// Its stream is the client's: the client asked for a stream.
	call
	w  http.ResponseWriter
	t  *target
	fr frontReq // copied: a pointer would make the serve loop's value escape

	native, translated bool        // the upstream speaks the front's API / chat, translated (codec.encode)
	tr                 translation // the translation, when translated
	st                 translator  // the front's stream stage, when translated
	ts                 translateSink

	sse      bool // the response is an event stream
	plainSSE bool // … and not compressed: heartbeats and error events may be spliced in
	// namedEvents: a native stream that names its events ("event: …"), so
	// its final event can be told by name.
	namedEvents bool

	out  clientWriter  // the last stage: writes, flushes, heartbeats
	sink sink          // where the copy loop writes; &out or a stage before it
	rws  rewriteSink   // the think-rewrite stage, when used
	body bodyTransform // non-stream whole-body transform, nil = pass through

	follow *followSink // model resume: the first stage, following the chat stream (resume.go)
	guard  *guardSink  // model repeat_guard: the first stage (repeat.go); &gs
	gs     guardSink
	cont   *continuation // set when a broken stream is handed over to be continued

	// extraAttempts: continuations of a non-stream answer that looped.
	extraAttempts int
}

// sink is one stage of the response chain. Write takes what the stage
// before it produced (an upstream read, for the first stage); end is called
// once after the upstream body ended cleanly, so the stage can emit what it
// still holds.
type sink interface {
	io.Writer
	end() error
}

// bodyTransform rewrites a whole non-stream response body into dst.
// changed false means body is to be sent as it is.
type bodyTransform interface {
	transformBody(dst, body []byte) (out []byte, changed bool)
}

// thinkBody is the think-tag rewrite of a whole completion.
type thinkBody transform.ThinkMode

func (m thinkBody) transformBody(dst, body []byte) ([]byte, bool) {
	return transform.RewriteCompletion(dst, body, transform.ThinkMode(m))
}

// rewriteSink feeds one upstream read to the think rewriter, then sends
// what it emitted with one write (see clientWriter.queueEvent).
type rewriteSink struct {
	rw  *transform.StreamRewriter
	out *clientWriter
}

func (s *rewriteSink) Write(p []byte) (int, error) {
	n, err := s.rw.Write(p)
	if err != nil {
		return n, err
	}
	return n, s.out.writeQueued()
}

func (s *rewriteSink) end() error {
	if err := s.rw.Close(); err != nil {
		return err
	}
	return s.out.writeQueued()
}

// exchange does the HTTP work of an attempt.
func (h *Handler) exchange(w http.ResponseWriter, r *http.Request, t *target, body []byte, fr *frontReq) attemptResult {
	ex := &exchange{call: call{h: h, u: t.up, r: r, log: h.logger, stream: fr.stream, firstByte: t.up.firstByte, rt: fr.rt, idx: fr.idx, pl: fr.place,
		own: fr.own}, w: w, t: t, fr: *fr}
	defer ex.out.clearDeadline()
	res := ex.run(body)
	switch {
	case ex.key != nil:
		ex.key.count(&res)
		res.key = ex.key.label
	case ex.ownKey:
		res.key = "own"
	}
	if ex.cont == nil {
		ex.releaseGuard()
	}
	res.api, res.mode = fr.api, ex.mode()
	res.usage, res.sent, res.firstByte = ex.out.usage.Usage, ex.sent, ex.out.firstWrite
	return res
}

func (ex *exchange) run(body []byte) attemptResult {
	h, r, u := ex.h, ex.r, ex.u
	out, ep, errBody, status := ex.buildBody(body)
	if status != 0 {
		if errBody != nil {
			// The front's translator refused the body, in its own shape.
			h.noteRefusal(r, "bad_request", "translation_refused", status, 0, zap.String("upstream", u.ID))
			ex.w.Header().Set("Cache-Control", "no-store")
			writeJSON(ex.w, status, errBody)
		} else {
			h.refuse(ex.w, r, ex.fr.f, errBadJSON, zap.String("upstream", u.ID))
		}
		return attemptResult{out: outDone, result: result4xx, status: status}
	}

	if !ex.takeKey() {
		return h.keysCooling(u)
	}
	ex.open(h.attemptContext(r.Context()))
	defer ex.close()
	req := ex.request(u.urls[ep], out)
	if u.sessionHdr != "" {
		req.Header.Set(u.sessionHdr, ex.sessionID(body, out))
	}
	if ex.translated {
		req.Header.Set("Accept-Encoding", "identity") // the answer is translated
	}
	res, ok := ex.send(req)
	if !ok {
		return res
	}
	resp := ex.resp

	ex.chooseSinks()
	ex.watchResume()
	guardWhole := ex.guardsWhole()
	if guardWhole && ex.body == nil {
		ex.body = identityBody{} // read whole, to be checked before it goes out
	}
	if ex.body != nil {
		// A whole-body transform reads the body before the status goes out,
		// so that a read error can still fail over.
		whole := getBuffer()
		defer putBuffer(whole)
		if err := ex.readWhole(whole); err != nil {
			return ex.classifyError(err)
		}
		if ex.translated && ex.firstErr == nil {
			if res, refused := ex.tooBigToTranslate(); refused {
				return res
			}
		}
		if guardWhole && ex.firstErr == io.EOF {
			n, changed := 0, false
			if ex.first, n, changed = ex.guardWhole(body, ex.first); changed {
				resp.Header.Del("Content-Length")
			}
			if n > 0 {
				// Each continuation is an attempt: the count goes out with
				// the headers (and to the serve loop).
				ex.extraAttempts = n
				h.setRouteHeaders(ex.w, ex.t, ex.fr.attempts+n)
			}
		}
	}

	if resp.StatusCode < 300 {
		u.recordSuccess(time.Now())
	}
	res = attemptResult{out: outDone, result: statusResult(resp.StatusCode), status: resp.StatusCode}
	// The client gets the upstream's status and headers (x-request-id, its
	// Content-Type, a 400's status), minus hop-by-hop ones.
	h.writeResponseHeader(ex.w, resp, u, ex.translated)
	if serr := ex.copyResponse(); serr != nil {
		res.result = serr.result
		res.abort = serr.code != "" && ex.cont == nil
		res.fault = serr.fault
	}
	res.cont = ex.cont
	res.extraAttempts = ex.extraAttempts
	return res
}

// chooseSinks decides how the body reaches the client: through the sink
// chain (streams, anything passed through) or a whole-body transform, and
// readies the client writer.
func (ex *exchange) chooseSinks() {
	h, u, resp := ex.h, ex.u, ex.resp
	ex.sse = isEventStream(resp)
	// Heartbeats and the final error event are plain-text SSE: spliced into
	// a compressed stream (passed through untouched) they would corrupt it,
	// so such a stream gets neither; a cut one is only aborted.
	ex.plainSSE = ex.sse && identityEncoded(resp)
	rewrite := u.think != transform.ThinkOff && resp.StatusCode < 300
	if rewrite && !identityEncoded(resp) {
		rewrite = false
		if c := h.logger.Check(zapcore.WarnLevel, "compressed upstream response, think_tags not applied"); c != nil {
			c.Write(zap.String("upstream", u.ID), zap.String("content_encoding", resp.Header.Get("Content-Encoding")))
		}
	}
	var limit time.Time
	if d, ok := ex.ctx.Deadline(); ok {
		limit = d // request_timeout bounds time blocked on the client too
	}
	ex.out.init(ex.w, ex.sse || resp.ContentLength < 0, ex.sse, h.clientWrite, limit, ex.r.ProtoMajor == 2)
	if ex.native {
		// A native stream is judged by the name of its final event only
		// when it names its events (Anthropic, OpenAI, Ollama, llama.cpp
		// and vLLM all do); a data-only one is passed as it ends.
		ex.namedEvents = bytes.HasPrefix(bytes.TrimLeft(ex.first, "\r\n"), []byte("event:"))
		ex.out.shape = ex.fr.codec.shape()
	}
	ex.sink = &ex.out
	// Token usage is read from what reaches the client, when it is plain
	// text (a compressed body is passed through unread).
	ex.out.scanUsage = resp.StatusCode < 300 && identityEncoded(resp)
	ex.out.usage.Timings = ex.u.timings
	ex.out.scanFinish = ex.native && ex.out.shape.needFinish && ex.plainSSE && resp.StatusCode < 300
	if ex.out.scanFinish {
		ex.out.finish.key = ex.out.shape.finishKey
	}
	if ex.translated {
		ex.chooseTranslator(rewrite)
		return
	}
	switch {
	case rewrite && !ex.sse:
		ex.body = thinkBody(u.think)
	case rewrite:
		rw := getRewriter(u.think, ex.out.queueEvent)
		rw.SetMaxEventSize(int(h.maxRewrite))
		ex.rws = rewriteSink{rw: rw, out: &ex.out}
		ex.sink = &ex.rws
	}
}

// chooseTranslator sets up a translated answer: an event stream goes
// through the think rewriter (when rewrite) into the front's Stream; any
// other body (a 2xx completion, an upstream error) is read whole and
// translated as one.
func (ex *exchange) chooseTranslator(rewrite bool) {
	if !ex.sse || ex.resp.StatusCode >= 300 {
		ex.body = translateBody{ex}
		return
	}
	ex.st = ex.tr.stream(ex.out.queueEvent)
	ex.ts = translateSink{st: ex.st, out: &ex.out}
	if rewrite {
		st := ex.st
		rw := getRewriter(ex.u.think, func(b []byte) error { _, err := st.Write(b); return err })
		rw.SetMaxEventSize(int(ex.h.maxRewrite))
		ex.rws.rw, ex.ts.rw = rw, rw // rws.rw: returned to the pool by copyResponse
	}
	ex.sink = &ex.ts
}

// copyResponse sends the upstream response body to the client.
func (ex *exchange) copyResponse() *streamErr {
	if ex.body != nil {
		return ex.copyCompletion()
	}
	if ex.sse {
		if hb := ex.heartbeat(); hb > 0 && ex.plainSSE {
			ex.out.startHeartbeat(hb)
		}
		if ex.u.streamIdle > 0 {
			ex.w8.prime(ex.u.streamIdle, codeStalled)
		}
	}
	defer ex.out.stop()
	defer ex.releaseRewriter()
	err := ex.endStream(pump(ex.sink, ex.resp.Body, ex.first, ex.firstErr, *ex.buf, &ex.w8))
	if err == nil {
		return nil
	}
	if se := ex.handOver(err); se != nil {
		return se // a continuation takes the stream on (resume.go)
	}
	return ex.streamFailure(err)
}

// heartbeat is the period of the stream's keepalive comments, 0 for none:
// a front whose clients' stream readers fail on a comment line (Gemini's)
// gets none, native or translated.
func (ex *exchange) heartbeat() time.Duration {
	if ex.fr.codec.shape().noHeartbeat {
		return 0
	}
	return ex.h.heartbeat
}

// errUnfinished: the upstream ended an event stream cleanly before the
// answer's end. A backend killed mid-answer whose body is delimited by the
// connection's close looks like that, and so does an engine that stops a
// generation without saying why.
var errUnfinished = errors.New("the upstream ended the stream before the answer's end (no finish reason, no [DONE], no final event)")

// endStream completes a body copy that ended with err: a clean end lets the
// sink chain emit what it holds, then checks that the stream had its end.
// A translator finds that out itself (its end returns an error).
func (ex *exchange) endStream(err error) error {
	if err == nil {
		err = ex.sink.end()
	}
	if err == nil && ex.unfinished() {
		err = errUnfinished
	}
	return err
}

// unfinished reports a plain event stream, passed through, that ended
// without its end (streamShape): a chat stream with neither a finish
// reason nor [DONE], a native Messages stream without message_stop, a
// native Responses stream without response.completed or
// response.incomplete. A finish reason without [DONE] is a whole answer
// (some servers never send it). A compressed stream is not read, so it is
// not judged; a translated one is its translator's to judge.
func (ex *exchange) unfinished() bool {
	if !ex.plainSSE || ex.resp.StatusCode >= 300 || ex.out.done || !ex.native {
		return false
	}
	sh := ex.out.shape
	return sh.needFinish && !ex.out.finish.seen || sh.needNamedEnd && ex.namedEvents
}

// releaseRewriter returns the think rewriter to its pool, unless a
// continuation goes on writing through it.
func (ex *exchange) releaseRewriter() {
	if ex.rws.rw != nil && ex.cont == nil {
		ex.h.putRewriter(ex.u, ex.rws.rw)
	}
}

// pump copies first, then the rest of body. The idle watchdog runs only
// while the proxy waits for the upstream: it is held while a read is
// processed and written to the client (a slow client is not upstream
// silence), and which of a read and the timer won is decided by that hold.
func pump(dst io.Writer, body io.Reader, first []byte, firstErr error, buf []byte, w8 *watchdog) error {
	if len(first) > 0 {
		if _, err := dst.Write(first); err != nil {
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
		w8.resume()
		n, rerr := body.Read(buf)
		lost := w8.hold()
		if n > 0 {
			// Bytes read are the upstream's, whoever won: pass them on.
			if _, err := dst.Write(buf[:n]); err != nil {
				return errClientWrite{err}
			}
		}
		switch {
		case rerr == io.EOF:
			return nil
		case lost != "":
			return errTimerWon{lost}
		case rerr != nil:
			return rerr
		}
	}
}

// errClientWrite wraps a failed write to the client.
type errClientWrite struct{ error }

// errTimerWon: the watchdog fired before a read returned; the attempt is
// cancelled for that reason.
type errTimerWon struct{ reason string }

func (e errTimerWon) Error() string { return "watchdog fired: " + e.reason }

// streamFailure classifies a body copy that did not end cleanly and, when
// the upstream is at fault on an event stream, sends the final error event.
func (ex *exchange) streamFailure(err error) *streamErr {
	se := ex.breakVerdict(err)
	if se == nil || se.code == "" {
		return se
	}
	ex.logBreak(se.code, err)
	ex.sendErrorEvent(se.code)
	return se
}

// breakVerdict classifies a body copy of this exchange that ended with err.
func (ex *exchange) breakVerdict(err error) *streamErr {
	return copyVerdict(err, &ex.w8, ex.r.Context().Err() != nil, ex.ctx.Err(), ex.finished())
}

// copyVerdict is streamVerdict for a copy that ended with err, the
// watchdog w8 having run over it.
func copyVerdict(err error, w8 *watchdog, clientGone bool, ctxErr error, done bool) *streamErr {
	var cw errClientWrite
	fired := w8.firedFor()
	var tw errTimerWon
	if errors.As(err, &tw) {
		fired = tw.reason
	}
	return streamVerdict(done, errors.As(err, &cw), clientGone, fired, ctxErr)
}

// finished reports that the stream's final event reached the client: on
// the chat front a finish reason is enough (what may follow it, the usage
// chunk and [DONE], adds nothing to the answer), so a break after it is not
// a cut.
func (ex *exchange) finished() bool {
	return ex.out.finished() || ex.out.finish.seen || ex.st != nil && ex.st.Finished()
}

func (ex *exchange) logBreak(code string, err error) {
	if c := ex.h.logger.Check(zapcore.WarnLevel, "upstream response broke off"); c != nil {
		c.Write(zap.String("upstream", ex.u.ID), zap.String("reason", code), zap.String("error", redactError(err)))
	}
}

// sendErrorEvent sends the final error event of a broken stream.
func (ex *exchange) sendErrorEvent(code string) {
	switch {
	case ex.st != nil:
		// The front's own error event (Anthropic's event: error, Responses'
		// response.failed), then the abort.
		_ = ex.st.Fail(code, streamErrorMessages[code])
		_ = ex.out.writeQueued()
	case ex.plainSSE:
		ex.out.writeError(code)
	}
}

// streamVerdict classifies a response that broke off after it reached the
// client, in order:
//   - the stream's final event ([DONE]; a native Messages message_stop, a
//     native Responses response.completed) had gone out: ok, whatever came
//     after (the openai SDK closes the connection right after it);
//   - the client stopped reading or left: cancelled, no error event, the
//     upstream not blamed;
//   - the idle timer: a stall, the upstream's fault;
//   - request_timeout: a long generation, not the upstream's fault;
//   - anything else: the upstream connection broke.
func streamVerdict(done, clientWrite, clientGone bool, fired string, ctxErr error) *streamErr {
	switch {
	case done:
		return nil
	case clientWrite || clientGone:
		return &streamErr{result: resultCancelled}
	case fired == codeStalled:
		return &streamErr{result: resultTimeout, code: codeStalled, fault: true}
	case errors.Is(ctxErr, context.DeadlineExceeded):
		return &streamErr{result: resultTimeout, code: codeRequestTimeout}
	}
	return &streamErr{result: resultNetErr, code: codeInterrupted, fault: true}
}

// readWhole reads a non-stream body (after what ex.first holds) into whole,
// up to max_rewrite_size+1 bytes, before anything is sent to the client.
func (ex *exchange) readWhole(whole *bytes.Buffer) error {
	whole.Write(ex.first)
	if ex.firstErr == nil {
		if _, err := whole.ReadFrom(io.LimitReader(ex.resp.Body, ex.h.maxRewrite+1)); err != nil {
			return err
		}
	}
	ex.first, ex.firstErr = whole.Bytes(), io.EOF
	if int64(len(ex.first)) > ex.h.maxRewrite {
		ex.firstErr = nil // more may follow
	}
	return nil
}

// tooBigToTranslate handles a translated non-stream answer larger than
// max_rewrite_size. Passing it on as it came would hand a Messages or
// Responses client chat JSON it cannot read, and translating it would mean
// holding more than the operator allowed in memory: a 2xx answer becomes a
// 502 in the front's shape that names the setting (refused true); an
// upstream error is translated from what was read, which holds its message.
func (ex *exchange) tooBigToTranslate() (attemptResult, bool) {
	if ex.resp.StatusCode >= 300 {
		ex.firstErr = io.EOF // translate the start of the error body
		return attemptResult{}, false
	}
	ex.u.recordSuccess(time.Now()) // the upstream answered; the bound is ours
	if c := ex.h.logger.Check(zapcore.WarnLevel, "translated answer larger than max_rewrite_size"); c != nil {
		c.Write(zap.String("upstream", ex.u.ID), zap.Stringer("api", ex.fr.api), zap.Int64("max_rewrite_size", ex.h.maxRewrite))
	}
	msg := "the upstream's answer is larger than max_rewrite_size (" + strconv.FormatInt(ex.h.maxRewrite, 10) +
		" bytes), the most a non-stream answer translated from chat completions may be; raise max_rewrite_size, or send the request with stream: true"
	body := ex.tr.errorBody(http.StatusBadGateway, "response_too_large", msg)
	ex.w.Header().Set("Cache-Control", "no-store")
	writeJSON(ex.w, http.StatusBadGateway, body)
	return attemptResult{out: outDone, result: result5xx, status: http.StatusBadGateway}, true
}

// copyCompletion sends a non-stream body read by readWhole through ex.body.
func (ex *exchange) copyCompletion() *streamErr {
	body := ex.first
	if ex.firstErr == nil {
		// Too big to rewrite: pass it on as it is.
		ex.h.warnTooBig(ex.u, 1)
		if _, err := ex.out.Write(body); err != nil {
			return &streamErr{result: resultCancelled}
		}
		if err := pump(&ex.out, ex.resp.Body, nil, nil, *ex.buf, &ex.w8); err != nil {
			return ex.streamFailure(err)
		}
		return nil
	}
	outBuf := getBytes()
	defer putBytes(outBuf)
	rewritten, changed := ex.body.transformBody((*outBuf)[:0], body)
	if changed {
		body = rewritten
		*outBuf = rewritten[:0]
	}
	if _, err := ex.out.Write(body); err != nil {
		return &streamErr{result: resultCancelled}
	}
	return nil
}
