package anthropic

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/chatsse"
	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// block kinds of the open content block.
const (
	blockNone = iota
	blockThinking
	blockText
	blockTool
)

// Stream translates a chat completions SSE stream into the Anthropic
// Messages event sequence:
//
//	message_start, ping,
//	(content_block_start, content_block_delta…, content_block_stop)…,
//	message_delta (stop_reason, usage), message_stop
//
// Every event carries its SSE "event:" name equal to its "type" (the Go SDK
// skips unnamed events). Blocks are opened in the order their deltas arrive:
// a thinking block (reasoning_content or reasoning deltas) ends with an empty
// signature_delta; a text block; one tool_use block per tool call index,
// started with "input":{} and filled by input_json_delta partial_json. The
// usage chunk a chat upstream sends last (stream_options.include_usage) is
// consumed: its counts go into message_delta. [DONE] (or Close at EOF after
// a finish_reason) finishes the message; Close at EOF with neither returns
// ErrUnfinished and emits nothing final: the answer was cut. An {"error":…}
// payload becomes an "event: error" and ends the stream.
//
// Write accepts arbitrary chunking (byte by byte gives the same events). Each
// event is handed to emit whole, once; emit's slice is only valid during the
// call. An error from emit stops the Stream: Write returns it from then on.
// A Stream is not safe for concurrent use.
type Stream struct {
	info *Info
	emit func([]byte) error
	err  error

	rd  chatsse.Reader // the upstream events
	out []byte         // event being built

	started, finished bool
	open              int // blockNone … blockTool
	index             int // index of the open (or last) block
	blocks            int // blocks started: the next block's index
	tools             []toolState
	stop              string // from the finish_reason, "" until one came
	usage             usageCounts
	msgID, model      []byte
}

// toolState maps a chat tool call (its tool_calls index and id) to its
// content block index.
type toolState struct {
	chatIndex int64
	block     int
	id        []byte // the call's id as sent (a JSON string), nil for none
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
		msgID: s.msgID[:0], model: s.model[:0],
	}
	s.rd.Reset()
}

// Finished reports whether message_stop (or an error event) was emitted.
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
var ErrUnfinished = errors.New("anthropic: the chat stream ended without a finish_reason or [DONE]")

// Close finishes the message when the upstream ended without [DONE] after
// a finish_reason. Data of an unterminated last event is handled first.
func (s *Stream) Close() error {
	if s.err != nil {
		return s.err
	}
	s.rd.Close((*events)(s))
	if !s.finished && s.err == nil {
		if s.stop == "" {
			return ErrUnfinished
		}
		s.finish()
	}
	return s.err
}

// Fail emits Anthropic's stream error event (the core calls it when the
// upstream broke off after the first byte) and finishes the stream. code
// is carried as error.code when not empty.
func (s *Stream) Fail(code, message string) error {
	if s.err != nil || s.finished {
		return s.err // after message_stop the client has a whole message
	}
	s.finished = true
	s.out = append(s.out[:0], "event: error\ndata: "...)
	s.out = appendErrorJSON(s.out, "api_error", code, message)
	s.out = append(s.out, "\n\n"...)
	s.send()
	return s.err
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
		s.finish()
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
		if nonEmptyString(id) {
			s.msgID = append(s.msgID[:0], id...)
		}
		if nonEmptyString(model) {
			s.model = append(s.model[:0], model...)
		}
		s.start()
	}
	if usage != nil && usage[0] == '{' {
		s.usage.read(usage)
	}
	if choices == nil || choices[0] != '[' {
		return
	}
	// Only choice 0 is translated (a Messages answer has one); a choice
	// without an index counts as 0.
	var delta, finish []byte
	ci := jsonscan.IterArray(choices, 0, false)
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
		var m jsonscan.Member
		var tmp [16]byte
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
		s.stop = stopReason(finish, len(s.tools) > 0)
	}
}

// delta emits the events for one choice delta, in the order reasoning,
// content, tool calls.
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
	if nonEmptyString(rc) {
		if s.open != blockThinking {
			s.openBlock(blockThinking, `{"type":"thinking","thinking":"","signature":""}`)
		}
		s.blockDelta(s.index, `{"type":"thinking_delta","thinking":`, rc)
	}
	if nonEmptyString(content) {
		if s.open != blockText {
			s.openBlock(blockText, `{"type":"text","text":""}`)
		}
		s.blockDelta(s.index, `{"type":"text_delta","text":`, content)
	}
	if calls != nil && calls[0] == '[' {
		ti := jsonscan.IterArray(calls, 0, false)
		for s.err == nil {
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

// toolDelta handles one element of delta.tool_calls.
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
	ci, block := s.toolFor(idx, id)
	if block < 0 {
		// A new call: its first delta carries id and name.
		s.out = append(s.out[:0], `{"type":"tool_use","id":`...)
		s.out = appendToolID(s.out, id)
		s.out = append(s.out, `,"name":`...)
		if name == nil || name[0] != '"' {
			name = []byte(`""`)
		}
		s.out = append(s.out, name...)
		s.out = append(s.out, `,"input":{}}`...)
		s.openBlockRaw(blockTool)
		block = s.index
		var tid []byte
		if nonEmptyString(id) {
			tid = append(tid, id...)
		}
		s.tools = append(s.tools, toolState{chatIndex: ci, block: block, id: tid})
	}
	if nonEmptyString(args) {
		// A delta for a call whose block was closed (interleaved calls)
		// still names that call's block index.
		s.blockDelta(block, `{"type":"input_json_delta","partial_json":`, args)
	}
}

// toolFor finds the call a tool_calls delta belongs to: by its index, or,
// without one (some upstreams number nothing), the last call. A delta whose
// id differs from that call's is a new call even so (the first delta of
// each call carries its id; some upstreams give every call index 0).
// block -1 means a new call, whose chat index is ci.
func (s *Stream) toolFor(idx, id []byte) (ci int64, block int) {
	block = -1
	var found *toolState
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
	if found == nil {
		return ci, -1
	}
	// An indexed call that came without an id takes the id as its own.
	if nonEmptyString(id) && (found.id != nil || idx == nil) && !bytes.Equal(id, found.id) {
		for i := range s.tools {
			if bytes.Equal(s.tools[i].id, id) {
				return s.tools[i].chatIndex, s.tools[i].block // an earlier call, named again
			}
		}
		return ci, -1
	}
	return found.chatIndex, found.block
}

// start emits message_start and ping.
func (s *Stream) start() {
	s.started = true
	s.out = append(s.out[:0], "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":"...)
	s.out = appendMessageID(s.out, s.msgID)
	s.out = append(s.out, `,"type":"message","role":"assistant","model":`...)
	s.out = appendModel(s.out, s.model, s.info)
	s.out = append(s.out, `,"content":[],"stop_reason":null,"stop_sequence":null,"usage":`...)
	s.out = s.usage.append(s.out, true)
	s.out = append(s.out, "}}\n\n"...)
	s.send()
	s.out = append(s.out[:0], "event: ping\ndata: {\"type\": \"ping\"}\n\n"...)
	s.send()
}

// openBlock closes the open block and starts a new one whose content_block
// is cb.
func (s *Stream) openBlock(kind int, cb string) {
	s.out = append(s.out[:0], cb...)
	s.openBlockRaw(kind)
}

// openBlockRaw is openBlock with the content_block JSON already in s.out.
func (s *Stream) openBlockRaw(kind int) {
	if s.err != nil {
		return
	}
	cb := len(s.out)
	s.closeBlock()
	// The content block JSON sits at the start of s.out; closeBlock used the
	// rest of the buffer, so build the event after it and move it down.
	s.out = s.out[:cb]
	s.index = s.blocks
	s.blocks++
	s.open = kind
	ev := len(s.out)
	s.out = append(s.out, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":"...)
	s.out = strconv.AppendInt(s.out, int64(s.index), 10)
	s.out = append(s.out, `,"content_block":`...)
	s.out = append(s.out, s.out[:cb]...)
	s.out = append(s.out, "}\n\n"...)
	s.sendFrom(ev)
}

// closeBlock ends the open block, if any, without touching s.out[:len(s.out)].
func (s *Stream) closeBlock() {
	if s.open == blockNone || s.err != nil {
		return
	}
	base := len(s.out)
	if s.open == blockThinking {
		s.out = append(s.out, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":"...)
		s.out = strconv.AppendInt(s.out, int64(s.index), 10)
		s.out = append(s.out, ",\"delta\":{\"type\":\"signature_delta\",\"signature\":\"\"}}\n\n"...)
		s.sendFrom(base)
		s.out = s.out[:base]
	}
	s.out = append(s.out, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":"...)
	s.out = strconv.AppendInt(s.out, int64(s.index), 10)
	s.out = append(s.out, "}\n\n"...)
	s.sendFrom(base)
	s.out = s.out[:base]
	s.open = blockNone
}

// blockDelta emits a content_block_delta whose delta is head + value + "}".
func (s *Stream) blockDelta(index int, head string, value []byte) {
	s.out = append(s.out[:0], "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":"...)
	s.out = strconv.AppendInt(s.out, int64(index), 10)
	s.out = append(s.out, `,"delta":`...)
	s.out = append(s.out, head...)
	s.out = append(s.out, value...)
	s.out = append(s.out, "}}\n\n"...)
	s.send()
}

// finish closes the open block and emits message_delta and message_stop.
func (s *Stream) finish() {
	if !s.started {
		s.start()
	}
	s.out = s.out[:0]
	s.closeBlock()
	stop := s.stop
	if stop == "" {
		stop = stopReason(nil, len(s.tools) > 0)
	}
	s.out = append(s.out[:0], "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\""...)
	s.out = append(s.out, stop...)
	s.out = append(s.out, `","stop_sequence":null},"usage":`...)
	s.out = s.usage.append(s.out, s.usage.seen)
	s.out = append(s.out, "}\n\n"...)
	s.send()
	s.out = append(s.out[:0], "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
	s.send()
	s.finished = true
}

// upstreamError turns an {"error":…} payload into an error event.
func (s *Stream) upstreamError(v []byte) {
	msg := []byte(nil)
	var code []byte
	if v[0] == '{' {
		msg, code = jsonscan.ObjGet(v, "message"), jsonscan.ObjGet(v, "code")
	} else if v[0] == '"' {
		msg = v
	}
	var text, c string
	if msg != nil && msg[0] == '"' {
		text = string(jsonscan.AppendUnescape(nil, msg[1:len(msg)-1]))
	} else {
		text = "upstream error"
	}
	if code != nil && code[0] == '"' {
		c = string(jsonscan.AppendUnescape(nil, code[1:len(code)-1]))
	}
	_ = s.Fail(c, text)
}

func (s *Stream) send() { s.sendFrom(0) }

func (s *Stream) sendFrom(i int) {
	if s.err == nil {
		s.err = s.emit(s.out[i:])
	}
}
