package llmroute

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// ServeHTTP answers the API paths (see front) and passes every other
// request to the next handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	f, allow, id, root := classifyPath(r.URL.Path)
	if f == frontNone || root && !h.claimsAtRoot(r, f, allow, id) {
		return h.serveNext(w, r, next)
	}
	var own []ownKey
	if len(h.ownKeyHdrs) > 0 {
		own = h.takeOwnKeys(r) // before anything could log or forward them
	}
	if geminiListing(r, f) {
		f = frontGeminiModels
	}
	setRequestID(w, r)
	if (h.corsAny || len(h.corsOrigins) > 0) && h.cors(w, r) {
		return nil
	}
	switch f {
	case frontUnsupported:
		h.refuse(w, r, f, errUnsupported)
		return nil
	case frontGeminiUnsupported:
		h.refuse(w, r, f, errGeminiUnsupported)
		return nil
	}
	if !methodAllowed(allow, r.Method) {
		w.Header().Set("Allow", allow)
		h.refuse(w, r, f, errMethod(allow))
		return nil
	}
	var key *clientKey
	if h.keys != nil {
		if key = h.authenticate(w, r, f); key == nil || h.keyListing(w, r, f, key, id) {
			return nil
		}
	}
	switch f {
	case frontModels:
		if r.Header.Get("Anthropic-Version") != "" {
			writeJSON(w, http.StatusOK, h.table.anthropicModels)
			return nil
		}
		return h.serveModels(w)
	case frontModel:
		return h.serveModel(w, r, id)
	case frontCountTokens:
		return h.serveCountTokens(w, r, key)
	case frontGeminiModels:
		return h.serveGeminiModels(w, r, id)
	case frontGeminiCount:
		return h.serveGeminiCount(w, r, key, id)
	}
	return h.serveFront(w, r, f, key, own)
}

// methodAllowed reports whether method is in the comma-separated allow.
func methodAllowed(allow, method string) bool {
	for allow != "" {
		var m string
		m, allow, _ = strings.Cut(allow, ",")
		if strings.TrimSpace(m) == method {
			return true
		}
	}
	return false
}

// serveFront is the request path of every generation front (chat,
// messages, responses, embeddings, completions): read → parse → admit →
// attempt (failing over to the next upstream while nothing has reached the
// client) → respond. Only the front's codec knows its wire format.
//
// own are the caller's own provider keys (client_key_header).
func (h *Handler) serveFront(w http.ResponseWriter, r *http.Request, f front, key *clientKey, own []ownKey) error {
	arrival := time.Now()
	bodyBuf := getBuffer()
	defer putBuffer(bodyBuf)
	body, apiErr := readBody(r, h.maxBody, bodyBuf)
	if apiErr != nil {
		h.refuse(w, r, f, *apiErr)
		return nil
	}
	// The members a pool's placement reads are noted in the same pass.
	place := placeInput{spans: frontCodecs[f].prompt().spans(), parsed: true}
	if h.table.routers {
		// and the members a router model's rules read (rules.go)
		frontCodecs[f].rules().addSpans(&place.spans)
	}
	model, stream, dups, err := transform.ParseRequestKeys(body, h.watchKeys, &place.spans)
	if m, s, ok := frontCodecs[f].pathTarget(r.URL.Path); ok {
		// The path names the model and the stream (Gemini): a body's own
		// "model" or "stream" member is not read.
		if errors.Is(err, transform.ErrNoModel) {
			err = nil
		}
		model, stream = m, s
		if stream && err == nil && !geminiStreamSSE(r.URL.RawQuery) {
			h.refuse(w, r, f, errStreamNeedsSSE)
			return nil
		}
	}
	if err != nil {
		switch {
		case errors.Is(err, transform.ErrNoModel):
			h.refuse(w, r, f, errNoModel)
		case errors.Is(err, transform.ErrDuplicateKey):
			h.refuse(w, r, f, errDuplicateKey)
		default:
			h.refuse(w, r, f, errBadJSON)
		}
		return nil
	}
	fr := frontReq{f: f, codec: frontCodecs[f], stream: stream, arrival: arrival, own: own}
	fr.api = fr.codec.api()
	rt := h.table.routes[model]
	var pinned effort
	if rt == nil {
		if h.table.routers {
			rt, pinned = h.table.suffixed(model) // "auto:high"
		}
		if rt == nil {
			h.refuse(w, r, f, errUnknownModel(model), clientModel(model))
			return nil
		}
	}
	// full is the route placement ranks over: the model's, or the chain's.
	full := rt
	if rt.rules != nil {
		var ch *chain
		if ch, rt = h.resolveRule(w, r, &fr, rt.rules, pinned, body, &place.spans, key); rt == nil {
			return nil
		}
		full = ch.full
	} else if rt = h.table.apiRoutes[fr.api][model]; rt == nil {
		// Only the upstreams that can serve the front's API take part.
		h.refuse(w, r, f, errNoAPI(model, fr.api), zap.String("model", model))
		return nil
	}
	fr.resume = rt.resume && stream
	fr.guard = rt.guard
	if dups&rt.dupKeys != 0 {
		// A key this model's patches write appears twice: the upstream might
		// read the client's copy instead of the patched one.
		h.refuse(w, r, f, errDuplicateKey, zap.String("model", rt.name), fr.ruleField())
		return nil
	}
	if rt.sized() {
		// Estimated once per request: context windows and long-context
		// slots narrow the upstreams it may go to (context.go).
		est := estimateTokens(body)
		fit := rt.fitting(est)
		if fit == nil {
			h.setSkipped(w, rt.noneFits(), nil, time.Now())
			h.refuse(w, r, f, errContextTooLong(est.prompt+est.output), zap.String("model", rt.name), fr.ruleField())
			return nil
		}
		rt = fit
	}
	// Pool steps are ranked once per request, over the model's full route
	// (every variant keeps its targets' place in it).
	fr.session = fr.codec.session(r)
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	place.r, place.repl, place.body, place.codec, place.led = r, repl, body, fr.codec, h.led
	fr.place = placeRequest(full, &place)
	defer donePlacing(fr.place)
	var kr *keyReq
	if key != nil {
		if kr = h.admitKey(w, r, f, key, rt, body); kr == nil {
			return nil
		}
		rt = kr.rt // only the upstreams its budget has room for
		kr.pl = fr.place
		defer kr.release() // a reservation an aborted attempt left
	}
	if repl != nil {
		repl.Set("http.llm_route.model", rt.nameAny)
	}

	admitStart := time.Now()
	idx, apiErr := h.admit(r, rt, fr.place)
	queued := time.Since(admitStart)
	if apiErr != nil {
		if apiErr == errClientGone {
			return caddyhttp.Error(499, errClientClosed)
		}
		if apiErr.status != http.StatusServiceUnavailable {
			h.refuse(w, r, f, *apiErr, zap.String("model", rt.name), fr.ruleField())
			return nil
		}
		// No free upstream: the refusal's one log line carries the slot
		// state of every upstream, which says why.
		now := time.Now()
		h.setSkipped(w, rt, nil, now)
		h.refuse(w, r, f, *apiErr, zap.String("model", rt.name), fr.ruleField(), zap.Array("slots", slotLog{rt, now}))
		return nil
	}
	if kr != nil {
		if idx, apiErr = h.reserveAttempt(kr, rt, idx); apiErr != nil {
			h.refuse(w, r, f, *apiErr, zap.String("model", rt.name), fr.ruleField())
			return nil
		}
	}
	var shadow *shadowRun
	if fr.rule != nil && fr.rule.shadowSend != nil {
		// A share of the rule's admitted requests is copied to its shadow
		// model, on the side (shadow.go); the answer goes on unchanged.
		if shadow = h.startShadow(w, r, &fr, rt.name, body, dups); shadow != nil {
			defer shadow.mainEnded()
		}
	}
	var failures []attemptRecord
	for {
		t := &rt.targets[idx]
		if repl != nil {
			// Preboxed values: setting placeholders allocates nothing.
			repl.Set("http.llm_route.upstream", t.up.idAny)
			repl.Set("http.llm_route.provider", t.up.providerAny)
			repl.Set("http.llm_route.attempts", attemptCount(fr.attempts+1)) // if the attempt aborts
		}
		fr.rt, fr.idx = rt, idx
		if fr.place != nil {
			var hdr http.Header
			if h.routeHeaders {
				hdr = w.Header()
			}
			fr.place.sent(hdr, t, time.Now())
		}
		res := h.attempt(w, r, rt, t, body, &fr) // sets the route headers (retry.go)
		if res.cont != nil {
			res, t = h.resume(r, rt, idx, res, body, &fr) // the stream broke: continue it
		}
		if repl != nil {
			// Retries and continuations included.
			repl.Set("http.llm_route.attempts", attemptCount(fr.attempts))
		}
		if shadow != nil {
			shadow.mainAnswer(t, &res)
		}
		if kr != nil {
			h.settleAttempt(kr, t, res)
		}
		if len(failures) == 0 {
			h.observeOverhead(res, arrival, queued)
		}
		if res.out != outFailover {
			if fr.place != nil && res.result == resultOK {
				fr.place.served(t, res.usage, h.led)
			}
			h.observeRequest(t, res, arrival)
			annotateSpan(r, rt, t, res, fr.attempts)
			if res.result == resultCancelled && res.status == 0 {
				// The client left before any answer: nothing was written,
				// so let Caddy log 499 rather than an empty 200.
				return caddyhttp.Error(499, errClientClosed)
			}
			return nil
		}
		failures = append(failures, attemptRecord{upstream: t.up.ID, result: res.result, status: res.status})
		next, ok := res.next, res.next > 0 // claimed by a context-length failover
		if !ok {
			next, ok = h.claimNext(rt, fr.place, idx)
		}
		if ok && kr != nil {
			if next, apiErr = h.reserveAttempt(kr, rt, next); apiErr != nil {
				if shadow != nil {
					shadow.mainRefused(*apiErr)
				}
				h.refuse(w, r, f, *apiErr, zap.String("model", rt.name), fr.ruleField())
				return nil
			}
		}
		if !ok {
			e := h.allFailed(rt, failures)
			if shadow != nil {
				shadow.mainRefused(e)
			}
			if kr != nil {
				kr.served(e.code)
			}
			if e.status == http.StatusServiceUnavailable {
				h.setSkipped(w, rt, failures, time.Now())
			} else {
				// No upstream answered this one either.
				w.Header().Del(hdrRouteUpstream)
			}
			// Each attempt already logged its failure; the refusal's line
			// lists them.
			h.refuse(w, r, f, e, zap.String("model", rt.name), fr.ruleField(), zap.Array("attempts", attemptLog(failures)))
			return nil
		}
		if c := h.logger.Check(zapcore.InfoLevel, "failover"); c != nil {
			c.Write(zap.String("model", rt.name), zap.String("from", t.up.ID),
				zap.String("to", rt.targets[next].up.ID), zap.String("result", res.result), zap.Int("status", res.status))
		}
		idx = next
	}
}

// allFailed is the answer when no upstream is left: 502 when every attempt
// was refused for the operator's credentials (401/403) or every upstream
// lacked the endpoint or model (404/405) — retrying cannot help — else 503
// with Retry-After saying when the first upstream leaves the cooling these
// very failures may have started, at least 1 s.
func (h *Handler) allFailed(rt *route, failures []attemptRecord) apiError {
	auth, notFound := true, true
	for _, f := range failures {
		auth = auth && f.result == resultAuthErr
		notFound = notFound && notFoundStatus(f.status)
	}
	switch {
	case auth:
		return errUpstreamAuth
	case notFound:
		return errUpstreamNotFound
	}
	e := errAllFailed
	if soonest, allCooling := soonestBack(rt, time.Now()); allCooling {
		e.retryAfter = max(int(math.Ceil(soonest.Seconds())), 1)
	}
	return e
}

// errClientGone marks an admission that ended because the client left.
var errClientGone = &apiError{status: 499, code: "client_closed_request"}

// errClientClosed is returned to Caddy (status 499) when the client left
// while waiting; there is nobody to write an answer to.
var errClientClosed = errors.New("client closed the request")

// attemptRecord is one failed attempt, kept for the "all upstreams failed"
// log entry.
type attemptRecord struct {
	upstream string
	result   string
	status   int
}

type attemptLog []attemptRecord

func (a attemptLog) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, r := range a {
		_ = enc.AppendObject(zapcore.ObjectMarshalerFunc(func(o zapcore.ObjectEncoder) error {
			o.AddString("upstream", r.upstream)
			o.AddString("result", r.result)
			if r.status != 0 {
				o.AddInt("status", r.status)
			}
			return nil
		}))
	}
	return nil
}

// admit takes a slot on the first upstream of the model, in order, that is
// not cooling and has a free slot, waiting in the model's queue if it has
// one. It returns the index of the claimed target.
func (h *Handler) admit(r *http.Request, rt *route, pl *placing) (int, *apiError) {
	if i, d := pl.warmTarget(rt); i >= 0 {
		// The member holding the request's cache is busy: worth a wait.
		if idx, ok := h.waitWarm(r, rt, pl, i, d); ok {
			return idx, nil
		}
		if r.Context().Err() != nil {
			return -1, errClientGone
		}
	}
	if sched.waiting.Load() == 0 {
		if idx, ok := h.claimNext(rt, pl, -1); ok {
			if rt.queueSize > 0 {
				h.observeWait(rt, "admitted", 0)
			}
			return idx, nil
		}
	}
	// Through the scheduler, so earlier waiters of any model keep their
	// turn (a model without a queue takes one turn and no more).
	return h.wait(r, rt, pl)
}

// claimNext claims a slot on the first eligible target after target index
// after (-1: the first) in the route's order, logging skipped and accepted
// upstreams.
func (h *Handler) claimNext(rt *route, pl *placing, after int) (int, bool) {
	return claimFrom(rt, pl, after, time.Now(), h.logger)
}

// reject builds the 503 for a model with no free upstream: cooling (with
// Retry-After) when every upstream is in backoff, busy otherwise.
func (h *Handler) reject(rt *route) *apiError {
	now := time.Now()
	soonest, allCooling := soonestBack(rt, now)
	if allCooling {
		e := errAllCooling(max(int(math.Ceil(soonest.Seconds())), 1))
		return &e
	}
	e := errAllBusy
	return &e
}

// slotLog renders the slot state of every upstream of a route.
type slotLog struct {
	rt  *route
	now time.Time
}

func (s slotLog) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, t := range s.rt.targets {
		u := t.up
		_ = enc.AppendObject(zapcore.ObjectMarshalerFunc(func(o zapcore.ObjectEncoder) error {
			o.AddString("upstream", u.ID)
			o.AddInt64("inflight", u.State.Inflight())
			if u.Limit != ledger.Unlimited {
				o.AddInt64("limit", u.Limit)
			}
			if left := u.Cooling(s.now); left > 0 {
				o.AddDuration("cooling", left)
			}
			return nil
		}))
	}
	return nil
}

// serveModels answers GET …/models in the OpenAI list format.
func (h *Handler) serveModels(w http.ResponseWriter) error {
	writeJSON(w, http.StatusOK, h.table.modelsBody)
	return nil
}

// serveModel answers GET …/models/{name}.
func (h *Handler) serveModel(w http.ResponseWriter, r *http.Request, name string) error {
	if h.table.routes[name] == nil {
		h.refuse(w, r, frontModel, errUnknownModel(name), clientModel(name))
		return nil
	}
	writeJSON(w, http.StatusOK, appendModelObject(nil, name, h.table.created))
	return nil
}

// modelsListBody pre-encodes the model list at provision time.
func modelsListBody(names []string, created int64) []byte {
	b := []byte(`{"object":"list","data":[`)
	for i, n := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendModelObject(b, n, created)
	}
	return append(b, "]}\n"...)
}

func appendModelObject(b []byte, name string, created int64) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"object":"model","created":`...)
	b = strconv.AppendInt(b, created, 10)
	return append(b, `,"owned_by":"llm_route"}`...)
}

// readBody reads the whole request body into buf, bounded by limit. A body
// cut by a tighter bound before this handler (Caddy's request_body
// max_size) is a 413 naming that bound, not a read error.
func readBody(r *http.Request, limit int64, buf *bytes.Buffer) ([]byte, *apiError) {
	if r.ContentLength > limit {
		e := errTooLarge(limit)
		return nil, &e
	}
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	n, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1))
	if err != nil {
		if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
			e := errTooLarge(mbe.Limit)
			return nil, &e
		}
		return nil, &errReadBody
	}
	if n > limit {
		e := errTooLarge(limit)
		return nil, &e
	}
	return buf.Bytes(), nil
}

// bufferPool recycles request and response bodies; buffers that grew past
// maxPooledBuffer are dropped so one huge body does not pin memory.
var bufferPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledBuffer = 1 << 20

func getBuffer() *bytes.Buffer { return bufferPool.Get().(*bytes.Buffer) }

func putBuffer(b *bytes.Buffer) {
	if b.Cap() > maxPooledBuffer {
		return
	}
	b.Reset()
	bufferPool.Put(b)
}

// attemptCounts are preboxed values of the attempts placeholder.
var attemptCounts = func() (a [16]any) {
	for i := range a {
		a[i] = i
	}
	return a
}()

func attemptCount(n int) any {
	if n < len(attemptCounts) {
		return attemptCounts[n]
	}
	return n
}
