package llmroute

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/repeatguard"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// Repeat guard (model `repeat_guard on`).
//
// A chat event stream of such a model (the chat front, or a front
// translated from chat) gets a RepeatGuard as the first stage of its sink
// chain (in front of the follower of mid-stream continuation, resume.go,
// when the model has resume on too). The guard follows the stream itself,
// cheaply; when it confirms a loop it stops the copy, a follower is started
// from what the client has (followFromGuard), and the exchange hands the
// stream over as a continuation marked with the loop. recoverLoop continues
// it from the text delivered on the next free upstream of the model (else
// the same one), with a raised temperature, at most repeat_recoveries
// times; then the answer ends with finish reason length. A non-stream
// answer is checked whole before it is sent (guardWhole).

// Defaults and bounds of the model's repeat_* fields.
const (
	defaultRepeatMinSpan    = 400
	defaultRepeatMaxPeriod  = 200
	defaultRepeatRecoveries = 1
	maxRepeatRecoveries     = 3
	maxRepeatMinSpan        = 1 << 20
)

// Recovery request settings: each recovery raises the temperature by
// loopTempStep from the request's (loopTempBase when it has none), to at
// most loopTempMax; frequency_penalty is loopPenalty unless the request
// sets one.
const (
	loopTempBase = 0.7
	loopTempStep = 0.3
	loopTempMax  = 1.5
	loopPenalty  = 0.5
)

// Results of llm_proxy_repeat_guard_total.
const (
	loopRecovered = "recovered"
	loopCut       = "cut"
)

// codeRepeat is the continuation's code for a loop (never sent as an
// error event: an answer cut at a loop ends with finish reason length).
const codeRepeat = "repeat"

// repeatConf is a model's repeat guard, compiled; nil on a route is off.
type repeatConf struct {
	minSpan, maxPeriod, recoveries int
}

// compileRepeat is the model's repeat guard, nil when off.
func compileRepeat(m Model) *repeatConf {
	if m.RepeatGuard != "on" {
		return nil
	}
	g := &repeatConf{minSpan: m.RepeatMinSpan, maxPeriod: m.RepeatMaxPeriod, recoveries: defaultRepeatRecoveries}
	if g.minSpan == 0 {
		g.minSpan = defaultRepeatMinSpan
	}
	if g.maxPeriod == 0 {
		g.maxPeriod = min(defaultRepeatMaxPeriod, g.minSpan/2)
	}
	if m.RepeatRecoveries != nil {
		g.recoveries = *m.RepeatRecoveries
	}
	return g
}

// validateRepeatGuard checks a model's repeat_* fields.
func validateRepeatGuard(bad func(string, ...any), where string, m Model) {
	if m.RepeatGuard != "" && m.RepeatGuard != "on" && m.RepeatGuard != "off" {
		bad("%s: repeat_guard: want on or off, got %q", where, m.RepeatGuard)
	}
	if m.RepeatMinSpan != 0 && (m.RepeatMinSpan < repeatguard.MinSpan || m.RepeatMinSpan > maxRepeatMinSpan) {
		bad("%s: repeat_min_span must be between %d and %d runes, got %d", where, repeatguard.MinSpan, maxRepeatMinSpan, m.RepeatMinSpan)
	}
	if m.RepeatMaxPeriod != 0 && (m.RepeatMaxPeriod < 1 || m.RepeatMaxPeriod > repeatguard.MaxPeriod) {
		bad("%s: repeat_max_period must be between 1 and %d runes, got %d", where, repeatguard.MaxPeriod, m.RepeatMaxPeriod)
	}
	span := m.RepeatMinSpan
	if span == 0 {
		span = defaultRepeatMinSpan
	}
	if 2*m.RepeatMaxPeriod > span {
		bad("%s: repeat_max_period (%d) must be at most half of repeat_min_span (%d): two copies of a unit must fit in the span", where, m.RepeatMaxPeriod, span)
	}
	if n := m.RepeatRecoveries; n != nil && (*n < 0 || *n > maxRepeatRecoveries) {
		bad("%s: repeat_recoveries must be between 0 and %d, got %d", where, maxRepeatRecoveries, *n)
	}
}

// guardSink is the repeat guard as the first stage of the chain.
type guardSink struct {
	g    *transform.RepeatGuard
	next sink
}

func (s *guardSink) Write(p []byte) (int, error) { return s.g.Write(p) }

func (s *guardSink) end() error {
	if err := s.g.Flush(); err != nil {
		return err
	}
	return s.next.end()
}

// guardPool recycles guards: each holds two detectors of about 11 KB.
var guardPool sync.Pool

// watchRepeats puts the guard first in the chain (in front of the
// follower, with resume on) when the model has repeat_guard on.
func (ex *exchange) watchRepeats() {
	g := ex.fr.guard
	if g == nil {
		return
	}
	rg, ok := guardPool.Get().(*transform.RepeatGuard)
	if ok && rg.Config() == [2]int{g.minSpan, g.maxPeriod} {
		rg.Reset(ex.sink)
	} else {
		rg = transform.NewRepeatGuard(ex.sink, g.minSpan, g.maxPeriod)
	}
	ex.gs = guardSink{g: rg, next: ex.sink}
	ex.guard = &ex.gs // in the exchange: no allocation of its own
	ex.sink = ex.guard
}

// followFromGuard puts a follower behind the guard at a loop, when resume
// did not: it starts from what the guard says the client has, and the
// continuation (or the final chunk) goes through it.
func (ex *exchange) followFromGuard() {
	if ex.follow != nil {
		return
	}
	ex.follow = &followSink{next: ex.guard.next}
	ex.follow.cr = transform.NewChatResumeFrom(ex.follow.next, ex.guard.g.State())
	ex.guard.next = ex.follow
	ex.guard.g.SetNext(ex.follow)
}

// releaseGuard returns the guard to its pool.
func (ex *exchange) releaseGuard() {
	if ex.guard != nil {
		ex.guard.g.Reset(nil)
		guardPool.Put(ex.guard.g)
		ex.guard = nil
	}
}

// loopTrip is the loop that stopped the copy, nil when none did.
func (ex *exchange) loopTrip() *transform.RepeatTrip {
	if ex.guard == nil {
		return nil
	}
	return ex.guard.g.Trip()
}

// logLoop writes the log line of a confirmed loop.
func (h *Handler) logLoop(model string, u *upstream, trip *transform.RepeatTrip, result string) {
	h.metrics.repeats.WithLabelValues(model, u.ID, result).Inc()
	if ce := h.logger.Check(zapcore.WarnLevel, "answer stuck in a loop"); ce != nil {
		where := "content"
		if trip.Reasoning {
			where = "reasoning"
		}
		ce.Write(zap.String("model", model), zap.String("upstream", u.ID), zap.String("in", where),
			zap.String("unit", trip.Unit), zap.Int("period", trip.Period), zap.Int("span", trip.Span),
			zap.String("result", result))
	}
}

// recoverLoop goes on with an answer whose stream the guard stopped at a
// loop: on the next free upstream of the model after the one that looped
// (else the same one), from the text delivered, at most repeat_recoveries
// times; with none left, or no upstream to take it, the answer ends with
// what was delivered and finish reason length.
func (h *Handler) recoverLoop(r *http.Request, rt *route, idx int, c *continuation, res attemptResult, body []byte, fr *frontReq) (attemptResult, *target) {
	defer c.close()
	ex := c.ex
	last := &rt.targets[idx]
	name := rt.name
	if fr.api != apiChat {
		// The continuation is a chat request: the model's chat upstreams.
		if rt, idx = h.chatRoute(rt.name, c.from); rt == nil {
			return c.cutLoop(name, ex.loopTrip(), res), last
		}
	}
	for {
		trip := ex.loopTrip()
		if c.recoveries >= fr.guard.recoveries {
			return c.cutLoop(rt.name, trip, res), last
		}
		if ok, _ := ex.follow.cr.Resumable(); !ok {
			return c.cutLoop(rt.name, trip, res), last
		}
		j, ok := h.claimNext(rt, fr.place, idx)
		if !ok {
			j, ok = claimTarget(rt, idx)
		}
		if !ok {
			return c.cutLoop(rt.name, trip, res), last
		}
		t := &rt.targets[j]
		if ex.follow.cr.Content() != "" && !t.up.prefill {
			// It cannot go on from the delivered text: the next one may.
			releaseClaim(t)
			if j == idx {
				return c.cutLoop(rt.name, trip, res), last
			}
			idx = j
			continue
		}
		c.recoveries++
		c.loop = true
		looped := c.from
		var v contVerdict
		res, v = h.continueOn(r, rt, j, c, body, fr)
		last = t
		switch v {
		case contDone:
			h.logLoop(rt.name, looped, trip, loopRecovered)
			return c.final(res), t
		case contRepeat:
			h.logLoop(rt.name, looped, trip, loopRecovered) // the answer went on after it
			c.from, idx = t.up, j                           // and looped again
			continue
		}
		// It did not take the continuation (refused, broke): the answer
		// ends with what the client has.
		c.from = looped
		return c.cutLoop(rt.name, trip, res), t
	}
}

// claimTarget claims rt.targets[j] itself (the upstream that looped, when
// no other is free).
func claimTarget(rt *route, j int) (int, bool) {
	t := &rt.targets[j]
	if t.up.Cooling(time.Now()) > 0 || !t.up.led.ClaimLong(t.long) {
		return -1, false
	}
	if _, ok := t.up.tryClaim(false); !ok {
		t.up.led.ReleaseLong(t.long)
		return -1, false
	}
	return j, true
}

// cutLoop ends an answer at a loop that is not recovered: a final chunk
// with finish reason length and [DONE] go down the chain, which translates
// them for the front (Messages: stop_reason max_tokens; Responses: status
// incomplete, max_output_tokens).
func (c *continuation) cutLoop(model string, trip *transform.RepeatTrip, res attemptResult) attemptResult {
	ex := c.ex
	if trip != nil {
		ex.h.logLoop(model, c.from, trip, loopCut)
	}
	ex.out.restart(time.Now().Add(errorEventWindow*10), 0, false)
	fin := ex.follow.cr.AppendFinish(nil, "length")
	if _, err := ex.follow.Write(fin); err == nil {
		_ = ex.follow.end()
	}
	ex.out.stop()
	res.out, res.abort = outDone, false
	if res.result == "" || res.result == resultNetErr {
		res.result = resultOK
	}
	return c.final(res)
}

// loopEdit sets the recovery's sampling on a chat request: temperature
// raised by loopTempStep per recovery from the request's (loopTempBase when
// unset), at most loopTempMax (a request above it keeps its own), and
// frequency_penalty loopPenalty unless the request sets one.
func loopEdit(req []byte, recovery int) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(req, &top); err != nil {
		return nil, err
	}
	temp := loopTempBase
	if raw, ok := top["temperature"]; ok {
		var v *float64
		if json.Unmarshal(raw, &v) == nil && v != nil {
			temp = *v
		}
	}
	raised := math.Max(temp, math.Min(temp+loopTempStep*float64(recovery), loopTempMax))
	top["temperature"] = json.RawMessage(fmt.Sprintf("%g", math.Round(raised*100)/100))
	if raw, ok := top["frequency_penalty"]; !ok || string(raw) == "null" {
		top["frequency_penalty"] = json.RawMessage(fmt.Sprintf("%g", loopPenalty))
	}
	return json.Marshal(top)
}

// Non-stream answers: the whole text is checked before anything is sent.

// identityBody reads a non-stream answer whole without changing it, so
// that the guard can check it before it goes out.
type identityBody struct{}

func (identityBody) transformBody(dst, body []byte) ([]byte, bool) { return dst, false }

// guardsWhole reports a non-stream chat answer (the chat front, or one
// translated from chat) of a model with the guard on: it is read whole.
func (ex *exchange) guardsWhole() bool {
	return ex.fr.guard != nil && !ex.sse && ex.resp.StatusCode < 300 && identityEncoded(ex.resp) &&
		(ex.fr.api == apiChat && ex.native || ex.translated)
}

// wholeAnswer is what the guard reads of a chat completion.
type wholeAnswer struct {
	top     map[string]json.RawMessage
	choices []map[string]json.RawMessage
	msg     map[string]json.RawMessage
	text    [2]string // content, reasoning
	rkey    string
}

func parseWhole(b []byte) (*wholeAnswer, bool) {
	a := &wholeAnswer{rkey: "reasoning_content"}
	if json.Unmarshal(b, &a.top) != nil || json.Unmarshal(a.top["choices"], &a.choices) != nil || len(a.choices) != 1 ||
		json.Unmarshal(a.choices[0]["message"], &a.msg) != nil {
		return nil, false
	}
	if raw, ok := a.msg["tool_calls"]; ok && string(raw) != "null" && string(raw) != "[]" {
		return nil, false // the text of a tool-calling turn is left alone
	}
	_ = json.Unmarshal(a.msg["content"], &a.text[0])
	for _, k := range [...]string{"reasoning_content", "reasoning"} {
		var s string
		if json.Unmarshal(a.msg[k], &s) == nil && s != "" {
			a.text[1], a.rkey = s, k
		}
	}
	return a, true
}

// findLoop runs the detectors over the answer's text: the channel of the
// first loop (-1: none) and the trip, whose Kept is that channel's text up
// to the end of the first copy of the unit.
func findLoop(g *repeatConf, text [2]string) (int, *transform.RepeatTrip) {
	for ch, s := range text {
		d := repeatguard.New(g.minSpan, g.maxPeriod)
		took := d.WriteString(s)
		if !d.Confirmed() {
			continue
		}
		period, span := d.Run()
		runes := []rune(s[:took])
		keep := len(runes) - span + period
		return ch, &transform.RepeatTrip{Reasoning: ch == 1, Unit: string(d.Unit(nil, 80)), Period: period, Span: span, Kept: string(runes[:keep])}
	}
	return -1, nil
}

// guardWhole checks a whole chat answer and, when it loops, recovers it
// as a stream would be: continued from the text kept on the next free
// upstream (else the same), at most repeat_recoveries times, else cut
// there with finish reason length. It returns the answer to send, the
// continuations made, and whether the answer changed.
func (ex *exchange) guardWhole(reqBody, answer []byte) ([]byte, int, bool) {
	a, ok := parseWhole(answer)
	if !ok {
		return answer, 0, false
	}
	g, h := ex.fr.guard, ex.h
	from := ex.u
	var finish json.RawMessage
	recoveries := 0
	changed := false
	for {
		ch, trip := findLoop(g, a.text)
		if trip == nil {
			break
		}
		changed = true
		a.text[ch] = trip.Kept
		if ch == 1 {
			a.text[0] = "" // a loop in the reasoning: no answer yet
		}
		if recoveries >= g.recoveries {
			h.logLoop(ex.fr.rt.name, from, trip, loopCut)
			finish = json.RawMessage(`"length"`)
			break
		}
		recoveries++
		next, u := ex.wholeContinuation(reqBody, a.text[0], recoveries)
		if next == nil {
			h.logLoop(ex.fr.rt.name, from, trip, loopCut)
			finish = json.RawMessage(`"length"`)
			break
		}
		h.logLoop(ex.fr.rt.name, from, trip, loopRecovered)
		from = u
		a.text[0] += next.text[0] // its reasoning is left out: the answer has its own
		finish = next.choices[0]["finish_reason"]
	}
	if !changed {
		return answer, recoveries, false
	}
	a.msg["content"], _ = json.Marshal(a.text[0])
	if a.text[1] != "" {
		a.msg[a.rkey], _ = json.Marshal(a.text[1])
	}
	a.choices[0]["message"], _ = json.Marshal(a.msg)
	if finish != nil {
		a.choices[0]["finish_reason"] = finish
	}
	a.top["choices"], _ = json.Marshal(a.choices)
	out, err := json.Marshal(a.top)
	if err != nil {
		return answer, recoveries, false
	}
	return out, recoveries, true
}

// wholeContinuation sends the non-stream continuation of a looped answer
// (prefill: the content kept, "" for none) to the next free chat upstream
// of the model after this one, else to this one (whose slot this exchange
// holds); nil when none answered it.
func (ex *exchange) wholeContinuation(reqBody []byte, prefill string, recovery int) (*wholeAnswer, *upstream) {
	h := ex.h
	rt, idx := ex.fr.rt, ex.fr.idx
	if ex.fr.api != apiChat {
		if rt, idx = h.chatRoute(rt.name, ex.u); rt == nil {
			return nil, nil
		}
	}
	j, ok := h.claimNext(rt, ex.fr.place, idx)
	same := !ok
	if same {
		j = idx
	}
	t := &rt.targets[j]
	start := time.Now()
	res := attemptResult{out: outDone, result: resultNetErr, api: apiChat, mode: "native"}
	defer func() {
		if !same {
			h.finish(rt, t, res, start, ex.fr.arrival)
		}
	}()
	if prefill != "" && !t.up.prefill {
		res.result = resultOK // not sent: nothing to blame
		return nil, nil
	}
	out, _, err := continuationBody(t, reqBody, &ex.fr, prefill != "", prefill)
	if err == nil {
		out, err = loopEdit(out, recovery)
	}
	if err != nil {
		res.result = result4xx
		return nil, nil
	}
	cl := call{h: h, u: t.up, r: ex.r, log: h.logger, rt: rt, idx: j, pl: ex.fr.place}
	cl.open(h.attemptContext(ex.r.Context()))
	defer cl.close()
	req := cl.request(t.up.urls[epChat], out)
	req.Header.Set("Accept-Encoding", "identity")
	sres, ok := cl.send(req)
	if !ok {
		sres.api, sres.mode = apiChat, "native"
		res = sres
		return nil, nil
	}
	res.status = cl.resp.StatusCode
	res.result = statusResult(cl.resp.StatusCode)
	if cl.resp.StatusCode >= 300 || isEventStream(cl.resp) {
		cl.discard()
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(cl.resp.Body, h.maxRewrite))
	if err != nil {
		res.result = resultNetErr
		return nil, nil
	}
	t.up.recordSuccess(time.Now())
	next, ok := parseWhole(body)
	if !ok {
		return nil, nil
	}
	return next, t.up
}
