package llmroute

import (
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
	"github.com/llm-route/caddy-llm-route/llmroute/wire/anthropic"
	"github.com/llm-route/caddy-llm-route/llmroute/wire/responses"
)

// frontAPI is the wire API a generation front speaks.
func frontAPI(f front) api {
	switch f {
	case frontMessages:
		return apiMessages
	case frontResponses:
		return apiResponses
	case frontEmbeddings:
		return apiEmbeddings
	case frontCompletions:
		return apiCompletions
	}
	return apiChat
}

// anthropicShaped reports a front whose errors use Anthropic's shape.
func anthropicShaped(f front) bool { return f == frontMessages || f == frontCountTokens }

// writeAs sends the error in the front's shape: Anthropic's for messages and
// count_tokens, OpenAI's (apiError.write) for the rest.
func (e apiError) writeAs(w http.ResponseWriter, f front) {
	if !anthropicShaped(f) {
		e.write(w)
		return
	}
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	if e.retryAfter > 0 {
		hdr.Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	writeJSON(w, e.status, anthropic.ErrorBody(e.status, e.code, e.message))
}

// errNoAPI is the 503 for a request to a model none of whose upstreams can
// serve the front's API (apiSet.canServe): embeddings and completions are
// never translated, chat never goes to a messages-only upstream.
func errNoAPI(model string, a api) apiError {
	return apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "no_upstream_for_api",
		message: "no upstream of model " + strconv.Quote(model) + " serves " + a.String(), retryAfter: 1}
}

// clientSessionHeaders are the session ids clients send themselves,
// in the order they are looked for.
var clientSessionHeaders = []string{"X-Claude-Code-Session-Id", "Session-Id", "Session_id", "X-Session-Affinity", "X-Opencode-Session"}

// clientSession is the client's own session id, "" when it sent none.
func clientSession(r *http.Request) string {
	for _, k := range clientSessionHeaders {
		if v := r.Header[k]; len(v) > 0 && v[0] != "" && validHeaderValue(v[0]) {
			return v[0]
		}
	}
	return ""
}

// translator is a front's chat → front stream stage (anthropic.Stream,
// responses.Stream).
type translator interface {
	Write(p []byte) (int, error)
	Close() error
	Fail(code, message string) error
	Finished() bool
}

// translateSink feeds upstream chat bytes (through the think rewriter when
// there is one) to the translator, which queues the front's events on the
// client writer; one upstream read is sent with one write.
type translateSink struct {
	rw  *transform.StreamRewriter // nil without think_tags
	st  translator
	out *clientWriter
}

func (s *translateSink) Write(p []byte) (int, error) {
	var err error
	n := len(p)
	if s.rw != nil {
		n, err = s.rw.Write(p)
	} else {
		_, err = s.st.Write(p)
	}
	if err != nil {
		return n, err
	}
	return n, s.out.writeQueued()
}

func (s *translateSink) end() error {
	if s.rw != nil {
		if err := s.rw.Close(); err != nil {
			return err
		}
	}
	err := s.st.Close()
	// What Close emitted goes out even when the stream was unfinished.
	if werr := s.out.writeQueued(); werr != nil {
		return werr
	}
	return err
}

// translateBody turns a whole chat answer into the front's: think tags
// first, then FromChat for a 2xx, TranslateError for anything else.
type translateBody struct {
	ex *exchange
}

func (b translateBody) transformBody(dst, body []byte) ([]byte, bool) {
	ex := b.ex
	status := ex.resp.StatusCode
	if status >= 300 {
		if ex.fr.f == frontMessages {
			return anthropic.TranslateError(status, body), true
		}
		return responses.TranslateError(status, body), true
	}
	if ex.u.think != transform.ThinkOff {
		if out, changed := transform.RewriteCompletion(nil, body, ex.u.think); changed {
			body = out
		}
	}
	var out []byte
	var err error
	if ex.fr.f == frontMessages {
		out, err = anthropic.FromChat(dst, body, ex.ainfo)
	} else {
		out, err = responses.FromChat(dst, body, ex.rinfo)
	}
	if err != nil {
		// The upstream said 2xx but sent something that is not a chat
		// completion: the client gets an error it can parse.
		if ex.fr.f == frontMessages {
			return anthropic.ErrorBody(http.StatusBadGateway, "bad_upstream_response", "the upstream's answer is not a chat completion"), true
		}
		return responses.ErrorBody(http.StatusBadGateway, "bad_upstream_response", "the upstream's answer is not a chat completion"), true
	}
	return out, true
}

// frontReq is what the serve loop parsed from a request, shared by its
// attempts.
type frontReq struct {
	f       front
	api     api
	stream  bool
	session string // the client's own session id, "" for none
	rt      *route // the route being walked, and the index of the
	idx     int    // attempt's target in it (for a context-length failover)
	// arrival is when the request reached the handler: time to first
	// token and the request duration count from it.
	arrival time.Time
	resume  bool // the model continues broken streams (resume.go)
	// attempts counts the request's exchanges with upstreams so far:
	// failovers, same-upstream retries and continuations (X-LLM-Route-Attempts).
	attempts int
}

// buildBody makes an attempt's outgoing body and picks the endpoint: native
// (the body as sent, model swapped, patches merged) when the upstream
// serves the front's API, else translated to chat (messages, responses).
// A body the translator refuses is a front-shaped 400 in errBody.
func (ex *exchange) buildBody(body []byte) (out []byte, ep endpoint, errBody []byte, status int) {
	fr, u := &ex.fr, ex.u
	if fr.api == apiChat {
		out, err := transform.RewriteRequest(make([]byte, 0, len(body)+512), body, &ex.t.edit)
		if err != nil {
			return nil, epChat, nil, http.StatusBadRequest
		}
		return out, epChat, nil, 0
	}
	if u.apis.has(fr.api) {
		ex.native = true
		src := body
		if fr.api == apiMessages && !u.keepBill {
			src = anthropic.StripBillingBlock(make([]byte, 0, len(body)), body)
		}
		edit := ex.t.edit
		edit.ReasoningField, edit.ReasoningEmptyOK = "", false // the reasoning backfill is chat's
		out, err := transform.RewriteRequest(make([]byte, 0, len(src)+512), src, &edit)
		if err != nil {
			return nil, epChat, nil, http.StatusBadRequest
		}
		return out, nativeEndpoint[fr.api], nil, 0
	}
	var chat []byte
	var terr error
	switch fr.api {
	case apiMessages:
		chat, ex.ainfo, terr = anthropic.ToChat(make([]byte, 0, len(body)+256), body,
			anthropic.Options{KeepBillingHeader: u.keepBill, ReasoningField: u.reasoning})
		if e, ok := terr.(*anthropic.Error); ok {
			return nil, epChat, anthropic.ErrorBody(e.Status, e.Code, e.Message), e.Status
		}
	case apiResponses:
		chat, ex.rinfo, terr = responses.ToChat(make([]byte, 0, len(body)+256), body, responses.Options{ReasoningField: u.reasoning})
		if e, ok := terr.(*responses.Error); ok {
			return nil, epChat, e.Body(), e.Status
		}
		if terr == nil && (len(ex.rinfo.DroppedTools) > 0 || len(ex.rinfo.DroppedItems) > 0) {
			ex.h.logger.Warn("responses request: left out what a chat upstream cannot take",
				zap.String("upstream", u.id), zap.Strings("dropped_tools", ex.rinfo.DroppedTools), zap.Strings("dropped_items", ex.rinfo.DroppedItems))
		}
	}
	if terr != nil {
		return nil, epChat, nil, http.StatusBadRequest
	}
	out, err := transform.RewriteRequest(make([]byte, 0, len(chat)+512), chat, &ex.t.edit)
	if err != nil {
		return nil, epChat, nil, http.StatusBadRequest
	}
	ex.translated = true
	return out, epChat, nil, 0
}

// sessionID is the value of the upstream's session header: the client's own
// session id, else Codex's prompt_cache_key, else the hash of the front's
// history.
func (ex *exchange) sessionID(body, out []byte) string {
	if ex.fr.session != "" {
		return ex.fr.session
	}
	switch ex.fr.api {
	case apiMessages:
		hist, err := anthropic.SessionBody(nil, body)
		if err == nil {
			return ex.h.led.sessionID(hist)
		}
	case apiResponses:
		info, chat := ex.rinfo, out
		if info == nil { // native: translate only to find the history
			var err error
			if chat, info, err = responses.ToChat(nil, body, responses.Options{}); err != nil {
				return ex.h.led.sessionID(body)
			}
		}
		if info.PromptCacheKey != "" && validHeaderValue(info.PromptCacheKey) {
			return info.PromptCacheKey
		}
		return ex.h.led.sessionID(chat)
	}
	return ex.h.led.sessionID(out)
}

// mode is the completion log's `mode`.
func (ex *exchange) mode() string {
	if ex.translated {
		return "translated"
	}
	return "native"
}
