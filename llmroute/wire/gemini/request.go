package gemini

import (
	"bytes"
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// Options tune the request translation per request and upstream.
type Options struct {
	// ReasoningField names the chat field that carries an assistant
	// message's reasoning (the provider's reasoning_field, e.g.
	// "reasoning_content"). Thought parts in model turns go there,
	// concatenated. Empty (the default): thought parts are dropped.
	ReasoningField string
	// Model is the model named in the request's URL path (a Gemini body
	// has none); a response whose upstream reports no model names this one.
	Model string
	// Stream is true for streamGenerateContent (the method is in the URL,
	// not the body).
	Stream bool
}

// Info is what ToChat learned that the response translation needs. It is
// created once per request and only read afterwards.
type Info struct {
	// Model is Options.Model.
	Model string
	// Stream is Options.Stream.
	Stream bool
	// IncludeThoughts is generationConfig.thinkingConfig.includeThoughts:
	// reasoning becomes thought parts only when it is true, as Google does.
	IncludeThoughts bool
	// DroppedTools names the tools of kinds chat cannot carry
	// (googleSearch, codeExecution …), each once, in request order.
	DroppedTools []string
	// DroppedFields names the other request members that were dropped
	// although they change what the model sees or may do (part kinds,
	// allowedFunctionNames with several names, responseMimeType
	// text/x.enum), each once. Sampling knobs chat lacks (topK,
	// safetySettings …) are dropped without being named.
	DroppedFields []string
}

// Error is a request the translator refuses. The core answers it with
// ErrorBody(Status, Code, Message, 0).
type Error struct {
	Status  int
	Code    string // "" or e.g. "unsupported_parameter"
	Message string
}

func (e *Error) Error() string { return e.Message }

func badRequest(code, msg string) *Error {
	return &Error{Status: 400, Code: code, Message: msg}
}

func unsupported(msg string) *Error { return badRequest("unsupported_parameter", msg) }

// ToChat translates a Gemini generateContent request body into a chat
// completions request body without "model" (the core adds the upstream's),
// appended to dst. The body must be a JSON object with a non-empty contents
// array; what chat cannot carry without losing the prompt (cachedContent,
// files other than images, several candidates) is an *Error (400). Other
// fields chat lacks are dropped (see the package doc).
//
// The chat body's members are, in this order and when present: messages,
// max_tokens, temperature, top_p, presence_penalty, frequency_penalty, seed,
// stop, response_format, tools, tool_choice, reasoning_effort, stream,
// stream_options. Values that need no change (numbers, texts, function
// arguments, schemas already in JSON Schema form) are copied byte for byte,
// and made-up call ids are deterministic, so translating the same body twice
// gives the same bytes (upstream prefix caches stay warm).
func ToChat(dst, body []byte, opt Options) ([]byte, *Info, error) {
	n0 := len(dst)
	var r request
	if err := r.parse(body); err != nil {
		return dst, nil, err
	}
	info := &Info{Model: opt.Model, Stream: opt.Stream, IncludeThoughts: r.includeThoughts}
	if r.cachedContent {
		return dst, nil, unsupported("cachedContent cannot be used on this model's upstream (the cached prompt is stored at Google)")
	}
	if r.candidateCount != nil && intOf(r.candidateCount) > 1 {
		return dst, nil, unsupported("candidateCount above 1 is not supported on this model's upstream")
	}

	dst = append(dst, `{"messages":`...)
	var err *Error
	w := msgWriter{dst: dst, opt: &opt, info: info}
	if err = w.messages(r.system, r.contents, true); err != nil {
		return dst[:n0], nil, err
	}
	dst = w.dst
	for _, f := range [...]struct {
		key string
		v   []byte
	}{{"max_tokens", r.maxTokens}, {"temperature", r.temperature}, {"top_p", r.topP},
		{"presence_penalty", r.presence}, {"frequency_penalty", r.frequency}, {"seed", r.seed}, {"stop", r.stop}} {
		if f.v != nil {
			dst = append(dst, `,"`...)
			dst = append(dst, f.key...)
			dst = append(dst, `":`...)
			dst = append(dst, f.v...)
		}
	}
	dst = r.appendResponseFormat(dst, info)
	if r.tools != nil {
		mark := len(dst)
		dst = append(dst, `,"tools":`...)
		var any bool
		if dst, any = appendTools(dst, r.tools, info); !any {
			dst = dst[:mark] // only tools chat cannot carry: no tools at all
		} else if r.toolConfig != nil {
			dst = appendToolChoice(dst, r.toolConfig, info)
		}
	}
	if e := r.effort(); e != "" {
		dst = append(dst, `,"reasoning_effort":"`...)
		dst = append(dst, e...)
		dst = append(dst, '"')
	}
	if opt.Stream {
		dst = append(dst, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	return append(dst, '}'), info, nil
}

// SessionBody appends {"messages":[…]} for session hashing: the chat
// messages ToChat would send, without the system instruction and without
// reasoning (whatever the upstream's reasoning field). Sessions.ID over this
// body gives the same id for a native and a translated attempt of one
// conversation.
func SessionBody(dst, body []byte) ([]byte, error) {
	var r request
	if err := r.parse(body); err != nil {
		return dst, err
	}
	n0 := len(dst)
	dst = append(dst, `{"messages":`...)
	w := msgWriter{dst: dst, opt: &Options{}, info: &Info{}}
	if err := w.messages(nil, r.contents, false); err != nil {
		return dst[:n0], err
	}
	return append(w.dst, '}'), nil
}

// request holds the raw values of the Gemini fields ToChat reads.
type request struct {
	system, contents, tools, toolConfig []byte
	cachedContent                       bool

	// generationConfig
	maxTokens, temperature, topP, presence, frequency, seed, stop []byte
	candidateCount, mime, jsonSchema, schema                      []byte
	thinkingLevel, thinkingBudget                                 []byte
	includeThoughts                                               bool
}

func (r *request) parse(body []byte) *Error {
	i := jsonscan.SkipWS(body, 0)
	if !jsonscan.Valid(body) {
		return badRequest("", "request body is not valid JSON")
	}
	if body[i] != '{' {
		return badRequest("", "request body must be a JSON object")
	}
	obj := body[i:]
	it := jsonscan.IterObject(obj, 0, false)
	var m jsonscan.Member
	var tmp [32]byte
	for it.Next(&m) {
		v := obj[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(obj, &m, tmp[:])) {
		case "contents":
			r.contents = v
		case "systemInstruction", "system_instruction":
			r.system = v
		case "tools":
			r.tools = nil
			if v[0] == '[' {
				r.tools = v
			}
		case "toolConfig", "tool_config":
			r.toolConfig = nil
			if v[0] == '{' {
				r.toolConfig = v
			}
		case "cachedContent", "cached_content":
			r.cachedContent = nonEmptyString(v)
		case "generationConfig", "generation_config":
			if v[0] == '{' {
				r.generationConfig(v)
			}
		}
	}
	if r.contents == nil || r.contents[0] != '[' || jsonscan.IsEmptyArray(r.contents) {
		return badRequest("", "contents is not specified")
	}
	return nil
}

func (r *request) generationConfig(g []byte) {
	it := jsonscan.IterObject(g, 0, false)
	var m jsonscan.Member
	var tmp [32]byte
	for it.Next(&m) {
		v := g[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(g, &m, tmp[:])) {
		case "maxOutputTokens":
			r.maxTokens = jsonscan.NumberOrNil(v)
		case "temperature":
			r.temperature = jsonscan.NumberOrNil(v)
		case "topP":
			r.topP = jsonscan.NumberOrNil(v)
		case "presencePenalty":
			r.presence = jsonscan.NumberOrNil(v)
		case "frequencyPenalty":
			r.frequency = jsonscan.NumberOrNil(v)
		case "seed":
			r.seed = jsonscan.NumberOrNil(v)
		case "stopSequences":
			r.stop = nil
			if v[0] == '[' && !jsonscan.IsEmptyArray(v) {
				r.stop = v
			}
		case "candidateCount":
			r.candidateCount = jsonscan.NumberOrNil(v)
		case "responseMimeType":
			r.mime = nil
			if v[0] == '"' {
				r.mime = v
			}
		case "responseJsonSchema", "_responseJsonSchema":
			r.jsonSchema = nil
			if v[0] == '{' {
				r.jsonSchema = v
			}
		case "responseSchema":
			r.schema = nil
			if v[0] == '{' {
				r.schema = v
			}
		case "thinkingConfig":
			if v[0] != '{' {
				continue
			}
			r.includeThoughts = string(jsonscan.ObjGet(v, "includeThoughts")) == "true"
			r.thinkingLevel, r.thinkingBudget = nil, nil
			if l := jsonscan.ObjGet(v, "thinkingLevel"); l != nil && l[0] == '"' {
				r.thinkingLevel = l
			}
			r.thinkingBudget = jsonscan.NumberOrNil(jsonscan.ObjGet(v, "thinkingBudget"))
		}
	}
}

// effort maps thinkingConfig to reasoning_effort: thinkingLevel MINIMAL,
// LOW, MEDIUM as such, HIGH and XHIGH → high; else thinkingBudget 0 or -1
// (off, dynamic) → nothing, < 2048 low, < 4096 medium, else high.
func (r *request) effort() string {
	if r.thinkingLevel != nil {
		var tmp [32]byte
		l := bytes.ToUpper(jsonscan.AppendStringValue(tmp[:0], r.thinkingLevel))
		switch string(l) {
		case "MINIMAL":
			return "minimal"
		case "LOW":
			return "low"
		case "MEDIUM":
			return "medium"
		case "HIGH", "XHIGH":
			return "high"
		}
	}
	b := r.thinkingBudget
	if b == nil || b[0] == '-' {
		return ""
	}
	switch n := intOf(b); {
	case n == 0:
		return ""
	case n < 2048:
		return "low"
	case n < 4096:
		return "medium"
	}
	return "high"
}

// appendResponseFormat appends ,"response_format":… for JSON mode.
func (r *request) appendResponseFormat(dst []byte, info *Info) []byte {
	if r.mime == nil {
		return dst
	}
	var tmp [64]byte
	mime := bytes.ToLower(bytes.TrimSpace(jsonscan.AppendStringValue(tmp[:0], r.mime)))
	switch string(mime) {
	case "application/json":
	case "text/x.enum":
		info.dropField("generationConfig.responseMimeType")
		return dst
	default:
		return dst
	}
	s := r.jsonSchema
	if s == nil {
		s = r.schema
	}
	if s == nil {
		return append(dst, `,"response_format":{"type":"json_object"}`...)
	}
	dst = append(dst, `,"response_format":{"type":"json_schema","json_schema":{"name":"response","schema":`...)
	dst = appendSchema(dst, s)
	return append(dst, `,"strict":false}}`...)
}

func (info *Info) dropField(name string) {
	for _, f := range info.DroppedFields {
		if f == name {
			return
		}
	}
	info.DroppedFields = append(info.DroppedFields, name)
}

func (info *Info) dropTool(name string) {
	for _, f := range info.DroppedTools {
		if f == name {
			return
		}
	}
	info.DroppedTools = append(info.DroppedTools, name)
}

// call is a function call of the latest model turn, for giving a
// functionResponse without id the id of its call.
type call struct {
	id       []byte // the id as written to chat, a JSON string
	name     []byte // raw JSON string
	answered bool
}

// msgWriter appends chat messages to dst.
type msgWriter struct {
	dst   []byte
	opt   *Options
	info  *Info
	n     int    // messages written
	calls []call // of the latest model turn
	idBuf []byte // made-up ids live here (calls point into it)
}

// messages writes the messages array: the system message (when withSystem),
// then one or more messages per content.
func (w *msgWriter) messages(system, contents []byte, withSystem bool) *Error {
	w.dst = append(w.dst, '[')
	if withSystem && system != nil {
		w.system(system)
	}
	it := jsonscan.IterArray(contents, 0, false)
	for ci := 0; ; ci++ {
		vs, ve, more := it.Next()
		if !more {
			break
		}
		if err := w.content(ci, contents[vs:ve]); err != nil {
			return err
		}
	}
	w.dst = append(w.dst, ']')
	return nil
}

// open starts a message of role; the caller writes the content value next.
func (w *msgWriter) open(role string) {
	if w.n > 0 {
		w.dst = append(w.dst, ',')
	}
	w.n++
	w.dst = append(w.dst, `{"role":"`...)
	w.dst = append(w.dst, role...)
	w.dst = append(w.dst, `","content":`...)
}

// system writes the system message: a bare string, or a content whose
// text parts are joined by "\n" (its role, "user" from Gemini CLI, is
// ignored). Other parts are dropped; no text, no message.
func (w *msgWriter) system(v []byte) {
	if v[0] == '"' {
		if len(v) > 2 {
			w.open("system")
			w.dst = append(w.dst, v...)
			w.dst = append(w.dst, '}')
		}
		return
	}
	if v[0] != '{' {
		return
	}
	parts := jsonscan.ObjGet(v, "parts")
	if parts == nil || parts[0] != '[' {
		return
	}
	mark, n := len(w.dst), w.n
	w.open("system")
	w.dst = append(w.dst, '"')
	start := len(w.dst)
	eachObject(parts, func(p []byte) {
		kind, text := partKind(p)
		if kind != kindText && kind != kindThought {
			if n := kindName(p); n != "" {
				w.info.dropField("systemInstruction." + n)
			}
			return
		}
		if len(w.dst) > start {
			w.dst = append(w.dst, `\n`...)
		}
		w.dst = append(w.dst, text[1:len(text)-1]...)
	})
	if len(w.dst) == start {
		w.dst, w.n = w.dst[:mark], n
		return
	}
	w.dst = append(w.dst, `"}`...)
}

// content translates one Gemini content into chat messages.
func (w *msgWriter) content(ci int, c []byte) *Error {
	if c[0] != '{' {
		return badRequest("", "contents["+strconv.Itoa(ci)+"] must be an object")
	}
	var role, parts []byte
	it := jsonscan.IterObject(c, 0, false)
	var m jsonscan.Member
	for it.Next(&m) {
		switch {
		case jsonscan.KeyIs(c, &m, "role"):
			role = c[m.Vs:m.Ve]
		case jsonscan.KeyIs(c, &m, "parts"):
			parts = c[m.Vs:m.Ve]
		}
	}
	if parts == nil || parts[0] == 'n' {
		return nil // a content without parts says nothing
	}
	if parts[0] != '[' {
		return badRequest("", "contents["+strconv.Itoa(ci)+"].parts must be an array")
	}
	switch {
	case jsonscan.StrIs(role, true, "model"):
		return w.model(ci, parts)
	case role == nil || string(role) == "null", jsonscan.StrIs(role, true, "user"),
		jsonscan.StrIs(role, true, "function"), jsonscan.StrIs(role, true, "tool"):
		return w.user(ci, parts)
	}
	return badRequest("", "contents["+strconv.Itoa(ci)+"].role must be user or model")
}

// part kinds.
const (
	kindOther = iota
	kindText
	kindThought
	kindInline
	kindFile
	kindCall
	kindResponse
)

// partKind tells what a part holds; text is the raw text string of text
// and thought parts.
func partKind(p []byte) (kind int, text []byte) {
	var thought bool
	it := jsonscan.IterObject(p, 0, false)
	var m jsonscan.Member
	var tmp [32]byte
	for it.Next(&m) {
		v := p[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(p, &m, tmp[:])) {
		case "text":
			if v[0] == '"' {
				text = v
			}
		case "thought":
			thought = string(v) == "true"
		case "inlineData", "inline_data":
			kind = kindInline
		case "fileData", "file_data":
			kind = kindFile
		case "functionCall", "function_call":
			kind = kindCall
		case "functionResponse", "function_response":
			kind = kindResponse
		}
	}
	if kind != kindOther {
		return kind, nil
	}
	if text != nil {
		if thought {
			return kindThought, text
		}
		return kindText, text
	}
	return kindOther, nil
}

// kindName names a part of a kind chat cannot carry by its first member
// that is not thought, thoughtSignature or partMetadata (executableCode,
// codeExecutionResult, videoMetadata …), for Info.DroppedFields; "" for a
// part with nothing else.
func kindName(p []byte) string {
	it := jsonscan.IterObject(p, 0, false)
	var m jsonscan.Member
	var tmp [32]byte
	for it.Next(&m) {
		switch k := jsonscan.KeyOf(p, &m, tmp[:]); string(k) {
		case "thought", "thoughtSignature", "thought_signature", "partMetadata", "part_metadata":
		default:
			return string(k)
		}
	}
	return "" // a bare signature: nothing was lost
}

// user writes one tool message per functionResponse part, then one user
// message with the other parts (texts joined by "\n"; with images, content
// parts). Chat wants tool messages right after the assistant message that
// called the tools, so they go first.
func (w *msgWriter) user(ci int, parts []byte) *Error {
	images := false // the user message needs the content-parts form
	rest := 0       // parts for the user message
	var err *Error
	pi := -1
	eachObject(parts, func(p []byte) {
		pi++
		if err != nil {
			return
		}
		kind, _ := partKind(p)
		switch kind {
		case kindText, kindThought:
			rest++
		case kindInline, kindFile:
			if err = checkMedia(p); err == nil {
				images = true
				rest++
			}
		case kindResponse:
			var imgs bool
			if imgs, err = w.toolMessage(ci, pi, p); imgs {
				images = true
				rest++
			}
		default:
			if n := kindName(p); n != "" {
				w.info.dropField(n)
			}
		}
	})
	if err != nil || rest == 0 {
		return err
	}
	w.open("user")
	if !images {
		w.dst = append(w.dst, '"')
		start := len(w.dst)
		eachObject(parts, func(p []byte) {
			if kind, text := partKind(p); kind == kindText || kind == kindThought {
				if len(w.dst) > start {
					w.dst = append(w.dst, `\n`...)
				}
				w.dst = append(w.dst, text[1:len(text)-1]...)
			}
		})
		w.dst = append(w.dst, `"}`...)
		return nil
	}
	w.dst = append(w.dst, '[')
	start := len(w.dst)
	eachObject(parts, func(p []byte) {
		switch kind, text := partKind(p); kind {
		case kindText, kindThought:
			w.comma(start)
			w.dst = append(w.dst, `{"type":"text","text":`...)
			w.dst = append(w.dst, text...)
			w.dst = append(w.dst, '}')
		case kindInline, kindFile:
			w.comma(start)
			w.image(p)
		case kindResponse:
			// Images a function returned: chat's tool messages carry text
			// only, so they follow in the user message.
			fr := jsonscan.ObjGet(p, "functionResponse")
			if fr == nil {
				fr = jsonscan.ObjGet(p, "function_response")
			}
			if rp := jsonscan.ObjGet(fr, "parts"); rp != nil && rp[0] == '[' {
				eachObject(rp, func(q []byte) {
					if k, _ := partKind(q); k == kindInline || k == kindFile {
						w.comma(start)
						w.image(q)
					}
				})
			}
		}
	})
	w.dst = append(w.dst, "]}"...)
	return nil
}

func (w *msgWriter) comma(start int) {
	if len(w.dst) > start {
		w.dst = append(w.dst, ',')
	}
}

// media returns the mimeType and data (inlineData) or fileUri (fileData)
// raw strings of a media part; nil when absent.
func media(p []byte) (mime, data []byte, file bool) {
	d := jsonscan.ObjGet(p, "inlineData")
	if d == nil {
		d = jsonscan.ObjGet(p, "inline_data")
	}
	if d == nil {
		file = true
		if d = jsonscan.ObjGet(p, "fileData"); d == nil {
			d = jsonscan.ObjGet(p, "file_data")
		}
	}
	if d == nil || d[0] != '{' {
		return nil, nil, file
	}
	mime = jsonscan.ObjGet(d, "mimeType")
	if mime == nil {
		mime = jsonscan.ObjGet(d, "mime_type")
	}
	if file {
		if data = jsonscan.ObjGet(d, "fileUri"); data == nil {
			data = jsonscan.ObjGet(d, "file_uri")
		}
	} else {
		data = jsonscan.ObjGet(d, "data")
	}
	if mime == nil || mime[0] != '"' {
		mime = nil
	}
	if data == nil || data[0] != '"' {
		data = nil
	}
	return mime, data, file
}

// checkMedia refuses media chat cannot carry: only images are sent, inline
// as a data URL or as an http(s) URL. A silently lost file (a PDF, audio)
// would give a wrong answer, so anything else is a 400.
func checkMedia(p []byte) *Error {
	mime, data, file := media(p)
	var tmp [64]byte
	mt := jsonscan.AppendStringValue(tmp[:0], mime)
	what := "inlineData"
	if file {
		what = "fileData"
	}
	if !bytes.HasPrefix(bytes.ToLower(mt), []byte("image/")) {
		if len(mt) == 0 {
			mt = append(mt, "unknown"...)
		}
		return unsupported(what + " of type " + string(mt) + " cannot be sent to this model's upstream (only images can)")
	}
	if data == nil {
		return badRequest("", what+": data is required")
	}
	if file {
		var u [8]byte
		s := bytes.ToLower(jsonscan.AppendStringValue(u[:0], data[:min(len(data), 9)]))
		if !bytes.HasPrefix(s, []byte("http://")) && !bytes.HasPrefix(s, []byte("https:/")) {
			return unsupported("fileData: only http(s) image URLs can be sent to this model's upstream")
		}
	}
	return nil
}

// image appends an image_url content part for a checked media part.
func (w *msgWriter) image(p []byte) {
	mime, data, file := media(p)
	if mime == nil || data == nil {
		return
	}
	w.dst = append(w.dst, `{"type":"image_url","image_url":{"url":`...)
	if file {
		w.dst = append(w.dst, data...)
	} else {
		w.dst = append(w.dst, `"data:`...)
		w.dst = append(w.dst, mime[1:len(mime)-1]...)
		w.dst = append(w.dst, `;base64,`...)
		w.dst = append(w.dst, data[1:len(data)-1]...)
		w.dst = append(w.dst, '"')
	}
	w.dst = append(w.dst, "}}"...)
}

// toolMessage writes the tool message of one functionResponse part; imgs
// reports image parts in it, which the user message carries.
func (w *msgWriter) toolMessage(ci, pi int, p []byte) (imgs bool, err *Error) {
	fr := jsonscan.ObjGet(p, "functionResponse")
	if fr == nil {
		fr = jsonscan.ObjGet(p, "function_response")
	}
	if fr == nil || fr[0] != '{' {
		return false, badRequest("", "functionResponse must be an object")
	}
	var id, name, resp, parts []byte
	it := jsonscan.IterObject(fr, 0, false)
	var m jsonscan.Member
	var tmp [16]byte
	for it.Next(&m) {
		v := fr[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(fr, &m, tmp[:])) {
		case "id":
			id = v
		case "name":
			name = v
		case "response":
			resp = v
		case "parts":
			parts = v
		}
	}
	if parts != nil && parts[0] == '[' {
		eachObject(parts, func(q []byte) {
			if k, _ := partKind(q); (k == kindInline || k == kindFile) && err == nil {
				if err = checkMedia(q); err == nil {
					imgs = true
				}
			}
		})
		if err != nil {
			return false, err
		}
	}
	if w.n > 0 {
		w.dst = append(w.dst, ',')
	}
	w.n++
	w.dst = append(w.dst, `{"role":"tool","tool_call_id":`...)
	w.dst = w.responseID(id, name, ci, pi)
	w.dst = append(w.dst, `,"content":`...)
	w.dst = appendResponseText(w.dst, resp)
	w.dst = append(w.dst, '}')
	return imgs, nil
}

// responseID appends the tool_call_id of a functionResponse: its own id;
// without one, the id of the earliest unanswered call of the same name in
// the latest model turn; else a made-up call_<content>_<part>.
func (w *msgWriter) responseID(id, name []byte, ci, pi int) []byte {
	if nonEmptyString(id) {
		for i := range w.calls {
			if !w.calls[i].answered && bytes.Equal(w.calls[i].id, id) {
				w.calls[i].answered = true
				break
			}
		}
		return append(w.dst, id...)
	}
	for i := range w.calls {
		if c := &w.calls[i]; !c.answered && name != nil && bytes.Equal(c.name, name) {
			c.answered = true
			return append(w.dst, c.id...)
		}
	}
	return appendMadeUpID(w.dst, ci, pi)
}

// appendMadeUpID appends "call_<ci>_<pi>": deterministic, so the same
// history gives the same bytes every turn.
func appendMadeUpID(dst []byte, ci, pi int) []byte {
	dst = append(dst, `"call_`...)
	dst = strconv.AppendInt(dst, int64(ci), 10)
	dst = append(dst, '_')
	dst = strconv.AppendInt(dst, int64(pi), 10)
	return append(dst, '"')
}

// appendResponseText appends a functionResponse.response as the tool
// message's content string: the string of {"output":<string>} alone, that
// of {"error":<string>} alone with "Error: " before it, else the object's
// JSON (absent: "").
func appendResponseText(dst, resp []byte) []byte {
	if resp == nil || resp[0] == 'n' {
		return append(dst, `""`...)
	}
	if resp[0] == '{' {
		var key, val []byte
		n := 0
		it := jsonscan.IterObject(resp, 0, false)
		var m jsonscan.Member
		for it.Next(&m) {
			n++
			key, val = resp[m.Ks:m.Ke], resp[m.Vs:m.Ve]
		}
		if n == 1 && val[0] == '"' {
			switch string(key) {
			case "output":
				return append(dst, val...)
			case "error":
				dst = append(dst, `"Error: `...)
				dst = append(dst, val[1:]...)
				return dst
			}
		}
	}
	return jsonscan.AppendQuoted(dst, resp)
}

// model writes one assistant message: texts concatenated as content (no
// separator: a streamed answer may be stored as many text parts), function
// calls as tool_calls, thought texts in opt.ReasoningField. A turn with none
// of these writes nothing.
func (w *msgWriter) model(ci int, parts []byte) *Error {
	w.calls = w.calls[:0]
	w.idBuf = w.idBuf[:0]
	text, calls, thoughts := false, false, false
	pi := -1
	eachObject(parts, func(p []byte) {
		pi++
		switch kind, t := partKind(p); kind {
		case kindText:
			text = text || len(t) > 2
		case kindThought:
			thoughts = thoughts || len(t) > 2
		case kindCall:
			calls = true
		default:
			if n := kindName(p); n != "" {
				w.info.dropField(n)
			}
		}
	})
	field := w.opt.ReasoningField
	if !text && !calls {
		return nil // thought-only or empty turns carry nothing chat keeps
	}
	w.open("assistant")
	if text {
		w.dst = append(w.dst, '"')
		eachObject(parts, func(p []byte) {
			if kind, t := partKind(p); kind == kindText {
				w.dst = append(w.dst, t[1:len(t)-1]...)
			}
		})
		w.dst = append(w.dst, '"')
	} else {
		w.dst = append(w.dst, "null"...)
	}
	if calls {
		w.dst = append(w.dst, `,"tool_calls":[`...)
		start := len(w.dst)
		var err *Error
		pi = -1
		eachObject(parts, func(p []byte) {
			pi++
			if kind, _ := partKind(p); kind != kindCall || err != nil {
				return
			}
			fc := jsonscan.ObjGet(p, "functionCall")
			if fc == nil {
				fc = jsonscan.ObjGet(p, "function_call")
			}
			var id, name, args []byte
			if fc != nil && fc[0] == '{' {
				id, name, args = jsonscan.ObjGet(fc, "id"), jsonscan.ObjGet(fc, "name"), jsonscan.ObjGet(fc, "args")
			}
			if !nonEmptyString(name) {
				err = badRequest("", "functionCall: name is required")
				return
			}
			w.comma(start)
			w.dst = append(w.dst, `{"id":`...)
			idAt := len(w.dst)
			if nonEmptyString(id) {
				w.dst = append(w.dst, id...)
			} else {
				w.dst = appendMadeUpID(w.dst, ci, pi)
			}
			w.calls = append(w.calls, call{id: w.dst[idAt:len(w.dst):len(w.dst)], name: name})
			w.dst = append(w.dst, `,"type":"function","function":{"name":`...)
			w.dst = append(w.dst, name...)
			w.dst = append(w.dst, `,"arguments":`...)
			if args == nil || args[0] == 'n' {
				args = []byte("{}")
			}
			w.dst = jsonscan.AppendQuoted(w.dst, args)
			w.dst = append(w.dst, "}}"...)
		})
		if err != nil {
			return err
		}
		w.dst = append(w.dst, ']')
		// The ids point into w.dst, which may move as it grows: keep copies.
		for i := range w.calls {
			k := len(w.idBuf)
			w.idBuf = append(w.idBuf, w.calls[i].id...)
			w.calls[i].id = w.idBuf[k:len(w.idBuf):len(w.idBuf)]
		}
	}
	if field != "" && thoughts {
		w.dst = append(w.dst, ',')
		w.dst = jsonscan.AppendQuoted(w.dst, field)
		w.dst = append(w.dst, `:"`...)
		eachObject(parts, func(p []byte) {
			if kind, t := partKind(p); kind == kindThought {
				w.dst = append(w.dst, t[1:len(t)-1]...)
			}
		})
		w.dst = append(w.dst, '"')
	}
	w.dst = append(w.dst, '}')
	return nil
}

// eachObject calls fn with every object element of the array arr.
func eachObject(arr []byte, fn func(obj []byte)) {
	it := jsonscan.IterArray(arr, 0, false)
	for {
		vs, ve, more := it.Next()
		if !more {
			return
		}
		if o := arr[vs:ve]; o[0] == '{' {
			fn(o)
		}
	}
}

// appendTools appends the chat tools array: one function per
// functionDeclarations entry. Tool kinds chat has no form for are named in
// info.DroppedTools; any is false when no function was written.
func appendTools(dst, tools []byte, info *Info) ([]byte, bool) {
	dst = append(dst, '[')
	start := len(dst)
	eachObject(tools, func(t []byte) {
		it := jsonscan.IterObject(t, 0, false)
		var m jsonscan.Member
		var tmp [32]byte
		for it.Next(&m) {
			v := t[m.Vs:m.Ve]
			switch k := jsonscan.KeyOf(t, &m, tmp[:]); string(k) {
			case "functionDeclarations", "function_declarations":
				if v[0] != '[' {
					continue
				}
				eachObject(v, func(fd []byte) {
					dst = appendFunction(dst, fd, start)
				})
			default:
				info.dropTool(string(k))
			}
		}
	})
	return append(dst, ']'), len(dst) > start
}

// appendFunction appends one chat function tool for a declaration with a
// name; its parameters are parametersJsonSchema, else parameters (both
// normalized to JSON Schema), else an empty object schema.
func appendFunction(dst, fd []byte, start int) []byte {
	var name, desc, pjs, params []byte
	it := jsonscan.IterObject(fd, 0, false)
	var m jsonscan.Member
	var tmp [32]byte
	for it.Next(&m) {
		v := fd[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(fd, &m, tmp[:])) {
		case "name":
			name = v
		case "description":
			desc = v
		case "parametersJsonSchema", "parameters_json_schema":
			pjs = v
		case "parameters":
			params = v
		}
	}
	if !nonEmptyString(name) {
		return dst
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
	switch {
	case pjs != nil && pjs[0] == '{':
		dst = appendSchema(dst, pjs)
	case params != nil && params[0] == '{':
		dst = appendSchema(dst, params)
	default:
		dst = append(dst, `{"type":"object","properties":{}}`...)
	}
	return append(dst, "}}"...)
}

// appendToolChoice appends ,"tool_choice":… from
// toolConfig.functionCallingConfig.
func appendToolChoice(dst, tc []byte, info *Info) []byte {
	fcc := jsonscan.ObjGet(tc, "functionCallingConfig")
	if fcc == nil || fcc[0] != '{' {
		return dst
	}
	mode := jsonscan.ObjGet(fcc, "mode")
	var names [2][]byte
	n := 0
	if a := jsonscan.ObjGet(fcc, "allowedFunctionNames"); a != nil && a[0] == '[' {
		jsonscan.EachElem(a, 0, func(vs, ve int) bool {
			if a[vs] == '"' {
				if n < 2 {
					names[n] = a[vs:ve]
				}
				n++
			}
			return true
		})
	}
	if n >= 2 {
		info.dropField("toolConfig.functionCallingConfig.allowedFunctionNames")
	}
	switch {
	case jsonscan.StrIs(mode, true, "AUTO"), jsonscan.StrIs(mode, true, "VALIDATED"):
		return append(dst, `,"tool_choice":"auto"`...)
	case jsonscan.StrIs(mode, true, "NONE"):
		return append(dst, `,"tool_choice":"none"`...)
	case jsonscan.StrIs(mode, true, "ANY"):
		if n == 1 {
			dst = append(dst, `,"tool_choice":{"type":"function","function":{"name":`...)
			dst = append(dst, names[0]...)
			return append(dst, "}}"...)
		}
		return append(dst, `,"tool_choice":"required"`...)
	}
	return dst
}
