package transform

import (
	"bytes"
	"errors"
	"io"
	"unicode/utf8"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
	"github.com/llm-route/caddy-llm-route/llmroute/internal/repeatguard"
)

// RepeatGuard watches a chat completion stream for an answer stuck in a
// loop (model `repeat_guard`): the text of choice 0, content and reasoning
// each on its own, never tool-call arguments, goes through a
// repeatguard.Detector.
//
// Events pass on whole and at once while the text is not inside a growing
// run. An event whose text leaves a run that is evidence (Detector.Holding)
// is held back with the ones after it until the run breaks (they are passed
// on as they came) or is confirmed. On confirmation the held events are
// dropped, one chunk is passed on in their place with the text the client
// lacks up to the end of the copy of the unit it is in (at least one whole
// copy after the text before the run), and Write returns ErrRepeat: the
// stream is to be continued elsewhere, or ended.
type RepeatGuard struct {
	next io.Writer
	sc   sseScanner
	pend []byte // the start of an event not yet complete
	out  []byte // what one Write passes on
	held []byte // events held back

	det      [2]*repeatguard.Detector // content, reasoning
	heldText [2][]byte                // each channel's text in the held events
	sent     [2]int64                 // runes of each channel passed on
	rkey     string                   // the reasoning member the stream uses
	tmp      []byte
	data     []byte
	pre, suf []byte // the last plain content chunk around its string (fromTemplate)

	// st is what the client has been sent, so that a follower can take
	// over at a trip (ChatState) without following every stream.
	st ChatState

	trip *RepeatTrip
}

// ChatState is what the client has been sent of a chat stream: enough to
// start a ChatResume that continues it (NewChatResumeFrom).
type ChatState struct {
	ID, Model, Created                          []byte
	Content, Reasoning                          []byte
	RoleSent, ToolCall, Multi, Finished, Opaque bool
}

// State is what the client has been sent so far.
func (g *RepeatGuard) State() *ChatState { return &g.st }

// SetNext points the guard at a new next stage (a follower that takes over
// at a trip).
func (g *RepeatGuard) SetNext(next io.Writer) { g.next = next }

// Channels of the text.
const (
	chanContent = iota
	chanReasoning
)

// RepeatTrip is a confirmed loop.
type RepeatTrip struct {
	Reasoning bool   // the loop is in the reasoning, not the content
	Unit      string // the unit, at most 80 runes of it
	Period    int    // the unit's length in runes
	Span      int    // the run's length in runes when confirmed
	// Kept is the text the stitched chunk added to the channel (the rest
	// of the copy of the unit the client was in).
	Kept string
}

// ErrRepeat is returned by RepeatGuard.Write once a loop was confirmed.
var ErrRepeat = errors.New("repeat guard: the answer is stuck in a loop")

// NewRepeatGuard returns a guard writing into next; minSpan and maxPeriod
// as repeatguard.New takes them.
func NewRepeatGuard(next io.Writer, minSpan, maxPeriod int) *RepeatGuard {
	g := &RepeatGuard{next: next, rkey: "reasoning_content"}
	g.det[chanContent] = repeatguard.New(minSpan, maxPeriod)
	g.det[chanReasoning] = repeatguard.New(minSpan, maxPeriod)
	g.sc.reset()
	return g
}

// Config is the span and period the guard looks for.
func (g *RepeatGuard) Config() [2]int {
	s, p := g.det[0].Config()
	return [2]int{s, p}
}

// Trip is the loop confirmed, nil while none is.
func (g *RepeatGuard) Trip() *RepeatTrip { return g.trip }

// Reset readies a pooled guard for a new stream into next.
func (g *RepeatGuard) Reset(next io.Writer) {
	g.trip = nil
	g.Continue()
	g.next, g.rkey, g.sent = next, "reasoning_content", [2]int64{}
	st := &g.st
	*st = ChatState{ID: st.ID[:0], Model: st.Model[:0], Created: st.Created[:0], Content: st.Content[:0], Reasoning: st.Reasoning[:0]}
}

// Continue readies the guard for a continuation's stream, after a trip or
// a break: what it held is dropped (the client never had it), and the
// detectors start again, from the text kept after a trip, so a model that
// falls straight back into the loop is caught again.
func (g *RepeatGuard) Continue() {
	t := g.trip
	g.trip = nil
	g.pend, g.held = g.pend[:0], g.held[:0]
	g.pre, g.suf = g.pre[:0], g.suf[:0]
	g.sc.reset()
	for ch, d := range g.det {
		d.Reset()
		g.heldText[ch] = g.heldText[ch][:0]
	}
	if t != nil {
		ch := chanContent
		if t.Reasoning {
			ch = chanReasoning
		}
		g.det[ch].WriteString(t.Kept)
	}
}

// Holding reports events held back.
func (g *RepeatGuard) Holding() bool { return len(g.held) > 0 }

// Write takes stream bytes and passes on, with one write, the complete
// events that are not held.
func (g *RepeatGuard) Write(p []byte) (int, error) {
	if g.trip != nil {
		return 0, ErrRepeat
	}
	g.out = g.out[:0]
	i := 0
	for i < len(p) && g.trip == nil {
		end, done := g.sc.scan(p[i:])
		if !done {
			break
		}
		ev := p[i : i+end]
		if len(g.pend) > 0 {
			g.pend = append(g.pend, ev...)
			ev = g.pend
		}
		g.event(ev)
		g.pend = g.pend[:0]
		i += end
	}
	if g.trip == nil && i < len(p) {
		g.pend = append(g.pend, p[i:]...)
		if len(g.pend) > maxPendingEvent {
			// Framing the scanner does not see end: not followed (the
			// follower behind passes such a stream through as well).
			g.release()
			g.out = append(g.out, g.pend...)
			g.pend = g.pend[:0]
		}
	}
	if len(g.out) > 0 {
		if _, err := g.next.Write(g.out); err != nil {
			return i, err
		}
	}
	if g.trip != nil {
		return len(p), ErrRepeat
	}
	return len(p), nil
}

// Flush passes on what is held at the clean end of the upstream's stream:
// an unterminated last event and a run that never reached the span.
func (g *RepeatGuard) Flush() error {
	if g.trip != nil {
		return nil
	}
	g.out = append(g.out[:0], g.held...)
	g.out = append(g.out, g.pend...)
	g.held, g.pend = g.held[:0], g.pend[:0]
	for ch := range g.heldText {
		g.heldText[ch] = g.heldText[ch][:0]
	}
	if len(g.out) == 0 {
		return nil
	}
	_, err := g.next.Write(g.out)
	return err
}

// release queues the held events, as they came.
func (g *RepeatGuard) release() {
	if len(g.held) == 0 {
		return
	}
	g.out = append(g.out, g.held...)
	g.held = g.held[:0]
	for ch := range g.heldText {
		g.deliver(ch, g.heldText[ch])
		g.heldText[ch] = g.heldText[ch][:0]
	}
}

// deliver notes text of channel ch passed on to the client.
func (g *RepeatGuard) deliver(ch int, text []byte) {
	if len(text) == 0 {
		return
	}
	g.sent[ch] += int64(utf8.RuneCount(text))
	if ch == chanContent {
		g.st.Content = append(g.st.Content, text...)
	} else {
		g.st.Reasoning = append(g.st.Reasoning, text...)
	}
}

// event handles one complete event.
func (g *RepeatGuard) event(ev []byte) {
	data := g.eventData(ev)
	var text [2][]byte
	ok := g.chunkText(data, &text)
	if !ok {
		// Not text of choice 0 (a tool call, a finish, [DONE], usage, a
		// comment): the run, if any, ended with the text before it.
		g.release()
		g.out = append(g.out, ev...)
		return
	}
	for ch := range text {
		t := text[ch]
		if len(t) == 0 {
			continue
		}
		d := g.det[ch]
		took := d.Write(t)
		if d.Confirmed() {
			g.heldText[ch] = append(g.heldText[ch], t[:took]...)
			g.confirm(ch, data)
			return
		}
	}
	if g.det[chanContent].Holding() || g.det[chanReasoning].Holding() {
		g.held = append(g.held, ev...)
		for ch := range text {
			g.heldText[ch] = append(g.heldText[ch], text[ch]...)
		}
		return
	}
	g.release()
	g.out = append(g.out, ev...)
	for ch := range text {
		g.deliver(ch, text[ch])
	}
}

// eventData is the event's data; several data lines are joined with LF.
func (g *RepeatGuard) eventData(ev []byte) []byte {
	g.data = g.data[:0]
	n := 0
	var one []byte
	for i := 0; i < len(ev); {
		le, next := nextLine(ev, i)
		if off, ok := dataValue(ev[i:le]); ok {
			if n == 0 {
				one = ev[i+off : le]
			} else {
				if n == 1 {
					g.data = append(g.data, one...)
				}
				g.data = append(append(g.data, '\n'), ev[i+off:le]...)
			}
			n++
		}
		i = next
	}
	if n > 1 {
		return g.data
	}
	return one
}

// chunkText decodes the text of choice 0 of a chat chunk into text (into
// g.tmp); ok false for anything else: no choice 0, another choice, a tool
// call, a finish reason.
func (g *RepeatGuard) chunkText(data []byte, text *[2][]byte) bool {
	st := &g.st
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		st.Finished = true
		return false
	}
	if len(data) == 0 {
		return false
	}
	if data[0] != '{' {
		st.Opaque = true // not a chat chunk: a follower could not take over
		return false
	}
	if g.fromTemplate(data, text) {
		return true
	}
	// One pass over each object (the chunk, its choice, the delta): this
	// runs on every event of a guarded stream.
	var choices []byte
	needID := len(st.ID) == 0
	var m jsonscan.Member
	for it := jsonscan.IterObject(data, 0, false); it.Next(&m); {
		v := data[m.Vs:m.Ve]
		switch {
		case jsonscan.KeyIs(data, &m, "choices"):
			choices = v
		case !needID:
		case jsonscan.KeyIs(data, &m, "id"):
			st.ID = jsonscan.AppendStringValue(st.ID[:0], v)
		case jsonscan.KeyIs(data, &m, "model"):
			st.Model = jsonscan.AppendStringValue(st.Model[:0], v)
		case jsonscan.KeyIs(data, &m, "created"):
			st.Created = append(st.Created[:0], v...)
		}
	}
	if len(choices) == 0 || choices[0] != '[' {
		return false
	}
	it := jsonscan.IterArray(choices, 0, false)
	vs, ve, more := it.Next()
	if !more {
		return false
	}
	if _, _, second := it.Next(); second {
		st.Multi = true
		return false
	}
	choice := choices[vs:ve]
	var delta, finish []byte
	for it := jsonscan.IterObject(choice, 0, false); it.Next(&m); {
		v := choice[m.Vs:m.Ve]
		switch {
		case jsonscan.KeyIs(choice, &m, "delta"):
			delta = v
		case jsonscan.KeyIs(choice, &m, "finish_reason"):
			finish = v
		case jsonscan.KeyIs(choice, &m, "index"):
			if string(v) != "0" {
				st.Multi = true
				return false
			}
		}
	}
	var content, reasoning []byte
	tool, role := false, false
	for it := jsonscan.IterObject(delta, 0, false); it.Next(&m); {
		v := delta[m.Vs:m.Ve]
		switch {
		case jsonscan.KeyIs(delta, &m, "content"):
			content = v
		case jsonscan.KeyIs(delta, &m, "reasoning_content"), jsonscan.KeyIs(delta, &m, "reasoning"):
			if jsonscan.IsString(v) {
				reasoning = v
				g.rkey = "reasoning"
				if jsonscan.KeyIs(delta, &m, "reasoning_content") {
					g.rkey = "reasoning_content"
				}
			}
		case jsonscan.KeyIs(delta, &m, "role"):
			role = true
			st.RoleSent = st.RoleSent || jsonscan.IsString(v)
		case jsonscan.KeyIs(delta, &m, "tool_calls"), jsonscan.KeyIs(delta, &m, "function_call"):
			tool = tool || present(v)
		}
	}
	if tool {
		st.ToolCall = true
		return false
	}
	if finish != nil && string(finish) != "null" && string(finish) != `""` {
		st.Finished = true
		return false
	}
	if delta == nil {
		return false
	}
	g.tmp = jsonscan.AppendStringValue(g.tmp[:0], content)
	nc := len(g.tmp)
	g.tmp = jsonscan.AppendStringValue(g.tmp, reasoning)
	text[chanContent], text[chanReasoning] = g.tmp[:nc], g.tmp[nc:]
	if jsonscan.IsString(content) && reasoning == nil && !role {
		// A plain content chunk: the template of the next ones. content
		// is a slice of data, so its offset is what its capacity lacks.
		at := cap(data) - cap(content)
		g.pre = append(g.pre[:0], data[:at]...)
		g.suf = append(g.suf[:0], data[at+len(content):]...)
	}
	return true
}

// fromTemplate reads a chunk that is the last plain content chunk with
// only its content string changed (streams repeat every other byte of a
// chunk): the same bytes before and after one JSON string. It is then the
// same chunk as far as the guard cares, read with two comparisons and one
// string scan instead of a parse.
func (g *RepeatGuard) fromTemplate(data []byte, text *[2][]byte) bool {
	pre, suf := g.pre, g.suf
	if len(pre) == 0 || len(data) < len(pre)+len(suf)+2 || !bytes.HasPrefix(data, pre) || !bytes.HasSuffix(data, suf) {
		return false
	}
	v := data[len(pre) : len(data)-len(suf)]
	if v[0] != '"' {
		return false
	}
	if end, _, ok := jsonscan.ScanString(v, 0, false); !ok || end != len(v) {
		return false
	}
	g.tmp = jsonscan.AppendStringValue(g.tmp[:0], v)
	text[chanContent], text[chanReasoning] = g.tmp, g.tmp[len(g.tmp):]
	return true
}

// confirm ends the stream at a confirmed loop in channel ch: the held
// events are replaced by one chunk (stamped from data, the confirming
// event's) holding the text the client lacks up to the end of the copy of
// the unit it is in, and the held text of the other channel.
func (g *RepeatGuard) confirm(ch int, data []byte) {
	d := g.det[ch]
	period, span := d.Run()
	total := g.sent[ch] + int64(utf8.RuneCount(g.heldText[ch]))
	start := total - int64(span) // the run's first rune
	// The end of the first copy after start that covers what was sent.
	end := start + int64(period)
	if g.sent[ch] > end {
		end += (g.sent[ch] - end + int64(period) - 1) / int64(period) * int64(period)
	}
	end = min(end, total)
	kept := runePrefix(g.heldText[ch], int(end-g.sent[ch]))
	g.trip = &RepeatTrip{Reasoning: ch == chanReasoning, Unit: string(d.Unit(nil, 80)), Period: period, Span: span, Kept: string(kept)}

	var add [2][]byte
	add[ch] = kept
	add[1-ch] = g.heldText[1-ch]
	g.held = g.held[:0]
	if len(add[0])+len(add[1]) > 0 {
		g.out = g.appendChunk(g.out, data, add)
	}
	for c := range add {
		g.deliver(c, add[c])
		g.heldText[c] = g.heldText[c][:0]
	}
}

// appendChunk appends a chat chunk event carrying text, with the id,
// object, created, model and system_fingerprint of the chunk data.
func (g *RepeatGuard) appendChunk(dst, data []byte, text [2][]byte) []byte {
	dst = append(dst, "data: {"...)
	n := 0
	for _, k := range [...]string{"id", "object", "created", "model", "system_fingerprint"} {
		if v := jsonscan.ObjGet(bytes.TrimSpace(data), k); v != nil {
			if n > 0 {
				dst = append(dst, ',')
			}
			dst = jsonscan.AppendQuoted(dst, k)
			dst = append(append(dst, ':'), v...)
			n++
		}
	}
	if n > 0 {
		dst = append(dst, ',')
	}
	dst = append(dst, `"choices":[{"index":0,"delta":{`...)
	sep := false
	if len(text[chanReasoning]) > 0 {
		dst = jsonscan.AppendQuoted(dst, g.rkey)
		dst = append(dst, ':')
		dst = jsonscan.AppendQuoted(dst, text[chanReasoning])
		sep = true
	}
	if len(text[chanContent]) > 0 {
		if sep {
			dst = append(dst, ',')
		}
		dst = append(dst, `"content":`...)
		dst = jsonscan.AppendQuoted(dst, text[chanContent])
	}
	return append(dst, "},\"finish_reason\":null}]}\n\n"...)
}

// runePrefix is the first n runes of b.
func runePrefix(b []byte, n int) []byte {
	if n <= 0 {
		return nil
	}
	i := 0
	for ; n > 0 && i < len(b); n-- {
		_, size := utf8.DecodeRune(b[i:])
		i += size
	}
	return b[:i]
}
