package responses

import (
	"bytes"
	"errors"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// Stream translates a chat completion SSE stream into the Responses event
// stream. It is an io.Writer over the upstream's bytes, which may arrive in
// any chunking; every event it produces goes out through emit as one
// complete SSE event ("event: <type>\ndata: {…}\n\n"). emit's slice is
// reused after emit returns. A Stream is not safe for concurrent use.
//
// Events, in order: response.created and response.in_progress with the
// first upstream chunk; per output item response.output_item.added, its
// content events, response.output_item.done; then response.completed (or
// response.incomplete for finish_reason length / content_filter) carrying
// every item and the usage from the upstream's usage chunk. No [DONE] goes
// out. Every event has `type` and a `sequence_number` counting from 0.
//
// Items: reasoning_content (or reasoning) deltas make a reasoning item
// (response.content_part.added, response.reasoning_text.delta/.done,
// response.content_part.done); content makes a message with one output_text
// part (response.output_text.delta/.done); each tool call makes a
// function_call (response.function_call_arguments.delta/.done) or, for a
// custom tool, a custom_tool_call whose input is streamed unwrapped from the
// {"input": …} arguments (response.custom_tool_call_input.delta/.done).
// A new kind of output closes the open item. Deltas for a tool call that
// was already closed (an upstream interleaving calls) are dropped.
type Stream struct {
	info *Info
	emit func([]byte) error
	ids  ids
	h    head

	seq      int64
	started  bool
	finished bool
	err      error // the first emit error; sticky

	line  []byte // partial line carried between writes
	data  []byte // data lines of the event being read
	inEvt bool   // data holds at least one data line
	ev    []byte // the event being emitted
	tmp   []byte // scratch

	model []byte // raw JSON string from the first chunk

	items  []byte // rendered done items, comma-separated
	nItems int    // output items opened so far

	cur    itemKind
	curIdx int    // output index of the open item
	text   []byte // escaped interior of the open reasoning/message text
	tools  []toolState
	open   int // index in tools of the open tool call, when cur == itemTool

	finish     []byte
	usage      Usage
	usageKnown bool
}

type itemKind uint8

const (
	itemNone itemKind = iota
	itemReasoning
	itemMessage
	itemTool
)

// toolState is one chat tool call (by its tool_calls index).
type toolState struct {
	index  int64
	outIdx int
	name   toolName
	callID []byte // escaped interior
	rawID  []byte // the upstream's id as sent (a JSON string), nil for none
	args   []byte // escaped interior: the chat arguments string as received
	closed bool

	// Custom tools: the decoded arguments text, and how far the "input"
	// string inside it has been streamed.
	dec      []byte
	mode     uint8 // inputUndecided, inputStreaming, inputEnded, inputFallback
	pos      int   // next byte of dec to stream
	streamed []byte
}

const (
	inputUndecided = iota
	inputStreaming
	inputEnded
	inputFallback
)

// NewStream starts the translation of one answer to the request info
// describes.
func NewStream(info *Info, emit func([]byte) error) *Stream {
	s := &Stream{}
	s.Reset(info, emit)
	return s
}

// Reset readies s for a new answer, keeping its buffers (for pooling).
func (s *Stream) Reset(info *Info, emit func([]byte) error) {
	*s = Stream{
		info: info, emit: emit, ids: newIDs(),
		line: s.line[:0], data: s.data[:0], ev: s.ev[:0], tmp: s.tmp[:0],
		model: s.model[:0], items: s.items[:0], text: s.text[:0], tools: s.tools[:0],
	}
	s.h = head{info: info, ids: &s.ids, created: time.Now().Unix()}
}

// Finished reports whether the final event (response.completed,
// response.incomplete or response.failed) has been emitted.
func (s *Stream) Finished() bool { return s.finished }

// Started reports whether any event has been emitted.
func (s *Stream) Started() bool { return s.started }

// Usage returns the usage the upstream reported, if it did.
func (s *Stream) Usage() (Usage, bool) { return s.usage, s.usageKnown }

// Write consumes upstream bytes. It returns the first error emit returned.
func (s *Stream) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 && s.err == nil && !s.finished {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.line = append(s.line, p...)
			break
		}
		line := p[:i]
		if len(s.line) > 0 {
			s.line = append(s.line, line...)
			line = s.line
		}
		p = p[i+1:]
		s.onLine(bytes.TrimSuffix(line, []byte{'\r'}))
		s.line = s.line[:0]
	}
	return n, s.err
}

// ErrUnfinished is returned by Close when the upstream ended the stream
// with neither a finish_reason nor [DONE]: the answer was cut, and the
// caller ends the stream with Fail (or has it continued elsewhere).
var ErrUnfinished = errors.New("responses: the chat stream ended without a finish_reason or [DONE]")

// Close ends a stream whose upstream ended cleanly after a finish_reason:
// the open item is closed and the final event emitted, unless that
// happened already. Without a finish_reason nothing final is emitted and
// Close returns ErrUnfinished.
func (s *Stream) Close() error {
	if s.finished || s.err != nil {
		return s.err
	}
	if len(s.line) > 0 {
		s.onLine(bytes.TrimSuffix(s.line, []byte{'\r'}))
		s.line = s.line[:0]
	}
	s.onLine(nil)
	if s.finished || s.err != nil {
		return s.err
	}
	if len(s.finish) == 0 {
		return ErrUnfinished
	}
	s.complete()
	return s.err
}

// Fail ends the stream with response.failed carrying code and message (for
// an upstream that broke after the first byte). Items already done are in
// the failed response's output; the open one is not. A finished stream
// emits nothing.
func (s *Stream) Fail(code, message string) error {
	if s.finished || s.err != nil {
		return s.err
	}
	s.start()
	s.tmp = append(s.tmp[:0], `{"code":`...)
	s.tmp = jsonscan.AppendQuoted(s.tmp, code)
	s.tmp = append(s.tmp, `,"message":`...)
	s.tmp = jsonscan.AppendQuoted(s.tmp, message)
	s.tmp = append(s.tmp, '}')
	s.begin("response.failed")
	s.ev = append(s.ev, `,"response":`...)
	s.ev = s.h.appendResponse(s.ev, statusFailed, s.items, &s.usage, s.usageKnown, s.tmp, "")
	s.end()
	s.finished = true
	return s.err
}

func (s *Stream) onLine(line []byte) {
	if len(line) == 0 {
		if s.inEvt {
			s.dispatch(bytes.TrimSpace(s.data))
			s.data, s.inEvt = s.data[:0], false
		}
		return
	}
	if !bytes.HasPrefix(line, []byte("data:")) {
		return // event:, id:, retry:, comments
	}
	v := line[5:]
	if len(v) > 0 && v[0] == ' ' {
		v = v[1:]
	}
	if s.inEvt {
		s.data = append(s.data, '\n')
	}
	s.data = append(s.data, v...)
	s.inEvt = true
}

func (s *Stream) dispatch(d []byte) {
	if s.finished {
		return
	}
	if string(d) == "[DONE]" {
		s.complete()
		return
	}
	if !jsonscan.Valid(d) || d[0] != '{' {
		return // not a chunk; nothing a client could use
	}
	var choices, usage, errv []byte
	jsonscan.EachMember(d, 0, func(key []byte, vs, ve int) bool {
		v := d[vs:ve]
		switch string(key) {
		case "choices":
			choices = v
		case "usage":
			if v[0] == '{' {
				usage = v
			}
		case "model":
			if !s.started && jsonscan.IsString(v) {
				s.model = append(s.model[:0], v...)
				s.h.model = s.model
			}
		case "error":
			errv = v
		}
		return true
	})
	if errv != nil {
		s.failFromChunk(errv)
		return
	}
	s.start()
	if choices != nil {
		jsonscan.EachElem(choices, 0, func(vs, ve int) bool {
			s.choice(choices[vs:ve])
			return false // the first choice only: Responses has one output
		})
	}
	if usage != nil && parseUsage(usage, &s.usage) {
		s.usageKnown = true
	}
}

// failFromChunk ends the stream for an error object sent in the stream.
func (s *Stream) failFromChunk(errv []byte) {
	code, msg := []byte("upstream_error"), []byte("upstream error")
	if errv[0] == '{' {
		jsonscan.EachMember(errv, 0, func(key []byte, vs, ve int) bool {
			v := errv[vs:ve]
			switch string(key) {
			case "message":
				if jsonscan.IsString(v) {
					msg = jsonscan.AppendStringValue(nil, v)
				}
			case "code":
				if jsonscan.IsString(v) && len(v) > 2 {
					code = jsonscan.AppendStringValue(nil, v)
				}
			}
			return true
		})
	} else if jsonscan.IsString(errv) {
		msg = jsonscan.AppendStringValue(nil, errv)
	}
	_ = s.Fail(string(code), string(msg))
}

func (s *Stream) choice(c []byte) {
	if len(c) == 0 || c[0] != '{' {
		return
	}
	var delta []byte
	jsonscan.EachMember(c, 0, func(key []byte, vs, ve int) bool {
		v := c[vs:ve]
		switch string(key) {
		case "delta":
			delta = v
		case "finish_reason":
			if jsonscan.IsString(v) {
				s.finish = jsonscan.AppendStringValue(s.finish[:0], v)
			}
		}
		return true
	})
	if len(delta) == 0 || delta[0] != '{' {
		return
	}
	var reasoning, content, calls []byte
	jsonscan.EachMember(delta, 0, func(key []byte, vs, ve int) bool {
		v := delta[vs:ve]
		switch string(key) {
		case "reasoning_content":
			if jsonscan.IsString(v) && len(v) > 2 {
				reasoning = v
			}
		case "reasoning":
			if reasoning == nil && jsonscan.IsString(v) && len(v) > 2 {
				reasoning = v
			}
		case "content", "refusal":
			if jsonscan.IsString(v) && len(v) > 2 {
				content = v
			}
		case "tool_calls":
			calls = v
		}
		return true
	})
	if reasoning != nil {
		s.textDelta(itemReasoning, reasoning[1:len(reasoning)-1])
	}
	if content != nil {
		s.textDelta(itemMessage, content[1:len(content)-1])
	}
	if calls != nil {
		jsonscan.EachElem(calls, 0, func(vs, ve int) bool {
			s.toolDelta(calls[vs:ve])
			return true
		})
	}
}

// begin starts an event of type typ in s.ev; the caller appends members
// (each starting with a comma) and calls end.
func (s *Stream) begin(typ string) {
	s.ev = append(s.ev[:0], "event: "...)
	s.ev = append(s.ev, typ...)
	s.ev = append(s.ev, "\ndata: {\"type\":\""...)
	s.ev = append(s.ev, typ...)
	s.ev = append(s.ev, `","sequence_number":`...)
	s.ev = strconv.AppendInt(s.ev, s.seq, 10)
	s.seq++
}

func (s *Stream) end() {
	s.ev = append(s.ev, "}\n\n"...)
	if s.err == nil {
		s.err = s.emit(s.ev)
	}
}

// itemRef appends ,"item_id":…,"output_index":n[,"content_index":0].
func (s *Stream) itemRef(prefix string, n int, content bool) {
	s.ev = append(s.ev, `,"item_id":`...)
	s.ev = s.ids.appendID(s.ev, prefix, n)
	s.ev = append(s.ev, `,"output_index":`...)
	s.ev = strconv.AppendInt(s.ev, int64(n), 10)
	if content {
		s.ev = append(s.ev, `,"content_index":0`...)
	}
}

func (s *Stream) start() {
	if s.started {
		return
	}
	s.started = true
	for _, typ := range [...]string{"response.created", "response.in_progress"} {
		s.begin(typ)
		s.ev = append(s.ev, `,"response":`...)
		s.ev = s.h.appendResponse(s.ev, statusInProgress, nil, nil, false, nil, "")
		s.end()
	}
}

// textDelta streams a piece (escaped interior) of reasoning or message text.
func (s *Stream) textDelta(kind itemKind, piece []byte) {
	if s.cur != kind {
		s.closeItem()
		s.openText(kind)
	}
	s.text = append(s.text, piece...)
	if kind == itemReasoning {
		s.begin("response.reasoning_text.delta")
		s.itemRef("rs", s.curIdx, true)
	} else {
		s.begin("response.output_text.delta")
		s.itemRef("msg", s.curIdx, true)
	}
	s.ev = append(s.ev, `,"delta":"`...)
	s.ev = append(s.ev, piece...)
	if kind == itemMessage {
		s.ev = append(s.ev, `","logprobs":[]`...)
	} else {
		s.ev = append(s.ev, '"')
	}
	s.end()
}

func (s *Stream) openText(kind itemKind) {
	s.cur, s.curIdx = kind, s.nItems
	s.nItems++
	s.text = s.text[:0]
	prefix := "msg"
	if kind == itemReasoning {
		prefix = "rs"
	}
	s.begin("response.output_item.added")
	s.ev = append(s.ev, `,"output_index":`...)
	s.ev = strconv.AppendInt(s.ev, int64(s.curIdx), 10)
	s.ev = append(s.ev, `,"item":`...)
	if kind == itemReasoning {
		s.ev = appendReasoningItem(s.ev, &s.ids, s.curIdx, nil, false)
	} else {
		s.ev = appendMessageItem(s.ev, &s.ids, s.curIdx, nil, statusInProgress)
	}
	s.end()
	s.begin("response.content_part.added")
	s.itemRef(prefix, s.curIdx, true)
	s.ev = append(s.ev, `,"part":`...)
	s.ev = appendPart(s.ev, kind, nil)
	s.end()
}

func appendPart(dst []byte, kind itemKind, text []byte) []byte {
	if kind == itemReasoning {
		dst = append(dst, `{"type":"reasoning_text","text":"`...)
		dst = append(dst, text...)
		return append(dst, `"}`...)
	}
	return appendTextPart(dst, text)
}

// closeItem emits the done events of the open item and records it.
func (s *Stream) closeItem() {
	switch s.cur {
	case itemNone:
		return
	case itemTool:
		s.closeTool(&s.tools[s.open])
	default:
		kind, n := s.cur, s.curIdx
		prefix := "msg"
		if kind == itemReasoning {
			prefix = "rs"
			s.begin("response.reasoning_text.done")
		} else {
			s.begin("response.output_text.done")
		}
		s.itemRef(prefix, n, true)
		s.ev = append(s.ev, `,"text":"`...)
		s.ev = append(s.ev, s.text...)
		if kind == itemMessage {
			s.ev = append(s.ev, `","logprobs":[]`...)
		} else {
			s.ev = append(s.ev, '"')
		}
		s.end()
		s.begin("response.content_part.done")
		s.itemRef(prefix, n, true)
		s.ev = append(s.ev, `,"part":`...)
		s.ev = appendPart(s.ev, kind, s.text)
		s.end()
		s.itemDone(func(dst []byte) []byte {
			if kind == itemReasoning {
				return appendReasoningItem(dst, &s.ids, n, s.text, true)
			}
			status := statusCompleted
			if st, _ := statusFor(s.finish); st == statusIncomplete {
				status = statusIncomplete
			}
			return appendMessageItem(dst, &s.ids, n, s.text, status)
		})
	}
	s.cur = itemNone
}

// itemDone emits response.output_item.done for the item render appends and
// adds it to the response's output.
func (s *Stream) itemDone(render func([]byte) []byte) {
	start := len(s.items)
	if start > 0 {
		s.items = append(s.items, ',')
		start++
	}
	s.items = render(s.items)
	s.begin("response.output_item.done")
	s.ev = append(s.ev, `,"output_index":`...)
	s.ev = strconv.AppendInt(s.ev, int64(s.curIdx), 10)
	s.ev = append(s.ev, `,"item":`...)
	s.ev = append(s.ev, s.items[start:]...)
	s.end()
}

func (s *Stream) toolDelta(el []byte) {
	if len(el) == 0 || el[0] != '{' {
		return
	}
	var index int64
	var hasIndex bool
	var id, name, args []byte
	jsonscan.EachMember(el, 0, func(key []byte, vs, ve int) bool {
		v := el[vs:ve]
		switch string(key) {
		case "index":
			index, hasIndex = jsonscan.ParseUint(v), true
		case "id":
			id = v
		case "function":
			if v[0] == '{' {
				jsonscan.EachMember(v, 0, func(k []byte, fs, fe int) bool {
					switch string(k) {
					case "name":
						name = v[fs:fe]
					case "arguments":
						args = v[fs:fe]
					}
					return true
				})
			}
		}
		return true
	})
	ti := s.toolFor(hasIndex, &index, id)
	if ti < 0 {
		s.closeItem()
		ti = s.openTool(index, id, name)
	}
	t := &s.tools[ti]
	if t.closed || !jsonscan.IsString(args) || len(args) == 2 {
		return
	}
	piece := args[1 : len(args)-1]
	if t.name.kind == kindCustom {
		t.dec = jsonscan.AppendUnescape(t.dec, piece)
		s.streamInput(t)
		return
	}
	t.args = append(t.args, piece...)
	s.begin("response.function_call_arguments.delta")
	s.itemRef("fc", t.outIdx, false)
	s.ev = append(s.ev, `,"delta":"`...)
	s.ev = append(s.ev, piece...)
	s.ev = append(s.ev, '"')
	s.end()
}

// toolFor finds the call a tool_calls delta belongs to (its index in
// s.tools, -1 for a new call): by its index, or, without one (some
// upstreams number nothing), the last call. A delta whose id differs from
// that call's is a new call even so (the first delta of each call carries
// its id; some upstreams give every call index 0). For a new call *index is
// set to the chat index it is known by.
func (s *Stream) toolFor(hasIndex bool, index *int64, id []byte) int {
	found := -1
	if hasIndex {
		for i := range s.tools {
			if s.tools[i].index == *index {
				found = i // the latest call with the index
			}
		}
	} else {
		*index = int64(len(s.tools))
		found = len(s.tools) - 1
	}
	if found < 0 {
		return -1
	}
	t := &s.tools[found]
	// An indexed call that came without an id takes the id as its own.
	if jsonscan.IsString(id) && len(id) > 2 && (t.rawID != nil || !hasIndex) && !bytes.Equal(id, t.rawID) {
		for i := range s.tools {
			if bytes.Equal(s.tools[i].rawID, id) {
				return i // an earlier call, named again
			}
		}
		return -1
	}
	return found
}

func (s *Stream) openTool(index int64, id, name []byte) int {
	s.tools = append(s.tools, toolState{})
	ti := len(s.tools) - 1
	t := &s.tools[ti]
	*t = toolState{index: index, outIdx: s.nItems}
	if jsonscan.IsString(id) && len(id) > 2 {
		t.rawID = append([]byte(nil), id...)
	}
	s.nItems++
	s.tmp = jsonscan.AppendStringValue(s.tmp[:0], name)
	t.name = s.info.lookup(s.tmp)
	t.callID = appendCallIDInterior(t.callID[:0], id, &s.ids, t.outIdx)
	s.cur, s.curIdx, s.open = itemTool, t.outIdx, ti
	s.begin("response.output_item.added")
	s.ev = append(s.ev, `,"output_index":`...)
	s.ev = strconv.AppendInt(s.ev, int64(t.outIdx), 10)
	s.ev = append(s.ev, `,"item":`...)
	s.ev = appendCallItem(s.ev, &s.ids, t.outIdx, &t.name, t.callID, nil, statusInProgress)
	s.end()
	return ti
}

// streamInput emits the part of a custom tool's "input" string that the
// decoded arguments so far make certain. Arguments that do not start as
// {"input":"… are held back and sent whole when the call closes.
func (s *Stream) streamInput(t *toolState) {
	if t.mode == inputUndecided {
		pos, st := inputPrefix(t.dec)
		switch st {
		case prefixNeedMore:
			return
		case prefixMismatch:
			t.mode = inputFallback
			return
		}
		t.mode, t.pos = inputStreaming, pos
	}
	if t.mode != inputStreaming {
		return
	}
	end, closed := stringSoFar(t.dec, t.pos)
	if end > t.pos {
		s.tmp = jsonscan.AppendUnescape(s.tmp[:0], t.dec[t.pos:end])
		s.inputDelta(t, s.tmp, true)
	}
	t.pos = end
	if closed {
		t.mode = inputEnded
	}
}

// inputDelta emits a custom_tool_call_input.delta; text is decoded when
// decode is true, else already an escaped interior.
func (s *Stream) inputDelta(t *toolState, text []byte, decoded bool) {
	start := len(t.streamed)
	if decoded {
		t.streamed = jsonscan.AppendEscaped(t.streamed, text)
	} else {
		t.streamed = append(t.streamed, text...)
	}
	if len(t.streamed) == start {
		return
	}
	s.begin("response.custom_tool_call_input.delta")
	s.itemRef("ctc", t.outIdx, false)
	s.ev = append(s.ev, `,"delta":"`...)
	s.ev = append(s.ev, t.streamed[start:]...)
	s.ev = append(s.ev, '"')
	s.end()
}

func (s *Stream) closeTool(t *toolState) {
	t.closed = true
	payload := t.args
	if t.name.kind == kindCustom {
		final := customInput(nil, t.dec)
		if bytes.HasPrefix(final, t.streamed) {
			s.inputDelta(t, final[len(t.streamed):], false)
		}
		payload = final
		s.begin("response.custom_tool_call_input.done")
		s.itemRef("ctc", t.outIdx, false)
		s.ev = append(s.ev, `,"input":"`...)
	} else {
		s.begin("response.function_call_arguments.done")
		s.itemRef("fc", t.outIdx, false)
		s.ev = append(s.ev, `,"name":`...)
		s.ev = jsonscan.AppendQuoted(s.ev, t.name.name)
		s.ev = append(s.ev, `,"arguments":"`...)
	}
	s.ev = append(s.ev, payload...)
	s.ev = append(s.ev, '"')
	s.end()
	s.curIdx = t.outIdx
	s.itemDone(func(dst []byte) []byte {
		return appendCallItem(dst, &s.ids, t.outIdx, &t.name, t.callID, payload, statusCompleted)
	})
}

// complete closes the open item and emits the final event.
func (s *Stream) complete() {
	if s.finished {
		return
	}
	s.start()
	s.closeItem()
	status, reason := statusFor(s.finish)
	typ := "response.completed"
	if status == statusIncomplete {
		typ = "response.incomplete"
	}
	s.begin(typ)
	s.ev = append(s.ev, `,"response":`...)
	s.ev = s.h.appendResponse(s.ev, status, s.items, &s.usage, s.usageKnown, nil, reason)
	s.end()
	s.finished = true
}

const (
	prefixNeedMore = iota
	prefixMatch
	prefixMismatch
)

// inputPrefix matches `{ "input" : "` (with any white space) at the start of
// b and returns the index after the opening quote of the value.
func inputPrefix(b []byte) (int, int) {
	i := jsonscan.SkipWS(b, 0)
	if i == len(b) {
		return 0, prefixNeedMore
	}
	if b[i] != '{' {
		return 0, prefixMismatch
	}
	i = jsonscan.SkipWS(b, i+1)
	const key = `"input"`
	for k := 0; k < len(key); k++ {
		if i+k == len(b) {
			return 0, prefixNeedMore
		}
		if b[i+k] != key[k] {
			return 0, prefixMismatch
		}
	}
	i = jsonscan.SkipWS(b, i+len(key))
	if i == len(b) {
		return 0, prefixNeedMore
	}
	if b[i] != ':' {
		return 0, prefixMismatch
	}
	i = jsonscan.SkipWS(b, i+1)
	if i == len(b) {
		return 0, prefixNeedMore
	}
	if b[i] != '"' {
		return 0, prefixMismatch
	}
	return i + 1, prefixMatch
}

// stringSoFar scans a JSON string interior from b[i] and returns how far it
// can be decoded for certain: not into an escape, a surrogate pair or a
// UTF-8 sequence that more bytes may complete. closed reports that the
// closing quote was reached (end is its index).
func stringSoFar(b []byte, i int) (end int, closed bool) {
	for i < len(b) {
		switch c := b[i]; {
		case c == '"':
			return i, true
		case c == '\\':
			need := 2
			if i+1 < len(b) && b[i+1] == 'u' {
				need = 6
				if i+6 <= len(b) {
					if r, ok := jsonscan.Hex4(b[i+2:]); ok && r >= 0xd800 && r < 0xdc00 {
						// A high surrogate: see whether a low one follows.
						switch {
						case i+6 == len(b), i+7 == len(b) && b[i+6] == '\\':
							return i, false
						case b[i+6] == '\\' && b[i+7] == 'u':
							need = 12
						}
					}
				}
			}
			if i+need > len(b) {
				return i, false
			}
			i += need
		case c < utf8.RuneSelf:
			i++
		default:
			if !utf8.FullRune(b[i:]) {
				return i, false
			}
			_, size := utf8.DecodeRune(b[i:])
			i += size
		}
	}
	return i, false
}
