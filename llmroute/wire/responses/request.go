package responses

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// Options tune the request translation for one upstream.
type Options struct {
	// ReasoningField names the chat field that carries an assistant
	// message's reasoning in the outgoing history (the provider's
	// reasoning_field, e.g. "reasoning_content"). Empty: reasoning items in
	// the input are dropped. Default: empty.
	ReasoningField string
}

// Error is a request the translator refuses. The core writes it back with
// ErrorBody(e.Status, e.Code, e.Message).
type Error struct {
	Status  int    // HTTP status, 400 for every error ToChat returns
	Code    string // error.code, e.g. "unsupported_parameter"
	Param   string // the offending request field, when there is one
	Message string // fixed text naming the field; never echoes request values
}

func (e *Error) Error() string { return e.Message }

func badRequest(code, param, msg string) *Error {
	return &Error{Status: http.StatusBadRequest, Code: code, Param: param, Message: msg}
}

// Info is what ToChat learned that the answer's translation needs. It owns
// its memory (nothing points into the request body) and is read-only once
// ToChat returns, so a stream and a log line may share it.
type Info struct {
	// Model is the request's model as the client sent it; the answer's
	// "model" is the upstream's when it names one, else this.
	Model string
	// Stream reports a stream request (`"stream":true`).
	Stream bool
	// PromptCacheKey is the request's prompt_cache_key (Codex sets it to its
	// session id), for session affinity. Empty when absent.
	PromptCacheKey string
	// DroppedTools lists, once each, the types of tools the chat upstream
	// cannot run and that were left out (web_search, file_search, mcp,
	// tool_search, …), so the core can log a warning.
	DroppedTools []string
	// DroppedItems lists, once each, the types of input items that were left
	// out (hosted tool calls in history, compaction, files in tool output …).
	DroppedItems []string

	tools  []toolName     // chat function name ⇄ what the client declared
	byChat map[string]int // chat name → index in tools
	byName map[string]int // namespace NUL name → index in tools (first)
	next   map[string]int // next suffix to try for a taken chat name
	echo   []byte         // request fields echoed in every Response object, pre-rendered
}

// toolKind says what a chat function stands for on the client's side.
type toolKind uint8

const (
	kindFunction toolKind = iota
	kindCustom            // a custom (freeform) tool: arguments are {"input": "<text>"}
)

// toolName maps one chat function back to the tool the client declared.
type toolName struct {
	chat      string
	name      string
	namespace string
	kind      toolKind
}

// lookup returns the client-side tool a chat function name stands for. A
// name the request did not declare is returned as a plain function.
func (in *Info) lookup(chat []byte) toolName {
	if i, ok := in.byChat[string(chat)]; ok {
		return in.tools[i]
	}
	return toolName{chat: string(chat), name: string(chat)}
}

// chatName returns the chat function name of a client tool (name within
// namespace), declaring it on the fly when the request's tools do not list
// it (a call in history to a tool that is no longer offered).
func (in *Info) chatName(namespace, name string) string {
	if i, ok := in.byName[namespace+"\x00"+name]; ok {
		return in.tools[i].chat
	}
	return flatName(namespace, name)
}

// flatName joins a namespace and a tool name into one chat function name.
// Codex's MCP namespaces already end in "__" (mcp__server__); others get a
// "__" separator.
func flatName(namespace, name string) string {
	switch {
	case namespace == "":
		return name
	case namespace[len(namespace)-1] == '_':
		return namespace + name
	default:
		return namespace + "__" + name
	}
}

// addTool records a tool. A chat name already taken (two namespaces
// flattening to the same name, or a name repeated) gets a _2, _3 … suffix;
// the maps keep this linear in the number of tools whatever the client sent.
func (in *Info) addTool(t toolName) {
	if in.byChat == nil {
		in.byChat, in.byName, in.next = map[string]int{}, map[string]int{}, map[string]int{}
	}
	if _, taken := in.byChat[t.chat]; taken {
		base := t.chat
		n := max(in.next[base], 2)
		for ; ; n++ {
			t.chat = base + "_" + strconv.Itoa(n)
			if _, taken := in.byChat[t.chat]; !taken {
				break
			}
		}
		in.next[base] = n + 1
	}
	in.byChat[t.chat] = len(in.tools)
	key := t.namespace + "\x00" + t.name
	if _, seen := in.byName[key]; !seen {
		in.byName[key] = len(in.tools)
	}
	in.tools = append(in.tools, t)
}

// maxDropped bounds the Dropped lists: they are for a log line.
const maxDropped = 16

func addOnce(list []string, s string) []string {
	if len(list) >= maxDropped {
		return list
	}
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

// request is the part of a Responses request the translation reads. Text
// and schemas stay raw: they are copied into the chat body byte for byte.
type request struct {
	Model              json.RawMessage   `json:"model"`
	Instructions       json.RawMessage   `json:"instructions"`
	Input              json.RawMessage   `json:"input"`
	Tools              []json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  json.RawMessage   `json:"parallel_tool_calls"`
	Reasoning          json.RawMessage   `json:"reasoning"`
	MaxOutputTokens    json.RawMessage   `json:"max_output_tokens"`
	Text               json.RawMessage   `json:"text"`
	Temperature        json.RawMessage   `json:"temperature"`
	TopP               json.RawMessage   `json:"top_p"`
	User               json.RawMessage   `json:"user"`
	SafetyIdentifier   json.RawMessage   `json:"safety_identifier"`
	PromptCacheKey     json.RawMessage   `json:"prompt_cache_key"`
	PreviousResponseID json.RawMessage   `json:"previous_response_id"`
	Conversation       json.RawMessage   `json:"conversation"`
	Prompt             json.RawMessage   `json:"prompt"`
	Background         json.RawMessage   `json:"background"`
	Metadata           json.RawMessage   `json:"metadata"`
	Stream             json.RawMessage   `json:"stream"`
}

// item is any input item; the fields of every kind the translation reads.
type item struct {
	Type      string            `json:"type"`
	Role      string            `json:"role"`
	Content   json.RawMessage   `json:"content"`
	CallID    json.RawMessage   `json:"call_id"`
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Arguments json.RawMessage   `json:"arguments"`
	Input     json.RawMessage   `json:"input"`
	Output    json.RawMessage   `json:"output"`
	Summary   []textPart        `json:"summary"`
	Tools     []json.RawMessage `json:"tools"`
}

// textPart is a content part: input_text, output_text, refusal,
// input_image, summary_text, reasoning_text, input_file.
type textPart struct {
	Type     string          `json:"type"`
	Text     json.RawMessage `json:"text"`
	Refusal  json.RawMessage `json:"refusal"`
	ImageURL json.RawMessage `json:"image_url"`
	FileID   json.RawMessage `json:"file_id"`
	Detail   json.RawMessage `json:"detail"`
}

// tool is any tool definition.
type tool struct {
	Type        string            `json:"type"`
	Name        string            `json:"name"`
	Description json.RawMessage   `json:"description"`
	Parameters  json.RawMessage   `json:"parameters"`
	Strict      json.RawMessage   `json:"strict"`
	Format      *customFormat     `json:"format"`
	Tools       []json.RawMessage `json:"tools"` // namespace members
}

type customFormat struct {
	Type       string          `json:"type"`
	Syntax     string          `json:"syntax"`
	Definition json.RawMessage `json:"definition"`
}

// present reports a field that is there and not null.
func present(v json.RawMessage) bool { return len(v) > 0 && string(v) != "null" }

// ToChat translates a Responses request body into a chat/completions body,
// appended to dst. The chat body keeps the client's model (the core swaps it
// and merges patches afterwards, as for chat requests). A request that cannot
// be served statelessly (previous_response_id, conversation, stored prompts,
// item_reference, background) is an *Error with status 400; so is a body
// that is not a JSON object or whose input has the wrong shape.
func ToChat(dst, body []byte, opt Options) ([]byte, *Info, error) {
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		return dst, nil, badRequest("invalid_json", "", "request body is not a valid Responses request")
	}
	for _, f := range [...]struct {
		v    json.RawMessage
		name string
	}{{req.PreviousResponseID, "previous_response_id"}, {req.Conversation, "conversation"}, {req.Prompt, "prompt"}} {
		if present(f.v) {
			return dst, nil, badRequest("unsupported_parameter", f.name,
				f.name+" is not supported by this upstream: the proxy stores no responses; send the whole conversation in input")
		}
	}
	if string(req.Background) == "true" {
		return dst, nil, badRequest("unsupported_parameter", "background", "background responses are not supported by this upstream")
	}

	info := &Info{Stream: string(req.Stream) == "true"}
	if jsonscan.IsString(req.Model) {
		info.Model = string(jsonscan.AppendStringValue(nil, req.Model))
	}
	if jsonscan.IsString(req.PromptCacheKey) {
		info.PromptCacheKey = string(jsonscan.AppendStringValue(nil, req.PromptCacheKey))
	}

	// Tools first: history items name them, and additional_tools items in
	// the input add to them.
	var items []json.RawMessage
	if present(req.Input) && req.Input[0] == '[' {
		if err := json.Unmarshal(req.Input, &items); err != nil {
			return dst, nil, badRequest("invalid_value", "input", "input must be a string or an array of items")
		}
	} else if present(req.Input) && !jsonscan.IsString(req.Input) {
		return dst, nil, badRequest("invalid_value", "input", "input must be a string or an array of items")
	}
	var tools []byte
	for _, raw := range req.Tools {
		tools = info.appendTool(tools, raw, "")
	}
	for _, raw := range items {
		var head struct {
			Type  string            `json:"type"`
			Tools []json.RawMessage `json:"tools"`
		}
		if json.Unmarshal(raw, &head) == nil && (head.Type == "additional_tools" || head.Type == "tool_search_output") {
			for _, t := range head.Tools {
				tools = info.appendTool(tools, t, "")
			}
		}
	}

	out := append(dst, `{"model":`...)
	if len(req.Model) > 0 {
		out = append(out, req.Model...)
	} else {
		out = append(out, `null`...)
	}
	out = append(out, `,"messages":[`...)
	mb := messageBuilder{out: out, start: len(out), info: info, reasoningField: opt.ReasoningField}
	if jsonscan.IsString(req.Instructions) {
		mb.system(req.Instructions)
	}
	if jsonscan.IsString(req.Input) {
		mb.flush()
		mb.open("user")
		mb.out = append(mb.out, `,"content":`...)
		mb.out = append(mb.out, req.Input...)
		mb.close()
	}
	for _, raw := range items {
		if err := mb.item(raw); err != nil {
			return dst, nil, err
		}
	}
	mb.flush()
	out = append(mb.out, ']')

	if len(tools) > 0 {
		out = append(out, `,"tools":[`...)
		out = append(out, tools...)
		out = append(out, ']')
		if present(req.ToolChoice) {
			out = info.appendToolChoice(out, req.ToolChoice)
		}
		if present(req.ParallelToolCalls) {
			out = append(out, `,"parallel_tool_calls":`...)
			out = append(out, req.ParallelToolCalls...)
		}
	}
	if present(req.Reasoning) {
		var r struct {
			Effort json.RawMessage `json:"effort"`
		}
		if json.Unmarshal(req.Reasoning, &r) == nil && jsonscan.IsString(r.Effort) {
			out = append(out, `,"reasoning_effort":`...)
			out = append(out, r.Effort...)
		}
	}
	out = appendRaw(out, "max_tokens", req.MaxOutputTokens)
	out = appendRaw(out, "temperature", req.Temperature)
	out = appendRaw(out, "top_p", req.TopP)
	switch {
	case jsonscan.IsString(req.User):
		out = appendRaw(out, "user", req.User)
	case jsonscan.IsString(req.SafetyIdentifier):
		out = appendRaw(out, "user", req.SafetyIdentifier)
	}
	if present(req.Text) {
		out = appendResponseFormat(out, req.Text)
	}
	if info.Stream {
		out = append(out, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	out = append(out, '}')

	info.echo = appendEcho(nil, &req)
	return out, info, nil
}

func appendRaw(dst []byte, key string, v json.RawMessage) []byte {
	if !present(v) {
		return dst
	}
	dst = append(dst, ',', '"')
	dst = append(dst, key...)
	dst = append(dst, '"', ':')
	return append(dst, v...)
}

// appendResponseFormat maps text.format to response_format; "text" (the
// default) and text.verbosity have no chat counterpart and are left out.
func appendResponseFormat(dst []byte, text json.RawMessage) []byte {
	var t struct {
		Format *struct {
			Type        string          `json:"type"`
			Name        json.RawMessage `json:"name"`
			Schema      json.RawMessage `json:"schema"`
			Strict      json.RawMessage `json:"strict"`
			Description json.RawMessage `json:"description"`
		} `json:"format"`
	}
	if json.Unmarshal(text, &t) != nil || t.Format == nil {
		return dst
	}
	switch t.Format.Type {
	case "json_object":
		return append(dst, `,"response_format":{"type":"json_object"}`...)
	case "json_schema":
		dst = append(dst, `,"response_format":{"type":"json_schema","json_schema":{"name":`...)
		if jsonscan.IsString(t.Format.Name) {
			dst = append(dst, t.Format.Name...)
		} else {
			dst = append(dst, `"response"`...)
		}
		dst = appendRaw(dst, "description", t.Format.Description)
		dst = appendRaw(dst, "schema", t.Format.Schema)
		dst = appendRaw(dst, "strict", t.Format.Strict)
		return append(dst, `}}`...)
	}
	return dst
}

// customParams is the parameter schema of the chat function that stands for
// a custom (freeform) tool.
const customParams = `{"type":"object","properties":{"input":{"type":"string","description":"The complete freeform input for the tool, exactly as the tool expects it."}},"required":["input"],"additionalProperties":false}`

// appendTool appends the chat form of one Responses tool (comma-separated)
// and records its name. Tools a chat upstream cannot run are recorded in
// DroppedTools instead.
func (in *Info) appendTool(dst []byte, raw json.RawMessage, namespace string) []byte {
	var t tool
	if json.Unmarshal(raw, &t) != nil {
		return dst
	}
	switch t.Type {
	case "function", "custom":
		if t.Name == "" {
			return dst
		}
	case "namespace":
		if namespace != "" { // namespaces do not nest
			in.DroppedTools = addOnce(in.DroppedTools, "namespace")
			return dst
		}
		for _, m := range t.Tools {
			dst = in.appendTool(dst, m, t.Name)
		}
		return dst
	default:
		if t.Type == "" {
			t.Type = "unknown"
		}
		in.DroppedTools = addOnce(in.DroppedTools, t.Type)
		return dst
	}
	tn := toolName{chat: flatName(namespace, t.Name), name: t.Name, namespace: namespace}
	if t.Type == "custom" {
		tn.kind = kindCustom
	}
	in.addTool(tn)
	tn = in.tools[len(in.tools)-1]

	if len(dst) > 0 {
		dst = append(dst, ',')
	}
	dst = append(dst, `{"type":"function","function":{"name":`...)
	dst = jsonscan.AppendQuoted(dst, tn.chat)
	desc := appendToolDescription(nil, &t)
	if len(desc) > 0 {
		dst = append(dst, `,"description":`...)
		dst = jsonscan.AppendQuoted(dst, desc)
	}
	if t.Type == "custom" {
		dst = append(dst, `,"parameters":`...)
		dst = append(dst, customParams...)
	} else {
		dst = appendRaw(dst, "parameters", t.Parameters)
		dst = appendRaw(dst, "strict", t.Strict)
	}
	return append(dst, `}}`...)
}

// appendToolDescription is the tool's description; a custom tool's grammar
// or regex goes with it, since the chat model sees no other trace of it.
func appendToolDescription(dst []byte, t *tool) []byte {
	dst = jsonscan.AppendStringValue(dst, t.Description)
	if t.Type != "custom" || t.Format == nil || t.Format.Type != "grammar" || !jsonscan.IsString(t.Format.Definition) {
		return dst
	}
	if len(dst) > 0 {
		dst = append(dst, "\n\n"...)
	}
	if t.Format.Syntax == "regex" {
		dst = append(dst, "The input must match this regular expression:\n"...)
	} else {
		dst = append(dst, "The input must follow this "...)
		dst = append(dst, t.Format.Syntax...)
		dst = append(dst, " grammar:\n"...)
	}
	return jsonscan.AppendStringValue(dst, t.Format.Definition)
}

// appendToolChoice maps tool_choice. A choice of a tool that was dropped, or
// an allowed_tools list (chat has no such restriction), becomes its mode.
func (in *Info) appendToolChoice(dst []byte, v json.RawMessage) []byte {
	if jsonscan.IsString(v) {
		return append(append(dst, `,"tool_choice":`...), v...)
	}
	var c struct {
		Type      string `json:"type"`
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		Mode      string `json:"mode"`
	}
	if json.Unmarshal(v, &c) != nil {
		return dst
	}
	switch c.Type {
	case "function", "custom":
		if c.Name != "" {
			dst = append(dst, `,"tool_choice":{"type":"function","function":{"name":`...)
			dst = jsonscan.AppendQuoted(dst, in.chatName(c.Namespace, c.Name))
			return append(dst, `}}`...)
		}
	case "allowed_tools":
		if c.Mode == "required" {
			return append(dst, `,"tool_choice":"required"`...)
		}
	}
	return append(dst, `,"tool_choice":"auto"`...)
}

// messageBuilder appends chat messages. Consecutive system messages are
// joined (chat templates of local models often allow only one, first);
// consecutive tool calls, and an assistant text followed by calls, become one
// assistant message; reasoning waits for the assistant message it belongs to.
type messageBuilder struct {
	out            []byte
	start          int // where the messages array's content begins
	info           *Info
	reasoningField string

	system_   []byte // pending system text (decoded)
	asstOpen  bool   // an assistant message is open (its "content" written or not)
	asstCalls bool   // …and its "tool_calls" array is open
	reasoning []byte // pending reasoning text (decoded), for the next assistant message
}

func (mb *messageBuilder) comma() {
	if len(mb.out) > mb.start {
		mb.out = append(mb.out, ',')
	}
}

// flush closes whatever is pending.
func (mb *messageBuilder) flush() {
	if mb.system_ != nil {
		mb.comma()
		mb.out = append(mb.out, `{"role":"system","content":`...)
		mb.out = jsonscan.AppendQuoted(mb.out, mb.system_)
		mb.out = append(mb.out, '}')
		mb.system_ = nil
	}
	mb.closeAssistant()
}

func (mb *messageBuilder) closeAssistant() {
	if !mb.asstOpen {
		return
	}
	if mb.asstCalls {
		mb.out = append(mb.out, ']')
	}
	mb.out = append(mb.out, '}')
	mb.asstOpen, mb.asstCalls = false, false
}

// open starts a message of the given role; the caller appends fields after
// "role" and calls close (or leaves an assistant open).
func (mb *messageBuilder) open(role string) {
	mb.comma()
	mb.out = append(mb.out, `{"role":"`...)
	mb.out = append(mb.out, role...)
	mb.out = append(mb.out, '"')
	if role == "assistant" {
		mb.asstOpen = true
		if len(mb.reasoning) > 0 && mb.reasoningField != "" {
			mb.out = append(mb.out, ',')
			mb.out = jsonscan.AppendQuoted(mb.out, mb.reasoningField)
			mb.out = append(mb.out, ':')
			mb.out = jsonscan.AppendQuoted(mb.out, mb.reasoning)
		}
		mb.reasoning = mb.reasoning[:0]
	}
}

func (mb *messageBuilder) close() { mb.out = append(mb.out, '}') }

// system queues system text (a JSON string literal or decoded text).
func (mb *messageBuilder) system(lit []byte) {
	mb.closeAssistant()
	if mb.system_ != nil {
		mb.system_ = append(mb.system_, "\n\n"...)
	} else {
		mb.system_ = []byte{}
	}
	mb.system_ = jsonscan.AppendStringValue(mb.system_, lit)
}

func (mb *messageBuilder) item(raw json.RawMessage) error {
	var it item
	if err := json.Unmarshal(raw, &it); err != nil {
		return badRequest("invalid_value", "input", "an input item is not a valid item object")
	}
	if it.Type == "" && it.Role != "" {
		it.Type = "message"
	}
	switch it.Type {
	case "message":
		return mb.message(&it)
	case "function_call", "custom_tool_call":
		mb.toolCall(&it)
	case "function_call_output", "custom_tool_call_output":
		mb.toolOutput(&it)
	case "reasoning":
		mb.addReasoning(&it)
	case "additional_tools", "tool_search_output":
		// Their tools were gathered before the messages.
	case "item_reference":
		return badRequest("unsupported_parameter", "input", "item_reference input items are not supported by this upstream: the proxy stores no items")
	default:
		if it.Type == "" {
			it.Type = "unknown"
		}
		mb.info.DroppedItems = addOnce(mb.info.DroppedItems, it.Type)
	}
	return nil
}

func (mb *messageBuilder) message(it *item) error {
	role := it.Role
	switch role {
	case "developer", "system":
		if jsonscan.IsString(it.Content) {
			mb.system(it.Content)
			return nil
		}
		text, _, err := mb.parts(it.Content, false)
		if err != nil {
			return err
		}
		mb.closeAssistant()
		if mb.system_ != nil {
			mb.system_ = append(mb.system_, "\n\n"...)
		} else {
			mb.system_ = []byte{}
		}
		mb.system_ = append(mb.system_, text...)
		return nil
	case "user", "assistant":
	default:
		return badRequest("invalid_value", "input", "a message item has an unknown role")
	}
	mb.flush()
	if role == "user" {
		mb.reasoning = mb.reasoning[:0] // reasoning belongs to an assistant turn
	}
	mb.open(role)
	mb.out = append(mb.out, `,"content":`...)
	switch {
	case jsonscan.IsString(it.Content):
		mb.out = append(mb.out, it.Content...)
	case present(it.Content):
		text, parts, err := mb.parts(it.Content, role == "user")
		if err != nil {
			return err
		}
		if parts != nil {
			mb.out = append(mb.out, parts...)
		} else {
			mb.out = jsonscan.AppendQuoted(mb.out, text)
		}
	default:
		mb.out = append(mb.out, `""`...)
	}
	if role == "user" {
		mb.close()
	}
	return nil
}

// parts reads a content array. Text parts are joined with blank lines into
// text; when images are allowed and present, parts is a chat content array
// instead.
func (mb *messageBuilder) parts(content json.RawMessage, images bool) (text, parts []byte, err error) {
	var ps []textPart
	if json.Unmarshal(content, &ps) != nil {
		return nil, nil, badRequest("invalid_value", "input", "message content must be a string or an array of content parts")
	}
	hasImage := false
	text = []byte{}
	for i := range ps {
		p := &ps[i]
		switch p.Type {
		case "input_text", "output_text", "text", "summary_text", "reasoning_text":
			if len(text) > 0 {
				text = append(text, "\n\n"...)
			}
			text = jsonscan.AppendStringValue(text, p.Text)
		case "refusal":
			if len(text) > 0 {
				text = append(text, "\n\n"...)
			}
			text = jsonscan.AppendStringValue(text, p.Refusal)
		case "input_image":
			if images && jsonscan.IsString(p.ImageURL) {
				hasImage = true
			} else {
				mb.info.DroppedItems = addOnce(mb.info.DroppedItems, "input_image")
			}
		default:
			mb.info.DroppedItems = addOnce(mb.info.DroppedItems, p.Type)
		}
	}
	if !hasImage {
		return text, nil, nil
	}
	parts = append(parts, '[')
	for i := range ps {
		p := &ps[i]
		if len(parts) > 1 && (p.Type == "input_text" || p.Type == "input_image" && jsonscan.IsString(p.ImageURL)) {
			parts = append(parts, ',')
		}
		switch p.Type {
		case "input_text":
			parts = append(parts, `{"type":"text","text":`...)
			parts = append(parts, p.Text...)
			parts = append(parts, '}')
		case "input_image":
			if !jsonscan.IsString(p.ImageURL) {
				continue
			}
			parts = append(parts, `{"type":"image_url","image_url":{"url":`...)
			parts = append(parts, p.ImageURL...)
			if jsonscan.IsString(p.Detail) && !bytes.Equal(p.Detail, []byte(`"auto"`)) {
				parts = append(parts, `,"detail":`...)
				parts = append(parts, p.Detail...)
			}
			parts = append(parts, `}}`...)
		}
	}
	return text, append(parts, ']'), nil
}

// toolCall appends a function_call or custom_tool_call to the open assistant
// message, opening one when needed.
func (mb *messageBuilder) toolCall(it *item) {
	if mb.system_ != nil {
		mb.flush()
	}
	if !mb.asstOpen {
		mb.open("assistant")
		mb.out = append(mb.out, `,"content":null`...)
	}
	if !mb.asstCalls {
		mb.out = append(mb.out, `,"tool_calls":[`...)
		mb.asstCalls = true
	} else {
		mb.out = append(mb.out, ',')
	}
	mb.out = append(mb.out, `{"id":`...)
	mb.out = appendCallID(mb.out, it.CallID)
	mb.out = append(mb.out, `,"type":"function","function":{"name":`...)
	mb.out = jsonscan.AppendQuoted(mb.out, mb.info.chatName(it.Namespace, it.Name))
	mb.out = append(mb.out, `,"arguments":`...)
	if it.Type == "custom_tool_call" {
		// {"input": <text>} as a JSON string.
		var args []byte
		args = append(args, `{"input":`...)
		if jsonscan.IsString(it.Input) {
			args = append(args, it.Input...)
		} else {
			args = append(args, `""`...)
		}
		args = append(args, '}')
		mb.out = jsonscan.AppendQuoted(mb.out, args)
	} else if jsonscan.IsString(it.Arguments) {
		mb.out = append(mb.out, it.Arguments...)
	} else {
		mb.out = append(mb.out, `"{}"`...)
	}
	mb.out = append(mb.out, `}}`...)
}

func appendCallID(dst []byte, id json.RawMessage) []byte {
	if jsonscan.IsString(id) {
		return append(dst, id...)
	}
	return append(dst, `""`...)
}

// toolOutput appends a tool message. An output given as content parts
// becomes their text; files and images in it cannot go to a chat tool
// message and are dropped.
func (mb *messageBuilder) toolOutput(it *item) {
	mb.flush()
	mb.comma()
	mb.out = append(mb.out, `{"role":"tool","tool_call_id":`...)
	mb.out = appendCallID(mb.out, it.CallID)
	mb.out = append(mb.out, `,"content":`...)
	switch {
	case jsonscan.IsString(it.Output):
		mb.out = append(mb.out, it.Output...)
	case present(it.Output) && it.Output[0] == '[':
		text, _, err := mb.parts(it.Output, false)
		if err != nil {
			text = nil
		}
		mb.out = jsonscan.AppendQuoted(mb.out, text)
	default:
		mb.out = append(mb.out, `""`...)
	}
	mb.out = append(mb.out, '}')
}

// addReasoning keeps a reasoning item's readable text (content, else its
// summary) for the next assistant message; encrypted_content is opaque to
// any other model and is dropped.
func (mb *messageBuilder) addReasoning(it *item) {
	if mb.reasoningField == "" {
		return
	}
	var text []byte
	if present(it.Content) {
		var ps []textPart
		if json.Unmarshal(it.Content, &ps) == nil {
			for i := range ps {
				if len(text) > 0 {
					text = append(text, '\n')
				}
				text = jsonscan.AppendStringValue(text, ps[i].Text)
			}
		}
	}
	if len(text) == 0 {
		for i := range it.Summary {
			if len(text) > 0 {
				text = append(text, '\n')
			}
			text = jsonscan.AppendStringValue(text, it.Summary[i].Text)
		}
	}
	if len(text) == 0 {
		return
	}
	if len(mb.reasoning) > 0 {
		mb.reasoning = append(mb.reasoning, '\n')
	}
	mb.reasoning = append(mb.reasoning, text...)
}

// appendEcho renders the request fields a Response object repeats, as
// members without the surrounding braces. The values are compacted: a
// pretty-printed request's line breaks would end an SSE data line in the
// middle of response.created. Tools are not echoed (they can
// be tens of kilobytes and no client reads them back).
func appendEcho(dst []byte, req *request) []byte {
	field := func(key string, v json.RawMessage, def string) {
		dst = append(dst, ',', '"')
		dst = append(dst, key...)
		dst = append(dst, '"', ':')
		if present(v) {
			dst = appendCompact(dst, v)
		} else {
			dst = append(dst, def...)
		}
	}
	field("instructions", req.Instructions, "null")
	field("max_output_tokens", req.MaxOutputTokens, "null")
	field("metadata", req.Metadata, "{}")
	field("parallel_tool_calls", req.ParallelToolCalls, "true")
	field("previous_response_id", nil, "null")
	field("prompt_cache_key", req.PromptCacheKey, "null")
	field("reasoning", req.Reasoning, `{"effort":null,"summary":null}`)
	field("safety_identifier", req.SafetyIdentifier, "null")
	field("store", nil, "false")
	field("temperature", req.Temperature, "1")
	field("text", req.Text, `{"format":{"type":"text"}}`)
	field("tool_choice", req.ToolChoice, `"auto"`)
	field("tools", nil, "[]")
	field("top_p", req.TopP, "1")
	field("truncation", nil, `"disabled"`)
	field("user", req.User, "null")
	return dst
}

// appendCompact appends a raw JSON value without insignificant whitespace
// when it spans lines, else as it is.
func appendCompact(dst []byte, v json.RawMessage) []byte {
	if !bytes.ContainsAny(v, "\r\n") {
		return append(dst, v...)
	}
	buf := bytes.NewBuffer(dst)
	if json.Compact(buf, v) != nil {
		return append(dst, `null`...) // cannot happen: v was decoded from valid JSON
	}
	return buf.Bytes()
}
