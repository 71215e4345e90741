package anthropic

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/chatsse"
	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// FromChat translates a non-stream chat.completion body (2xx) into an
// Anthropic message body, appended to dst. Only the first choice is used. A
// body that is not a chat completion object (invalid JSON, no choices, an
// "error" member) is an error: the core treats it as a failed attempt.
func FromChat(dst, chat []byte, info *Info) ([]byte, error) {
	c, err := chatsse.ReadCompletion(chat)
	if err != nil {
		return dst, fmt.Errorf("anthropic: %w", err)
	}
	id, model, choices, usage := c.ID, c.Model, c.Choices, c.Usage
	var message, finish []byte
	ci := jsonscan.IterArray(choices, 0, false)
	if vs, ve, ok := ci.Next(); ok && choices[vs] == '{' {
		c := choices[vs:ve]
		message, finish = jsonscan.ObjGet(c, "message"), jsonscan.ObjGet(c, "finish_reason")
	}

	dst = append(dst, `{"id":`...)
	dst = appendMessageID(dst, id)
	dst = append(dst, `,"type":"message","role":"assistant","model":`...)
	dst = appendModel(dst, model, info)
	dst = append(dst, `,"content":[`...)
	start := len(dst)
	tools := false
	if message != nil && message[0] == '{' {
		dst, tools = appendContent(dst, message, start)
	}
	dst = append(dst, `],"stop_reason":"`...)
	dst = append(dst, stopReason(finish, tools)...)
	dst = append(dst, `","stop_sequence":null,"usage":`...)
	var u usageCounts
	u.read(usage)
	dst = u.append(dst, true)
	return append(dst, '}'), nil
}

// appendContent appends the content blocks of a chat message: thinking (from
// reasoning_content or reasoning), text (content and refusal), tool_use.
func appendContent(dst, msg []byte, start int) (_ []byte, tools bool) {
	var content, rc, reasoning, refusal, calls []byte
	it := jsonscan.IterObject(msg, 0, false)
	var m jsonscan.Member
	var tmp [32]byte
	for it.Next(&m) {
		v := msg[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(msg, &m, tmp[:])) {
		case "content":
			content = v
		case "reasoning_content":
			rc = v
		case "reasoning":
			reasoning = v
		case "refusal":
			refusal = v
		case "tool_calls":
			calls = v
		}
	}
	comma := func() {
		if len(dst) > start {
			dst = append(dst, ',')
		}
	}
	if !nonEmptyString(rc) {
		rc = reasoning
	}
	if nonEmptyString(rc) {
		dst = append(dst, `{"type":"thinking","thinking":`...)
		dst = append(dst, rc...)
		dst = append(dst, `,"signature":""}`...)
	}
	switch {
	case nonEmptyString(content):
		comma()
		dst = append(dst, `{"type":"text","text":`...)
		dst = append(dst, content...)
		dst = append(dst, '}')
	case content != nil && content[0] == '[': // content parts: their texts
		mark := len(dst)
		comma()
		dst = append(dst, `{"type":"text","text":"`...)
		ts := len(dst)
		pi := jsonscan.IterArray(content, 0, false)
		for {
			vs, ve, more := pi.Next()
			if !more {
				break
			}
			if _, t := blockTypeText(content[vs:ve]); t != nil {
				dst = append(dst, t[1:len(t)-1]...)
			}
		}
		if len(dst) == ts {
			dst = dst[:mark]
		} else {
			dst = append(dst, `"}`...)
		}
	}
	if nonEmptyString(refusal) {
		comma()
		dst = append(dst, `{"type":"text","text":`...)
		dst = append(dst, refusal...)
		dst = append(dst, '}')
	}
	if calls != nil && calls[0] == '[' {
		ti := jsonscan.IterArray(calls, 0, false)
		for {
			vs, ve, more := ti.Next()
			if !more {
				break
			}
			tc := calls[vs:ve]
			if tc[0] != '{' {
				continue
			}
			fn := jsonscan.ObjGet(tc, "function")
			comma()
			tools = true
			dst = append(dst, `{"type":"tool_use","id":`...)
			dst = appendToolID(dst, jsonscan.ObjGet(tc, "id"))
			dst = append(dst, `,"name":`...)
			name := jsonscan.ObjGet(fn, "name")
			if name == nil || name[0] != '"' {
				name = []byte(`""`)
			}
			dst = append(dst, name...)
			dst = append(dst, `,"input":`...)
			dst = appendInput(dst, jsonscan.ObjGet(fn, "arguments"))
			dst = append(dst, '}')
		}
	}
	return dst, tools
}

// appendInput appends a tool call's arguments (a JSON string holding JSON) as
// the tool_use input object; anything that is not an object becomes {} (a
// call cut off by max_tokens has unfinished arguments).
func appendInput(dst, args []byte) []byte {
	if args == nil {
		return append(dst, "{}"...)
	}
	if args[0] == '{' { // some servers send the object itself
		return append(dst, args...)
	}
	if args[0] != '"' {
		return append(dst, "{}"...)
	}
	mark := len(dst)
	dst = jsonscan.AppendUnescape(dst, args[1:len(args)-1])
	obj := dst[mark:]
	if i := jsonscan.SkipWS(obj, 0); i < len(obj) && obj[i] == '{' && jsonscan.Valid(obj) {
		return dst
	}
	return append(dst[:mark], "{}"...)
}

// stopReason maps a chat finish_reason to an Anthropic stop_reason. A turn
// that called tools is tool_use whatever the upstream said, except when it
// was cut off (length): some local servers report "stop" with tool calls.
func stopReason(finish []byte, tools bool) string {
	switch {
	case jsonscan.StrIs(finish, true, "length"):
		return "max_tokens"
	case tools, jsonscan.StrIs(finish, true, "tool_calls"), jsonscan.StrIs(finish, true, "function_call"):
		return "tool_use"
	case jsonscan.StrIs(finish, true, "content_filter"):
		return "refusal"
	}
	return "end_turn"
}

// appendMessageID appends a msg_ id derived from the chat id, or a random one.
func appendMessageID(dst, chatID []byte) []byte {
	if nonEmptyString(chatID) {
		raw := chatID[1 : len(chatID)-1]
		raw = bytes.TrimPrefix(raw, []byte("chatcmpl-"))
		dst = append(dst, `"msg_`...)
		dst = append(dst, raw...)
		return append(dst, '"')
	}
	return appendRandomID(dst, "msg_")
}

// appendToolID appends the chat tool call id as the tool_use id (the client
// sends it back as tool_use_id, which ToChat turns back into tool_call_id),
// or a random toolu_ id when the upstream gave none.
func appendToolID(dst, id []byte) []byte {
	if nonEmptyString(id) {
		return append(dst, id...)
	}
	return appendRandomID(dst, "toolu_")
}

func appendRandomID(dst []byte, prefix string) []byte {
	var b [12]byte
	_, _ = rand.Read(b[:])
	dst = append(dst, '"')
	dst = append(dst, prefix...)
	dst = hex.AppendEncode(dst, b[:])
	return append(dst, '"')
}

// appendModel appends the model the upstream reported, else the requested
// one (clients see which model really answered).
func appendModel(dst, model []byte, info *Info) []byte {
	if nonEmptyString(model) {
		return append(dst, model...)
	}
	if info != nil {
		return jsonscan.AppendQuoted(dst, info.Model)
	}
	return append(dst, `""`...)
}

func nonEmptyString(v []byte) bool { return len(v) > 2 && v[0] == '"' }

// usageCounts are the token counts of a chat usage object.
type usageCounts struct {
	prompt, completion, cached int64
	seen                       bool
}

// read takes the counts from a chat usage object (nil or null: none).
// Cached prompt tokens come from prompt_tokens_details.cached_tokens or
// DeepSeek's prompt_cache_hit_tokens.
func (u *usageCounts) read(usage []byte) {
	if len(usage) == 0 || usage[0] != '{' {
		return
	}
	u.seen = true
	it := jsonscan.IterObject(usage, 0, false)
	var m jsonscan.Member
	var tmp [32]byte
	for it.Next(&m) {
		v := usage[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(usage, &m, tmp[:])) {
		case "prompt_tokens":
			u.prompt = intOf(v)
		case "completion_tokens":
			u.completion = intOf(v)
		case "prompt_tokens_details":
			if c := jsonscan.ObjGet(v, "cached_tokens"); c != nil {
				u.cached = intOf(c)
			}
		case "prompt_cache_hit_tokens":
			u.cached = intOf(v)
		}
	}
}

// append writes an Anthropic usage object. Anthropic counts cache reads
// apart from input_tokens while chat's prompt_tokens include them, so
// input_tokens is prompt_tokens minus the cached ones.
func (u *usageCounts) append(dst []byte, withInput bool) []byte {
	in := max(u.prompt-u.cached, 0)
	dst = append(dst, '{')
	if withInput {
		dst = append(dst, `"input_tokens":`...)
		dst = strconv.AppendInt(dst, in, 10)
		dst = append(dst, `,"cache_creation_input_tokens":0,"cache_read_input_tokens":`...)
		dst = strconv.AppendInt(dst, u.cached, 10)
		dst = append(dst, ',')
	}
	dst = append(dst, `"output_tokens":`...)
	dst = strconv.AppendInt(dst, u.completion, 10)
	return append(dst, '}')
}

// intOf parses a JSON number as a non-negative integer (fractions dropped);
// anything else is 0.
func intOf(v []byte) int64 {
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			break
		}
		if n > (1<<62)/10 {
			return n
		}
		n = n*10 + int64(c-'0')
	}
	return n
}
