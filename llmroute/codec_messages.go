package llmroute

import (
	"net/http"
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/wire/anthropic"
)

// messagesCodec is Anthropic's Messages front (POST …/messages, and the
// error shape of …/messages/count_tokens): native on an upstream that
// serves Messages, else translated to chat by wire/anthropic.
type messagesCodec struct{}

func (messagesCodec) api() api                       { return apiMessages }
func (messagesCodec) generates() bool                { return true }
func (messagesCodec) viaChat() bool                  { return true }
func (messagesCodec) session(r *http.Request) string { return clientSession(r) }
func (messagesCodec) notResumable([]byte) string     { return "" }
func (messagesCodec) shape() *streamShape            { return &messagesShape }

// prompt: metadata.user_id carries Claude Code's session.
// rules: where the effort and the user are (router models).
func (messagesCodec) rules() *ruleShape { return &messagesRules }

var messagesRules = ruleShape{effort: [2]string{"output_config", "effort"}, budget: [2]string{"thinking", "budget_tokens"}, userIn: "user_id",
	said: [3]string{"messages", "content", "text"}}

func (messagesCodec) prompt() *promptShape { return &messagesPrompt }

// pathTarget: the body names the model and the stream.
func (messagesCodec) pathTarget(string) (string, bool, bool) { return "", false, false }

var messagesPrompt = promptShape{parts: [3]string{"system", "messages", "tools"}, key: [2]string{"metadata", "user_id"}}

// sessionID: the hash of the conversation's history (the system prompt and
// messages, without the billing block that changes per request).
func (messagesCodec) sessionID(ids ledger.Ledger, body, out []byte, _ translation) string {
	if hist, err := anthropic.SessionBody(nil, body); err == nil {
		return ids.SessionID(hist)
	}
	return ids.SessionID(out)
}

// encode: native with the billing block stripped (unless the upstream
// keeps it), else translated; a request the translator refuses is a 400 in
// Anthropic's shape.
func (messagesCodec) encode(ex *exchange, body []byte) ([]byte, endpoint, []byte, int) {
	u := ex.u
	if u.apis.has(apiMessages) {
		src := body
		if !u.keepBill {
			src = anthropic.StripBillingBlock(make([]byte, 0, len(body)), body)
		}
		return ex.encodeNative(src)
	}
	chat, info, err := anthropic.ToChat(make([]byte, 0, len(body)+256), body, messagesOptions(u))
	if e, ok := err.(*anthropic.Error); ok {
		return nil, epChat, anthropic.ErrorBody(e.Status, e.Code, e.Message), e.Status
	}
	if err != nil {
		return nil, epChat, nil, http.StatusBadRequest
	}
	return ex.encodeTranslated(chat, (*messagesTranslation)(info))
}

func (messagesCodec) chatRequest(u *upstream, body []byte) ([]byte, error) {
	chat, _, err := anthropic.ToChat(make([]byte, 0, len(body)+256), body, messagesOptions(u))
	return chat, err
}

func messagesOptions(u *upstream) anthropic.Options {
	return anthropic.Options{KeepBillingHeader: u.keepBill, ReasoningField: u.reasoning}
}

// writeError: Anthropic's error shape.
func (messagesCodec) writeError(w http.ResponseWriter, e apiError) {
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	if e.retryAfter > 0 {
		hdr.Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	writeJSON(w, e.status, anthropic.ErrorBody(e.status, e.code, e.message))
}

// messagesTranslation is a Messages request's translation (anthropic.Info).
type messagesTranslation anthropic.Info

func (t *messagesTranslation) info() *anthropic.Info { return (*anthropic.Info)(t) }

func (t *messagesTranslation) answer(dst, chat []byte) ([]byte, error) {
	return anthropic.FromChat(dst, chat, t.info())
}

func (t *messagesTranslation) stream(emit func([]byte) error) translator {
	return anthropic.NewStream(t.info(), emit)
}

func (*messagesTranslation) translateError(status int, body []byte) []byte {
	return anthropic.TranslateError(status, body)
}

func (*messagesTranslation) errorBody(status int, code, message string) []byte {
	return anthropic.ErrorBody(status, code, message)
}

// messagesShape: a native Messages stream names its events and ends with
// message_stop (or the upstream's own error event); the proxy's error
// event is Anthropic's `event: error`, the only kind Anthropic's SDKs read
// (they skip unnamed events).
var messagesShape = streamShape{
	markers:      [][]byte{[]byte("event: message_stop"), []byte("event: error")},
	markersEvent: true,
	needNamedEnd: true,
	errorEvent:   appendAnthropicErrorEvent,
}

func appendAnthropicErrorEvent(ev []byte, code, message string) []byte {
	ev = append(ev, `event: error`+"\n"+`data: {"type":"error","error":{"type":"api_error","message":`...)
	ev = appendJSONString(ev, message)
	ev = append(ev, `,"code":`...)
	ev = appendJSONString(ev, code)
	return append(ev, "}}\n\n"...)
}
