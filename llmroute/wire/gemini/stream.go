package gemini

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/chatsse"
	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// maxLine bounds the bytes buffered for one upstream SSE line, for the data
// of one event and for the arguments of one tool call; a longer one is
// dropped (it cannot be a chunk this translator could use).
const maxLine = chatsse.MaxLine

// Stream translates a chat completions SSE stream into Gemini's
// streamGenerateContent?alt=sse events. Every event is exactly
//
//	data: <one-line GenerateContentResponse JSON>\r\n\r\n
//
// (Google's framing: the genai SDKs split on the blank line and reject
// comments and event: lines, and U+2028/U+2029 are escaped). A text delta
// gives one event with a text part; a reasoning delta a part with
// "thought":true when Info.IncludeThoughts, else nothing. Tool calls are
// gathered per chat index and sent whole (Gemini never streams partial
// arguments) in the final event, which also carries finishReason and
// usageMetadata, as Google's last event does:
//
//	data: {"candidates":[{"content":{"role":"model","parts":[<functionCall parts, or {"text":""}>]},"finishReason":"STOP","index":0}],"usageMetadata":{…},"modelVersion":…,"responseId":…}
//
// The final event is sent at the first of: the usage chunk after a
// finish_reason (or usage in the finish chunk itself), [DONE], Close after a
// finish_reason, Fail after a finish_reason (the answer is whole). The usage
// chunk itself is consumed. Close at EOF with neither a finish_reason nor
// [DONE] returns ErrUnfinished and emits nothing final: the answer was cut.
// An {"error":…} payload becomes an error event and ends the stream.
//
// Write accepts arbitrary chunking (byte by byte gives the same events) and
// allocates nothing per chunk once its buffers have grown (Reset keeps them,
// for pooling). Each event is handed to emit whole, once; emit's slice is
// only valid during the call. An error from emit stops the Stream: Write
// returns it from then on. A Stream is not safe for concurrent use.
type Stream struct {
	info *Info
	emit func([]byte) error
	err  error

	rd  chatsse.Reader // the upstream events
	out []byte         // event being built

	started, finished bool
	finish            []byte // the finish_reason as sent (a JSON string), nil until one came
	finishBuf         []byte
	tools             []toolState
	usage             usageCounts
	respID, model     []byte // as JSON strings
}

// toolState gathers one chat tool call.
type toolState struct {
	chatIndex int64
	id        []byte // the call's id as sent (a JSON string), empty for none
	name      []byte // JSON string, empty until one came
	args      []byte // the arguments text, unescaped
	tooLong   bool
}

// NewStream returns a Stream that emits through emit.
func NewStream(info *Info, emit func([]byte) error) *Stream {
	s := &Stream{}
	s.Reset(info, emit)
	return s
}

// Reset prepares s for a new stream, keeping its buffers (for pooling).
func (s *Stream) Reset(info *Info, emit func([]byte) error) {
	*s = Stream{
		info: info, emit: emit,
		rd: s.rd, out: s.out[:0], tools: s.tools[:0],
		respID: s.respID[:0], model: s.model[:0], finishBuf: s.finishBuf[:0],
	}
	s.rd.Reset()
}

// Finished reports whether the final event (or an error event) was emitted.
func (s *Stream) Finished() bool { return s.finished }

// Write consumes upstream bytes.
func (s *Stream) Write(p []byte) (int, error) {
	if s.err == nil {
		s.rd.Write(p, (*events)(s))
	}
	if s.err != nil {
		return 0, s.err
	}
	return len(p), nil
}

// events is the Stream as the line reader's handler.
type events Stream

func (e *events) Event(data []byte) { (*Stream)(e).dispatch(data) }
func (e *events) Stopped() bool     { return e.err != nil }

// ErrUnfinished is returned by Close when the upstream ended the stream
// with neither a finish_reason nor [DONE]: the answer was cut, and the
// caller ends the stream with Fail (or has it continued elsewhere).
var ErrUnfinished = errors.New("gemini: the chat stream ended without a finish_reason or [DONE]")

// Close sends the final event when the upstream ended without [DONE] after
// a finish_reason. Data of an unterminated last event is handled first.
func (s *Stream) Close() error {
	if s.err != nil {
		return s.err
	}
	s.rd.Close((*events)(s))
	if !s.finished && s.err == nil {
		if s.finish == nil {
			return ErrUnfinished
		}
		s.final()
	}
	return s.err
}

// Fail ends the stream for the core (the upstream broke off after the
// first byte, or stalled). After a finish_reason the answer is whole, so it
// gets its normal final event; otherwise Fail emits Google's error event:
// request_timeout as 504 DEADLINE_EXCEEDED, any other code (stream_stalled,
// stream_interrupted …) as 503 UNAVAILABLE, code as the ErrorInfo reason.
// After the end it does nothing.
func (s *Stream) Fail(code, message string) error {
	if s.err != nil || s.finished {
		return s.err
	}
	if s.finish != nil {
		s.final()
		return s.err
	}
	status := 503
	if code == "request_timeout" {
		status = 504
	}
	s.fail(status, code, message)
	return s.err
}

func (s *Stream) fail(status int, code, message string) {
	s.finished = true
	s.out = AppendErrorEvent(s.out[:0], status, code, message)
	s.send()
}

// dispatch translates one upstream event's data (trimmed by the reader:
// a payload that is not valid JSON as it stands is not a chunk, as for
// transform's think splitter, which passes such events through unsplit).
func (s *Stream) dispatch(data []byte) {
	if s.finished || s.err != nil {
		return
	}
	switch c, ok, done := chatsse.ReadChunk(data); {
	case done:
		s.final()
	case ok:
		s.chunk(c)
	}
}

// chunk handles one chat.completion.chunk (or an error payload).
func (s *Stream) chunk(c chatsse.Chunk) {
	if c.Error != nil {
		s.upstreamError(c.Error)
		return
	}
	id, model, choices, usage := c.ID, c.Model, c.Choices, c.Usage
	if !s.started {
		s.start(id, model)
	}
	gotUsage := usage != nil && usage[0] == '{'
	if gotUsage {
		s.usage.read(usage)
	}
	if choices != nil && choices[0] == '[' {
		s.choices(choices)
	}
	if s.finish != nil && gotUsage && s.err == nil {
		s.final()
	}
}

// choices handles choice 0 of a chunk (a Gemini answer has one candidate);
// a choice without an index counts as 0.
func (s *Stream) choices(choices []byte) {
	var delta, finish []byte
	ci := jsonscan.IterArray(choices, 0, false)
	var m jsonscan.Member
	var tmp [16]byte
	for {
		vs, ve, more := ci.Next()
		if !more {
			break
		}
		ch := choices[vs:ve]
		if ch[0] != '{' {
			continue
		}
		var index []byte
		it := jsonscan.IterObject(ch, 0, false)
		for it.Next(&m) {
			switch string(jsonscan.KeyOf(ch, &m, tmp[:])) {
			case "delta":
				delta = ch[m.Vs:m.Ve]
			case "finish_reason":
				finish = ch[m.Vs:m.Ve]
			case "index":
				index = ch[m.Vs:m.Ve]
			}
		}
		if index == nil || intOf(index) == 0 && index[0] == '0' {
			break
		}
		delta, finish = nil, nil
	}
	if delta != nil && delta[0] == '{' {
		s.delta(delta)
	}
	if nonEmptyString(finish) {
		s.finishBuf = append(s.finishBuf[:0], finish...)
		s.finish = s.finishBuf
	}
}

// delta emits one event for the text and thought of a delta and gathers
// its tool calls.
func (s *Stream) delta(d []byte) {
	var content, rc, reasoning, calls []byte
	it := jsonscan.IterObject(d, 0, false)
	var m jsonscan.Member
	var tmp [32]byte
	for it.Next(&m) {
		v := d[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(d, &m, tmp[:])) {
		case "content":
			content = v
		case "reasoning_content":
			rc = v
		case "reasoning":
			reasoning = v
		case "tool_calls":
			calls = v
		}
	}
	if !nonEmptyString(rc) {
		rc = reasoning
	}
	thought := s.info != nil && s.info.IncludeThoughts && nonEmptyString(rc)
	if thought || nonEmptyString(content) {
		s.out = append(s.out[:0], `data: {"candidates":[{"content":{"role":"model","parts":[`...)
		if thought {
			s.out = append(s.out, `{"text":`...)
			s.out = appendJSONText(s.out, rc)
			s.out = append(s.out, `,"thought":true}`...)
		}
		if nonEmptyString(content) {
			if thought {
				s.out = append(s.out, ',')
			}
			s.out = append(s.out, `{"text":`...)
			s.out = appendJSONText(s.out, content)
			s.out = append(s.out, '}')
		}
		s.out = append(s.out, `]},"index":0}]`...)
		s.out = s.appendTail(s.out)
		s.send()
	}
	if calls != nil && calls[0] == '[' {
		ti := jsonscan.IterArray(calls, 0, false)
		for {
			vs, ve, more := ti.Next()
			if !more {
				break
			}
			if tc := calls[vs:ve]; tc[0] == '{' {
				s.toolDelta(tc)
			}
		}
	}
}

// appendTail appends ,"modelVersion":…,"responseId":…} and the event's end.
func (s *Stream) appendTail(dst []byte) []byte {
	dst = append(dst, `,"modelVersion":`...)
	dst = appendModel(dst, s.model, s.info)
	dst = append(dst, `,"responseId":`...)
	dst = append(dst, s.respID...)
	return append(dst, "}\r\n\r\n"...)
}

// toolDelta gathers one element of delta.tool_calls.
func (s *Stream) toolDelta(tc []byte) {
	var idx, id, fn []byte
	it := jsonscan.IterObject(tc, 0, false)
	var m jsonscan.Member
	var tmp [16]byte
	for it.Next(&m) {
		v := tc[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(tc, &m, tmp[:])) {
		case "index":
			idx = v
		case "id":
			id = v
		case "function":
			fn = v
		}
	}
	var name, args []byte
	if fn != nil && fn[0] == '{' {
		name, args = jsonscan.ObjGet(fn, "name"), jsonscan.ObjGet(fn, "arguments")
	}
	t := s.toolFor(idx, id)
	if nonEmptyString(id) && len(t.id) == 0 {
		t.id = append(t.id, id...)
	}
	if nonEmptyString(name) && len(t.name) == 0 {
		t.name = append(t.name, name...)
	}
	switch {
	case t.tooLong || args == nil:
	case args[0] == '"':
		if len(t.args)+len(args) > maxLine {
			t.tooLong, t.args = true, t.args[:0]
			return
		}
		// Each fragment is a whole JSON string: unescaped, they join into
		// the arguments text.
		t.args = jsonscan.AppendUnescape(t.args, args[1:len(args)-1])
	case args[0] == '{': // some servers send the object itself
		t.args = append(t.args[:0], args...)
	}
}

// toolFor finds the call a tool_calls delta belongs to: by its index, or,
// without one (some upstreams number nothing), the last call. A delta whose
// id differs from that call's is a new call even so (the first delta of
// each call carries its id; some upstreams give every call index 0).
func (s *Stream) toolFor(idx, id []byte) *toolState {
	var found *toolState
	var ci int64
	if idx != nil {
		ci = intOf(idx)
		for i := range s.tools {
			if s.tools[i].chatIndex == ci {
				found = &s.tools[i] // the latest call with the index
			}
		}
	} else {
		ci = int64(len(s.tools))
		if len(s.tools) > 0 {
			found = &s.tools[len(s.tools)-1]
		}
	}
	if found != nil && nonEmptyString(id) && (len(found.id) > 0 || idx == nil) && !bytes.Equal(id, found.id) {
		found = nil
		for i := range s.tools {
			if bytes.Equal(s.tools[i].id, id) {
				return &s.tools[i] // an earlier call, named again
			}
		}
	}
	if found != nil {
		return found
	}
	// A new call; reuse the buffers of a pooled Stream's earlier calls.
	n := len(s.tools)
	if n < cap(s.tools) {
		s.tools = s.tools[:n+1]
		t := &s.tools[n]
		*t = toolState{chatIndex: ci, id: t.id[:0], name: t.name[:0], args: t.args[:0]}
		return t
	}
	s.tools = append(s.tools, toolState{chatIndex: ci})
	return &s.tools[n]
}

// start records the response id and model from the first chunk.
func (s *Stream) start(id, model []byte) {
	s.started = true
	if nonEmptyString(id) {
		s.respID = appendJSONText(s.respID[:0], id)
	} else {
		var b [8]byte
		_, _ = rand.Read(b[:])
		s.respID = append(s.respID[:0], '"')
		s.respID = hex.AppendEncode(s.respID, b[:])
		s.respID = append(s.respID, '"')
	}
	if nonEmptyString(model) {
		s.model = append(s.model[:0], model...)
	}
}

// final emits the last event: the gathered function calls (or an empty
// text part), finishReason and usageMetadata.
func (s *Stream) final() {
	if !s.started {
		s.start(nil, nil)
	}
	s.finished = true
	cut := jsonscan.StrIs(s.finish, true, "length")
	malformed := false
	s.out = append(s.out[:0], `data: {"candidates":[{"content":{"role":"model","parts":[`...)
	start := len(s.out)
	for i := range s.tools {
		t := &s.tools[i]
		mark := len(s.out)
		if len(s.out) > start {
			s.out = append(s.out, ',')
		}
		s.out = append(s.out, `{"functionCall":{"id":`...)
		s.out = appendCallID(s.out, t.id)
		s.out = append(s.out, `,"name":`...)
		if len(t.name) == 0 {
			s.out = append(s.out, `""`...)
		} else {
			s.out = appendJSONText(s.out, t.name)
		}
		s.out = append(s.out, `,"args":`...)
		ok := false
		switch {
		case t.tooLong:
		case len(bytes.TrimSpace(t.args)) == 0:
			s.out, ok = append(s.out, "{}"...), true
		case isObject(t.args):
			s.out, ok = appendCompact(s.out, t.args), true
		}
		if !ok {
			if !cut {
				s.out = s.out[:mark]
				malformed = true
				continue
			}
			s.out = append(s.out, "{}"...)
		}
		s.out = append(s.out, "}}"...)
	}
	if len(s.out) == start {
		s.out = append(s.out, `{"text":""}`...)
	}
	s.out = append(s.out, `]},"finishReason":"`...)
	s.out = append(s.out, finishReason(s.finish, malformed)...)
	s.out = append(s.out, `","index":0}]`...)
	if s.usage.seen {
		s.out = append(s.out, `,"usageMetadata":`...)
		s.out = s.usage.append(s.out)
	}
	s.out = s.appendTail(s.out)
	s.send()
}

// upstreamError turns an {"error":…} payload into an error event: the
// status is the error's numeric code when it is an HTTP error status, else
// 500; a string code (else type) is the ErrorInfo reason.
func (s *Stream) upstreamError(v []byte) {
	status := 500
	var msg, code, typ []byte
	if v[0] == '{' {
		msg, code, typ = jsonscan.ObjGet(v, "message"), jsonscan.ObjGet(v, "code"), jsonscan.ObjGet(v, "type")
	} else if v[0] == '"' {
		msg = v
	}
	if n := jsonscan.NumberOrNil(code); n != nil && n[0] != '-' {
		if c := intOf(n); c >= 400 && c < 600 {
			status = int(c)
		}
	}
	text := "upstream error"
	if nonEmptyString(msg) {
		text = string(jsonscan.AppendUnescape(nil, msg[1:len(msg)-1]))
	}
	var reason string
	switch {
	case nonEmptyString(code):
		reason = string(jsonscan.AppendUnescape(nil, code[1:len(code)-1]))
	case nonEmptyString(typ):
		reason = string(jsonscan.AppendUnescape(nil, typ[1:len(typ)-1]))
	}
	s.fail(status, reason, text)
}

func (s *Stream) send() {
	if s.err == nil {
		s.err = s.emit(s.out)
	}
}
