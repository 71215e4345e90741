package transform

import (
	"bytes"
	"errors"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// MaxEventSize is the default bound of the memory a StreamRewriter buffers
// for one SSE event (SetMaxEventSize changes it per stream). A bigger event
// is passed through untouched: buffering stops, its bytes are forwarded as
// they arrive, and parsing resumes at the next event boundary. It matches
// the handler's bound for a whole non-stream body, so a completion is
// rewritten the same whether it streams or not.
const MaxEventSize = 16 << 20

// maxChoices bounds the per-choice splitter states one stream keeps; choices
// with further indexes pass through unsplit.
const maxChoices = 64

// errClosed is returned by Write after Close.
var errClosed = errors.New("transform: write after Close")

type span struct{ s, e int }

// chunkMeta holds the raw spans of a chunk's id, created and model values.
type chunkMeta struct{ id, created, model span }

// choiceState is the splitter of one choices[].index.
type choiceState struct {
	index int
	sp    splitter
}

// StreamRewriter applies think_tags to an OpenAI-style SSE stream of
// chat.completion.chunk events, as bytes flow through it.
//
// The handler feeds upstream bytes in arbitrary chunks to Write. Every complete
// SSE event (ended by a blank line; LF, CRLF and CR line ends) is transformed
// and handed to emit exactly once, before the Write that completed it returns;
// emit's slice is only valid during the call. Unchanged events completed by
// the same Write are handed over together in one call (see Write); emit never
// gets a partial event, except for an oversized one (see MaxEventSize).
//
// Per choices[].index, delta.content is run through an incremental think-tag
// splitter (see splitter for the exact semantics). A choice that carries a
// whole "message" instead of a "delta" (MiniMax closes streams with such a
// chat.completion frame repeating the full text) is split on its own, as
// RewriteCompletion would, without touching the running state. Think text goes
// to delta.reasoning_content in split mode (after any reasoning_content the delta
// already has; added as the delta's last member otherwise) or is dropped in
// strip mode. Only those two values change: every other byte of the chunk
// survives, and a chunk that needs no change is emitted byte for byte, from the
// caller's buffer when it arrived whole, with no allocation. Comments, event:,
// id: and retry: lines, CRLF framing and non-JSON data pass through; a data
// payload that is not a valid JSON object, or that has a top-level "error"
// key, is never touched. A rewritten event keeps its other lines and puts the
// data on one line ("data: " + JSON, multi-line data joined per the SSE rules
// with the JSON's own newlines turned into spaces).
//
// Text held back because it might start a tag is released by a later chunk, or
// at "data: [DONE]" or Close, where it goes out in one synthetic chunk, before
// the [DONE] event:
//
//	{"id":…,"object":"chat.completion.chunk","created":…,"model":…,"choices":[{"index":i,"delta":{"content":"…"}}]}
//
// (reasoning_content instead of content when the text was inside a think
// block), with id, created and model copied from the last chunk seen (keys
// omitted if never seen). A held "<thi" at the end was not a tag, so it is
// content.
//
// A StreamRewriter is not safe for concurrent use. Reset readies it for
// another stream so it can live in a sync.Pool.
type StreamRewriter struct {
	mode ThinkMode
	emit func([]byte) error
	max  int
	over int // events passed through because they exceeded max
	err  error
	done bool // Close was called

	sc       sseScanner
	buf      []byte // the incomplete event carried between Writes
	skipping bool   // inside an oversized event: forwarding raw
	inP      bool   // the event being handled is a slice of Write's p
	run      []byte // unchanged bytes of p not yet emitted

	choices []choiceState
	meta    []byte // `"id":…,"object":…,"created":…,"model":…,` of the last chunk
	term    string // line terminator of the last data line seen

	// Per-event scratch, reused.
	spans []choiceSpan
	join  []byte
	dec   []byte
	cbuf  []byte
	rbuf  []byte
	held  []byte
	pay   []byte
	out   []byte
}

// NewStreamRewriter returns a rewriter applying mode to the stream and
// passing every resulting event to emit. With ThinkOff it only frames events
// and passes them through (the handler normally just copies bytes instead).
func NewStreamRewriter(mode ThinkMode, emit func(event []byte) error) *StreamRewriter {
	s := &StreamRewriter{}
	s.Reset(mode, emit)
	return s
}

// Reset discards all state and readies s for a new stream, keeping its
// buffers (except any that grew past 64 KiB, so pooled rewriters stay small)
// for reuse through a sync.Pool.
func (s *StreamRewriter) Reset(mode ThinkMode, emit func([]byte) error) {
	s.mode, s.emit, s.max, s.over = mode, emit, MaxEventSize, 0
	s.err, s.done, s.skipping, s.inP, s.run = nil, false, false, false, nil
	s.sc.reset()
	s.buf = trim(s.buf)
	s.choices = s.choices[:0]
	s.meta = s.meta[:0]
	s.term = "\n"
	s.spans = s.spans[:0]
	s.join, s.dec, s.cbuf, s.rbuf = trim(s.join), trim(s.dec), trim(s.cbuf), trim(s.rbuf)
	s.held, s.pay, s.out = trim(s.held), trim(s.pay), trim(s.out)
}

// SetMaxEventSize sets the bound of one buffered event for this stream
// (until the next Reset); n <= 0 keeps MaxEventSize.
func (s *StreamRewriter) SetMaxEventSize(n int) {
	if n > 0 {
		s.max = n
	}
}

// Oversized returns how many events of this stream exceeded the bound and
// went through unrewritten.
func (s *StreamRewriter) Oversized() int { return s.over }

// trim empties b, dropping it if a huge event made it grow, so pooled
// rewriters do not pin megabytes.
func trim(b []byte) []byte {
	if cap(b) > 64<<10 {
		return nil
	}
	return b[:0]
}

// Write consumes upstream bytes; it always consumes all of p. The first
// error returned by emit stops the rewriter: Write returns 0 and that error,
// and so does every later call.
//
// Consecutive events that need no change and arrived in the same p are handed
// to emit together, as one slice of p, at the end of the call (they all became
// complete at the same moment, so nothing is delayed): one write and flush
// instead of one per event. emit never sees part of an event, except for an
// oversized one, which is forwarded in pieces as it arrives.
func (s *StreamRewriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if s.done {
		return 0, errClosed
	}
	total := len(p)
	s.inP = true
	for len(p) > 0 && s.err == nil {
		end, complete := s.sc.scan(p)
		switch {
		case s.skipping:
			s.pass(p[:end])
			s.skipping = !complete
		case !complete:
			if len(s.buf)+len(p) > s.max {
				// Oversized: forward what we have and the rest as it comes.
				s.over++
				s.raw(s.buf)
				s.pass(p)
				s.buf = s.buf[:0]
				s.skipping = true
			} else {
				s.buf = append(s.buf, p...)
			}
		case len(s.buf) == 0:
			s.event(p[:end]) // zero copy
		case len(s.buf)+end > s.max:
			s.over++
			s.raw(s.buf)
			s.pass(p[:end])
			s.buf = s.buf[:0]
		default:
			s.buf = append(s.buf, p[:end]...)
			s.inP = false
			s.event(s.buf)
			s.inP = true
			s.buf = s.buf[:0]
		}
		p = p[end:]
	}
	s.inP = false
	s.flushRun()
	if s.err != nil {
		return 0, s.err
	}
	return total, nil
}

// Close ends the stream at clean upstream EOF: a trailing incomplete event is
// processed and emitted as it is, then any held text is flushed in a synthetic
// chunk (after completing the framing of an unterminated last event, the only
// case where bytes are added). It never invents a [DONE].
func (s *StreamRewriter) Close() error {
	if s.err != nil || s.done {
		return s.err
	}
	s.done = true
	if !s.skipping && len(s.buf) > 0 {
		if s.sc.hasContent {
			s.event(s.buf)
		} else {
			s.raw(s.buf) // only blank lines
		}
		s.buf = s.buf[:0]
	}
	if s.err == nil && s.pending() {
		if s.sc.hasContent {
			// The last event never got its blank line; end it first so the
			// synthetic chunk is a separate event.
			s.out = s.out[:0]
			if !s.sc.lineStart {
				s.out = append(s.out, s.term...)
			}
			s.out = append(s.out, s.term...)
			s.raw(s.out)
			s.sc.reset()
		}
		s.flushHeld(nil)
	}
	return s.err
}

// raw emits b now (after any pending run, to keep the order).
func (s *StreamRewriter) raw(b []byte) {
	s.flushRun()
	if s.err == nil && len(b) > 0 {
		s.err = s.emit(b)
	}
}

// pass forwards b unchanged. When b is part of the p of the current Write it
// joins the pending run if it directly follows it in memory (the usual case:
// the previous unchanged event), so a run of unchanged events costs one emit.
func (s *StreamRewriter) pass(b []byte) {
	if !s.inP {
		s.raw(b)
		return
	}
	if len(b) == 0 || s.err != nil {
		return
	}
	if n := len(s.run); n > 0 && cap(s.run)-n >= len(b) && &s.run[:n+1][n] == &b[0] {
		s.run = s.run[:n+len(b)]
		return
	}
	s.flushRun()
	s.run = b
}

// flushRun emits the pending run of unchanged bytes.
func (s *StreamRewriter) flushRun() {
	if len(s.run) > 0 {
		if s.err == nil {
			s.err = s.emit(s.run)
		}
		s.run = nil
	}
}

// event processes one complete event (or a trailing partial one at Close).
func (s *StreamRewriter) event(ev []byte) {
	if len(ev) > s.max {
		s.over++
		s.pass(ev)
		return
	}
	// Find the data lines.
	nData, firstData := 0, -1
	var payload []byte
	for i := 0; i < len(ev); {
		le, next := nextLine(ev, i)
		if off, ok := dataValue(ev[i:le]); ok {
			v := ev[i+off : le]
			switch nData {
			case 0:
				firstData = i
				payload = v
				s.term = termOf(ev, le, next)
			case 1:
				s.join = append(append(append(s.join[:0], payload...), '\n'), v...)
				payload = s.join
			default:
				s.join = append(append(s.join, '\n'), v...)
				payload = s.join
			}
			nData++
		}
		i = next
	}
	if nData == 0 || s.mode == ThinkOff {
		s.pass(ev)
		return
	}
	if isDone(payload) {
		// Held text goes out right before [DONE]; blank-line bytes leading
		// the event (say the LF of a CRLF split across writes) stay in front
		// of it so the output doesn't depend on how the input was chunked.
		lead := 0
		for lead < len(ev) && (ev[lead] == '\n' || ev[lead] == '\r') {
			lead++
		}
		if s.flushHeld(ev[:lead]) {
			ev = ev[lead:]
		}
		s.pass(ev)
		s.choices = s.choices[:0]
		return
	}
	if newPayload, changed := s.rewriteChunk(payload); changed {
		s.raw(s.rebuild(ev, firstData, newPayload, nData > 1))
		return
	}
	s.pass(ev)
}

// termOf returns the terminator of the line ending at le.
func termOf(b []byte, le, next int) string {
	switch {
	case next-le == 2:
		return "\r\n"
	case le < len(b) && b[le] == '\r':
		return "\r"
	}
	return "\n"
}

func isDone(payload []byte) bool {
	return string(bytes.TrimSpace(payload)) == "[DONE]"
}

// rewriteChunk runs the splitters over one chunk's contents and returns the
// rewritten JSON (in s.pay) when any choice changed.
func (s *StreamRewriter) rewriteChunk(payload []byte) ([]byte, bool) {
	// Cheap rejection of non-JSON data before any parsing.
	if i := jsonscan.SkipWS(payload, 0); i >= len(payload) || payload[i] != '{' {
		return nil, false
	}
	// Fast path for the common chunk: no splitter is mid-tag or inside a
	// block, and nothing in the payload can decode to '<'. Then no content
	// can change, so skip parsing altogether.
	if s.clean() && !mayHaveLT(payload) {
		return nil, false
	}
	var meta chunkMeta
	spans, ok := collectChoices(payload, true, s.spans[:0], &meta)
	s.spans = spans
	if !ok {
		return nil, false
	}
	if meta.id.s >= 0 || meta.created.s >= 0 || meta.model.s >= 0 {
		s.saveMeta(payload, &meta)
	}
	s.dec, s.cbuf, s.rbuf = s.dec[:0], s.cbuf[:0], s.rbuf[:0]
	changed := false
	for i := range spans {
		sp := &spans[i]
		// A whole message (see collectChoices) is split on its own, with a
		// fresh splitter flushed at its end; deltas go through the choice's
		// running splitter.
		var whole splitter
		st := &whole
		if !sp.whole {
			if sp.index < 0 {
				continue
			}
			if st = s.state(sp.index); st == nil {
				continue
			}
		}
		text := payload[sp.cs+1 : sp.ce-1]
		if sp.cesc {
			d0 := len(s.dec)
			s.dec = jsonscan.AppendUnescape(s.dec, text)
			text = s.dec[d0:]
		}
		// Fast path: outside a block, nothing held and no '<': unchanged.
		if !st.inThink && st.nheld == 0 && bytes.IndexByte(text, '<') < 0 {
			continue
		}
		sp.c0, sp.r0 = len(s.cbuf), len(s.rbuf)
		s.cbuf, s.rbuf, s.held = st.feed(text, s.cbuf, s.rbuf, s.held)
		if sp.whole {
			s.cbuf, s.rbuf = st.flush(s.cbuf, s.rbuf)
		}
		if s.mode == ThinkStrip {
			s.rbuf = s.rbuf[:sp.r0]
		}
		sp.c1, sp.r1 = len(s.cbuf), len(s.rbuf)
		sp.addReason = sp.r1 > sp.r0
		sp.changed = sp.addReason || !bytes.Equal(s.cbuf[sp.c0:sp.c1], text)
		changed = changed || sp.changed
	}
	if !changed {
		return nil, false
	}
	s.pay = applyChoices(s.pay[:0], payload, spans, s.cbuf, s.rbuf)
	return s.pay, true
}

// clean reports whether every splitter is outside a block with nothing held.
func (s *StreamRewriter) clean() bool {
	for i := range s.choices {
		if sp := &s.choices[i].sp; sp.inThink || sp.nheld > 0 {
			return false
		}
	}
	return true
}

// mayHaveLT reports whether JSON text b may contain a string that decodes to
// '<': a raw '<' or a \u003c escape (either case). False positives (an escaped
// backslash before "u003c") only cost a full parse.
func mayHaveLT(b []byte) bool {
	if bytes.IndexByte(b, '<') >= 0 {
		return true
	}
	for {
		i := bytes.Index(b, []byte(`\u003`))
		if i < 0 || i+5 >= len(b) {
			return false
		}
		if c := b[i+5]; c == 'c' || c == 'C' {
			return true
		}
		b = b[i+5:]
	}
}

// state returns the splitter for a choice index, creating it; nil when the
// stream already tracks maxChoices indexes.
func (s *StreamRewriter) state(index int) *splitter {
	for i := range s.choices {
		if s.choices[i].index == index {
			return &s.choices[i].sp
		}
	}
	if len(s.choices) >= maxChoices {
		return nil
	}
	s.choices = append(s.choices, choiceState{index: index})
	return &s.choices[len(s.choices)-1].sp
}

// saveMeta remembers id/created/model of the last chunk for synthetic chunks.
func (s *StreamRewriter) saveMeta(b []byte, m *chunkMeta) {
	s.meta = s.meta[:0]
	if m.id.s >= 0 {
		s.meta = append(append(s.meta, `"id":`...), b[m.id.s:m.id.e]...)
		s.meta = append(s.meta, ',')
	}
	s.meta = append(s.meta, `"object":"chat.completion.chunk",`...)
	if m.created.s >= 0 {
		s.meta = append(append(s.meta, `"created":`...), b[m.created.s:m.created.e]...)
		s.meta = append(s.meta, ',')
	}
	if m.model.s >= 0 {
		s.meta = append(append(s.meta, `"model":`...), b[m.model.s:m.model.e]...)
		s.meta = append(s.meta, ',')
	}
}

// rebuild returns ev with its data lines replaced by one data line carrying
// payload, at the place of the first one; every other line is kept as is.
func (s *StreamRewriter) rebuild(ev []byte, firstData int, payload []byte, multi bool) []byte {
	out := s.out[:0]
	for i := 0; i < len(ev); {
		le, next := nextLine(ev, i)
		off, isData := dataValue(ev[i:le])
		switch {
		case !isData:
			out = append(out, ev[i:next]...)
		case i == firstData:
			out = append(out, ev[i:i+off]...)
			p0 := len(out)
			out = append(out, payload...)
			if multi {
				// Joined data lines put '\n' between them, which can only
				// be JSON whitespace (strings can't hold raw newlines).
				for k := p0; k < len(out); k++ {
					if out[k] == '\n' {
						out[k] = ' '
					}
				}
			}
			out = append(out, ev[le:next]...)
		}
		i = next
	}
	s.out = out
	return out
}

// pending reports whether any choice holds text back.
func (s *StreamRewriter) pending() bool {
	for i := range s.choices {
		if s.choices[i].sp.nheld > 0 {
			return true
		}
	}
	return false
}

// flushHeld emits lead followed by the held text of every choice in one
// synthetic chunk, and resets the splitters' held tails. It reports whether it
// emitted anything (lead included).
func (s *StreamRewriter) flushHeld(lead []byte) bool {
	if !s.pending() {
		return false
	}
	out := append(s.out[:0], lead...)
	out = append(out, "data: {"...)
	out = append(out, s.meta...)
	if len(s.meta) == 0 {
		out = append(out, `"object":"chat.completion.chunk",`...)
	}
	out = append(out, `"choices":[`...)
	n := 0
	for i := range s.choices {
		cs := &s.choices[i]
		if cs.sp.nheld == 0 {
			continue
		}
		text := cs.sp.held[:cs.sp.nheld]
		cs.sp.nheld = 0
		field := `"content":`
		if cs.sp.inThink {
			if s.mode == ThinkStrip {
				continue
			}
			field = `"reasoning_content":`
		}
		if n > 0 {
			out = append(out, ',')
		}
		n++
		out = append(out, `{"index":`...)
		out = appendInt(out, cs.index)
		out = append(out, `,"delta":{`...)
		out = append(out, field...)
		out = jsonscan.AppendQuoted(out, text)
		out = append(out, "}}"...)
	}
	out = append(out, "]}"...)
	out = append(out, s.term...)
	out = append(out, s.term...)
	s.out = out
	if n == 0 {
		if len(lead) == 0 {
			return false
		}
		out = append(out[:0], lead...)
	}
	s.raw(out)
	return true
}

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}
