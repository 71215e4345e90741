package llmroute

import (
	"encoding/json"
	"net/http"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// chatCodec is the chat completions front (POST …/chat/completions), the
// hub: every upstream on a chat route serves it natively, and every other
// API that is translated is translated to it.
type chatCodec struct{}

func (chatCodec) api() api            { return apiChat }
func (chatCodec) generates() bool     { return true }
func (chatCodec) viaChat() bool       { return false }
func (chatCodec) shape() *streamShape { return &chatShape }

// prompt: the system prompt is one of the messages; prompt_cache_key is
// the client's key (OpenAI's cache routing hint).
// rules: where the effort and the user are (router models).
func (chatCodec) rules() *ruleShape { return &chatRules }

var chatRules = ruleShape{effort: [2]string{"reasoning_effort"}, user: "user", said: [3]string{"messages", "content", "text"}}

func (chatCodec) prompt() *promptShape { return &chatPrompt }

// pathTarget: the body names the model and the stream.
func (chatCodec) pathTarget(string) (string, bool, bool) { return "", false, false }

var chatPrompt = promptShape{parts: [3]string{"messages", "tools"}, key: [2]string{"prompt_cache_key"}}

// session: a chat request's session header is the hash of its history; the
// client's own session headers are not read.
func (chatCodec) session(*http.Request) string { return "" }

func (chatCodec) sessionID(ids ledger.Ledger, _, out []byte, _ translation) string {
	return ids.SessionID(out)
}

// encode: the body as sent, model swapped, patches merged, the reasoning
// backfill included.
func (chatCodec) encode(ex *exchange, body []byte) ([]byte, endpoint, []byte, int) {
	out, err := transform.RewriteRequest(make([]byte, 0, len(body)+512), body, &ex.t.edit)
	if err != nil {
		return nil, epChat, nil, http.StatusBadRequest
	}
	ex.native = true
	return out, epChat, nil, 0
}

func (chatCodec) chatRequest(_ *upstream, body []byte) ([]byte, error) { return body, nil }

// notResumable: a request for several choices cannot be continued (the
// follower tracks one).
func (chatCodec) notResumable(body []byte) string {
	var req struct {
		N int `json:"n"`
	}
	if json.Unmarshal(body, &req) == nil && req.N > 1 {
		return "several_choices"
	}
	return ""
}

func (chatCodec) writeError(w http.ResponseWriter, e apiError) { e.write(w) }

// chatShape: a chat stream ends with data: [DONE]; one that ends cleanly
// with neither it nor a finish reason was cut.
var chatShape = streamShape{markers: chatMarkers, needFinish: true, errorEvent: appendOpenAIErrorEvent}
