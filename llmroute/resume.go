package llmroute

import (
	"encoding/json"
	"net/http"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// Mid-stream continuation (model `resume on`).
//
// A stream of a model with resume on gets a first stage in its sink chain,
// followSink, which passes the chat events through whole and remembers what
// the client was sent (transform.ChatResume). When the upstream breaks off
// after the first byte (cut, stall, request_timeout), the exchange hands
// the stream over instead of sending the error event: its attempt is
// recorded and its slot freed as usual, then the serve loop calls resume,
// which claims the next free upstream of the model and sends it either the
// request plus an assistant message holding the delivered text (prefill) or
// the request as it was (replay, matched against the delivered text). The
// continuation's bytes go through the same follower and the rest of the
// same chain (think rewriter, a front's translator, the client writer), so
// the client sees one stream. Each continuation is an attempt of its own:
// slot, metric, backoff and log as any other.

// Results of llm_proxy_stream_resumes_total.
const (
	resumeOK       = "ok"
	resumeDiverged = "diverged"
	resumeFailed   = "failed"
)

// followSink is the follower as the first stage of the chain.
type followSink struct {
	cr   *transform.ChatResume
	next sink
}

func (s *followSink) Write(p []byte) (int, error) { return s.cr.Write(p) }

func (s *followSink) end() error {
	if err := s.cr.Flush(); err != nil {
		return err
	}
	return s.next.end()
}

// watchResume puts the follower in front of the chain when the stream could
// be continued: the model has resume on, and the answer is a plain-text
// chat event stream (the chat front, or a front translated from chat).
func (ex *exchange) watchResume() {
	if !ex.fr.resume && ex.fr.guard == nil || !ex.plainSSE || ex.body != nil || ex.resp.StatusCode >= 300 ||
		ex.fr.api != apiChat && !ex.translated {
		return
	}
	if ex.fr.resume {
		ex.follow = &followSink{next: ex.sink}
		ex.follow.cr = transform.NewChatResume(ex.follow.next)
		ex.sink = ex.follow
	}
	// The guard follows the stream itself; without resume a follower only
	// takes over at a loop (repeat.go).
	ex.watchRepeats()
}

// continuation is a broken stream waiting to be finished elsewhere.
type continuation struct {
	ex   *exchange // the first exchange: its chain and client writer go on
	from *upstream // the upstream that broke last
	code string    // why it broke: the error event's code if nobody finishes
	// loop: the stream was stopped at a loop (repeat.go); recoveries is
	// how many continuations went on after one.
	loop       bool
	recoveries int
	closed     bool // close ran (a resume that turns into a loop recovery defers it twice)
}

// handOver takes a broken stream from the exchange when it is followed and
// the upstream (not the client) ended it; nil leaves it to streamFailure.
func (ex *exchange) handOver(err error) *streamErr {
	if ex.loopTrip() != nil {
		// The guard stopped the copy at a loop: the upstream did nothing
		// wrong, and the answer goes on elsewhere or ends (repeat.go).
		ex.followFromGuard()
		ex.cont = &continuation{ex: ex, from: ex.u, code: codeRepeat, loop: true}
		return &streamErr{result: resultOK}
	}
	if ex.follow == nil || !ex.fr.resume {
		return nil
	}
	se := ex.breakVerdict(err)
	if se == nil || se.code == "" {
		return nil
	}
	ex.logBreak(se.code, err)
	ex.cont = &continuation{ex: ex, from: ex.u, code: se.code}
	return se
}

// contVerdict is how one continuation attempt ended.
type contVerdict int

const (
	contDone            contVerdict = iota // the stream is complete (or the client left)
	contNext                               // this upstream could not finish it: try the next
	contDiverged                           // the replay disagreed with the delivered text
	contPrefillRejected                    // a 400 to the prefill: replay on the same upstream
	contRepeat                             // the repeat guard stopped it at a loop
)

// resume finishes a stream handed over by the attempt on rt.targets[idx],
// walking the model's later upstreams until one completes it. It returns the
// attempt that did and its target; when none does, the client gets the
// error event and the response is aborted, as without resume.
func (h *Handler) resume(r *http.Request, rt *route, idx int, first attemptResult, body []byte, fr *frontReq) (attemptResult, *target) {
	c := first.cont
	if c.loop {
		return h.recoverLoop(r, rt, idx, c, first, body, fr)
	}
	defer c.close()
	if why := c.notResumable(body, fr); why != "" {
		c.fail(rt.name, "", why)
	}
	if fr.api != apiChat {
		// The continuation is a chat request: only the model's upstreams
		// that serve chat, in the same order, after the one that broke.
		name := rt.name
		if rt, idx = h.chatRoute(rt.name, c.from); rt == nil {
			c.fail(name, "", "no_upstream")
		}
	}
	next := 0 // a target a context-length refusal claimed (0: none)
	for after := idx; ; {
		j, ok := next, next > 0
		if !ok {
			j, ok = h.claimNext(rt, fr.place, after)
		}
		if !ok {
			c.fail(rt.name, "", "no_upstream")
		}
		t := &rt.targets[j]
		res, v := h.continueOn(r, rt, j, c, body, fr)
		switch v {
		case contDone:
			if res.result != resultCancelled {
				h.metrics.resumes.WithLabelValues(rt.name, resumeOK).Inc()
				if ce := h.logger.Check(zapcore.InfoLevel, "stream resumed"); ce != nil {
					ce.Write(zap.String("model", rt.name), zap.String("from", c.from.ID), zap.String("to", t.up.ID))
				}
			}
			return c.final(res), t
		case contDiverged:
			c.fail(rt.name, t.up.ID, resumeDiverged)
		case contRepeat:
			// The continuation of a break looped: the guard's recovery
			// takes over from here.
			c.from, c.loop = t.up, true
			return h.recoverLoop(r, rt, j, c, res, body, fr)
		}
		if why := c.notResumable(nil, fr); why != "" {
			if res.next > 0 {
				releaseClaim(&rt.targets[res.next])
			}
			c.fail(rt.name, t.up.ID, why)
		}
		if res.fault {
			c.from = t.up // it broke as well: the next one continues from it
		}
		after, next = j, res.next
	}
}

// releaseClaim gives back a slot claimed for a target that will not be
// tried.
func releaseClaim(t *target) {
	t.up.led.ReleaseLong(t.long) // before the slot: its release wakes the queue
	t.up.release()
}

// chatRoute is the model's route of chat-serving upstreams and the index
// of u in it (nil when u is not there).
func (h *Handler) chatRoute(model string, u *upstream) (*route, int) {
	rt := h.table.apiRoutes[apiChat][model]
	if rt == nil {
		return nil, 0
	}
	for i := range rt.targets {
		if rt.targets[i].up == u {
			return rt, i
		}
	}
	return nil, 0
}

// notResumable says why the stream cannot be continued, "" when it can:
// the follower's reasons, or the request's own (codec.notResumable: a
// chat request for several choices; body is checked once, nil skips it).
func (c *continuation) notResumable(body []byte, fr *frontReq) string {
	if ok, why := c.ex.follow.cr.Resumable(); !ok {
		return why
	}
	if body != nil {
		return fr.codec.notResumable(body)
	}
	return ""
}

// fail ends a stream no upstream could finish: the error event of the
// break (diverged included: the stream_interrupted error event), the metric, the log, then the
// abort, as an attempt does for a cut stream.
func (c *continuation) fail(model, to, why string) {
	result := resumeFailed
	if why == resumeDiverged {
		result = resumeDiverged
	}
	h := c.ex.h
	h.metrics.resumes.WithLabelValues(model, result).Inc()
	if ce := h.logger.Check(zapcore.WarnLevel, "stream resume failed"); ce != nil {
		ce.Write(zap.String("model", model), zap.String("from", c.from.ID), zap.String("to", to),
			zap.String("reason", why), zap.String("code", c.code))
	}
	c.ex.sendErrorEvent(c.code)
	panic(http.ErrAbortHandler) // close runs first (deferred in resume)
}

// close ends the chain the first exchange left running.
func (c *continuation) close() {
	if c.closed {
		return
	}
	c.closed = true
	c.ex.out.stop()
	c.ex.out.clearDeadline()
	if rw := c.ex.rws.rw; rw != nil {
		c.ex.h.putRewriter(c.ex.u, rw)
	}
	c.ex.releaseGuard()
}

// final is the request's result as the serve loop reports it: the
// continuation's, with what the client writer saw over the whole stream.
func (c *continuation) final(res attemptResult) attemptResult {
	res.usage, res.firstByte, res.sent = c.ex.out.usage.Usage, c.ex.out.firstWrite, c.ex.sent
	return res
}

// continueOn runs the continuation on rt.targets[j], whose slot is
// claimed: prefill when the upstream takes it and there is text to
// prefill, else replay; a rejected prefill is replayed on the same slot.
// The upstream's run follows the same-upstream rules of any attempt
// (tryAgain: retries, a Retry-After waited out). The attempt is recorded
// (slot released, metric, backoff) exactly once, panics included.
func (h *Handler) continueOn(r *http.Request, rt *route, j int, c *continuation, body []byte, fr *frontReq) (res attemptResult, v contVerdict) {
	t := &rt.targets[j]
	start := time.Now()
	recorded := false
	defer h.finishOnPanic(rt, t, &res, start, fr.arrival, &recorded)
	prefill := t.up.prefill && c.ex.follow.cr.Content() != ""
	if ce := h.logger.Check(zapcore.InfoLevel, "continuing stream"); ce != nil {
		ce.Write(zap.String("model", rt.name), zap.String("from", c.from.ID), zap.String("to", t.up.ID),
			zap.String("path", resumePath(prefill)), zap.Int("delivered_bytes", c.ex.follow.cr.Delivered()))
	}
	run := retryRun{start: start}
	for {
		fr.attempts++ // counted, though the headers are out
		res, v = c.try(r, rt, j, body, fr, prefill)
		if v == contPrefillRejected && c.loop {
			v = contNext // a replay would only find the loop again
		}
		if v == contPrefillRejected {
			if ce := h.logger.Check(zapcore.WarnLevel, "prefill rejected, replaying"); ce != nil {
				ce.Write(zap.String("model", rt.name), zap.String("upstream", t.up.ID), zap.Int("status", res.status))
			}
			prefill = false
			continue
		}
		if !h.tryAgain(r, rt, t, &res, &run) {
			break
		}
	}
	c.ex.out.stop() // the keepalives went on through the run's waits
	if res.result == resultCancelled {
		v = contDone // the client left, during a wait too
	}
	res.api, res.mode = fr.api, c.ex.mode()
	res.usage, res.firstByte = c.ex.out.usage.Usage, c.ex.out.firstWrite
	h.finish(rt, t, res, start, fr.arrival)
	recorded = true
	return res, v
}

func resumePath(prefill bool) string {
	if prefill {
		return "prefill"
	}
	return "replay"
}

// try sends one continuation request to rt.targets[j] through the
// attempt path (call.go) and, once its stream starts, copies it through
// the first exchange's chain.
func (c *continuation) try(r *http.Request, rt *route, j int, body []byte, fr *frontReq, prefill bool) (attemptResult, contVerdict) {
	ex, h := c.ex, c.ex.h
	t := &rt.targets[j]
	u := t.up
	out, base, err := continuationBody(t, body, fr, prefill, ex.follow.cr.Content())
	if err == nil && c.loop {
		out, err = loopEdit(out, c.recoveries)
	}
	if err != nil {
		if prefill {
			return attemptResult{out: outDone, result: result4xx, status: http.StatusBadRequest}, contPrefillRejected
		}
		return attemptResult{out: outDone, result: result4xx, status: http.StatusBadRequest}, contNext
	}
	cl := call{h: h, u: u, r: r, log: h.logger, stream: true, firstByte: u.firstByte, rt: rt, idx: j, pl: fr.place, own: fr.own}
	cl.open(h.attemptContext(r.Context()))
	defer cl.close()
	ex.out.restart(cl.limit(), ex.heartbeat(), ex.plainSSE) // keepalives while this upstream thinks

	req := cl.request(u.urls[epChat], out)
	if u.sessionHdr != "" {
		sx := exchange{call: call{h: h}, fr: *fr, tr: ex.tr}
		req.Header.Set(u.sessionHdr, sx.sessionID(body, base)) // the history, not the prefill
	}
	req.Header.Set("Accept-Encoding", "identity") // the answer is followed
	res, ok := cl.send(req)
	if !ok {
		if res.result == resultCancelled {
			return res, contDone
		}
		return res, contNext
	}
	switch st := cl.resp.StatusCode; {
	case prefill && st == http.StatusBadRequest:
		cl.discard()
		return attemptResult{out: outDone, result: result4xx, status: st}, contPrefillRejected
	case st >= 300:
		cl.discard() // this upstream will not take the request: the next may
		return attemptResult{out: outDone, result: statusResult(st), status: st}, contNext
	case !isEventStream(cl.resp) || !identityEncoded(cl.resp):
		cl.discard()
		return attemptResult{out: outFailover, result: resultNetErr, status: st}, contNext
	}
	res, v := c.copy(r, t, &cl, prefill)
	ex.out.stop() // the stream went through: no wait on this upstream follows
	return res, v
}

// copy sends the continuation's stream through the chain, bounded by the
// upstream's idle timeout and this attempt's request_timeout.
func (c *continuation) copy(r *http.Request, t *target, cl *call, prefill bool) (attemptResult, contVerdict) {
	ex, u, resp := c.ex, t.up, cl.resp
	if c.loop {
		ex.follow.cr.ContinueAfterLoop()
	} else {
		ex.follow.cr.Continue(prefill)
	}
	if ex.guard != nil {
		ex.guard.g.Continue()
	}
	if u.streamIdle > 0 {
		cl.w8.prime(u.streamIdle, codeStalled)
	}
	err := ex.endStream(pump(ex.sink, resp.Body, cl.first, cl.firstErr, *cl.buf, &cl.w8))
	res := attemptResult{out: outDone, result: statusResult(resp.StatusCode), status: resp.StatusCode}
	switch {
	case err == nil:
		u.recordSuccess(time.Now())
		return res, contDone
	case ex.loopTrip() != nil:
		u.recordSuccess(time.Now()) // it answered; the loop is the model's
		return res, contRepeat
	case ex.follow.cr.Diverged():
		return res, contDiverged // the upstream answered; only differently
	}
	se := copyVerdict(err, &cl.w8, r.Context().Err() != nil, cl.ctx.Err(), ex.finished())
	switch {
	case se == nil:
		return res, contDone // the final event was out
	case se.code == "":
		res.result = se.result
		return res, contDone // the client left
	}
	if ce := ex.h.logger.Check(zapcore.WarnLevel, "upstream response broke off"); ce != nil {
		ce.Write(zap.String("upstream", u.ID), zap.String("reason", se.code), zap.String("error", redactError(err)))
	}
	c.code = se.code
	res.result, res.fault = se.result, se.fault
	return res, contNext
}

// continuationBody is the chat request for a continuation on t: the
// client's request as the exchange would send it to a chat upstream (as
// the front's codec translates it), plus, for prefill, the
// delivered text as a final assistant message; base is the request without
// that message.
func continuationBody(t *target, body []byte, fr *frontReq, prefill bool, delivered string) (out, base []byte, err error) {
	chat, err := fr.codec.chatRequest(t.up, body)
	if err != nil {
		return nil, nil, err
	}
	base, err = transform.RewriteRequest(make([]byte, 0, len(chat)+512), chat, &t.edit)
	if err != nil || !prefill {
		return base, base, err
	}
	out, err = appendAssistant(base, delivered)
	return out, base, err
}

// appendAssistant adds {"role":"assistant","content":text} as the last
// message of a chat request.
func appendAssistant(req []byte, text string) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(req, &top); err != nil {
		return nil, err
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(top["messages"], &msgs); err != nil {
		return nil, err
	}
	msg, err := json.Marshal(struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}{"assistant", text})
	if err != nil {
		return nil, err
	}
	if top["messages"], err = json.Marshal(append(msgs, msg)); err != nil {
		return nil, err
	}
	return json.Marshal(top)
}

// restart readies the client writer for a continuation after the first
// exchange stopped it: the new attempt's request_timeout bounds the writes,
// and the heartbeat runs again on a plain event stream.
func (c *clientWriter) restart(limit time.Time, heartbeat time.Duration, plainSSE bool) {
	c.mu.Lock()
	c.limit, c.stopped = limit, false
	if c.hb != nil {
		c.hb.Stop()
		c.hb = nil
	}
	c.mu.Unlock()
	if heartbeat > 0 && plainSSE {
		c.startHeartbeat(heartbeat)
	}
}
