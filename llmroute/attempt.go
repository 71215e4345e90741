package llmroute

import (
	"context"
	"errors"
	"io"
	"math"
	"mime"
	"net/http"
	"net/url"
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
	resultAuthErr   = "auth_err" // upstream 401/403: the operator's key was refused
)

// allResults lists every result label.
var allResults = []string{resultOK, result4xx, result429, result402, result5xx, resultNetErr, resultTimeout, resultCancelled, resultAuthErr}

// attemptResult is what one attempt reports to the failover loop.
type attemptResult struct {
	out    outcome
	result string
	status int
	// abort: the response was cut after it started; the handler must abort
	// the connection once the attempt is recorded.
	abort bool
	// fault: the upstream broke a response that had started (a cut or a
	// stall) and is backed off for it. A failover always is.
	fault bool
	// api and mode name the front and how the attempt went (native,
	// translated), for the completion log.
	api  api
	mode string
	// retryAfter is the upstream's Retry-After on a 429/503 (0: none); the
	// upstream cools for it only when the run ends on this failure.
	retryAfter time.Duration
	// noBlame: a failover that records no failure (a context-length
	// refusal: the upstream is fine, the prompt too long for it).
	noBlame bool
	// keyFault: the provider refused the pool key the exchange was sent
	// with, which now cools (keypool.go); the run tries another key.
	keyFault keyFault
	// key names the key the exchange went with, for the completion log:
	// a pool key's index, "own" for a caller's own key, "" otherwise.
	key string
	// next is the target a context-length refusal already claimed for the
	// failover (0: none; a claimed next is never the route's first).
	next int
	// counted: the exchange was counted already (a retry run the client
	// left during its pause).
	counted bool
	// What the exchange saw, for metrics and the log (usage.go): the
	// upstream's token usage, when the request went upstream and when the
	// first body byte reached the client (zero: not reached).
	usage     transform.Usage
	sent      time.Time
	firstByte time.Time
	// cont: the stream broke and is handed to a continuation (resume.go);
	// the serve loop runs it once this attempt is recorded.
	cont *continuation
	// extraAttempts: continuations a non-stream answer made (repeat.go).
	extraAttempts int
	// placement and affinity are a pool member's placement (its
	// X-LLM-Route-Placement) and the short hash of the request's affinity
	// key, for the completion log; "" outside a pool.
	placement, affinity string
	// rule, effort and effortSrc are a router model request's (frontReq),
	// for the completion log and the span; rule is nil for a plain model.
	rule      *rule
	effort    effort
	effortSrc effortSource
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
func (h *Handler) attempt(w http.ResponseWriter, r *http.Request, rt *route, t *target, body []byte, fr *frontReq) (res attemptResult) {
	start := time.Now()
	recorded := false
	defer h.finishOnPanic(rt, t, &res, start, fr.arrival, &recorded)
	res = h.exchangeRetrying(w, r, rt, t, body, fr)
	res.placement, res.affinity = fr.place.logged(t)
	res.rule, res.effort, res.effortSrc = fr.rule, fr.effort, fr.effortSrc
	h.finish(rt, t, res, start, fr.arrival)
	recorded = true
	if res.abort {
		// The upstream broke after the client got bytes; the error event is
		// out. Abort the response so it is never mistaken for complete.
		panic(http.ErrAbortHandler)
	}
	return res
}

// attemptContext bounds one upstream exchange by request_timeout.
func (h *Handler) attemptContext(parent context.Context) (context.Context, context.CancelFunc) {
	if h.requestTimeout > 0 {
		return context.WithTimeout(parent, h.requestTimeout)
	}
	return context.WithCancel(parent)
}

// codeFirstByte marks a watchdog that fired before the first byte.
const codeFirstByte = "first_byte"

// codeDrain marks a watchdog that fired while a failed response's body was
// being drained; drainTimeout is that window.
const (
	codeDrain    = "drain"
	drainTimeout = time.Second
)

// watchdog cancels an attempt when its window passes with no read
// returning, and remembers why. One watchdog serves both windows of a
// stream: first byte, then idle.
//
// Its timer is not reset per read: a stream reads every few milliseconds
// and a timer reset costs as much as the read's bookkeeping. resume stamps
// the window's start (window), hold clears it, and the timer, when it
// fires, re-arms itself for what is left of the current window, or for a
// whole period while the proxy is writing to the client (held), so it
// fires about once per period whatever the event rate.
//
// A read that returns data and the window passing can race. Which of them
// won is decided once, by a compare-and-swap on window: the timer claims
// the window it measured (start → firedWindow) and then cancels; hold
// swaps it out. If hold finds it claimed, the attempt is already cancelled
// and the caller must treat the read as timed out, never as a broken
// connection.
type watchdog struct {
	cancel context.CancelFunc
	timer  atomic.Pointer[time.Timer] // made on first use; the timer's own function reads it
	period time.Duration              // owned by the request goroutine
	// lost is the reason hold found the window claimed for (request
	// goroutine): the attempt timed out.
	lost string
	// moved: the period changed since the timer was set, so the next
	// window sets it afresh (a pending timer may be due too late).
	moved bool

	window atomic.Int64           // the open window's start (monoNow), 0 held, firedWindow claimed
	span   atomic.Int64           // the window's length in nanoseconds, as the timer reads it
	armed  atomic.Bool            // a timer is pending
	reason atomic.Pointer[string] // why the open window would fire
	fired  atomic.Pointer[string] // why it did fire
}

// firedWindow marks a window the timer claimed.
const firedWindow = -1

// monoBase makes monoNow monotonic and never 0 (0 means held).
var monoBase = time.Now()

func monoNow() int64 { return int64(time.Since(monoBase)) + 1 }

// arm (re)starts the window for d with the given reason.
func (w *watchdog) arm(d time.Duration, reason string) {
	w.prime(d, reason)
	w.resume()
}

// prime sets the window for d with the given reason without starting it;
// resume starts it.
func (w *watchdog) prime(d time.Duration, reason string) {
	w.moved = w.moved || d != w.period
	w.period = d
	w.span.Store(int64(d))
	w.reason.Store(internReason(reason))
}

// watchReasons are the reasons a window is primed with. internReason
// points into it, so storing a window's reason allocates nothing (a
// streamed request primes two windows).
var watchReasons = [...]string{codeFirstByte, codeStalled, codeDrain}

// internReason is a pointer to a string equal to reason that outlives the
// call: one of watchReasons, else a copy.
func internReason(reason string) *string {
	for i := range watchReasons {
		if watchReasons[i] == reason {
			return &watchReasons[i]
		}
	}
	other := reason // a copy: taking reason's own address would move it to the heap on every call
	return &other
}

// hold ends the open window after a read returned and reports who won:
// "" when the read did (the timer's cancel will never run), else the
// reason of the window that passed first (the attempt is cancelled).
func (w *watchdog) hold() string {
	if w.lost != "" {
		return w.lost
	}
	if w.window.Swap(0) == firedWindow {
		w.window.Store(firedWindow)
		w.lost = *w.reason.Load()
	}
	return w.lost
}

// resume opens a window for the period: the proxy is about to wait for the
// upstream again. Time spent writing to a slow client in between is not
// upstream silence.
func (w *watchdog) resume() {
	if w.period <= 0 || w.lost != "" {
		return
	}
	w.window.Store(monoNow())
	if w.moved {
		// A pending timer may be due after this window's end: set it
		// for this window (a check running meanwhile only re-arms it).
		w.moved = false
		w.armed.Store(true)
		w.set(w.period)
		return
	}
	if w.armed.CompareAndSwap(false, true) {
		w.set(w.period)
	}
}

// set (re)starts the timer for d; the caller holds armed.
func (w *watchdog) set(d time.Duration) {
	t := w.timer.Load()
	if t == nil {
		// Made idle and stored before it is started: check reads it.
		t = time.AfterFunc(math.MaxInt64, w.check)
		w.timer.Store(t)
	}
	t.Reset(d)
}

// check runs when the timer fires: a window that has lasted its span is
// claimed and the attempt cancelled; an open window younger than that
// gets the timer again for the rest; a held watchdog lets the timer go
// (resume arms it again).
func (w *watchdog) check() {
	for {
		start := w.window.Load()
		switch {
		case start == firedWindow:
			return
		case start == 0:
			w.armed.Store(false)
			// A resume between the load and the store above found the
			// timer armed and left it to us.
			if w.window.Load() != 0 && w.armed.CompareAndSwap(false, true) {
				continue
			}
			return
		}
		if left := w.span.Load() - (monoNow() - start); left > 0 {
			w.timer.Load().Reset(time.Duration(left))
			return
		}
		if w.window.CompareAndSwap(start, firedWindow) {
			w.fired.Store(w.reason.Load())
			w.cancel()
			return
		}
		// Held or resumed meanwhile: look again.
	}
}

// stop closes the window until the next arm, and takes the pending timer
// out of the runtime's timer heap: a request that ended must not leave a
// timer behind for a whole period (thousands of them, at load).
func (w *watchdog) stop() {
	w.hold()
	w.period = 0
	if t := w.timer.Load(); t != nil && w.armed.Load() && t.Stop() {
		w.armed.Store(false)
	}
}

// firedFor returns why the watchdog fired, or "".
func (w *watchdog) firedFor() string {
	if p := w.fired.Load(); p != nil {
		return *p
	}
	return w.lost
}

// firstRead is what to do with a stream's first read (n bytes, err) given
// whether it beat the first-byte timer.
type firstRead int

const (
	firstProceed  firstRead = iota // commit to the client with what was read
	firstTimedOut                  // the timer won: fail over as a first-byte timeout
	firstFailed                    // no byte and an error: classify the error
)

// decideFirstRead is that decision. Data that lost the race to the timer is
// dropped: the cancel has already killed the body, so committing to the
// client would only produce a cut stream, while nothing has reached the
// client yet and another upstream can still answer.
func decideFirstRead(n int, err error, readWon bool) firstRead {
	switch {
	case !readWon:
		return firstTimedOut
	case n == 0 && err != nil && err != io.EOF:
		return firstFailed
	}
	return firstProceed
}

// attemptOutcome classifies an attempt that ended before anything reached
// the client: the client left (cancelled, nobody to answer, the upstream
// not blamed), a timer or request_timeout ran out (timeout), or the
// connection failed (net_err). The last two fail over.
func attemptOutcome(clientGone bool, fired string, ctxErr error) attemptResult {
	switch {
	case clientGone:
		return attemptResult{out: outDone, result: resultCancelled}
	case fired == codeFirstByte, errors.Is(ctxErr, context.DeadlineExceeded):
		return attemptResult{out: outFailover, result: resultTimeout}
	}
	return attemptResult{out: outFailover, result: resultNetErr}
}

// finishOnPanic, deferred by attempt and continueOn, records an attempt a
// panic cut short (unless it already was), then lets the panic go on: the
// slot is released exactly once on every path.
func (h *Handler) finishOnPanic(rt *route, t *target, res *attemptResult, start, arrival time.Time, recorded *bool) {
	if p := recover(); p != nil {
		if !*recorded {
			if res.result == "" {
				res.result, res.fault = resultNetErr, true
			}
			h.finish(rt, t, *res, start, arrival)
		}
		panic(p)
	}
}

// finish releases the slot and records the attempt: metric, backoff, log.
func (h *Handler) finish(rt *route, t *target, res attemptResult, start, arrival time.Time) {
	u := t.up
	u.led.ReleaseLong(t.long) // before the slot: its release wakes the queue
	n := u.release()
	now := time.Now()
	t.recordAttempt(now.UnixNano(), res.result, n+1)
	if res.out == outFailover && !res.noBlame || res.fault {
		u.recordFailure(now, h.logger)
		u.State.NoteFailure(res.result, now)
	}
	if !res.counted {
		h.countAttempt(rt, t, res)
	}
	if c := h.logger.Check(zapcore.InfoLevel, "request completed"); c != nil {
		rule, effort, chainModel := ruleFields(&res, t)
		c.Write(zap.String("model", rt.name), zap.String("upstream", u.ID), zap.String("provider", u.Provider),
			zap.String("result", res.result), zap.Int("status", res.status), zap.Duration("duration", now.Sub(start)),
			zap.Int64("slot_released", n), limitField(u.Limit), zap.Stringer("api", res.api), zap.String("mode", res.mode),
			zap.Int64("input_tokens", res.usage.Input), zap.Int64("output_tokens", res.usage.Output),
			ttftField(res, arrival), zap.Duration("request_duration", now.Sub(arrival)),
			optionalString("placement", res.placement), optionalString("affinity", res.affinity),
			optionalString("rule", rule), optionalString("effort", effort), optionalString("chain_model", chainModel),
			optionalString("key", res.key))
	}
}

// ruleFields are a router model request's rule, effort (with its source)
// and the used model of the chain, for the completion log; "" (no field)
// for a plain model.
func ruleFields(res *attemptResult, t *target) (rule, effort, chainModel string) {
	if res.rule == nil {
		return "", "", ""
	}
	return res.rule.name, effortHeaders[res.effort][res.effortSrc], t.model
}

// optionalString is a string field, left out when empty.
func optionalString(key, val string) zap.Field {
	if val == "" {
		return zap.Skip()
	}
	return zap.String(key, val)
}

// recordSuccess resets the failure streak and ends the backoff.
func (u *upstream) recordSuccess(now time.Time) {
	u.State.Succeeded()
	if u.Backoff != nil {
		u.led.Recovered(u.Backoff, now)
	}
}

// recordFailure counts a failure and starts (or doubles) the cooling.
func (u *upstream) recordFailure(now time.Time, logger *zap.Logger) {
	u.State.Failed()
	if u.Backoff == nil {
		return
	}
	d := u.led.Failed(u.Backoff, now)
	if c := logger.Check(zapcore.InfoLevel, "backoff applied"); c != nil {
		c.Write(zap.String("upstream", u.ID), zap.String("scope", u.backoffScope), zap.Duration("cooling", d))
	}
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

// isEventStream reports a text/event-stream response.
func isEventStream(resp *http.Response) bool {
	ct := resp.Header.Get("Content-Type")
	switch ct {
	case "":
		return false
	case "text/event-stream": // the common answers, without ParseMediaType's map
		return true
	case "application/json":
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
