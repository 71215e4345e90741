package transform

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// ChatResume follows a chat completion stream on its way to the client so
// that, when the upstream breaks off, another upstream can finish the answer
// as one stream (mid-stream continuation).
//
// On the first upstream it passes complete events through unchanged and
// notes what the client has been sent: id, created, model, the text and
// reasoning of choice 0, whether a role chunk, a tool call, a second choice
// or a finish reason went out. An event is passed on only once it is whole,
// so a cut never leaves half an event at the client.
//
// After Continue it rewrites the continuation's events: the role chunk is
// dropped, id/created/model become those already sent, and on the replay
// path the regenerated text is held back until it has matched what was
// delivered, then only the rest goes on. A regeneration that disagrees marks
// the stream diverged and nothing more is passed on.
type ChatResume struct {
	next io.Writer
	sc   sseScanner
	pend []byte // the start of an event not yet complete
	out  []byte // rewritten events of one Write (continuation)

	// What the client has been sent.
	id, model string
	created   json.RawMessage
	content   []byte
	reasoning []byte
	roleSent  bool
	toolCall  bool // a tool call (or function_call) delta went out
	multi     bool // a choice other than 0 went out
	finished  bool // a finish_reason or [DONE] went out
	opaque    bool // the stream could not be followed: passed through as is

	// The continuation, after Continue.
	cont          bool
	dropReasoning bool // the client has its reasoning: the regenerated one is left out
	mContent      int  // bytes of content the regenerated text has matched
	mReasoning    int  // … of reasoning
	diverged      bool
}

// maxPendingEvent bounds an event held back while incomplete; a stream with
// longer events (or framing the scanner does not see end) is passed through
// as is and not continued.
const maxPendingEvent = 1 << 20

// ErrDiverged is returned by Write once the regenerated text disagreed with
// what the client already has.
var ErrDiverged = errors.New("resume: the regenerated answer diverged from what was delivered")

// NewChatResume returns a follower that writes into next.
func NewChatResume(next io.Writer) *ChatResume {
	c := &ChatResume{next: next}
	c.sc.reset()
	return c
}

// NewChatResumeFrom returns a follower that writes into next and takes
// over a stream another stage followed so far (RepeatGuard.State): what the
// client has been sent is st.
func NewChatResumeFrom(next io.Writer, st *ChatState) *ChatResume {
	c := NewChatResume(next)
	c.id, c.model = string(st.ID), string(st.Model)
	c.created = append(json.RawMessage(nil), st.Created...)
	c.content = append([]byte(nil), st.Content...)
	c.reasoning = append([]byte(nil), st.Reasoning...)
	c.roleSent, c.toolCall, c.multi, c.finished, c.opaque = st.RoleSent, st.ToolCall, st.Multi, st.Finished, st.Opaque
	return c
}

// Resumable reports whether the stream may be continued elsewhere, and if
// not, why: never inside a tool call, with several choices, after the answer
// finished, or on a stream that could not be followed.
func (c *ChatResume) Resumable() (ok bool, why string) {
	switch {
	case c.opaque:
		return false, "unparsed_stream"
	case c.toolCall:
		return false, "tool_call"
	case c.multi:
		return false, "several_choices"
	case c.finished:
		return false, "finished"
	case c.diverged:
		return false, "diverged"
	}
	return true, ""
}

// Content is the text of choice 0 the client has been sent.
func (c *ChatResume) Content() string { return string(c.content) }

// Delivered is how many bytes of text and reasoning the client has.
func (c *ChatResume) Delivered() int { return len(c.content) + len(c.reasoning) }

// Diverged reports a regeneration that disagreed with the delivered text.
func (c *ChatResume) Diverged() bool { return c.diverged }

// Continue readies the follower for the next upstream's stream. prefill
// says that upstream was sent the delivered text as an assistant message, so
// its text follows on directly; otherwise (replay) it regenerates the whole
// answer and must first match what was delivered. Either way, once the
// client has text, regenerated reasoning is left out: the client has the
// reasoning that led to it.
func (c *ChatResume) Continue(prefill bool) {
	c.cont = true
	c.pend = c.pend[:0]
	c.sc.reset()
	c.dropReasoning = len(c.content) > 0
	c.mContent, c.mReasoning = 0, 0
	if prefill {
		c.mContent = len(c.content)
	}
	if c.dropReasoning {
		c.mReasoning = len(c.reasoning)
	}
}

// ContinueAfterLoop readies the follower for the stream that goes on with
// an answer cut at a loop (RepeatGuard): that upstream was sent the
// delivered content as an assistant message, or, with no content yet, the
// request as it was. Its text follows on directly; its reasoning is left
// out once the client has any (it has the reasoning that led here).
func (c *ChatResume) ContinueAfterLoop() {
	c.Continue(true)
	if len(c.reasoning) > 0 {
		c.dropReasoning, c.mReasoning = true, len(c.reasoning)
	}
}

// AppendFinish appends a final chunk with the finish reason and no text,
// stamped with the id, created and model the client has, then [DONE].
func (c *ChatResume) AppendFinish(dst []byte, reason string) []byte {
	chunk := map[string]any{"object": "chat.completion.chunk",
		"choices": []any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": reason}}}
	if c.id != "" {
		chunk["id"], chunk["model"] = c.id, c.model
	}
	if len(c.created) > 0 {
		chunk["created"] = c.created
	}
	b, _ := json.Marshal(chunk)
	dst = append(dst, "data: "...)
	dst = append(dst, b...)
	return append(dst, "\n\ndata: [DONE]\n\n"...)
}

// matched reports that the regenerated answer has caught up with the
// delivered one.
func (c *ChatResume) matched() bool {
	return c.mContent >= len(c.content) && c.mReasoning >= len(c.reasoning)
}

// Write takes stream bytes, passes on the complete events (rewritten when
// continuing) with one write, and keeps the start of an incomplete one.
func (c *ChatResume) Write(p []byte) (int, error) {
	if c.opaque {
		return len(p), c.write(p)
	}
	if c.diverged {
		return 0, ErrDiverged
	}
	c.out = c.out[:0]
	i := 0
	for i < len(p) {
		end, done := c.sc.scan(p[i:])
		if !done {
			break
		}
		ev := p[i : i+end]
		if len(c.pend) > 0 {
			c.pend = append(c.pend, ev...)
			ev = c.pend
		}
		if err := c.event(ev); err != nil {
			return i, err
		}
		c.pend = c.pend[:0]
		i += end
	}
	if i < len(p) {
		c.pend = append(c.pend, p[i:]...)
	}
	if !c.cont {
		// The first upstream's bytes go on unchanged: the complete events of
		// this write (whatever was pending before, then p up to i).
		var err error
		if i > 0 {
			err = c.write(c.out)
		}
		c.out = c.out[:0]
		if err == nil && (c.opaque || len(c.pend) > maxPendingEvent) {
			// From here on bytes pass straight through: what is held first.
			c.opaque = true
			err = c.write(c.pend)
			c.pend = c.pend[:0]
		}
		return len(p), err
	}
	if len(c.pend) > maxPendingEvent {
		c.opaque = true // not continued again; what it held is dropped
		c.pend = c.pend[:0]
	}
	return len(p), c.write(c.out)
}

func (c *ChatResume) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := c.next.Write(b)
	return err
}

// Flush passes on what an upstream that ended cleanly left unterminated:
// an event that only lacks its blank line. One cut inside its data (the
// connection closed mid-event) is dropped: it is no event, and the stream
// may be continued after what the client has.
func (c *ChatResume) Flush() error {
	if len(c.pend) == 0 || c.opaque || c.diverged {
		return nil
	}
	if d := bytes.TrimSpace(eventData(c.pend)); len(d) > 0 && string(d) != "[DONE]" && !json.Valid(d) {
		c.pend = c.pend[:0]
		return nil
	}
	if !c.cont {
		err := c.write(c.pend)
		c.pend = c.pend[:0]
		return err
	}
	c.out = c.out[:0]
	if err := c.event(append(c.pend, "\n\n"...)); err != nil {
		return err
	}
	c.pend = c.pend[:0]
	return c.write(c.out)
}

// event handles one complete event (its raw bytes): noted and queued as it
// is on the first upstream, rewritten when continuing.
func (c *ChatResume) event(ev []byte) error {
	data := eventData(ev)
	if !c.cont {
		c.note(data)
		c.out = append(c.out, ev...)
		return nil
	}
	return c.rewrite(ev, data)
}

// eventData joins an event's data lines (nil for none).
func eventData(ev []byte) []byte {
	var data []byte
	n := 0
	for i := 0; i < len(ev); {
		le, next := nextLine(ev, i)
		if off, ok := dataValue(ev[i:le]); ok {
			if n > 0 {
				data = append(data, '\n')
			}
			data = append(data, ev[i+off:le]...)
			n++
		}
		i = next
	}
	return data
}

// chunkView is what the follower reads of a chat chunk.
type chunkView struct {
	ID      string          `json:"id"`
	Created json.RawMessage `json:"created"`
	Model   string          `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role             string          `json:"role"`
			Content          string          `json:"content"`
			ReasoningContent string          `json:"reasoning_content"`
			Reasoning        string          `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
			FunctionCall     json.RawMessage `json:"function_call"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

// note records what one event of the first upstream tells the client.
func (c *ChatResume) note(data []byte) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return
	}
	if string(data) == "[DONE]" {
		c.finished = true
		return
	}
	var ch chunkView
	if err := json.Unmarshal(data, &ch); err != nil {
		c.opaque = true // not a chat chunk we can follow
		return
	}
	if c.id == "" {
		c.id, c.model = ch.ID, ch.Model
		c.created = append(c.created[:0], ch.Created...)
	}
	for _, choice := range ch.Choices {
		if choice.Index != 0 {
			c.multi = true
			continue
		}
		d := &choice.Delta
		c.roleSent = c.roleSent || d.Role != ""
		c.content = append(c.content, d.Content...)
		c.reasoning = append(c.reasoning, d.ReasoningContent...)
		c.reasoning = append(c.reasoning, d.Reasoning...)
		if present(d.ToolCalls) || present(d.FunctionCall) {
			c.toolCall = true
		}
		if choice.FinishReason != nil && *choice.FinishReason != "" {
			c.finished = true
		}
	}
}

// present reports a JSON value that is there and not null or empty.
func present(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) > 0 && string(v) != "null" && string(v) != "[]" && string(v) != "{}"
}

// rewrite turns one event of the continuation into what the client gets
// (possibly nothing), queued on c.out.
func (c *ChatResume) rewrite(ev, data []byte) error {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		c.out = append(c.out, ev...) // a comment or a bare field: harmless
		return nil
	}
	if string(data) == "[DONE]" {
		if !c.matched() {
			return c.diverge()
		}
		c.finished = true
		c.out = append(c.out, "data: [DONE]\n\n"...)
		return nil
	}
	var chunk map[string]json.RawMessage
	if err := json.Unmarshal(data, &chunk); err != nil {
		return c.diverge() // not a chat chunk: cannot be matched or followed
	}
	if _, isErr := chunk["error"]; isErr {
		c.out = append(c.out, ev...) // the upstream's own error event
		return nil
	}
	keep, err := c.rewriteChoices(chunk)
	if err != nil {
		return err
	}
	if !keep {
		return nil
	}
	c.stamp(chunk)
	b, err := json.Marshal(chunk)
	if err != nil {
		return c.diverge()
	}
	c.out = append(c.out, "data: "...)
	c.out = append(c.out, b...)
	c.out = append(c.out, "\n\n"...)
	return nil
}

// stamp gives a continuation chunk the id, created and model the client
// already has (or records them when the client has none yet).
func (c *ChatResume) stamp(chunk map[string]json.RawMessage) {
	if c.id == "" {
		var ch chunkView
		if b, err := json.Marshal(chunk); err == nil && json.Unmarshal(b, &ch) == nil {
			c.id, c.model, c.created = ch.ID, ch.Model, ch.Created
		}
		return
	}
	chunk["id"], _ = json.Marshal(c.id)
	chunk["model"], _ = json.Marshal(c.model)
	if len(c.created) > 0 {
		chunk["created"] = c.created
	}
}

// rewriteChoices rewrites the choices of a continuation chunk in place and
// reports whether anything is left to send.
func (c *ChatResume) rewriteChoices(chunk map[string]json.RawMessage) (keep bool, err error) {
	raw, ok := chunk["choices"]
	if !ok || !present(raw) {
		return present(chunk["usage"]), nil // the usage chunk closes the stream
	}
	var choices []map[string]json.RawMessage
	if json.Unmarshal(raw, &choices) != nil {
		return false, c.diverge()
	}
	kept := choices[:0]
	for _, choice := range choices {
		var index int
		if json.Unmarshal(choice["index"], &index) != nil || index != 0 {
			c.multi = true
			return false, c.diverge()
		}
		send, err := c.rewriteChoice(choice)
		if err != nil {
			return false, err
		}
		if send {
			kept = append(kept, choice)
		}
	}
	if len(kept) == 0 && !present(chunk["usage"]) {
		return false, nil
	}
	chunk["choices"], _ = json.Marshal(kept)
	return true, nil
}

// rewriteChoice rewrites one choice-0 delta: role dropped when the client
// has one, reasoning dropped or matched, content matched; it reports whether
// the choice still says something.
func (c *ChatResume) rewriteChoice(choice map[string]json.RawMessage) (bool, error) {
	var delta map[string]json.RawMessage
	if d, ok := choice["delta"]; ok && present(d) {
		if json.Unmarshal(d, &delta) != nil {
			return false, c.diverge()
		}
	}
	if _, ok := delta["role"]; ok {
		if c.roleSent {
			delete(delta, "role")
		}
		c.roleSent = true
	}
	for _, k := range [...]string{"reasoning_content", "reasoning"} {
		s, ok := stringField(delta, k)
		if !ok {
			continue
		}
		if c.dropReasoning {
			delete(delta, k)
			continue
		}
		rest, ok := consume(&c.mReasoning, c.reasoning, s)
		if !ok {
			return false, c.diverge()
		}
		setString(delta, k, rest)
		c.reasoning = append(c.reasoning, rest...)
		c.mReasoning += len(rest)
	}
	if s, ok := stringField(delta, "content"); ok && s == "" {
		delete(delta, "content")
	} else if ok {
		if c.mReasoning < len(c.reasoning) {
			return false, c.diverge() // the regenerated reasoning ended early
		}
		rest, ok := consume(&c.mContent, c.content, s)
		if !ok {
			return false, c.diverge()
		}
		setString(delta, "content", rest)
		c.content = append(c.content, rest...)
		c.mContent += len(rest)
	}
	if present(delta["tool_calls"]) || present(delta["function_call"]) {
		if !c.matched() {
			return false, c.diverge()
		}
		c.toolCall = true
	}
	finish := present(choice["finish_reason"])
	if finish {
		if !c.matched() {
			return false, c.diverge()
		}
		c.finished = true
	}
	if !finish && !saysSomething(delta) {
		return false, nil
	}
	choice["delta"], _ = json.Marshal(delta)
	if delta == nil {
		choice["delta"] = json.RawMessage(`{}`)
	}
	return true, nil
}

// saysSomething reports a delta with a member that is not null or empty.
func saysSomething(delta map[string]json.RawMessage) bool {
	for _, v := range delta {
		if present(v) && string(bytes.TrimSpace(v)) != `""` {
			return true
		}
	}
	return false
}

// consume matches s against delivered[*m:]: the part of s the client
// already has must be equal to it; what goes beyond is returned. ok false
// means the texts disagree.
func consume(m *int, delivered []byte, s string) (rest string, ok bool) {
	left := delivered[*m:]
	k := min(len(s), len(left))
	if string(left[:k]) != s[:k] {
		return "", false
	}
	*m += k
	return s[k:], true
}

// stringField reads a string member of a delta; a missing or null one is
// not there.
func stringField(m map[string]json.RawMessage, k string) (string, bool) {
	raw, ok := m[k]
	if !ok || string(bytes.TrimSpace(raw)) == "null" {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// setString sets (or, for "", removes) a string member of a delta.
func setString(m map[string]json.RawMessage, k, s string) {
	if s == "" {
		delete(m, k)
		return
	}
	m[k], _ = json.Marshal(s)
}

func (c *ChatResume) diverge() error {
	c.diverged = true
	c.out = c.out[:0] // nothing of a diverged read reaches the client
	return ErrDiverged
}
