package anthropic

import (
	"bytes"
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// Options tune the request translation per upstream.
type Options struct {
	// KeepBillingHeader keeps Claude Code's x-anthropic-billing-header
	// system block (the provider's keep_billing_header). Default false:
	// the block is removed.
	KeepBillingHeader bool

	// ReasoningField names the chat field that carries an assistant
	// message's reasoning (the provider's reasoning_field, e.g.
	// "reasoning_content"). Thinking blocks in the history go there, joined
	// by "\n". Empty (the default): thinking blocks are dropped.
	ReasoningField string

	// Effort maps the request's thinking settings to chat's
	// reasoning_effort (see the package doc). Default false: they are
	// dropped, because chat upstreams that do not reason reject the field.
	Effort bool
}

// Info is what ToChat learned that the response translation needs. It is
// created once per request and only read afterwards.
type Info struct {
	// Model is the model the client asked for; a response whose upstream
	// reports no model names this one.
	Model string
	// Stream is the request's stream flag.
	Stream bool
	// Thinking is true when the client enabled thinking ("enabled" or
	// "adaptive"). Reasoning is turned into thinking blocks either way.
	Thinking bool
}

// Error is a request the translator refuses. The core answers it with
// ErrorBody(Status, Code, Message).
type Error struct {
	Status  int
	Code    string // "" or e.g. "unsupported_parameter"
	Message string
}

func (e *Error) Error() string { return e.Message }

func badRequest(code, msg string) *Error {
	return &Error{Status: 400, Code: code, Message: msg}
}

const billingPrefix = "x-anthropic-billing-header:"

// ToChat translates an Anthropic Messages request body into a chat
// completions request body, appended to dst. The body must be a JSON object
// with a messages array; every other problem the translator cannot carry is
// an *Error (400). Fields not listed in the package doc are dropped.
//
// The chat body's members are, in this order and when present: model,
// messages, max_tokens, temperature, top_p, stop, user, tools, tool_choice,
// parallel_tool_calls, reasoning_effort, stream, stream_options. Values that
// need no change (model, numbers, stop_sequences, input_schema, tool input)
// are copied byte for byte, so translating the same body twice gives the same
// bytes (upstream prefix caches stay warm).
func ToChat(dst, body []byte, opt Options) ([]byte, *Info, error) {
	n0 := len(dst)
	if !jsonscan.Valid(body) {
		return dst, nil, badRequest("", "request body is not valid JSON")
	}
	var r request
	if err := r.parse(body); err != nil {
		return dst, nil, err
	}
	info := &Info{Stream: r.stream, Thinking: r.thinkingOn}
	if r.model != nil && r.model[0] == '"' {
		info.Model = string(jsonscan.AppendUnescape(nil, r.model[1:len(r.model)-1]))
	}

	dst = append(dst, '{')
	sep := func() {
		if dst[len(dst)-1] != '{' {
			dst = append(dst, ',')
		}
	}
	if r.model != nil {
		dst = append(dst, `"model":`...)
		dst = append(dst, r.model...)
	}
	sep()
	dst = append(dst, `"messages":`...)
	var err *Error
	if dst, err = appendMessages(dst, r.system, r.messages, &opt, true); err != nil {
		return dst[:n0], nil, err
	}
	for _, f := range [...]struct {
		key string
		v   []byte
	}{{"max_tokens", r.maxTokens}, {"temperature", r.temperature}, {"top_p", r.topP}, {"stop", r.stop}, {"user", r.user}} {
		if f.v != nil {
			sep()
			dst = append(dst, '"')
			dst = append(dst, f.key...)
			dst = append(dst, `":`...)
			dst = append(dst, f.v...)
		}
	}
	if r.tools != nil {
		n := len(dst)
		sep()
		dst = append(dst, `"tools":`...)
		var any bool
		if dst, any = appendTools(dst, r.tools); !any {
			dst = dst[:n] // only server tools: no tools at all
		} else {
			if r.toolChoice != nil {
				dst = appendToolChoice(dst, r.toolChoice)
			}
		}
	}
	if opt.Effort {
		if e := r.effort(); e != "" {
			sep()
			dst = append(dst, `"reasoning_effort":"`...)
			dst = append(dst, e...)
			dst = append(dst, '"')
		}
	}
	if r.stream {
		sep()
		dst = append(dst, `"stream":true,"stream_options":{"include_usage":true}`...)
	}
	dst = append(dst, '}')
	return dst, info, nil
}

// request holds the raw values of the Messages fields ToChat reads.
type request struct {
	model, system, messages            []byte
	maxTokens, temperature, topP, stop []byte
	user, tools, toolChoice            []byte
	stream, thinkingOn                 bool
	thinkingBudget, outputEffort       []byte
}

func (r *request) parse(body []byte) *Error {
	i := jsonscan.SkipWS(body, 0)
	if body[i] != '{' {
		return badRequest("", "request body must be a JSON object")
	}
	it := jsonscan.IterObject(body, i, false)
	var m jsonscan.Member
	var tmp [32]byte
	for it.Next(&m) {
		v := body[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(body, &m, tmp[:])) {
		case "model":
			r.model = v
		case "system":
			r.system = v
		case "messages":
			r.messages = v
		case "max_tokens":
			r.maxTokens = jsonscan.NumberOrNil(v)
		case "temperature":
			r.temperature = jsonscan.NumberOrNil(v)
		case "top_p":
			r.topP = jsonscan.NumberOrNil(v)
		case "stop_sequences":
			r.stop = nil
			if v[0] == '[' && !jsonscan.IsEmptyArray(v) {
				r.stop = v
			}
		case "metadata":
			r.user = nil
			if v[0] == '{' {
				if u := jsonscan.ObjGet(v, "user_id"); u != nil && u[0] == '"' {
					r.user = u
				}
			}
		case "tools":
			r.tools = nil
			if v[0] == '[' {
				r.tools = v
			}
		case "tool_choice":
			r.toolChoice = nil
			if v[0] == '{' {
				r.toolChoice = v
			}
		case "stream":
			r.stream = string(v) == "true"
		case "thinking":
			r.thinkingOn, r.thinkingBudget = false, nil
			if v[0] == '{' {
				t := jsonscan.ObjGet(v, "type")
				r.thinkingOn = jsonscan.StrIs(t, true, "enabled") || jsonscan.StrIs(t, true, "adaptive")
				r.thinkingBudget = jsonscan.NumberOrNil(jsonscan.ObjGet(v, "budget_tokens"))
			}
		case "output_config":
			r.outputEffort = nil
			if v[0] == '{' {
				if e := jsonscan.ObjGet(v, "effort"); e != nil && e[0] == '"' {
					r.outputEffort = e
				}
			}
		}
	}
	if r.messages == nil || r.messages[0] != '[' {
		return badRequest("", "messages: an array is required")
	}
	return nil
}

// effort is the reasoning_effort for the request's thinking settings, or "".
func (r *request) effort() string {
	if !r.thinkingOn {
		return ""
	}
	if r.outputEffort != nil {
		switch {
		case jsonscan.StrIs(r.outputEffort, true, "low"):
			return "low"
		case jsonscan.StrIs(r.outputEffort, true, "medium"):
			return "medium"
		default: // high, xhigh, max: chat's strongest widely accepted value
			return "high"
		}
	}
	if r.thinkingBudget != nil {
		n, err := strconv.ParseFloat(string(r.thinkingBudget), 64)
		switch {
		case err != nil:
		// The inverse of LiteLLM's (and agentgateway's) effort budgets:
		// low 1024, medium 2048, high 4096.
		case n < 2048:
			return "low"
		case n < 4096:
			return "medium"
		default:
			return "high"
		}
	}
	return "medium"
}

// appendMessages appends the chat messages array for system and msgs.
// withSystem false leaves the top-level system prompt out (session hashing).
func appendMessages(dst, system, msgs []byte, opt *Options, withSystem bool) ([]byte, *Error) {
	dst = append(dst, '[')
	w := msgWriter{dst: dst, opt: opt}
	if withSystem && system != nil {
		w.system(system, true)
	}
	it := jsonscan.IterArray(msgs, 0, false)
	for {
		vs, ve, more := it.Next()
		if !more {
			break
		}
		if err := w.message(msgs[vs:ve]); err != nil {
			return w.dst, err
		}
	}
	return append(w.dst, ']'), nil
}

// msgWriter appends chat messages, one Anthropic message at a time.
type msgWriter struct {
	dst []byte
	opt *Options
	n   int // messages written
}

func (w *msgWriter) open(role string) {
	if w.n > 0 {
		w.dst = append(w.dst, ',')
	}
	w.n++
	w.dst = append(w.dst, `{"role":"`...)
	w.dst = append(w.dst, role...)
	w.dst = append(w.dst, `","content":`...)
}

// system writes a system message from a string or text blocks. top marks the
// top-level system prompt, whose first block may be the billing header.
func (w *msgWriter) system(v []byte, top bool) {
	if v[0] == '"' {
		w.open("system")
		w.dst = append(w.dst, v...)
		w.dst = append(w.dst, '}')
		return
	}
	if v[0] != '[' {
		return
	}
	mark := len(w.dst)
	n := w.n
	w.open("system")
	w.dst = append(w.dst, '"')
	start := len(w.dst)
	first := true
	it := jsonscan.IterArray(v, 0, false)
	for {
		vs, ve, more := it.Next()
		if !more {
			break
		}
		blk := v[vs:ve]
		typ, text := blockTypeText(blk)
		if !jsonscan.StrIs(typ, true, "text") || text == nil {
			continue
		}
		if top && first && !w.opt.KeepBillingHeader && isBillingText(text) {
			first = false
			continue
		}
		first = false
		if len(w.dst) > start {
			w.dst = append(w.dst, `\n`...)
		}
		w.dst = append(w.dst, text[1:len(text)-1]...)
	}
	if len(w.dst) == start {
		w.dst, w.n = w.dst[:mark], n // nothing left: no system message
		return
	}
	w.dst = append(w.dst, `"}`...)
}

// message translates one Anthropic message into one or more chat messages.
func (w *msgWriter) message(msg []byte) *Error {
	if msg[0] != '{' {
		return badRequest("", "messages: each message must be an object")
	}
	var role, content []byte
	it := jsonscan.IterObject(msg, 0, false)
	var m jsonscan.Member
	var tmp [16]byte
	for it.Next(&m) {
		switch string(jsonscan.KeyOf(msg, &m, tmp[:])) {
		case "role":
			role = msg[m.Vs:m.Ve]
		case "content":
			content = msg[m.Vs:m.Ve]
		}
	}
	if content == nil || (content[0] != '"' && content[0] != '[') {
		return badRequest("", "messages: content must be a string or an array of blocks")
	}
	switch {
	case jsonscan.StrIs(role, true, "user"):
		return w.user(content)
	case jsonscan.StrIs(role, true, "assistant"):
		return w.assistant(content)
	case jsonscan.StrIs(role, true, "system"):
		w.system(content, false)
		return nil
	}
	return badRequest("", "messages: role must be user, assistant or system")
}

// user writes the tool messages for a user turn's tool_result blocks, then
// one user message with its other blocks. Chat wants tool messages right
// after the assistant message that called the tools, so they go first even
// when text precedes them in the Anthropic turn.
func (w *msgWriter) user(content []byte) *Error {
	if content[0] == '"' {
		w.open("user")
		w.dst = append(w.dst, content...)
		w.dst = append(w.dst, '}')
		return nil
	}
	parts := false // some block needs the content-parts form
	rest := 0      // blocks for the user message
	it := jsonscan.IterArray(content, 0, false)
	for {
		vs, ve, more := it.Next()
		if !more {
			break
		}
		blk := content[vs:ve]
		typ := jsonscan.ObjGet(blk, "type")
		switch {
		case jsonscan.StrIs(typ, true, "tool_result"):
			imgs, err := w.toolResult(blk)
			if err != nil {
				return err
			}
			if imgs {
				parts = true
				rest++
			}
		case jsonscan.StrIs(typ, true, "text"):
			rest++
		case jsonscan.StrIs(typ, true, "image"):
			parts = true
			rest++
		case jsonscan.StrIs(typ, true, "document"):
			return &Error{Status: 400, Code: "unsupported_parameter", Message: "document blocks cannot be sent to this model's upstream"}
		}
	}
	if rest == 0 {
		return nil
	}
	w.open("user")
	if !parts {
		w.dst = append(w.dst, '"')
		start := len(w.dst)
		w.eachBlock(content, func(typ, blk []byte) {
			if jsonscan.StrIs(typ, true, "text") {
				if t := jsonscan.ObjGet(blk, "text"); t != nil && t[0] == '"' {
					if len(w.dst) > start {
						w.dst = append(w.dst, `\n`...)
					}
					w.dst = append(w.dst, t[1:len(t)-1]...)
				}
			}
		})
		w.dst = append(w.dst, `"}`...)
		return nil
	}
	w.dst = append(w.dst, '[')
	start := len(w.dst)
	var err *Error
	w.eachBlock(content, func(typ, blk []byte) {
		if err != nil {
			return
		}
		switch {
		case jsonscan.StrIs(typ, true, "text"), jsonscan.StrIs(typ, true, "image"):
			err = w.part(typ, blk, start)
		case jsonscan.StrIs(typ, true, "tool_result"):
			// Images a tool returned: chat's tool messages carry text only,
			// so they follow in the user message.
			c := jsonscan.ObjGet(blk, "content")
			if c == nil || c[0] != '[' {
				return
			}
			w.eachBlock(c, func(t2, b2 []byte) {
				if err == nil && jsonscan.StrIs(t2, true, "image") {
					err = w.part(t2, b2, start)
				}
			})
		}
	})
	if err != nil {
		return err
	}
	w.dst = append(w.dst, "]}"...)
	return nil
}

// part appends one text or image content part.
func (w *msgWriter) part(typ, blk []byte, start int) *Error {
	if jsonscan.StrIs(typ, true, "text") {
		t := jsonscan.ObjGet(blk, "text")
		if t == nil || t[0] != '"' {
			return nil
		}
		if len(w.dst) > start {
			w.dst = append(w.dst, ',')
		}
		w.dst = append(w.dst, `{"type":"text","text":`...)
		w.dst = append(w.dst, t...)
		w.dst = append(w.dst, '}')
		return nil
	}
	src := jsonscan.ObjGet(blk, "source")
	if src == nil || src[0] != '{' {
		return badRequest("", "image: source is required")
	}
	st := jsonscan.ObjGet(src, "type")
	var url []byte
	switch {
	case jsonscan.StrIs(st, true, "base64"):
		mt, data := jsonscan.ObjGet(src, "media_type"), jsonscan.ObjGet(src, "data")
		if mt == nil || mt[0] != '"' || data == nil || data[0] != '"' {
			return badRequest("", "image: base64 source needs media_type and data")
		}
		if len(w.dst) > start {
			w.dst = append(w.dst, ',')
		}
		w.dst = append(w.dst, `{"type":"image_url","image_url":{"url":"data:`...)
		w.dst = append(w.dst, mt[1:len(mt)-1]...)
		w.dst = append(w.dst, `;base64,`...)
		w.dst = append(w.dst, data[1:len(data)-1]...)
		w.dst = append(w.dst, `"}}`...)
		return nil
	case jsonscan.StrIs(st, true, "url"):
		if url = jsonscan.ObjGet(src, "url"); url == nil || url[0] != '"' {
			return badRequest("", "image: url source needs url")
		}
	default:
		return &Error{Status: 400, Code: "unsupported_parameter", Message: "image: only base64 and url sources can be sent to this model's upstream"}
	}
	if len(w.dst) > start {
		w.dst = append(w.dst, ',')
	}
	w.dst = append(w.dst, `{"type":"image_url","image_url":{"url":`...)
	w.dst = append(w.dst, url...)
	w.dst = append(w.dst, "}}"...)
	return nil
}

// toolResult writes one tool message; imgs reports image blocks in its
// content, which the user message carries.
func (w *msgWriter) toolResult(blk []byte) (imgs bool, err *Error) {
	id := jsonscan.ObjGet(blk, "tool_use_id")
	if id == nil || id[0] != '"' {
		return false, badRequest("", "tool_result: tool_use_id is required")
	}
	c := jsonscan.ObjGet(blk, "content")
	isErr := string(jsonscan.ObjGet(blk, "is_error")) == "true"
	if w.n > 0 {
		w.dst = append(w.dst, ',')
	}
	w.n++
	w.dst = append(w.dst, `{"role":"tool","tool_call_id":`...)
	w.dst = append(w.dst, id...)
	w.dst = append(w.dst, `,"content":"`...)
	if isErr {
		w.dst = append(w.dst, "Error: "...)
	}
	switch {
	case c == nil:
	case c[0] == '"':
		w.dst = append(w.dst, c[1:len(c)-1]...)
	case c[0] == '[':
		start := len(w.dst)
		w.eachBlock(c, func(typ, b []byte) {
			switch {
			case jsonscan.StrIs(typ, true, "text"):
				if t := jsonscan.ObjGet(b, "text"); t != nil && t[0] == '"' {
					if len(w.dst) > start {
						w.dst = append(w.dst, `\n`...)
					}
					w.dst = append(w.dst, t[1:len(t)-1]...)
				}
			case jsonscan.StrIs(typ, true, "image"):
				imgs = true
			}
		})
	}
	w.dst = append(w.dst, `"}`...)
	return imgs, nil
}

// assistant writes one assistant message: text blocks joined as content,
// tool_use blocks as tool_calls, thinking blocks in opt.ReasoningField.
func (w *msgWriter) assistant(content []byte) *Error {
	w.open("assistant")
	if content[0] == '"' {
		w.dst = append(w.dst, content...)
		w.dst = append(w.dst, '}')
		return nil
	}
	// Content first: text blocks joined.
	mark := len(w.dst)
	w.dst = append(w.dst, '"')
	start := len(w.dst)
	tools := false
	w.eachBlock(content, func(typ, blk []byte) {
		switch {
		case jsonscan.StrIs(typ, true, "text"):
			if t := jsonscan.ObjGet(blk, "text"); t != nil && t[0] == '"' {
				if len(w.dst) > start {
					w.dst = append(w.dst, `\n`...)
				}
				w.dst = append(w.dst, t[1:len(t)-1]...)
			}
		case jsonscan.StrIs(typ, true, "tool_use"):
			tools = true
		}
	})
	if len(w.dst) == start && tools {
		w.dst = append(w.dst[:mark], "null"...)
	} else {
		w.dst = append(w.dst, '"')
	}
	if tools {
		w.dst = append(w.dst, `,"tool_calls":[`...)
		start := len(w.dst)
		var err *Error
		w.eachBlock(content, func(typ, blk []byte) {
			if err != nil || !jsonscan.StrIs(typ, true, "tool_use") {
				return
			}
			id, name, input := jsonscan.ObjGet(blk, "id"), jsonscan.ObjGet(blk, "name"), jsonscan.ObjGet(blk, "input")
			if id == nil || id[0] != '"' || name == nil || name[0] != '"' {
				err = badRequest("", "tool_use: id and name are required")
				return
			}
			if len(w.dst) > start {
				w.dst = append(w.dst, ',')
			}
			w.dst = append(w.dst, `{"id":`...)
			w.dst = append(w.dst, id...)
			w.dst = append(w.dst, `,"type":"function","function":{"name":`...)
			w.dst = append(w.dst, name...)
			w.dst = append(w.dst, `,"arguments":`...)
			if input == nil {
				input = []byte("{}")
			}
			w.dst = jsonscan.AppendQuoted(w.dst, input)
			w.dst = append(w.dst, "}}"...)
		})
		if err != nil {
			return err
		}
		w.dst = append(w.dst, ']')
	}
	if f := w.opt.ReasoningField; f != "" {
		mark := len(w.dst)
		w.dst = append(w.dst, ',')
		w.dst = jsonscan.AppendQuoted(w.dst, f)
		w.dst = append(w.dst, `:"`...)
		start := len(w.dst)
		w.eachBlock(content, func(typ, blk []byte) {
			if jsonscan.StrIs(typ, true, "thinking") {
				if t := jsonscan.ObjGet(blk, "thinking"); t != nil && t[0] == '"' && len(t) > 2 {
					if len(w.dst) > start {
						w.dst = append(w.dst, `\n`...)
					}
					w.dst = append(w.dst, t[1:len(t)-1]...)
				}
			}
		})
		if len(w.dst) == start {
			w.dst = w.dst[:mark]
		} else {
			w.dst = append(w.dst, '"')
		}
	}
	w.dst = append(w.dst, '}')
	return nil
}

// eachBlock calls fn with the type and bytes of every object in the array
// blocks.
func (w *msgWriter) eachBlock(blocks []byte, fn func(typ, blk []byte)) {
	it := jsonscan.IterArray(blocks, 0, false)
	for {
		vs, ve, more := it.Next()
		if !more {
			return
		}
		if blk := blocks[vs:ve]; blk[0] == '{' {
			fn(jsonscan.ObjGet(blk, "type"), blk)
		}
	}
}

// appendTools appends the chat tools array; any is false when no tool could
// be translated (Anthropic server tools have no chat form and are dropped).
func appendTools(dst, tools []byte) ([]byte, bool) {
	dst = append(dst, '[')
	start := len(dst)
	it := jsonscan.IterArray(tools, 0, false)
	for {
		vs, ve, more := it.Next()
		if !more {
			break
		}
		t := tools[vs:ve]
		if t[0] != '{' {
			continue
		}
		var name, desc, schema, typ []byte
		ti := jsonscan.IterObject(t, 0, false)
		var m jsonscan.Member
		var tmp [16]byte
		for ti.Next(&m) {
			v := t[m.Vs:m.Ve]
			switch string(jsonscan.KeyOf(t, &m, tmp[:])) {
			case "name":
				name = v
			case "description":
				desc = v
			case "input_schema":
				schema = v
			case "type":
				typ = v
			}
		}
		if typ != nil && !jsonscan.StrIs(typ, true, "custom") || name == nil || name[0] != '"' || schema == nil {
			continue
		}
		if len(dst) > start {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"type":"function","function":{"name":`...)
		dst = append(dst, name...)
		if desc != nil && desc[0] == '"' {
			dst = append(dst, `,"description":`...)
			dst = append(dst, desc...)
		}
		dst = append(dst, `,"parameters":`...)
		dst = append(dst, schema...)
		dst = append(dst, "}}"...)
	}
	return append(dst, ']'), len(dst) > start
}

// appendToolChoice appends ,"tool_choice":… (and parallel_tool_calls).
func appendToolChoice(dst, tc []byte) []byte {
	typ := jsonscan.ObjGet(tc, "type")
	switch {
	case jsonscan.StrIs(typ, true, "auto"):
		dst = append(dst, `,"tool_choice":"auto"`...)
	case jsonscan.StrIs(typ, true, "any"):
		dst = append(dst, `,"tool_choice":"required"`...)
	case jsonscan.StrIs(typ, true, "none"):
		dst = append(dst, `,"tool_choice":"none"`...)
	case jsonscan.StrIs(typ, true, "tool"):
		name := jsonscan.ObjGet(tc, "name")
		if name == nil || name[0] != '"' {
			return dst
		}
		dst = append(dst, `,"tool_choice":{"type":"function","function":{"name":`...)
		dst = append(dst, name...)
		dst = append(dst, "}}"...)
	default:
		return dst
	}
	if string(jsonscan.ObjGet(tc, "disable_parallel_tool_use")) == "true" {
		dst = append(dst, `,"parallel_tool_calls":false`...)
	}
	return dst
}

// StripBillingBlock returns body without Claude Code's billing block (a
// first system text block whose text starts with
// "x-anthropic-billing-header:"), every other byte as sent, for native
// upstreams. A body without that block is returned as it is (same slice);
// otherwise the result is appended to dst.
func StripBillingBlock(dst, body []byte) []byte {
	i := jsonscan.SkipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return body
	}
	svs, sve := jsonscan.ObjSpan(body[i:], "system")
	if svs < 0 || body[i+svs] != '[' {
		return body
	}
	off := i + svs // index of the system array in body
	sys := body[off : i+sve]
	it := jsonscan.IterArray(sys, 0, false)
	vs, ve, more := it.Next()
	if !more {
		return body
	}
	typ, text := blockTypeText(sys[vs:ve])
	if !jsonscan.StrIs(typ, true, "text") || text == nil || !isBillingText(text) {
		return body
	}
	// Cut from the block to the next element (or, for a lone block, to the
	// closing bracket), keeping the array well formed.
	cutFrom, cutTo := off+vs, off+ve
	j := jsonscan.SkipWS(sys, ve)
	if j < len(sys) && sys[j] == ',' {
		cutTo = off + jsonscan.SkipWS(sys, j+1)
	}
	dst = append(dst, body[:cutFrom]...)
	return append(dst, body[cutTo:]...)
}

// isBillingText reports whether the raw JSON string starts with the billing
// header prefix (decoded, so an escaped spelling counts too).
func isBillingText(text []byte) bool {
	raw := text[1 : len(text)-1]
	if bytes.HasPrefix(raw, []byte(billingPrefix)) {
		return true
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return false
	}
	var tmp [64]byte
	head := raw[:min(len(raw), len(billingPrefix)*6)]
	return bytes.HasPrefix(jsonscan.AppendUnescape(tmp[:0], head), []byte(billingPrefix))
}

// SessionBody appends {"messages":[…]} for session hashing:
// the chat messages ToChat would send, without the top-level system prompt
// (so the billing block is never hashed). Sessions.ID over this body gives the
// same id for a native and a translated attempt of one conversation.
func SessionBody(dst, body []byte) ([]byte, error) {
	if !jsonscan.Valid(body) {
		return dst, badRequest("", "request body is not valid JSON")
	}
	var r request
	if err := r.parse(body); err != nil {
		return dst, err
	}
	n0 := len(dst)
	dst = append(dst, `{"messages":`...)
	dst, err := appendMessages(dst, nil, r.messages, &Options{}, false)
	if err != nil {
		return dst[:n0], err
	}
	return append(dst, '}'), nil
}
