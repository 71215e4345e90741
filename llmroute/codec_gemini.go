package llmroute

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
	"github.com/llm-route/caddy-llm-route/llmroute/wire/gemini"
)

// geminiCodec is Google's Gemini API front (Gemini CLI, the Google GenAI
// SDKs): POST …/v1beta/models/{model}:generateContent and
// :streamGenerateContent?alt=sse, whose model and stream are in the path,
// not the body. Native on an upstream that serves gemini (the body passes
// as sent, the upstream's model in the URL), else translated to chat by
// wire/gemini. Its refusals and the model list answer in Google's shape.
type geminiCodec struct{}

func (geminiCodec) api() api                       { return apiGemini }
func (geminiCodec) generates() bool                { return true }
func (geminiCodec) viaChat() bool                  { return true }
func (geminiCodec) session(r *http.Request) string { return clientSession(r) }
func (geminiCodec) notResumable([]byte) string     { return "" }
func (geminiCodec) shape() *streamShape            { return &geminiShape }

// rules: a Gemini body has no top-level effort, user or metadata (its
// thinkingConfig sits two levels down, in generationConfig): a router
// model on this front takes its effort from the name's suffix
// (models/auto:high:generateContent) and its attributes from headers.
func (geminiCodec) rules() *ruleShape { return &geminiRules }

// geminiRules: no effort or user in the body; the judge reads the last
// user turn's text parts.
var geminiRules = ruleShape{said: [3]string{"contents", "parts"}}

// prompt: a Gemini body carries no affinity key of the client's.
func (geminiCodec) prompt() *promptShape { return &geminiPrompt }

var geminiPrompt = promptShape{parts: [3]string{"systemInstruction", "contents", "tools"}}

// pathTarget: the model and the verb of …/models/{model}:verb.
func (geminiCodec) pathTarget(path string) (string, bool, bool) {
	f, _, id, ok := classifyGemini(path)
	if !ok || f != frontGemini && f != frontGeminiCount {
		return "", false, false
	}
	return id, f == frontGemini && strings.HasSuffix(path, ":"+verbStream), true
}

// sessionID: the hash of the conversation as chat messages, the system
// instruction left out, so that native and translated attempts of one
// conversation hash the same.
func (geminiCodec) sessionID(ids ledger.Ledger, body, out []byte, _ translation) string {
	if hist, err := gemini.SessionBody(nil, body); err == nil {
		return ids.SessionID(hist)
	}
	return ids.SessionID(out)
}

// encode: native with the model in the URL, else translated; a request the
// translator refuses is a 400 in Google's shape, and what a chat upstream
// cannot take (Google's hosted tools, some fields) is left out with a
// warning.
func (geminiCodec) encode(ex *exchange, body []byte) ([]byte, endpoint, []byte, int) {
	u := ex.u
	if u.apis.has(apiGemini) {
		return ex.encodeGeminiNative(body)
	}
	model, _, _ := geminiCodec{}.pathTarget(ex.r.URL.Path)
	opt := gemini.Options{ReasoningField: u.reasoning, Model: model, Stream: ex.fr.stream}
	chat, info, err := gemini.ToChat(make([]byte, 0, len(body)+256), body, opt)
	if e, ok := err.(*gemini.Error); ok {
		return nil, epChat, gemini.ErrorBody(e.Status, e.Code, e.Message, 0), e.Status
	}
	if err != nil {
		return nil, epChat, nil, http.StatusBadRequest
	}
	if len(info.DroppedTools) > 0 || len(info.DroppedFields) > 0 {
		ex.h.logger.Warn("gemini request: left out what a chat upstream cannot take",
			zap.String("upstream", u.ID), zap.Strings("dropped_tools", info.DroppedTools), zap.Strings("dropped_fields", info.DroppedFields))
	}
	return ex.encodeTranslated(chat, (*geminiTranslation)(info))
}

// chatRequest: only streams are continued, so the chat request streams.
func (geminiCodec) chatRequest(u *upstream, body []byte) ([]byte, error) {
	chat, _, err := gemini.ToChat(make([]byte, 0, len(body)+256), body, gemini.Options{ReasoningField: u.reasoning, Stream: true})
	return chat, err
}

// writeError: Google's error shape, with the proxy's code in its ErrorInfo
// and the Retry-After also as RetryInfo (Gemini CLI times its retry by it).
func (geminiCodec) writeError(w http.ResponseWriter, e apiError) {
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	if e.retryAfter > 0 {
		hdr.Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	writeJSON(w, e.status, gemini.ErrorBody(e.status, e.code, e.message, e.retryAfter))
}

// encodeGeminiNative is the native body: the request as sent with the
// patches merged (written in Gemini's format), at the upstream's own
// generate or stream URL. The model is in that URL: none is added to the
// body, and the reasoning backfill (chat's) does not apply.
func (ex *exchange) encodeGeminiNative(body []byte) ([]byte, endpoint, []byte, int) {
	ex.native = true
	ep := epGeminiGenerate
	if ex.fr.stream {
		ep = epGeminiStream
	}
	edit := ex.t.edit
	edit.Model = ""
	edit.ReasoningField, edit.ReasoningEmptyOK = "", false
	out, err := transform.RewriteRequest(make([]byte, 0, len(body)+512), body, &edit)
	if err != nil {
		return nil, ep, nil, http.StatusBadRequest
	}
	return out, ep, nil, 0
}

// geminiTranslation is a Gemini request's translation (gemini.Info).
type geminiTranslation gemini.Info

func (t *geminiTranslation) info() *gemini.Info { return (*gemini.Info)(t) }

func (t *geminiTranslation) answer(dst, chat []byte) ([]byte, error) {
	return gemini.FromChat(dst, chat, t.info())
}

func (t *geminiTranslation) stream(emit func([]byte) error) translator {
	return gemini.NewStream(t.info(), emit)
}

func (*geminiTranslation) translateError(status int, body []byte) []byte {
	return gemini.TranslateError(status, body)
}

func (*geminiTranslation) errorBody(status int, code, message string) []byte {
	return gemini.ErrorBody(status, code, message, 0)
}

// geminiShape: Google's stream is data-only events framed `\r\n\r\n`, the
// last carrying candidates[0].finishReason; a stream that ends without one
// was cut. The Google SDKs' stream readers take every line as `data:` and
// fail on anything else, so the stream gets no keepalive comments, and the
// proxy's error event is a data event in Google's framing, which both SDKs
// report as an API error.
var geminiShape = streamShape{
	needFinish:  true,
	finishKey:   []byte(`"finishReason"`),
	noHeartbeat: true,
	crlf:        true,
	errorEvent:  appendGeminiErrorEvent,
}

func appendGeminiErrorEvent(ev []byte, code, message string) []byte {
	status := http.StatusServiceUnavailable
	if code == codeRequestTimeout {
		status = http.StatusGatewayTimeout
	}
	return gemini.AppendErrorEvent(ev, status, code, message)
}

// The Gemini methods served, by the verb after the model in the path.
const (
	verbGenerate = "generateContent"
	verbStream   = "streamGenerateContent"
	verbCount    = "countTokens"
)

// classifyGemini sorts a Gemini API path: anything under a `/v1beta`
// segment (found anywhere, so a mount works), and under `/v1` only
// `…/models/{model}:<verb>` with a served verb (no OpenAI path has one).
// The model is everything between `/models/` and the last colon; it may
// contain `/`. ok is false for a path that is not Gemini's.
func classifyGemini(path string) (f front, allow, id string, ok bool) {
	rest, beta := betaRest(path)
	if !beta {
		if strings.IndexByte(path, ':') < 0 {
			return frontNone, "", "", false // the common case: no verb
		}
		if rest, ok = apiRest(path); !ok {
			return frontNone, "", "", false
		}
	}
	if beta && rest == "/models" {
		return frontGeminiModels, "GET, HEAD", "", true
	}
	m, isModel := strings.CutPrefix(rest, "/models/")
	if !isModel || m == "" {
		if beta {
			return frontGeminiUnsupported, "", "", true
		}
		return frontNone, "", "", false
	}
	if c := strings.LastIndexByte(m, ':'); c > 0 {
		switch m[c+1:] {
		case verbGenerate, verbStream:
			return frontGemini, "POST", m[:c], true
		case verbCount:
			return frontGeminiCount, "POST", m[:c], true
		}
	}
	if !beta {
		return frontNone, "", "", false
	}
	// A model itself (its colon, if any, is part of its name: an Ollama
	// tag); another verb gets the 405 of a model path.
	return frontGeminiModels, "GET, HEAD", m, true
}

// betaRest splits off the shortest prefix of path ending in the segment
// `/v1beta` and returns what follows it ("" for the version itself).
func betaRest(path string) (string, bool) {
	for off := 0; ; {
		i := strings.Index(path[off:], "/v1beta")
		if i < 0 {
			return "", false
		}
		end := off + i + len("/v1beta")
		if end == len(path) || path[end] == '/' {
			return path[end:], true
		}
		off = end
	}
}

// geminiListing reports a GET …/v1/models[/{id}] asked with a Google key
// (Google's SDKs with API version v1): the list is Gemini's.
func geminiListing(r *http.Request, f front) bool {
	return (f == frontModels || f == frontModel) &&
		(r.Header.Get("X-Goog-Api-Key") != "" || hasKeyQuery(r.URL.RawQuery))
}

// hasKeyQuery reports a `key` parameter in a raw query (Google's API key in
// the URL).
func hasKeyQuery(rawQuery string) bool {
	for rawQuery != "" {
		var kv string
		kv, rawQuery, _ = strings.Cut(rawQuery, "&")
		if kv == "key" || strings.HasPrefix(kv, "key=") {
			return true
		}
	}
	return false
}

// geminiStreamSSE reports that the query asks for server-sent events
// (`alt=sse`): without it Google answers a stream as one JSON array, which
// the proxy does not produce.
func geminiStreamSSE(rawQuery string) bool {
	for rawQuery != "" {
		var kv string
		kv, rawQuery, _ = strings.Cut(rawQuery, "&")
		if kv == "alt=sse" {
			return true
		}
	}
	return false
}

// geminiModelURL is the upstream's model URL, base + `/models/{model}`, the
// model escaped per path segment (a leading `models/` in the configured
// name is Google's resource prefix, not part of it).
func geminiModelURL(base, model string) string {
	model = strings.TrimPrefix(model, "models/")
	segs := strings.Split(model, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return base + "/models/" + strings.Join(segs, "/")
}

// geminiURLs are the per-upstream Gemini endpoints.
var geminiURLs = [...]struct {
	ep     endpoint
	suffix string
}{
	{epGeminiGenerate, ":" + verbGenerate},
	{epGeminiStream, ":" + verbStream + "?alt=sse"},
	{epGeminiCount, ":" + verbCount},
}

// errStreamNeedsSSE: streamGenerateContent without alt=sse.
var errStreamNeedsSSE = apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "stream_needs_sse",
	message: "streamGenerateContent needs ?alt=sse"}

// errGeminiUnsupported: a path under /v1beta the proxy does not serve.
var errGeminiUnsupported = apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "unsupported_endpoint",
	message: "no such endpoint; this proxy serves the Gemini API's POST /v1beta/models/{model}:generateContent, " +
		":streamGenerateContent?alt=sse, :countTokens and GET /v1beta/models, /v1beta/models/{model}"}
