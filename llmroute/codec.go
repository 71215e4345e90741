package llmroute

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// A codec is everything one client API (chat, Messages, Responses,
// embeddings, completions) does differently from the others, in one place:
// the request path asks the front's codec and never branches on the API
// itself, so a new API is one codec file (codec_<api>.go) and its wire
// package, plus a row in the path table (front.go) and the api enum
// (apis.go). The shape follows Envoy AI Gateway's Translator (request body,
// response body, response error), cut to what this proxy does: an upstream
// either speaks the front's API (native: the body passes with the model
// swapped and the patches merged) or speaks chat, the hub every translation
// goes through (translated: the request to chat, the answer back).
//
// Codecs are stateless values (frontCodecs, codecs); what one translated
// exchange must remember (the request's model, its tool names) is the
// translation the codec's encode leaves on the exchange. A translated
// non-stream answer is bounded by max_rewrite_size; over it, the
// translation's errorBody refuses it in the front's shape.
//
// Chat is not only one codec among others: every translation and every
// continuation (resume.go) speaks it, so the few checks for apiChat left
// outside the codecs ask "is this the hub", never which API a request is.
type codec interface {
	// api is the wire API the front speaks: the routes it takes
	// (apiRoutes), the `api` of the completion log.
	api() api
	// viaChat reports that a chat upstream can serve the API, translated.
	viaChat() bool
	// generates reports that an answer bills output tokens (embeddings
	// does not): a key's budget reserves for them.
	generates() bool
	// pathTarget is the model and stream an API names in the request path
	// rather than in the body (Gemini's `/models/{model}:verb`); ok false
	// when the body names them.
	pathTarget(path string) (model string, stream, ok bool)

	// session is the client's own session id, "" for none or when the
	// API does not use one (the upstream's session header then hashes the
	// history).
	session(r *http.Request) string
	// sessionID is the upstream's session header when the client sent no
	// session id: from the request body (the front's), the outgoing body
	// out, and tr, the exchange's translation (nil when native); ids is
	// the handler's ledger, which keeps the session registry.
	sessionID(ids ledger.Ledger, body, out []byte, tr translation) string

	// encode makes the attempt's upstream body and picks its endpoint:
	// native when ex.u serves the API (ex.native set), else translated to
	// chat (ex.translated and ex.tr set). A request the translator refuses
	// comes back as a front-shaped body errBody with its status; a body
	// that is not JSON as status 400 with no errBody.
	encode(ex *exchange, body []byte) (out []byte, ep endpoint, errBody []byte, status int)
	// chatRequest is the request as a chat request for u, before the
	// target's edits: the base of a continuation (resume.go).
	chatRequest(u *upstream, body []byte) ([]byte, error)
	// notResumable says why a broken stream of this request cannot be
	// continued, "" when nothing in the request forbids it.
	notResumable(body []byte) string

	// prompt says where a request keeps its prompt and the client's own
	// affinity key (place.go): cache_aware hashes the prompt's members in
	// order into its prefix index, and a pool keys a session by the
	// affinity key when no session header names it.
	prompt() *promptShape
	// rules says where a request keeps its effort and user, for a router
	// model's rules (rules.go).
	rules() *ruleShape

	// shape is how an event stream of the API, passed through as a native
	// upstream sent it, ends and takes the proxy's final error event.
	shape() *streamShape

	// writeError sends a refusal of the proxy's own in the API's error
	// shape.
	writeError(w http.ResponseWriter, e apiError)
}

// translation is one translated exchange's state: what the request's
// translation to chat learned that the answer's translation back needs.
// encode creates it; it is read-only afterwards, so a continuation shares
// it.
type translation interface {
	// answer turns a whole 2xx chat completion into the front's answer.
	answer(dst, chat []byte) ([]byte, error)
	// stream is the chat → front stage of a stream: it takes the chat
	// upstream's bytes and emits the front's events.
	stream(emit func([]byte) error) translator
	// translateError turns the chat upstream's error body into the front's
	// error shape.
	translateError(status int, body []byte) []byte
	// errorBody is a proxy-made error body in the front's shape (an answer
	// too large to translate, one that is not a chat completion).
	errorBody(status int, code, message string) []byte
}

// codecs are the codecs by api.
var codecs = [numAPIs]codec{
	apiChat:        chatCodec{},
	apiMessages:    messagesCodec{},
	apiResponses:   responsesCodec{},
	apiEmbeddings:  embeddingsCodec{},
	apiCompletions: completionsCodec{},
	apiGemini:      geminiCodec{},
}

// writeAs sends the error in the shape of front f's API.
func (e apiError) writeAs(w http.ResponseWriter, f front) {
	frontCodecs[f].writeError(w, e)
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
		if v := r.Header[k]; len(v) > 0 && v[0] != "" && transform.ValidHeaderValue(v[0]) {
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
// first, then the translation's answer for a 2xx, its translateError for
// anything else.
type translateBody struct {
	ex *exchange
}

func (b translateBody) transformBody(dst, body []byte) ([]byte, bool) {
	ex := b.ex
	status := ex.resp.StatusCode
	if status >= 300 {
		return ex.tr.translateError(status, body), true
	}
	if ex.u.think != transform.ThinkOff {
		if out, changed := transform.RewriteCompletion(nil, body, ex.u.think); changed {
			body = out
		}
	}
	out, err := ex.tr.answer(dst, body)
	if err != nil {
		// The upstream said 2xx but sent something that is not a chat
		// completion: the client gets an error it can parse.
		return ex.tr.errorBody(http.StatusBadGateway, "bad_upstream_response", "the upstream's answer is not a chat completion"), true
	}
	return out, true
}

// frontReq is what the serve loop parsed from a request, shared by its
// attempts.
type frontReq struct {
	f       front
	codec   codec // the front's API: everything that differs per API
	api     api   // codec.api()
	stream  bool
	session string // the client's own session id, "" for none
	rt      *route // the route being walked, and the index of the
	idx     int    // attempt's target in it (for a context-length failover)
	// arrival is when the request reached the handler: time to first
	// token and the request duration count from it.
	arrival time.Time
	resume  bool        // the model continues broken streams (resume.go)
	guard   *repeatConf // the model's repeat guard, nil when off (repeat.go)
	// place is this request's placement of the model's pool members
	// (place.go); nil when the model has no pool step.
	place *placing
	// attempts counts the request's exchanges with upstreams so far:
	// failovers, same-upstream retries and continuations (X-LLM-Route-Attempts).
	attempts int
	// rule is a router model's rule for the request (nil for a plain
	// model), with the request's effort and where it came from.
	rule      *rule
	effort    effort
	effortSrc effortSource
	// own are the caller's own provider keys (client_key_header,
	// keypool.go); nil for none.
	own []ownKey
}

// buildBody makes an attempt's outgoing body and picks the endpoint, as the
// front's codec says (codec.encode).
func (ex *exchange) buildBody(body []byte) (out []byte, ep endpoint, errBody []byte, status int) {
	return ex.fr.codec.encode(ex, body)
}

// encodeNative is a non-chat API's native body, for its native endpoint:
// src (the request, as the codec prepared it) with the model swapped and
// the patches merged, minus the reasoning backfill, which is chat's.
func (ex *exchange) encodeNative(src []byte) ([]byte, endpoint, []byte, int) {
	ex.native = true
	ep := nativeEndpoint[ex.fr.api]
	edit := ex.t.edit
	edit.ReasoningField, edit.ReasoningEmptyOK = "", false
	out, err := transform.RewriteRequest(make([]byte, 0, len(src)+512), src, &edit)
	if err != nil {
		return nil, ep, nil, http.StatusBadRequest
	}
	return out, ep, nil, 0
}

// encodeTranslated is a translated body: chat, the codec's translation of
// the request, with the target's edits; tr is kept for the answer.
func (ex *exchange) encodeTranslated(chat []byte, tr translation) ([]byte, endpoint, []byte, int) {
	out, err := transform.RewriteRequest(make([]byte, 0, len(chat)+512), chat, &ex.t.edit)
	if err != nil {
		return nil, epChat, nil, http.StatusBadRequest
	}
	ex.translated, ex.tr = true, tr
	return out, epChat, nil, 0
}

// sessionID is the value of the upstream's session header: the client's own
// session id, else what the front's codec finds (Codex's prompt_cache_key,
// the hash of the front's history).
func (ex *exchange) sessionID(body, out []byte) string {
	if ex.fr.session != "" {
		return ex.fr.session
	}
	return ex.fr.codec.sessionID(ex.h.led, body, out, ex.tr)
}

// mode is the completion log's `mode`.
func (ex *exchange) mode() string {
	if ex.translated {
		return "translated"
	}
	return "native"
}

// nativeOnly is the part of a codec shared by the APIs that are only ever
// served natively, in OpenAI's shapes (embeddings, completions): never
// translated, never continued.
type nativeOnly struct{}

func (nativeOnly) generates() bool                { return true }
func (nativeOnly) viaChat() bool                  { return false }
func (nativeOnly) session(r *http.Request) string { return clientSession(r) }
func (nativeOnly) sessionID(ids ledger.Ledger, _, out []byte, _ translation) string {
	return ids.SessionID(out)
}
func (nativeOnly) notResumable([]byte) string             { return "" }
func (nativeOnly) pathTarget(string) (string, bool, bool) { return "", false, false }
func (nativeOnly) shape() *streamShape                    { return &defaultShape }
func (nativeOnly) prompt() *promptShape                   { return &nativePrompt }
func (nativeOnly) rules() *ruleShape                      { return &nativeRules }

// nativeRules: a top-level user, no effort; completions' prompt is what
// the judge reads (embeddings have none).
var nativeRules = ruleShape{user: "user", said: [3]string{"prompt"}}

// nativePrompt: completions' prompt, embeddings' input.
var nativePrompt = promptShape{parts: [3]string{"prompt", "input"}}

func (nativeOnly) writeError(w http.ResponseWriter, e apiError) { e.write(w) }

// encode: the body as sent (an upstream of the route serves the API).
func (nativeOnly) encode(ex *exchange, body []byte) ([]byte, endpoint, []byte, int) {
	return ex.encodeNative(body)
}

// chatRequest: such a stream is not followed (watchResume), so it is never
// continued.
func (nativeOnly) chatRequest(*upstream, []byte) ([]byte, error) { return nil, errNotChat }

// errNotChat: an API with no chat form was asked for one.
var errNotChat = errors.New("the request's API has no chat form")
