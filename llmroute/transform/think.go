package transform

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// ThinkMode says what to do with <think>…</think> blocks that some providers
// (MiniMax, some DeepSeek deployments) put inside "content".
type ThinkMode uint8

// The think_tags modes.
const (
	// ThinkOff leaves responses untouched, byte for byte.
	ThinkOff ThinkMode = iota
	// ThinkSplit cuts think blocks out of content into reasoning_content.
	ThinkSplit
	// ThinkStrip cuts think blocks out of content and drops them.
	ThinkStrip
)

// ParseThinkMode parses a think_tags value tolerantly: "split" and "true" are
// ThinkSplit, "strip" is ThinkStrip, "off", "false" and "" are ThinkOff.
// Anything else is ThinkOff with known=false so the caller can warn. Matching
// ignores ASCII case and surrounding spaces.
func ParseThinkMode(s string) (m ThinkMode, known bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "split", "true":
		return ThinkSplit, true
	case "strip":
		return ThinkStrip, true
	case "off", "false", "":
		return ThinkOff, true
	}
	return ThinkOff, false
}

// String returns the canonical config spelling of m.
func (m ThinkMode) String() string {
	switch m {
	case ThinkSplit:
		return "split"
	case ThinkStrip:
		return "strip"
	case ThinkOff:
		return "off"
	}
	return "ThinkMode(" + strconv.Itoa(int(m)) + ")"
}

const (
	openTag  = "<think>"
	closeTag = "</think>"
)

// splitter is the incremental think-tag state machine for one choice.
//
// Semantics (the same whether the text arrives whole or in pieces):
//   - Outside a block, "<think>" opens one; inside, "</think>" closes it. Tags
//     are exact and case-sensitive. Blocks do not nest: a "<think>" inside a
//     block is reasoning text, and a "</think>" outside any block is ordinary
//     content (it is kept, not dropped).
//   - A tail that could still become the tag being looked for (a proper prefix
//     of it, so at most 7 bytes, always ASCII) is held back until the next
//     piece decides it. Since tags are ASCII, holding never splits a UTF-8
//     rune.
//   - At the end (flush) a held tail was not a tag after all: it goes to
//     wherever the text around it was going, content outside a block and
//     reasoning inside one. An unclosed block therefore makes everything after
//     "<think>" reasoning.
//   - Text is not trimmed: the "\n\n" models put after "</think>" stays in
//     content, so content+reasoning keep every non-tag byte.
type splitter struct {
	inThink bool
	nheld   uint8
	held    [7]byte
}

// tag returns the tag the splitter is looking for in its current state.
func (s *splitter) tag() string {
	if s.inThink {
		return closeTag
	}
	return openTag
}

// feed consumes text, appending content to c and think text to r. scratch is
// a reusable buffer for joining a held tail with new text; the updated buffers
// are returned.
func (s *splitter) feed(text, c, r, scratch []byte) (c2, r2, scratch2 []byte) {
	data := text
	if s.nheld > 0 {
		scratch = append(append(scratch[:0], s.held[:s.nheld]...), text...)
		data = scratch
		s.nheld = 0
	}
	for {
		tag := s.tag()
		if i := bytes.Index(data, []byte(tag)); i >= 0 {
			c, r = s.out(data[:i], c, r)
			data = data[i+len(tag):]
			s.inThink = !s.inThink
			continue
		}
		// Only a suffix starting at the last '<' can be a tag prefix, since
		// each tag holds exactly one '<', at its start.
		k := 0
		lo := len(data) - (len(tag) - 1)
		if lo < 0 {
			lo = 0
		}
		if j := bytes.LastIndexByte(data[lo:], '<'); j >= 0 {
			if tail := data[lo+j:]; strings.HasPrefix(tag, string(tail)) {
				k = len(tail)
			}
		}
		c, r = s.out(data[:len(data)-k], c, r)
		s.nheld = uint8(copy(s.held[:], data[len(data)-k:]))
		return c, r, scratch
	}
}

// flush releases a held tail at the end of the text (see splitter).
func (s *splitter) flush(c, r []byte) ([]byte, []byte) {
	c, r = s.out(s.held[:s.nheld], c, r)
	s.nheld = 0
	return c, r
}

// out appends text to content or reasoning depending on the state.
func (s *splitter) out(text, c, r []byte) ([]byte, []byte) {
	if s.inThink {
		return c, append(r, text...)
	}
	return append(c, text...), r
}

// choiceSpan is where one choice's content (and reasoning) sit in a
// chat.completion(.chunk) payload.
type choiceSpan struct {
	index     int  // choices[].index; -1 when unusable
	cs, ce    int  // content value span (a JSON string)
	cesc      bool // content has escapes
	rs, re    int  // reasoning_content value span; rs < 0 when absent
	insert    int  // where a new member goes: after the parent's last value
	c0, c1    int  // new content text, in the content buffer
	r0, r1    int  // think text, in the reasoning buffer
	changed   bool // this choice needs rewriting
	addReason bool // split mode produced think text for this choice
	whole     bool // a complete message inside a stream, split on its own
}

// collectChoices parses the payload (strictly: it must be a valid JSON
// object), and appends a choiceSpan for every choice whose "delta" object
// (stream) or "message" object has a string "content". In a stream, a choice
// with a "message" and no "delta" is a whole message (MiniMax ends its streams
// with such a chat.completion frame repeating the full text) and is marked
// whole. meta receives the raw spans of id/created/model. It reports false
// when the payload isn't a valid object or carries a top-level "error" key; in
// both cases it must pass through.
func collectChoices(b []byte, stream bool, spans []choiceSpan, meta *chunkMeta) ([]choiceSpan, bool) {
	i := jsonscan.SkipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return spans, false
	}
	it := jsonscan.IterObject(b, i, true)
	var m jsonscan.Member
	choices := jsonscan.Member{Vs: -1}
	if meta != nil {
		*meta = chunkMeta{id: span{-1, -1}, created: span{-1, -1}, model: span{-1, -1}}
	}
	for it.Next(&m) {
		switch {
		case jsonscan.KeyIs(b, &m, "choices"):
			choices = m
		case jsonscan.KeyIs(b, &m, "error"):
			return spans, false
		case meta == nil:
		case jsonscan.KeyIs(b, &m, "id"):
			meta.id = span{m.Vs, m.Ve}
		case jsonscan.KeyIs(b, &m, "created"):
			meta.created = span{m.Vs, m.Ve}
		case jsonscan.KeyIs(b, &m, "model"):
			meta.model = span{m.Vs, m.Ve}
		}
	}
	if !it.OK() || jsonscan.SkipWS(b, it.Pos()) != len(b) {
		return spans, false
	}
	if choices.Vs < 0 || b[choices.Vs] != '[' {
		return spans, true
	}
	ai := jsonscan.IterArray(b, choices.Vs, false)
	for pos := 0; ; pos++ {
		vs, _, more := ai.Next()
		if !more {
			break
		}
		if b[vs] != '{' {
			continue
		}
		oi := jsonscan.IterObject(b, vs, false)
		index, delta, msg := jsonscan.Member{Vs: -1}, jsonscan.Member{Vs: -1}, jsonscan.Member{Vs: -1}
		for oi.Next(&m) {
			switch {
			case jsonscan.KeyIs(b, &m, "index"):
				index = m
			case jsonscan.KeyIs(b, &m, "message"):
				msg = m
			case stream && jsonscan.KeyIs(b, &m, "delta"):
				delta = m
			}
		}
		inObj, whole := delta, false
		if inObj.Vs < 0 || b[inObj.Vs] != '{' {
			inObj, whole = msg, stream
		}
		if inObj.Vs < 0 || b[inObj.Vs] != '{' {
			continue
		}
		cs := choiceSpan{index: pos, cs: -1, rs: -1, insert: inObj.Vs + 1, whole: whole}
		if index.Vs >= 0 {
			cs.index = smallInt(b[index.Vs:index.Ve])
		}
		di := jsonscan.IterObject(b, inObj.Vs, false)
		for di.Next(&m) {
			cs.insert = m.Ve
			if jsonscan.KeyIs(b, &m, "content") {
				cs.cs, cs.ce, cs.cesc = m.Vs, m.Ve, false
				if b[m.Vs] == '"' {
					_, esc, _ := jsonscan.ScanString(b, m.Vs, false)
					cs.cesc = esc
				}
			} else if jsonscan.KeyIs(b, &m, "reasoning_content") {
				cs.rs, cs.re = m.Vs, m.Ve
			}
		}
		if cs.cs >= 0 && b[cs.cs] == '"' {
			spans = append(spans, cs)
		}
	}
	return spans, true
}

// smallInt parses a non-negative integer below 1<<20, else returns -1.
func smallInt(b []byte) int {
	if len(b) == 0 || len(b) > 7 {
		return -1
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	if n >= 1<<20 {
		return -1
	}
	return n
}

// applyChoices appends b with every changed choice rewritten: content replaced
// by cbuf[c0:c1]; in split mode think text rbuf[r0:r1] appended to an existing
// reasoning_content string, replacing a non-string one, or added as a new
// member at the end of the parent object.
func applyChoices(dst, b []byte, spans []choiceSpan, cbuf, rbuf []byte) []byte {
	cur := 0
	for i := range spans {
		sp := &spans[i]
		if !sp.changed {
			continue
		}
		// content and reasoning_content may come in either order; the insert
		// point is after both.
		first, second := [2]int{sp.cs, sp.ce}, [2]int{sp.rs, sp.re}
		contentFirst := sp.rs < 0 || sp.cs < sp.rs
		if !contentFirst {
			first, second = second, first
		}
		for k, seg := range [2][2]int{first, second} {
			if seg[0] < 0 {
				continue
			}
			isContent := (k == 0) == contentFirst
			if !isContent && !sp.addReason {
				continue
			}
			dst = append(dst, b[cur:seg[0]]...)
			if isContent {
				dst = jsonscan.AppendQuoted(dst, cbuf[sp.c0:sp.c1])
			} else if b[seg[0]] == '"' {
				// Existing string: keep its raw interior, add ours after it.
				dst = append(dst, b[seg[0]:seg[1]-1]...)
				dst = jsonscan.AppendEscaped(dst, rbuf[sp.r0:sp.r1])
				dst = append(dst, '"')
			} else {
				dst = jsonscan.AppendQuoted(dst, rbuf[sp.r0:sp.r1])
			}
			cur = seg[1]
		}
		if sp.addReason && sp.rs < 0 {
			dst = append(dst, b[cur:sp.insert]...)
			dst = append(dst, `,"reasoning_content":`...)
			dst = jsonscan.AppendQuoted(dst, rbuf[sp.r0:sp.r1])
			cur = sp.insert
		}
	}
	return append(dst, b[cur:]...)
}

// RewriteCompletion applies think_tags to a non-stream chat.completion body:
// for every choices[].message whose "content" is a string, think blocks are cut
// out of it; in split mode their text is appended to message.reasoning_content
// (after any existing string value, with no separator; a null or non-string
// value is replaced; a missing one is added at the end of the message), in
// strip mode it is dropped. Non-string content (multimodal parts) is left
// alone. Everything else is copied verbatim.
//
// When there is nothing to do, or body isn't a valid JSON object of that shape
// (or carries a top-level "error"), it returns body itself and changed=false;
// otherwise the rewritten body appended to dst.
func RewriteCompletion(dst, body []byte, mode ThinkMode) (out []byte, changed bool) {
	if mode != ThinkSplit && mode != ThinkStrip {
		return body, false
	}
	if !bytes.Contains(body, []byte("think")) && bytes.IndexByte(body, '\\') < 0 {
		return body, false // fast path: no tag can be present, escaped or not
	}
	var spanBuf [4]choiceSpan
	spans, ok := collectChoices(body, false, spanBuf[:0], nil)
	if !ok || len(spans) == 0 {
		return body, false
	}
	var dec, cbuf, rbuf, scratch []byte
	for i := range spans {
		sp := &spans[i]
		text := body[sp.cs+1 : sp.ce-1]
		if sp.cesc {
			d0 := len(dec)
			dec = jsonscan.AppendUnescape(dec, text)
			text = dec[d0:]
		}
		var s splitter
		sp.c0, sp.r0 = len(cbuf), len(rbuf)
		cbuf, rbuf, scratch = s.feed(text, cbuf, rbuf, scratch)
		cbuf, rbuf = s.flush(cbuf, rbuf)
		if mode == ThinkStrip {
			rbuf = rbuf[:sp.r0]
		}
		sp.c1, sp.r1 = len(cbuf), len(rbuf)
		sp.addReason = sp.r1 > sp.r0
		sp.changed = sp.addReason || !bytes.Equal(cbuf[sp.c0:sp.c1], text)
		changed = changed || sp.changed
	}
	if !changed {
		return body, false
	}
	return applyChoices(dst, body, spans, cbuf, rbuf), true
}
