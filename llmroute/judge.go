package llmroute

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// The judge (experimental): a router model may name a plain model that
// guesses the effort of a request that pins none (no name suffix, no
// effort field). The request's last user message goes to that model with
// a fixed classification question; a clean low, medium or high within the
// deadline is the effort (source judge); anything else leaves the request
// at medium (source default). The request is never lost to the judge: it
// goes on in every case, later by at most the deadline.
//
// Slots: the judge's request is a real request to a real upstream, so it
// holds a slot of the judge model's upstream while it runs (a provider
// limit of 4 must never see 5 requests). But it takes one only when one is
// free at once and no client waits in the queue: a queue cannot fit a
// deadline of a few hundred milliseconds, and a client that waits for a
// slot must never lose it to a guess. It is sent once (no retry, no
// failover), and its failures, a missed deadline included, never feed the
// upstream's backoff: the deadline is the router's budget, not the
// upstream's fault, and a cooled upstream would hurt the clients that use
// it as a model. It is not a client attempt (no llm_proxy_requests_total,
// nothing on the client's key); its tokens count in llm_proxy_tokens_total
// under the judge model, since the operator pays for them.

// defaultJudgeDeadline bounds a judge's answer when the config sets none.
const defaultJudgeDeadline = 250 * time.Millisecond

// judgeSystem is the judge's question. The answer is read strictly (see
// judgeVerdict), so the prompt asks for exactly one word.
const judgeSystem = "Rate how much reasoning the user's request needs. " +
	"Answer with exactly one word: low, medium or high."

// judgeMaxText bounds the user text sent to the judge: its start, cut at a
// UTF-8 boundary. The start of a message usually says what is asked, and
// the deadline leaves no time for a long prompt.
const judgeMaxText = 4 << 10

// judgeMaxAnswer bounds what is read of the judge's answer.
const judgeMaxAnswer = 64 << 10

// judgeMaxTokens is the judge's max_tokens: one word, with room for a
// stray space, newline or period.
const judgeMaxTokens = 8

// Judge results, the result label of llm_proxy_judge_total.
const (
	judgeLow        = "low"        // answered low
	judgeMedium     = "medium"     // answered medium
	judgeHigh       = "high"       // answered high
	judgeLate       = "late"       // no answer within the deadline
	judgeError      = "error"      // a transport error or a non-2xx answer
	judgeUnparsable = "unparsable" // a 2xx answer that is not one clean word
	judgeBusy       = "busy"       // no slot free at once, or clients queued: not asked
	judgeEmpty      = "empty"      // no user text to judge: not asked
	judgeCancelled  = "cancelled"  // the client left while the judge ran
)

var judgeResults = [...]string{judgeLow, judgeMedium, judgeHigh, judgeLate, judgeError,
	judgeUnparsable, judgeBusy, judgeEmpty, judgeCancelled}

// judge is a router model's judge, compiled.
type judge struct {
	model    string
	rt       *route // the judge model's chat route
	deadline time.Duration
	// counters are llm_proxy_judge_total of the router model, by
	// result.
	counters map[string]prometheus.Counter
}

// newJudge compiles the judge of router model router.
func (h *Handler) newJudge(router string, jc *Judge, rt *route) *judge {
	j := &judge{model: jc.Model, rt: rt, deadline: defaultJudgeDeadline,
		counters: make(map[string]prometheus.Counter, len(judgeResults))}
	if jc.Deadline != nil {
		j.deadline = time.Duration(*jc.Deadline)
	}
	for _, res := range judgeResults {
		j.counters[res] = h.metrics.judge.WithLabelValues(router, res)
	}
	return j
}

// askJudge asks the router's judge for the effort of a request that pins
// none; effortNone when it gave no clean answer in time (the request is
// then medium, source default). It runs on the request's goroutine, under
// the deadline and the client's context.
func (h *Handler) askJudge(r *http.Request, rs *ruleSet, fr *frontReq, body []byte) effort {
	j := rs.judging
	start := time.Now()
	e, result := h.judgeOnce(r, j, fr.codec.rules(), body)
	j.counters[result].Inc()
	if c := h.logger.Check(zapcore.DebugLevel, "judge asked"); c != nil {
		c.Write(zap.String("model", rs.model), zap.String("judge", j.model), zap.String("result", result),
			zap.Duration("duration", time.Since(start)))
	}
	return e
}

// judgeOnce sends the judge's question once and reads its verdict.
func (h *Handler) judgeOnce(r *http.Request, j *judge, sh *ruleShape, body []byte) (effort, string) {
	text := lastUserText(sh, body)
	if len(text) == 0 {
		return effortNone, judgeEmpty
	}
	// A slot only when one is free now and nobody waits for one. The
	// no-op logger marks the claim as the request's own (not a queued
	// waiter's), so that a rollback wakes the queue.
	if sched.waiting.Load() != 0 {
		return effortNone, judgeBusy
	}
	idx, ok := claimFrom(j.rt, nil, -1, time.Now(), nopLogger)
	if !ok {
		return effortNone, judgeBusy
	}
	t := &j.rt.targets[idx]
	defer func() {
		t.up.led.ReleaseLong(t.long) // before the slot: its release wakes the queue
		t.up.release()
	}()

	q := judgeRequest(j.model, text)
	out, err := transform.RewriteRequest(make([]byte, 0, len(q)+64), q, &t.edit)
	if err != nil {
		return effortNone, judgeError
	}
	ctx, cancel := context.WithTimeout(r.Context(), j.deadline)
	// r is left out of the call: no client header goes to the judge.
	c := call{h: h, u: t.up, log: nopLogger}
	c.open(ctx, cancel)
	defer c.close()
	late := func() string {
		if r.Context().Err() != nil {
			return judgeCancelled
		}
		return judgeLate
	}
	if _, ok := c.send(c.request(t.up.urls[epChat], out)); !ok {
		if ctx.Err() != nil {
			return effortNone, late()
		}
		return effortNone, judgeError
	}
	answer := getBuffer()
	defer putBuffer(answer)
	_, err = answer.ReadFrom(io.LimitReader(c.resp.Body, judgeMaxAnswer))
	if err != nil {
		if ctx.Err() != nil {
			return effortNone, late()
		}
		return effortNone, judgeError
	}
	if st := c.resp.StatusCode; st < 200 || st > 299 {
		return effortNone, judgeError
	}
	var us transform.UsageScanner
	us.Write(answer.Bytes())
	if us.Seen {
		for i, n := range [...]int64{us.Input, us.Output, us.CachedInput, us.Reasoning} {
			if n > 0 {
				t.series.tokens[i].Add(float64(n))
			}
		}
	}
	e := judgeVerdict(answer.Bytes())
	if e == effortNone {
		return effortNone, judgeUnparsable
	}
	return e, e.String()
}

// judgeRequest is the judge's chat request over text (decoded).
func judgeRequest(model string, text []byte) []byte {
	b := make([]byte, 0, len(text)+len(judgeSystem)+192)
	b = append(b, `{"model":`...)
	b = jsonscan.AppendQuoted(b, model)
	b = append(b, `,"messages":[{"role":"system","content":`...)
	b = jsonscan.AppendQuoted(b, judgeSystem)
	b = append(b, `},{"role":"user","content":`...)
	b = jsonscan.AppendQuoted(b, text)
	b = append(b, `}],"max_tokens":`...)
	b = strconv.AppendInt(b, judgeMaxTokens, 10)
	b = append(b, `,"temperature":0,"stream":false}`...)
	return b
}

// judgeVerdict reads a chat completion's answer: the first choice's
// content, after a leading <think>…</think> block, with surrounding white
// space and one final period dropped and case ignored, must be exactly
// low, medium or high. Anything else ("very high", a sentence, JSON) is
// no verdict: a guess the router cannot read is not a guess it may act on.
func judgeVerdict(answer []byte) effort {
	var a struct {
		Choices []struct {
			Message struct {
				Content *string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if json.Unmarshal(answer, &a) != nil || len(a.Choices) == 0 || a.Choices[0].Message.Content == nil {
		return effortNone
	}
	s := bytes.TrimSpace([]byte(*a.Choices[0].Message.Content))
	if rest, ok := bytes.CutPrefix(s, []byte("<think>")); ok {
		_, after, found := bytes.Cut(rest, []byte("</think>"))
		if !found {
			return effortNone
		}
		s = bytes.TrimSpace(after)
	}
	s = bytes.TrimSuffix(s, []byte("."))
	if len(s) > len("medium") {
		return effortNone
	}
	return parseEffortExact(string(bytes.ToLower(s)))
}

// lastUserText is the text of the request's last user message that has
// any, decoded, its parts joined by newlines and cut to judgeMaxText. The
// codec's shape says where it is (ruleShape.said): a string member (a
// Responses input, a completions prompt), or an array of messages (turns)
// whose content is a string or a list of parts. nil when there is none
// (embeddings, a conversation of tool results only).
func lastUserText(sh *ruleShape, body []byte) []byte {
	if sh.said[0] == "" {
		return nil
	}
	v := jsonscan.ObjGet(body, sh.said[0])
	if jsonscan.IsString(v) {
		return boundText(jsonscan.AppendStringValue(nil, v))
	}
	return lastUserOf(v, sh.said[1], sh.said[2])
}

// lastUserOf finds, in an array of messages, the last one of role user
// (or of no role: a Gemini turn may leave it out) with text in its member
// content: a string, or the parts of type partType.
func lastUserOf(msgs []byte, content, partType string) []byte {
	if len(msgs) == 0 || msgs[0] != '[' {
		return nil
	}
	var last []byte
	jsonscan.EachElem(msgs, 0, func(vs, ve int) bool {
		m := msgs[vs:ve]
		if role := jsonscan.ObjGet(m, "role"); role != nil && !jsonscan.StrIs(role, true, "user") {
			return true
		}
		if t := userText(jsonscan.ObjGet(m, content), partType); len(t) > 0 {
			last = t
		}
		return true
	})
	return last
}

// userText is a message content's text: a string, or its parts of type
// partType ("": any part) joined by newlines, cut to judgeMaxText.
func userText(content []byte, partType string) []byte {
	if jsonscan.IsString(content) {
		return boundText(jsonscan.AppendStringValue(nil, content))
	}
	if len(content) == 0 || content[0] != '[' {
		return nil
	}
	var out []byte
	jsonscan.EachElem(content, 0, func(vs, ve int) bool {
		p := content[vs:ve]
		if partType != "" && !jsonscan.StrIs(jsonscan.ObjGet(p, "type"), true, partType) {
			return true
		}
		txt := jsonscan.ObjGet(p, "text")
		if !jsonscan.IsString(txt) {
			return true
		}
		if len(out) > 0 {
			out = append(out, '\n')
		}
		out = jsonscan.AppendStringValue(out, txt)
		return len(out) < judgeMaxText
	})
	return boundText(out)
}

// boundText cuts t to judgeMaxText bytes at a UTF-8 boundary.
func boundText(t []byte) []byte {
	if len(t) <= judgeMaxText {
		return t
	}
	n := judgeMaxText
	for n > 0 && !utf8.RuneStart(t[n]) {
		n--
	}
	return t[:n]
}
