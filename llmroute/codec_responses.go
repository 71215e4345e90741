package llmroute

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
	"github.com/llm-route/caddy-llm-route/llmroute/wire/responses"
)

// responsesCodec is OpenAI's Responses front (POST …/responses): native on
// an upstream that serves Responses, else translated to chat by
// wire/responses. Its errors are OpenAI's shape.
type responsesCodec struct{}

func (responsesCodec) api() api                       { return apiResponses }
func (responsesCodec) generates() bool                { return true }
func (responsesCodec) viaChat() bool                  { return true }
func (responsesCodec) session(r *http.Request) string { return clientSession(r) }
func (responsesCodec) notResumable([]byte) string     { return "" }
func (responsesCodec) shape() *streamShape            { return &responsesShape }

// prompt: Codex sets prompt_cache_key to its session.
// rules: where the effort and the user are (router models).
func (responsesCodec) rules() *ruleShape { return &responsesRules }

var responsesRules = ruleShape{effort: [2]string{"reasoning", "effort"}, user: "user", said: [3]string{"input", "content", "input_text"}}

func (responsesCodec) prompt() *promptShape { return &responsesPrompt }

// pathTarget: the body names the model and the stream.
func (responsesCodec) pathTarget(string) (string, bool, bool) { return "", false, false }

var responsesPrompt = promptShape{parts: [3]string{"instructions", "input", "tools"}, key: [2]string{"prompt_cache_key"}}

func (responsesCodec) writeError(w http.ResponseWriter, e apiError) { e.write(w) }

// sessionID: Codex's prompt_cache_key, else the hash of the history as chat
// (a native request is translated only to find it).
func (responsesCodec) sessionID(ids ledger.Ledger, body, out []byte, tr translation) string {
	chat := out
	t, _ := tr.(*responsesTranslation)
	info := t.info()
	if info == nil {
		var err error
		if chat, info, err = responses.ToChat(nil, body, responses.Options{}); err != nil {
			return ids.SessionID(body)
		}
	}
	if info.PromptCacheKey != "" && transform.ValidHeaderValue(info.PromptCacheKey) {
		return info.PromptCacheKey
	}
	return ids.SessionID(chat)
}

// encode: native as sent, else translated; a request the translator
// refuses is a 400 in OpenAI's shape, and what a chat upstream cannot take
// (hosted tools, some input items) is left out with a warning.
func (responsesCodec) encode(ex *exchange, body []byte) ([]byte, endpoint, []byte, int) {
	u := ex.u
	if u.apis.has(apiResponses) {
		return ex.encodeNative(body)
	}
	chat, info, err := responses.ToChat(make([]byte, 0, len(body)+256), body, responsesOptions(u))
	if e, ok := err.(*responses.Error); ok {
		return nil, epChat, e.Body(), e.Status
	}
	if err != nil {
		return nil, epChat, nil, http.StatusBadRequest
	}
	if len(info.DroppedTools) > 0 || len(info.DroppedItems) > 0 {
		ex.h.logger.Warn("responses request: left out what a chat upstream cannot take",
			zap.String("upstream", u.ID), zap.Strings("dropped_tools", info.DroppedTools), zap.Strings("dropped_items", info.DroppedItems))
	}
	return ex.encodeTranslated(chat, (*responsesTranslation)(info))
}

func (responsesCodec) chatRequest(u *upstream, body []byte) ([]byte, error) {
	chat, _, err := responses.ToChat(make([]byte, 0, len(body)+256), body, responsesOptions(u))
	return chat, err
}

func responsesOptions(u *upstream) responses.Options {
	return responses.Options{ReasoningField: u.reasoning}
}

// responsesTranslation is a Responses request's translation
// (responses.Info).
type responsesTranslation responses.Info

func (t *responsesTranslation) info() *responses.Info { return (*responses.Info)(t) }

func (t *responsesTranslation) answer(dst, chat []byte) ([]byte, error) {
	return responses.FromChat(dst, chat, t.info())
}

func (t *responsesTranslation) stream(emit func([]byte) error) translator {
	return responses.NewStream(t.info(), emit)
}

func (*responsesTranslation) translateError(status int, body []byte) []byte {
	return responses.TranslateError(status, body)
}

func (*responsesTranslation) errorBody(status int, code, message string) []byte {
	return responses.ErrorBody(status, code, message)
}

// responsesShape: a native Responses stream names its events and ends with
// response.completed or response.incomplete (or the upstream's own
// failure); the proxy's error event is the plain data: one.
var responsesShape = streamShape{
	markers: [][]byte{[]byte("event: response.completed"), []byte("event: response.incomplete"),
		[]byte("event: response.failed"), []byte("event: error")},
	markersEvent: true,
	needNamedEnd: true,
	errorEvent:   appendOpenAIErrorEvent,
}
