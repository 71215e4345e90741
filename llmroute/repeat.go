package llmroute

import (
	"encoding/json"
	"fmt"
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
// chain, in front of the follower of mid-stream continuation
// (resume.go): the follower only ever sees what the client is sent. When the
// guard confirms a loop it stops the copy; the exchange hands the stream
// over as a continuation marked with the loop, and recoverLoop continues it
// from the text delivered on the next free upstream of the model (else the
// same one), with a raised temperature, at most repeat_recoveries times;
// then the answer ends with finish reason length.

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

// watchRepeats puts the guard in front of the follower (watchResume set it
// up) when the model has repeat_guard on.
func (ex *exchange) watchRepeats() {
	g := ex.fr.guard
	if g == nil || ex.follow == nil {
		return
	}
	rg, ok := guardPool.Get().(*transform.RepeatGuard)
	if ok && rg.Config() == [2]int{g.minSpan, g.maxPeriod} {
		rg.Reset(ex.follow)
	} else {
		rg = transform.NewRepeatGuard(ex.follow, g.minSpan, g.maxPeriod)
	}
	ex.guard = &guardSink{g: rg, next: ex.follow}
	ex.sink = ex.guard
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
func (h *Handler) recoverLoop(r *http.Request, rt *route, idx int, first attemptResult, body []byte, fr *frontReq) (attemptResult, *target) {
	c := first.cont
	defer c.close()
	ex := c.ex
	last := &rt.targets[idx]
	res := first
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
			c.from, idx = t.up, j                            // and looped again
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
