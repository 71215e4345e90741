package llmroute

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The attempt path. A call is one request to one upstream, up to the start
// of its answer, and it is the only way a request reaches an upstream:
// an attempt's exchange (exchange.go) with its same-upstream retries and
// Retry-After waits (retry.go), a stream continuation (resume.go), a probe
// (prober.go) and count_tokens (count_tokens.go) all send through it. So
// every rule about sending and about the start of an answer is written here
// once and holds for all of them alike: the outgoing request
// (upstreamRequest), request_timeout (and through it the client's write
// deadline), the first-byte watchdog and the first read, the sorting of a
// failed answer (a context-length refusal, the failover statuses, a 404
// about the client's own ids, Retry-After) and the bounded drain of its
// body. Before this, four senders each had their own copy, and the copies
// had drifted apart: the continuation knew neither the context-length
// refusal nor the retry rules.
//
// What happens to an answer once it started (the sink chain, the stream
// copy) stays with the caller. The same-upstream rules of a run of calls
// (retries, the Retry-After wait, the hold when the run ends on one) are
// tryAgain's (retry.go), used by the callers that hold a slot: an attempt
// and a continuation. A probe and count_tokens send once: they hold no
// slot, and their failure changes nothing but their own answer.
type call struct {
	h *Handler
	u *upstream
	r *http.Request // the client's request; nil for a probe, which has none
	// log takes the call's own lines (a failover's reason, a refused key's
	// body); nopLogger for the senders whose failure is only their own
	// line (a probe, count_tokens).
	log *zap.Logger

	// stream: the answer's first body byte must arrive before the caller
	// commits to it (a stream, a probe), within firstByte (0: unbounded).
	stream    bool
	firstByte time.Duration
	// rt and idx are the route and the target whose slot the call holds: a
	// context-length refusal claims the next target of rt (nil: the call
	// holds no slot and the rule does not apply).
	rt  *route
	idx int
	pl  *placing // the request's placement order of rt (nil: list order)

	ctx    context.Context // request_timeout, the watchdog's cancel
	cancel context.CancelFunc
	w8     watchdog
	sent   time.Time // the request went upstream
	err    error     // the transport error that ended the call, if one did

	// The key the call sends (keypool.go): own holds the caller's own
	// keys (client_key_header); takeKey chooses, once (keyed), the header
	// value auth: a caller's own key (ownKey), a pool key (key), or the
	// provider's one key.
	own    []ownKey
	keyed  bool
	ownKey bool
	auth   []string
	key    *poolKey
	// head is the start of a failed answer's body, once peekBody read it.
	head   []byte
	peeked bool

	resp     *http.Response
	buf      *[]byte // copy buffer, pooled
	first    []byte  // bytes read before committing (streams)
	firstErr error   // the error that came with first
}

// nopLogger is the log of a quiet call.
var nopLogger = zap.NewNop()

// open starts the call under ctx, ended by cancel, and arms the
// first-byte window of a call that waits for its first byte. close must
// follow.
func (c *call) open(ctx context.Context, cancel context.CancelFunc) {
	c.ctx, c.cancel = ctx, cancel
	c.w8.cancel = cancel
	if c.stream && c.firstByte > 0 {
		c.w8.arm(c.firstByte, codeFirstByte)
	}
}

// close ends the call: its buffer back to the pool, the answer's body
// closed, the watchdog stopped, the context cancelled.
func (c *call) close() {
	if c.buf != nil {
		putCopyBuf(c.buf)
		c.buf = nil
	}
	if c.resp != nil {
		c.resp.Body.Close()
	}
	c.w8.stop()
	if c.cancel != nil {
		c.cancel()
	}
}

// limit is the call's request_timeout deadline (zero: none): writes to the
// client made for this call are bounded by it too.
func (c *call) limit() time.Time {
	d, _ := c.ctx.Deadline()
	return d
}

// request builds the outgoing request of body out to dst (upstreamRequest:
// the forwarded client headers, the provider's key and headers). The body
// is not pooled: the transport may still be writing it after RoundTrip
// returns. Wrapped as NopCloser(*bytes.Reader), net/http knows it is in
// memory and sends headers and body in one write.
func (c *call) request(dst *url.URL, out []byte) *http.Request {
	if !c.keyed && !c.takeKey() {
		// Every key of the pool cools: a sender other than an attempt (a
		// probe, a continuation) goes with the key that comes back first.
		c.key, _ = c.u.keys.soonest(time.Now())
		c.auth = c.key.authValue
	}
	return c.h.upstreamRequest(c.ctx, c.r, c.u, c.auth, dst, out, io.NopCloser(bytes.NewReader(out)))
}

// send sends req and reads the start of the answer. ok: the answer is the
// caller's to use (c.resp, and for a stream c.first and c.firstErr, the
// watchdog stopped); otherwise res says how the call ended before anything
// reached the client (a failover, or the client left), and a failed
// answer's body is drained.
func (c *call) send(req *http.Request) (res attemptResult, ok bool) {
	c.sent = time.Now()
	resp, err := c.u.transport.RoundTrip(req)
	if err != nil {
		return c.classifyError(err), false
	}
	c.resp = resp
	if res, failed := c.classify(); failed {
		return res, false
	}
	// For streams the first body byte must arrive before anything is sent
	// to the client, so that a silent upstream can still fail over.
	c.buf = getCopyBuf()
	if c.stream {
		if res, failed := c.firstRead(); failed {
			return res, false
		}
	}
	c.w8.stop()
	return attemptResult{}, true
}

// classify sorts the answer by its status. A context-length refusal hands
// on to the next upstream without blame (contextRefusal); a failover
// status (failoverStatus, but not a 404 about something the client named)
// fails over with its Retry-After, which the run decides on (wait, or
// cool), after a drain bounded in time: an upstream that sends error
// headers and then stalls must not hold up the failover until
// request_timeout (when the window passes, the call is cancelled and the
// connection dropped instead of reused). Anything else is the caller's.
func (c *call) classify() (attemptResult, bool) {
	resp := c.resp
	res, refusal := c.contextRefusal()
	switch {
	case refusal == refusalFailover:
		return res, true
	case refusal == refusalLast: // delivered as it came, even a 500
		return attemptResult{}, false
	}
	if c.key != nil || c.ownKey {
		if res, refused := c.keyRefused(); refused {
			return res, true
		}
	}
	if !failoverStatus(resp.StatusCode) || clientsNotFound(resp.StatusCode, c.peekNotFound()) {
		return attemptResult{}, false
	}
	retryAfter := retryAfterOf(resp, time.Now())
	c.w8.arm(drainTimeout, codeDrain)
	c.drainFailed()
	c.w8.stop()
	return attemptResult{out: outFailover, result: statusResult(resp.StatusCode), status: resp.StatusCode, retryAfter: retryAfter}, true
}

// keyRefused sorts an answer to a call sent with a pool key or a caller's
// own key: a refusal of the key (keyFaultOf, from the status and the
// bounded head of the body) fails over. A pool key cools for it, and the
// run tries another key (tryAgain); a caller's own key is never cooled,
// and its refusal is not the upstream's fault (no blame).
func (c *call) keyRefused() (attemptResult, bool) {
	resp := c.resp
	var head []byte
	switch resp.StatusCode {
	case http.StatusBadRequest, http.StatusForbidden, http.StatusTooManyRequests:
		head = c.peekBody() // quota and billing errors say so in the body
	case http.StatusUnauthorized, http.StatusPaymentRequired:
	default:
		return attemptResult{}, false
	}
	f := keyFaultOf(resp.StatusCode, head)
	if f == keyFine {
		return attemptResult{}, false
	}
	now := time.Now()
	retryAfter := retryAfterOf(resp, now)
	c.w8.arm(drainTimeout, codeDrain)
	c.drainFailed()
	c.w8.stop()
	res := attemptResult{out: outFailover, result: statusResult(resp.StatusCode), status: resp.StatusCode}
	if c.ownKey {
		res.noBlame = true
		return res, true
	}
	res.retryAfter, res.keyFault = retryAfter, f
	c.h.coolKey(c.u, c.key, f, retryAfter, resp.StatusCode)
	return res, true
}

// testHookFirstRead, when set by a test, runs between a stream's first read
// and the first-byte decision: the seam for the timer-fires-just-after-data
// race.
var testHookFirstRead func(*watchdog)

// firstRead reads the first body bytes of a stream and decides on them
// (decideFirstRead); failed: the call ends with res.
func (c *call) firstRead() (res attemptResult, failed bool) {
	n, rerr := readSome(c.resp.Body, *c.buf)
	if testHookFirstRead != nil {
		testHookFirstRead(&c.w8)
	}
	switch decideFirstRead(n, rerr, c.w8.hold() == "") {
	case firstTimedOut:
		return c.firstByteTimeout(), true
	case firstFailed:
		return c.classifyError(rerr), true
	}
	c.first, c.firstErr = (*c.buf)[:n], rerr
	if n == 0 && rerr == io.EOF && c.resp.StatusCode < 300 && isEventStream(c.resp) {
		// An event stream closed before its first byte gave no answer,
		// and nothing has reached the client: the next upstream may.
		if ce := c.log.Check(zapcore.WarnLevel, "upstream closed an empty stream, failing over"); ce != nil {
			ce.Write(zap.String("upstream", c.u.ID))
		}
		return attemptResult{out: outFailover, result: resultNetErr}, true
	}
	return attemptResult{}, false
}

// firstByteTimeout ends a call whose first-byte timer beat the first read:
// nothing reached the client, so it fails over.
func (c *call) firstByteTimeout() attemptResult {
	if c.clientGone() {
		return attemptResult{out: outDone, result: resultCancelled}
	}
	if ce := c.log.Check(zapcore.WarnLevel, "first byte timeout, failing over"); ce != nil {
		ce.Write(zap.String("upstream", c.u.ID), zap.Duration("first_byte_timeout", c.firstByte))
	}
	return attemptResult{out: outFailover, result: resultTimeout}
}

// classifyError turns a transport error before anything reached the
// client into a result, and logs why it fails over.
func (c *call) classifyError(err error) attemptResult {
	c.err = err
	res := attemptOutcome(c.clientGone(), c.w8.firedFor(), c.ctx.Err())
	switch {
	case res.result == resultCancelled:
	case c.w8.firedFor() == codeFirstByte:
		if ce := c.log.Check(zapcore.WarnLevel, "first byte timeout, failing over"); ce != nil {
			ce.Write(zap.String("upstream", c.u.ID), zap.Duration("first_byte_timeout", c.firstByte))
		}
	case res.result == resultNetErr:
		if ce := c.log.Check(zapcore.WarnLevel, "upstream connection failed"); ce != nil {
			ce.Write(zap.String("upstream", c.u.ID), zap.String("error", redactError(err)))
		}
	}
	return res
}

// clientGone reports that the client left (a probe has no client).
func (c *call) clientGone() bool {
	return c.r != nil && c.r.Context().Err() != nil
}

// discard drains an answer the caller will not use, bounded like the
// drain of a failed one, so the connection can be reused.
func (c *call) discard() {
	c.w8.arm(drainTimeout, codeDrain)
	drain(c.resp.Body)
	c.w8.stop()
}
