package responses

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// Usage is the token usage of one answer, in Responses terms.
type Usage struct {
	InputTokens     int64 // chat prompt_tokens
	OutputTokens    int64 // chat completion_tokens
	TotalTokens     int64 // chat total_tokens, else input + output
	CachedTokens    int64 // prompt_tokens_details.cached_tokens
	ReasoningTokens int64 // completion_tokens_details.reasoning_tokens
}

// appendUsage renders a usage object; unknown usage is null (Codex and the
// SDKs treat a null usage as absent, but reject one with missing counts).
func appendUsage(dst []byte, u *Usage, known bool) []byte {
	if !known {
		return append(dst, `null`...)
	}
	total := u.TotalTokens
	if total == 0 {
		total = u.InputTokens + u.OutputTokens
	}
	dst = append(dst, `{"input_tokens":`...)
	dst = strconv.AppendInt(dst, u.InputTokens, 10)
	dst = append(dst, `,"input_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, u.CachedTokens, 10)
	dst = append(dst, `},"output_tokens":`...)
	dst = strconv.AppendInt(dst, u.OutputTokens, 10)
	dst = append(dst, `,"output_tokens_details":{"reasoning_tokens":`...)
	dst = strconv.AppendInt(dst, u.ReasoningTokens, 10)
	dst = append(dst, `},"total_tokens":`...)
	dst = strconv.AppendInt(dst, total, 10)
	return append(dst, '}')
}

// parseUsage reads a chat usage object.
func parseUsage(b []byte, u *Usage) bool {
	return jsonscan.EachMember(b, 0, func(key []byte, vs, ve int) bool {
		v := b[vs:ve]
		switch string(key) {
		case "prompt_tokens":
			u.InputTokens = jsonscan.ParseUint(v)
		case "completion_tokens":
			u.OutputTokens = jsonscan.ParseUint(v)
		case "total_tokens":
			u.TotalTokens = jsonscan.ParseUint(v)
		case "prompt_tokens_details", "completion_tokens_details":
			if v[0] == '{' {
				jsonscan.EachMember(v, 0, func(k []byte, s, e int) bool {
					switch string(k) {
					case "cached_tokens":
						u.CachedTokens = jsonscan.ParseUint(v[s:e])
					case "reasoning_tokens":
						u.ReasoningTokens = jsonscan.ParseUint(v[s:e])
					}
					return true
				})
			}
		}
		return true
	})
}

// ids makes the ids of one response: a random base shared by the response
// and its items, so they are unique across responses and stable within one.
type ids struct {
	base [24]byte // hex
}

func newIDs() ids {
	var raw [12]byte
	_, _ = rand.Read(raw[:]) // never fails (crypto/rand panics instead)
	var x ids
	hex.Encode(x.base[:], raw[:])
	return x
}

// appendID appends `"<prefix>_<base>[_n]"`; n < 0 is the response's own id.
func (x *ids) appendID(dst []byte, prefix string, n int) []byte {
	dst = append(dst, '"')
	dst = append(dst, prefix...)
	dst = append(dst, '_')
	dst = append(dst, x.base[:]...)
	if n >= 0 {
		dst = append(dst, '_')
		dst = strconv.AppendInt(dst, int64(n), 10)
	}
	return append(dst, '"')
}

// head is what a Response object carries besides output and usage.
type head struct {
	info    *Info
	ids     *ids
	created int64
	model   []byte // raw JSON string: the upstream's model, else the request's
}

func (h *head) appendModel(dst []byte) []byte {
	if jsonscan.IsString(h.model) {
		return append(dst, h.model...)
	}
	return jsonscan.AppendQuoted(dst, h.info.Model)
}

// Response statuses and why one is incomplete.
const (
	statusInProgress = "in_progress"
	statusCompleted  = "completed"
	statusIncomplete = "incomplete"
	statusFailed     = "failed"
)

// appendResponse renders a Response object. output is the comma-separated
// rendered items; errObj a rendered error object (failed) or nil; reason the
// incomplete_details reason or "".
func (h *head) appendResponse(dst []byte, status string, output []byte, u *Usage, usageKnown bool, errObj []byte, reason string) []byte {
	dst = append(dst, `{"id":`...)
	dst = h.ids.appendID(dst, "resp", -1)
	dst = append(dst, `,"object":"response","created_at":`...)
	dst = strconv.AppendInt(dst, h.created, 10)
	dst = append(dst, `,"status":"`...)
	dst = append(dst, status...)
	dst = append(dst, `","background":false,"error":`...)
	if errObj != nil {
		dst = append(dst, errObj...)
	} else {
		dst = append(dst, `null`...)
	}
	dst = append(dst, `,"incomplete_details":`...)
	if reason != "" {
		dst = append(dst, `{"reason":"`...)
		dst = append(dst, reason...)
		dst = append(dst, `"}`...)
	} else {
		dst = append(dst, `null`...)
	}
	dst = append(dst, `,"model":`...)
	dst = h.appendModel(dst)
	dst = append(dst, `,"output":[`...)
	dst = append(dst, output...)
	dst = append(dst, ']')
	dst = append(dst, h.info.echo...)
	dst = append(dst, `,"usage":`...)
	dst = appendUsage(dst, u, usageKnown)
	return append(dst, '}')
}

// statusFor maps a chat finish_reason to the response status and the
// incomplete reason.
func statusFor(finish []byte) (status, reason string) {
	switch string(finish) {
	case "length":
		return statusIncomplete, "max_output_tokens"
	case "content_filter":
		return statusIncomplete, "content_filter"
	}
	return statusCompleted, ""
}

// Item renderers. text, args and input are JSON string interiors (escaped,
// no quotes), so raw upstream string bytes can be concatenated into them.

func appendReasoningItem(dst []byte, x *ids, n int, text []byte, done bool) []byte {
	dst = append(dst, `{"id":`...)
	dst = x.appendID(dst, "rs", n)
	dst = append(dst, `,"type":"reasoning","summary":[],"content":[`...)
	if done {
		dst = append(dst, `{"type":"reasoning_text","text":"`...)
		dst = append(dst, text...)
		dst = append(dst, `"}`...)
	}
	return append(dst, `]}`...)
}

func appendTextPart(dst []byte, text []byte) []byte {
	dst = append(dst, `{"type":"output_text","annotations":[],"logprobs":[],"text":"`...)
	dst = append(dst, text...)
	return append(dst, `"}`...)
}

func appendMessageItem(dst []byte, x *ids, n int, text []byte, status string) []byte {
	dst = append(dst, `{"id":`...)
	dst = x.appendID(dst, "msg", n)
	dst = append(dst, `,"type":"message","status":"`...)
	dst = append(dst, status...)
	dst = append(dst, `","content":[`...)
	if status != statusInProgress {
		dst = appendTextPart(dst, text)
	}
	return append(dst, `],"role":"assistant"}`...)
}

// appendCallItem renders a function_call or, for a custom tool, a
// custom_tool_call item; payload is the arguments or the input.
func appendCallItem(dst []byte, x *ids, n int, t *toolName, callID, payload []byte, status string) []byte {
	dst = append(dst, `{"id":`...)
	if t.kind == kindCustom {
		dst = x.appendID(dst, "ctc", n)
		dst = append(dst, `,"type":"custom_tool_call","status":"`...)
	} else {
		dst = x.appendID(dst, "fc", n)
		dst = append(dst, `,"type":"function_call","status":"`...)
	}
	dst = append(dst, status...)
	if t.kind == kindCustom {
		dst = append(dst, `","call_id":"`...)
		dst = append(dst, callID...)
		dst = append(dst, `","input":"`...)
	} else {
		dst = append(dst, `","call_id":"`...)
		dst = append(dst, callID...)
		dst = append(dst, `","arguments":"`...)
	}
	dst = append(dst, payload...)
	dst = append(dst, `","name":`...)
	dst = jsonscan.AppendQuoted(dst, t.name)
	if t.namespace != "" {
		dst = append(dst, `,"namespace":`...)
		dst = jsonscan.AppendQuoted(dst, t.namespace)
	}
	return append(dst, '}')
}

// appendCallID appends the escaped interior of a call id: the upstream's
// (raw JSON string) when it gave one, else a generated one.
func appendCallIDInterior(dst []byte, upstream []byte, x *ids, n int) []byte {
	if jsonscan.IsString(upstream) && len(upstream) > 2 {
		return append(dst, upstream[1:len(upstream)-1]...)
	}
	dst = append(dst, "call_"...)
	dst = append(dst, x.base[:]...)
	dst = append(dst, '_')
	return strconv.AppendInt(dst, int64(n), 10)
}

// customInput returns the escaped interior of a custom tool's input from
// the chat function's arguments (decoded JSON text): the "input" string of
// {"input": …}, or, when the model did not follow the schema, the
// arguments text itself so nothing it wrote is lost.
func customInput(dst, args []byte) []byte {
	var v struct {
		Input *string `json:"input"`
	}
	if json.Unmarshal(args, &v) == nil && v.Input != nil {
		return jsonscan.AppendEscaped(dst, *v.Input)
	}
	return jsonscan.AppendEscaped(dst, args)
}

// chatCompletion is the part of a chat.completion body FromChat reads.
type chatCompletion struct {
	Model   json.RawMessage `json:"model"`
	Created int64           `json:"created"`
	Choices []struct {
		Message struct {
			Content          json.RawMessage `json:"content"`
			ReasoningContent json.RawMessage `json:"reasoning_content"`
			Reasoning        json.RawMessage `json:"reasoning"`
			Refusal          json.RawMessage `json:"refusal"`
			ToolCalls        []struct {
				ID       json.RawMessage `json:"id"`
				Function struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage json.RawMessage `json:"usage"`
}

// ErrNotCompletion is FromChat's answer to a body that is not a chat
// completion; the core treats it like an upstream that answered garbage.
var ErrNotCompletion = errors.New("upstream answer is not a chat completion")

// FromChat translates a non-stream chat.completion body (2xx) into a
// Response object appended to dst: reasoning (from reasoning_content or
// reasoning), the message, then the tool calls as function_call or
// custom_tool_call items; status incomplete when finish_reason is length or
// content_filter.
func FromChat(dst, chat []byte, info *Info) ([]byte, error) {
	var c chatCompletion
	if err := json.Unmarshal(chat, &c); err != nil || len(c.Choices) == 0 {
		return dst, ErrNotCompletion
	}
	x := newIDs()
	h := head{info: info, ids: &x, created: c.Created, model: c.Model}
	if h.created == 0 {
		h.created = time.Now().Unix()
	}
	ch := &c.Choices[0]
	m := &ch.Message
	status, reason := statusFor([]byte(ch.FinishReason))

	var out []byte
	n := 0
	item := func() {
		if n > 0 {
			out = append(out, ',')
		}
		n++
	}
	reasoning := m.ReasoningContent
	if !jsonscan.IsString(reasoning) || len(reasoning) == 2 {
		reasoning = m.Reasoning
	}
	if jsonscan.IsString(reasoning) && len(reasoning) > 2 {
		item()
		out = appendReasoningItem(out, &x, n-1, reasoning[1:len(reasoning)-1], true)
	}
	text := m.Content
	if !jsonscan.IsString(text) || len(text) == 2 {
		text = m.Refusal
	}
	if jsonscan.IsString(text) && len(text) > 2 {
		item()
		itemStatus := statusCompleted
		if status == statusIncomplete {
			itemStatus = statusIncomplete
		}
		out = appendMessageItem(out, &x, n-1, text[1:len(text)-1], itemStatus)
	}
	for i := range m.ToolCalls {
		tc := &m.ToolCalls[i]
		t := info.lookup([]byte(tc.Function.Name))
		var args []byte // escaped interior
		switch {
		case jsonscan.IsString(tc.Function.Arguments):
			args = tc.Function.Arguments[1 : len(tc.Function.Arguments)-1]
		case present(tc.Function.Arguments): // an object instead of a string
			args = jsonscan.AppendEscaped(nil, tc.Function.Arguments)
		}
		if t.kind == kindCustom {
			args = customInput(nil, jsonscan.AppendUnescape(nil, args))
		}
		item()
		callID := appendCallIDInterior(nil, tc.ID, &x, n-1)
		out = appendCallItem(out, &x, n-1, &t, callID, args, statusCompleted)
	}
	var u Usage
	known := len(c.Usage) > 0 && c.Usage[0] == '{' && parseUsage(c.Usage, &u)
	return h.appendResponse(dst, status, out, &u, known, nil, reason), nil
}
