package gemini

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/chatsse"
	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// FromChat translates a non-stream chat.completion body (2xx) into a
// GenerateContentResponse body, appended to dst. Only the first choice is
// used. A body that is not a chat completion object (invalid JSON, no
// choices, an "error" member) is an error: the core treats it as a failed
// attempt.
func FromChat(dst, chat []byte, info *Info) ([]byte, error) {
	c, err := chatsse.ReadCompletion(chat)
	if err != nil {
		return dst, fmt.Errorf("gemini: %w", err)
	}
	id, model, choices, usage := c.ID, c.Model, c.Choices, c.Usage
	var message, finish []byte
	ci := jsonscan.IterArray(choices, 0, false)
	if vs, ve, ok := ci.Next(); ok && choices[vs] == '{' {
		c := choices[vs:ve]
		message, finish = jsonscan.ObjGet(c, "message"), jsonscan.ObjGet(c, "finish_reason")
	}
	thoughts := info != nil && info.IncludeThoughts
	cut := jsonscan.StrIs(finish, true, "length")

	dst = append(dst, `{"candidates":[{"content":{"role":"model","parts":[`...)
	start := len(dst)
	malformed := false
	if message != nil && message[0] == '{' {
		dst, malformed = appendParts(dst, message, start, thoughts, cut)
	}
	if len(dst) == start {
		dst = append(dst, `{"text":""}`...) // code reading parts[0] keeps working
	}
	dst = append(dst, `]},"finishReason":"`...)
	dst = append(dst, finishReason(finish, malformed)...)
	dst = append(dst, `","index":0}]`...)
	var u usageCounts
	u.read(usage)
	if u.seen {
		dst = append(dst, `,"usageMetadata":`...)
		dst = u.append(dst)
	}
	dst = append(dst, `,"modelVersion":`...)
	dst = appendModel(dst, model, info)
	dst = append(dst, `,"responseId":`...)
	dst = appendResponseID(dst, id)
	return append(dst, '}'), nil
}

// appendParts appends the parts of a chat message: a thought part (from
// reasoning_content or reasoning, when thoughts), a text part (content), a
// text part for a refusal, a functionCall part per tool call. malformed
// reports a call left out because its arguments were not a JSON object.
func appendParts(dst, msg []byte, start int, thoughts, cut bool) (_ []byte, malformed bool) {
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
	if thoughts && nonEmptyString(rc) {
		dst = append(dst, `{"text":`...)
		dst = appendJSONText(dst, rc)
		dst = append(dst, `,"thought":true}`...)
	}
	switch {
	case nonEmptyString(content):
		comma()
		dst = append(dst, `{"text":`...)
		dst = appendJSONText(dst, content)
		dst = append(dst, '}')
	case content != nil && content[0] == '[': // content parts: their texts
		mark := len(dst)
		comma()
		dst = append(dst, `{"text":"`...)
		ts := len(dst)
		eachObject(content, func(p []byte) {
			if t := jsonscan.ObjGet(p, "text"); t != nil && t[0] == '"' {
				dst = appendJSONText(dst, t[1:len(t)-1])
			}
		})
		if len(dst) == ts {
			dst = dst[:mark]
		} else {
			dst = append(dst, `"}`...)
		}
	}
	if nonEmptyString(refusal) {
		comma()
		dst = append(dst, `{"text":`...)
		dst = appendJSONText(dst, refusal)
		dst = append(dst, '}')
	}
	if calls != nil && calls[0] == '[' {
		eachObject(calls, func(tc []byte) {
			fn := jsonscan.ObjGet(tc, "function")
			name, args := jsonscan.ObjGet(fn, "name"), jsonscan.ObjGet(fn, "arguments")
			mark := len(dst)
			comma()
			dst = append(dst, `{"functionCall":{"id":`...)
			dst = appendCallID(dst, jsonscan.ObjGet(tc, "id"))
			dst = append(dst, `,"name":`...)
			if name == nil || name[0] != '"' {
				name = []byte(`""`)
			}
			dst = appendJSONText(dst, name)
			dst = append(dst, `,"args":`...)
			var ok bool
			if dst, ok = appendArgs(dst, args, cut); !ok {
				dst = dst[:mark]
				malformed = true
				return
			}
			dst = append(dst, "}}"...)
		})
	}
	return dst, malformed
}

// appendArgs appends a tool call's arguments (a JSON string holding JSON;
// some servers send the object itself) as the functionCall args object,
// compacted. Absent or empty arguments are {}. Arguments that are not a
// JSON object give ok false, except for a cut answer (cut), where they
// become {} (the call was cut off by the token limit).
func appendArgs(dst, args []byte, cut bool) (_ []byte, ok bool) {
	switch {
	case args == nil || string(args) == `""` || string(args) == "null":
		return append(dst, "{}"...), true
	case args[0] == '{':
		return appendCompact(dst, args), true
	case args[0] == '"':
		mark := len(dst)
		dst = jsonscan.AppendUnescape(dst, args[1:len(args)-1])
		if isObject(dst[mark:]) {
			n := len(dst)
			dst = appendCompact(dst, dst[mark:n])
			return append(dst[:mark], dst[n:]...), true
		}
		dst = dst[:mark]
	}
	if cut {
		return append(dst, "{}"...), true
	}
	return dst, false
}

// finishReason maps a chat finish_reason to Gemini's: stop, tool_calls,
// function_call and none → STOP (Gemini ends a turn with function calls as
// STOP), length → MAX_TOKENS, content_filter → SAFETY, anything else OTHER.
// malformed (a call whose arguments were not an object) →
// MALFORMED_FUNCTION_CALL, unless the answer was cut.
func finishReason(finish []byte, malformed bool) string {
	switch {
	case jsonscan.StrIs(finish, true, "length"):
		return "MAX_TOKENS"
	case malformed:
		return "MALFORMED_FUNCTION_CALL"
	case finish == nil || string(finish) == "null", jsonscan.StrIs(finish, true, "stop"),
		jsonscan.StrIs(finish, true, "tool_calls"), jsonscan.StrIs(finish, true, "function_call"):
		return "STOP"
	case jsonscan.StrIs(finish, true, "content_filter"):
		return "SAFETY"
	}
	return "OTHER"
}

// appendCallID appends the chat tool call id as the functionCall id (the
// client echoes it in functionResponse.id, which ToChat turns back into
// tool_call_id), or a random call_ id when the upstream gave none.
func appendCallID(dst, id []byte) []byte {
	if nonEmptyString(id) {
		return appendJSONText(dst, id)
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [24]byte
	_, _ = rand.Read(b[:])
	dst = append(dst, `"call_`...)
	for _, c := range b {
		dst = append(dst, alphabet[int(c)%len(alphabet)])
	}
	return append(dst, '"')
}

// appendResponseID appends the chat id as responseId, or 16 random hex
// digits when the upstream gave none.
func appendResponseID(dst, id []byte) []byte {
	if nonEmptyString(id) {
		return appendJSONText(dst, id)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	dst = append(dst, '"')
	dst = hex.AppendEncode(dst, b[:])
	return append(dst, '"')
}

// appendModel appends the model the upstream reported, else the requested
// one (clients see which model really answered).
func appendModel(dst, model []byte, info *Info) []byte {
	if nonEmptyString(model) {
		return appendJSONText(dst, model)
	}
	if info != nil {
		return appendQuotedText(dst, info.Model)
	}
	return append(dst, `""`...)
}

// usageCounts are the token counts of a chat usage object.
type usageCounts struct {
	prompt, completion, total, cached, reasoning int64
	seen                                         bool
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
		case "total_tokens":
			u.total = intOf(v)
		case "prompt_tokens_details":
			if c := jsonscan.ObjGet(v, "cached_tokens"); c != nil {
				u.cached = intOf(c)
			}
		case "prompt_cache_hit_tokens":
			u.cached = intOf(v)
		case "completion_tokens_details":
			if r := jsonscan.ObjGet(v, "reasoning_tokens"); r != nil {
				u.reasoning = intOf(r)
			}
		}
	}
}

// append writes a usageMetadata object. Gemini's promptTokenCount includes
// cached tokens as chat's prompt_tokens does; its candidatesTokenCount
// excludes the thoughts chat counts in completion_tokens.
func (u *usageCounts) append(dst []byte) []byte {
	total := u.total
	if total == 0 {
		total = u.prompt + u.completion
	}
	thoughts := min(u.reasoning, u.completion)
	dst = append(dst, `{"promptTokenCount":`...)
	dst = strconv.AppendInt(dst, u.prompt, 10)
	dst = append(dst, `,"candidatesTokenCount":`...)
	dst = strconv.AppendInt(dst, u.completion-thoughts, 10)
	dst = append(dst, `,"totalTokenCount":`...)
	dst = strconv.AppendInt(dst, total, 10)
	if u.cached > 0 {
		dst = append(dst, `,"cachedContentTokenCount":`...)
		dst = strconv.AppendInt(dst, u.cached, 10)
	}
	if thoughts > 0 {
		dst = append(dst, `,"thoughtsTokenCount":`...)
		dst = strconv.AppendInt(dst, thoughts, 10)
	}
	return append(dst, '}')
}
