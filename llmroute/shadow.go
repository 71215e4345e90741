package llmroute

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// Shadow traffic: a rule's `shadow` sends a share of the rule's requests,
// as well, to a candidate model, to compare it with what clients get
// before any client is moved to it. The copy is the router's own business
// and must cost the client nothing:
//
//   - It never delays or changes the client's answer: it runs on its own
//     goroutine, with its own copy of the body and of the request, its own
//     context and deadline, and writes to a writer that discards; the
//     client's request goroutine only decides, copies and starts it.
//   - It never queues, retries or fails over: it is sent to the first
//     upstream of the shadow model with a slot free at once, once, and
//     only when no client waits in any queue (a waiting client gets every
//     slot that frees). Otherwise it is not sent (`busy`).
//   - It never counts against the client: no key reservation, rate, token
//     or spend usage, no llm_proxy_requests_total, no backoff (a
//     candidate's failures must never move real traffic), no completion
//     log line.
//   - It is bounded: at most shadowMax copies run at once per handler; one
//     more is not sent (`dropped`). Its deadline is request_timeout
//     (shadowDeadline when that is off), and a reload or stop cancels it.
//
// The share is deterministic: of the rule's admitted requests, exactly
// floor(n × fraction) of the first n are shadowed (striding, not a coin
// toss), so 0.25 is one request in four.
//
// What it records: llm_proxy_shadow_requests_total{model,result} (model:
// the shadow model; result: an attempt result, or busy, dropped, skipped),
// the shadow's tokens in llm_proxy_tokens_total (the operator pays for
// them), and, for each copy that was sent, one INFO line "shadow compared"
// with both answers side by side (see logCompared). Never a body: neither
// the prompt nor either answer is logged.

const (
	// shadowMax is how many shadow copies may run at once per handler.
	shadowMax = 16
	// shadowDeadline bounds a shadow copy when request_timeout is off.
	shadowDeadline = 5 * time.Minute
	// shadowStopWait bounds how long a handler's cleanup waits for its
	// cancelled shadow copies to end.
	shadowStopWait = 10 * time.Second
)

// Results of a shadow copy that was not sent (label `result` of
// llm_proxy_shadow_requests_total, beside the attempt results).
const (
	shadowBusy    = "busy"    // no slot free at once (or every upstream cooling), or a client was waiting
	shadowDropped = "dropped" // shadowMax copies were running already
	shadowSkipped = "skipped" // the shadow model cannot take this request (API, size, duplicate key)
)

var shadowResults = append(slices.Clone(allResults), shadowBusy, shadowDropped, shadowSkipped)

// shadowSpec is one rule's shadow, compiled.
type shadowSpec struct {
	model    string
	fraction float64
	routes   [numAPIs]*route // the shadow model's route per API (nil: not served)
	seen     atomic.Uint64   // the rule's admitted requests so far, for the striding
	counters map[string]prometheus.Counter
}

// compileShadow compiles a rule's shadow; nil when there is none to send.
// It runs after the plain models' routes are compiled.
func (h *Handler) compileShadow(s *Shadow) *shadowSpec {
	if s == nil || s.Fraction <= 0 {
		return nil
	}
	sp := &shadowSpec{model: s.Model, fraction: s.Fraction, counters: make(map[string]prometheus.Counter, len(shadowResults))}
	for a := range numAPIs {
		sp.routes[a] = h.table.apiRoutes[a][s.Model]
	}
	for _, res := range shadowResults {
		sp.counters[res] = h.metrics.shadows.WithLabelValues(s.Model, res)
	}
	if h.shadowSem == nil {
		h.shadowSem = make(chan struct{}, shadowMax)
	}
	return sp
}

// take reports whether the rule's next request is shadowed: the k-th is
// when floor(k×f) grows, so the first n requests send floor(n×f) copies.
func (sp *shadowSpec) take() bool {
	k := float64(sp.seen.Add(1))
	return math.Floor(k*sp.fraction) > math.Floor((k-1)*sp.fraction)
}

// shadowRun is one shadow copy on its way, and the meeting point of the
// two answers. The client's request goroutine notes its answer in main
// (mainAnswer, mainRefused) and hands it over when serveFront returns
// (mainEnded); the copy's goroutine hands over its own when it ends
// (shadowEnded). Whichever of the two comes second has the comparison line
// written, so neither waits for the other: a copy does not hold its
// concurrency token for the length of the client's answer, and the client
// never waits for the copy (nor for the line).
type shadowRun struct {
	c    *shadowCopy  // what the line says of the request (read only)
	main shadowAnswer // the request goroutine's own, until mainEnded

	mu    sync.Mutex
	sums  [2]shadowAnswer // the client's, the copy's
	ended [2]bool
}

// shadowAnswer is what the comparison line says of one answer.
type shadowAnswer struct {
	model, upstream, result string
	status                  int
	usage                   transform.Usage
	end, firstByte          time.Time // zero firstByte: no body byte
	final                   bool      // the client's: an answer, not a failover
	sent                    bool      // the copy's: it went upstream (else no line)
}

// mainAnswer notes the client's attempt that just ended (the last one
// noted is the answer the client got).
func (sr *shadowRun) mainAnswer(t *target, res *attemptResult) {
	sr.main = shadowAnswer{model: t.model, upstream: t.up.ID, result: res.result, status: res.status,
		usage: res.usage, end: time.Now(), firstByte: res.firstByte, final: res.out != outFailover}
}

// mainRefused notes that the client got the proxy's own refusal after its
// attempts (every upstream failed, or its key's budget stopped a failover).
func (sr *shadowRun) mainRefused(e apiError) {
	sr.main.result, sr.main.status, sr.main.end, sr.main.final = e.code, e.status, time.Now(), true
	sr.main.usage, sr.main.firstByte = transform.Usage{}, time.Time{}
}

// mainEnded hands the client's answer over; deferred by serveFront, so it
// also runs when an attempt aborted a broken answer (then nothing final
// was noted, and the line says "interrupted").
func (sr *shadowRun) mainEnded() {
	m := sr.main
	if !m.final {
		// An attempt panicked: the client's answer was cut after it started.
		m = shadowAnswer{result: "interrupted", end: time.Now(), final: true}
	}
	sr.handOver(0, m)
}

// shadowEnded hands the copy's answer over (a copy not sent: no line).
func (sr *shadowRun) shadowEnded(a shadowAnswer) { sr.handOver(1, a) }

// handOver records one side's answer; the second to come writes the line.
func (sr *shadowRun) handOver(side int, a shadowAnswer) {
	sr.mu.Lock()
	if sr.ended[side] {
		sr.mu.Unlock()
		return
	}
	sr.sums[side], sr.ended[side] = a, true
	both := sr.ended[0] && sr.ended[1]
	sr.mu.Unlock()
	switch {
	case !both || !sr.sums[1].sent:
	case side == 0:
		// Not on the client's goroutine: its answer may still be in the
		// server's buffer, going out when serveFront returns.
		go sr.c.logCompared(sr.sums[0], sr.sums[1])
	default:
		sr.c.logCompared(sr.sums[0], sr.sums[1])
	}
}

// shadowBase is the context shadow copies run under: the handler's, which
// a reload or stop cancels.
func (h *Handler) shadowBase() context.Context {
	if h.ctx.Context == nil {
		return context.Background() // a handler provisioned without a config (tests)
	}
	return h.ctx
}

// startShadow sends a copy of the client's admitted request to the rule's
// shadow model when the rule's share says so. Called on the client's
// request goroutine, after its admission and before its first attempt: it
// only decides, copies the body and the request, and starts the copy's
// goroutine. router is the router model's name. It returns nil when no
// copy runs (the caller then reports nothing).
func (h *Handler) startShadow(w http.ResponseWriter, r *http.Request, fr *frontReq, router string, body []byte, dups uint64) *shadowRun {
	sp := fr.rule.shadowSend
	if !sp.take() {
		return nil
	}
	base := h.shadowBase()
	if base.Err() != nil {
		return nil // the config is stopping: its copies are cancelled
	}
	select {
	case h.shadowSem <- struct{}{}:
	default:
		sp.counters[shadowDropped].Inc()
		return nil
	}
	deadline := h.requestTimeout
	if deadline <= 0 {
		deadline = shadowDeadline
	}
	// Never the client's context: the copy outlives the client's answer,
	// and must not touch its placeholders or log fields.
	ctx, cancel := context.WithTimeout(context.WithValue(base, caddy.ReplacerCtxKey, caddy.NewReplacer()), deadline)
	c := &shadowCopy{h: h, sp: sp, r: r.Clone(ctx), ctx: ctx, cancel: cancel, body: bytes.Clone(body), dups: dups,
		start: time.Now(), requestID: w.Header().Get(hdrRequestID),
		router: router, rule: fr.rule.name, effort: effortHeaders[fr.effort][fr.effortSrc],
		fr: frontReq{f: fr.f, codec: fr.codec, api: fr.api, stream: fr.stream, session: fr.session}}
	c.fr.arrival = c.start
	c.run = &shadowRun{c: c}
	go c.send()
	return c.run
}

// shadowCopy is the state of one copy's goroutine.
type shadowCopy struct {
	h      *Handler
	sp     *shadowSpec
	r      *http.Request // the client's request, cloned onto ctx
	ctx    context.Context
	cancel context.CancelFunc
	body   []byte // a copy: the client's buffer goes back to its pool
	dups   uint64 // the client body's duplicated watched keys
	fr     frontReq
	run    *shadowRun

	start     time.Time // the client's admission: both latencies count from it
	requestID string
	router    string // the router model
	rule      string
	effort    string // "high (suffix)"
}

// send runs on the copy's own goroutine: it picks a free slot, sends the
// copy once, discards the answer, hands its summary over (the comparison
// line) and counts the result. A panic is logged and ends the copy; the
// slot and the concurrency token are released on every path.
func (c *shadowCopy) send() {
	defer func() { <-c.h.shadowSem }()
	defer c.cancel()
	defer func() {
		if p := recover(); p != nil {
			c.h.logger.Error("shadow request panicked", zap.String("model", c.sp.model), zap.Any("panic", p))
		}
	}()
	rt, result := c.route()
	idx, ok := -1, false
	if rt != nil {
		result = shadowBusy
		if sched.waiting.Load() == 0 { // a waiting client gets every slot that frees
			idx, ok = claimFrom(rt, nil, -1, time.Now(), nopLogger)
		}
	}
	if !ok {
		c.run.shadowEnded(shadowAnswer{})
		c.sp.counters[result].Inc()
		return
	}
	t := &rt.targets[idx]
	res := c.exchange(t)
	if res.result == resultCancelled && errors.Is(c.ctx.Err(), context.DeadlineExceeded) {
		res.result = resultTimeout // the copy's own deadline, not a client leaving
	}
	if res.usage.Seen {
		for i, n := range [...]int64{res.usage.Input, res.usage.Output, res.usage.CachedInput, res.usage.Reasoning} {
			if n > 0 {
				t.series.tokens[i].Add(float64(n))
			}
		}
	}
	c.run.shadowEnded(shadowAnswer{model: c.sp.model, upstream: t.up.ID, result: res.result, status: res.status,
		usage: res.usage, end: time.Now(), firstByte: res.firstByte, sent: true})
	if ctr := c.sp.counters[res.result]; ctr != nil {
		ctr.Inc()
	}
}

// route is the shadow model's route for the request, narrowed to the
// upstreams whose context fits it; nil with the result when the shadow
// model cannot take it.
func (c *shadowCopy) route() (*route, string) {
	if c.ctx.Err() != nil {
		return nil, resultCancelled
	}
	rt := c.sp.routes[c.fr.api]
	if rt == nil || c.dups&rt.dupKeys != 0 {
		return nil, shadowSkipped
	}
	if rt.sized() {
		if rt = rt.fitting(estimateTokens(c.body)); rt == nil {
			return nil, shadowSkipped
		}
	}
	return rt, ""
}

// exchange sends the copy to t, whose slot it holds, and reads the whole
// answer into a writer that discards it (a stream to its end, so its usage
// arrives). One exchange: no same-upstream retry, no failover (a
// context-length refusal included: the call holds no route), no backoff,
// no metric of client attempts. Its transport lines are not logged: its
// result is in the comparison line. The slot is released before return.
func (c *shadowCopy) exchange(t *target) (res attemptResult) {
	u := t.up
	defer func() {
		u.led.ReleaseLong(t.long) // before the slot: its release wakes the queue
		u.release()
	}()
	ex := &exchange{call: call{h: c.h, u: u, r: c.r, log: nopLogger, stream: c.fr.stream, firstByte: u.firstByte},
		w: &shadowWriter{hdr: make(http.Header)}, t: t, fr: c.fr}
	defer ex.out.clearDeadline()
	res = ex.run(c.body)
	res.usage, res.firstByte = ex.out.usage.Usage, ex.out.firstWrite
	return res
}

// logCompared writes the one "shadow compared" line (INFO) of a copy that
// was sent. Its fields:
//
//   - model (the router model), rule, effort (as in X-LLM-Route-Effort),
//     request_id (the client's X-Request-Id, to find its completion line);
//   - for the client's answer (main_*) and the copy's (shadow_*): model
//     (the used model of the chain; the shadow model), upstream, status
//     (HTTP status; 0 when none came), result (an attempt result; for the
//     client also the proxy's own refusal code, or "interrupted" when its
//     answer was cut after it started), input_tokens and output_tokens (as
//     the upstream reported them), latency (to the answer's end) and ttft
//     (to its first body byte; 0 when none). Both answers' times count
//     from the same instant, the client's admission, so the client's queue
//     wait is in neither and they compare directly;
//   - same_status: both statuses are equal.
//
// Never a body: the prompt and both answers stay out of the log. It is
// written when the later of the two answers ends.
func (c *shadowCopy) logCompared(main, shadow shadowAnswer) {
	ce := c.h.logger.Check(zapcore.InfoLevel, "shadow compared")
	if ce == nil {
		return
	}
	fields := make([]zap.Field, 0, 24)
	fields = append(fields, zap.String("model", c.router), zap.String("rule", c.rule), zap.String("effort", c.effort),
		optionalString("request_id", c.requestID))
	fields = c.answerFields(fields, "main_", main)
	fields = c.answerFields(fields, "shadow_", shadow)
	fields = append(fields, zap.Bool("same_status", main.status == shadow.status))
	ce.Write(fields...)
}

// answerFields appends one answer's fields, each name prefixed.
func (c *shadowCopy) answerFields(fields []zap.Field, prefix string, a shadowAnswer) []zap.Field {
	ttft := time.Duration(0)
	if !a.firstByte.IsZero() {
		ttft = a.firstByte.Sub(c.start)
	}
	return append(fields, optionalString(prefix+"model", a.model), optionalString(prefix+"upstream", a.upstream),
		zap.Int(prefix+"status", a.status), zap.String(prefix+"result", a.result),
		zap.Int64(prefix+"input_tokens", a.usage.Input), zap.Int64(prefix+"output_tokens", a.usage.Output),
		zap.Duration(prefix+"latency", a.end.Sub(c.start)), zap.Duration(prefix+"ttft", ttft))
}

// stopShadows waits, after the handler's context was cancelled (a reload
// or stop: every copy is being cancelled), for its running copies to end,
// by taking every concurrency token: none is left to start another.
func (h *Handler) stopShadows() {
	if h.shadowSem == nil {
		return
	}
	limit := time.NewTimer(shadowStopWait)
	defer limit.Stop()
	for range cap(h.shadowSem) {
		select {
		case h.shadowSem <- struct{}{}:
		case <-limit.C:
			h.logger.Warn("shadow requests still running after the handler stopped", zap.Duration("waited", shadowStopWait))
			return
		}
	}
}

// shadowWriter is a shadow copy's response writer: it keeps the headers
// (the exchange writes them) and drops the body.
type shadowWriter struct{ hdr http.Header }

func (d *shadowWriter) Header() http.Header         { return d.hdr }
func (d *shadowWriter) WriteHeader(int)             {}
func (d *shadowWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *shadowWriter) Flush()                      {}
