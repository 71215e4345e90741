package transform

import "github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"

// Reasoning backfill. Some gateways in thinking mode reject a history
// whose assistant messages lack their native reasoning field, while clients
// keep reasoning in their own shapes ("reasoning" string, "reasoning_details"
// array). The backfill adds the native field from those, additively: nothing
// is removed or renamed, and only assistant messages are touched.
//
// Decisions where the spec is silent:
//   - A field that is present but "" or null counts as missing and is replaced
//     in place; with no text it is left alone, except that reasoning_empty_ok
//     turns a null (or other non-string) into "".
//   - A present non-string value (number, object, ...) counts as missing too:
//     the upstream wants a string.
//   - reasoning_details items are used when their "type" is absent, null or
//     "reasoning.text" and their "text" is a string; empty texts still take part
//     in the "\n" join. A join that yields "" is "no text".
//   - Text is joined from the raw JSON string interiors, so it is never decoded
//     or re-encoded and escapes survive as the client wrote them.
//   - When a message repeats a key, its last occurrence is the one read.

// backfillMessages appends msgs (the raw value of "messages") to dst with the
// reasoning field backfilled. Anything that isn't an array of objects is copied
// through.
func backfillMessages(dst, msgs []byte, e *RequestEdit) []byte {
	if len(msgs) == 0 || msgs[0] != '[' {
		return append(dst, msgs...)
	}
	// The field name as a JSON key, usually on the stack.
	var kbuf [64]byte
	fieldKey := jsonscan.AppendQuoted(kbuf[:0], e.ReasoningField)
	// Walk the elements by hand so each message object is scanned once: the
	// object walk in backfillOne also finds its end.
	cur := 0
	i := jsonscan.SkipWS(msgs, 1)
	if i < len(msgs) && msgs[i] == ']' {
		return append(dst, msgs...)
	}
	for i < len(msgs) {
		var end int
		if msgs[i] == '{' {
			dst, cur, end = backfillOne(dst, msgs, i, cur, e, fieldKey)
		} else {
			var ok bool
			if end, ok = jsonscan.SkipValue(msgs, i, false, 1); !ok {
				end = 0
			}
		}
		if end <= 0 {
			break // malformed: copy the rest as is
		}
		i = jsonscan.SkipWS(msgs, end)
		if i >= len(msgs) || msgs[i] != ',' {
			break
		}
		i = jsonscan.SkipWS(msgs, i+1)
	}
	return append(dst, msgs[cur:]...)
}

// backfillOne handles the message object at msgs[vs]. It appends msgs[cur:...]
// up to and including any change and returns the new copy cursor (cur itself
// when the message needs nothing) and the index past the object (0 when it is
// malformed).
func backfillOne(dst, msgs []byte, vs, cur int, e *RequestEdit, fieldKey []byte) ([]byte, int, int) {
	it := jsonscan.IterObject(msgs, vs, false)
	var m jsonscan.Member
	var role, field, reasoning, details jsonscan.Member
	role.Vs, field.Vs, reasoning.Vs, details.Vs = -1, -1, -1, -1
	lastEnd := vs + 1
	var tmp [64]byte
	for it.Next(&m) {
		lastEnd = m.Ve
		key := msgs[m.Ks:m.Ke]
		if m.Kesc {
			key = jsonscan.AppendUnescape(tmp[:0], key)
		}
		switch string(key) {
		case "role":
			role = m
		case "reasoning":
			reasoning = m
		case "reasoning_details":
			details = m
		}
		if string(key) == e.ReasoningField { // may also be one of the above
			field = m
		}
	}
	if !it.OK() {
		return dst, cur, 0
	}
	end := it.Pos()
	if role.Vs < 0 {
		return dst, cur, end
	}
	if rv := msgs[role.Vs:role.Ve]; !jsonscan.StrIs(rv, true, "assistant") {
		return dst, cur, end
	}
	// Present and non-empty: nothing to do. `""` is the only empty string.
	if field.Vs >= 0 && msgs[field.Vs] == '"' && field.Ve-field.Vs > 2 {
		return dst, cur, end
	}
	// Where the text comes from: "reasoning" or the joined details.
	useReasoning := reasoning.Vs >= 0 && reasoning.Vs != field.Vs &&
		msgs[reasoning.Vs] == '"' && reasoning.Ve-reasoning.Vs > 2
	var detailsRaw []byte
	if !useReasoning && details.Vs >= 0 && details.Vs != field.Vs {
		detailsRaw = msgs[details.Vs:details.Ve]
	}
	if !useReasoning && detailsRaw == nil && !e.ReasoningEmptyOK {
		return dst, cur, end
	}
	// Write optimistically and roll back if the details join turns out empty:
	// one walk over reasoning_details instead of a counting pass first.
	mark := len(dst)
	next := lastEnd
	if field.Vs >= 0 {
		dst = append(dst, msgs[cur:field.Vs]...)
		next = field.Ve
	} else {
		dst = append(dst, msgs[cur:lastEnd]...)
		if lastEnd > vs+1 {
			dst = append(dst, ',')
		}
		dst = append(dst, fieldKey...)
		dst = append(dst, ':')
	}
	if useReasoning {
		return append(dst, msgs[reasoning.Vs:reasoning.Ve]...), next, end
	}
	dst = append(dst, '"')
	v0 := len(dst)
	if detailsRaw != nil {
		dst = appendDetails(dst, detailsRaw)
	}
	if len(dst) == v0 { // no text ("\n" joins are never empty)
		if !e.ReasoningEmptyOK || (field.Vs >= 0 && msgs[field.Vs] == '"') {
			return dst[:mark], cur, end // nothing, or already ""
		}
	}
	return append(dst, '"'), next, end
}

// appendDetails appends the selected texts' raw string interiors joined by an
// escaped newline: concatenating valid interiors yields a valid string.
func appendDetails(dst, arr []byte) []byte {
	n := 0
	walkDetails(arr, func(interior []byte) {
		if n > 0 {
			dst = append(dst, `\n`...)
		}
		n++
		dst = append(dst, interior...)
	})
	return dst
}

// walkDetails calls f with the raw interior of every selected text of a
// reasoning_details array.
func walkDetails(arr []byte, f func(interior []byte)) {
	if len(arr) == 0 || arr[0] != '[' {
		return
	}
	it := jsonscan.IterArray(arr, 0, false)
	for {
		vs, _, more := it.Next()
		if !more {
			return
		}
		if arr[vs] != '{' {
			continue
		}
		typ, text, ok := jsonscan.TwoMembers(arr, vs, "type", "text")
		if !ok || text.Vs < 0 || arr[text.Vs] != '"' {
			continue
		}
		if typ.Vs >= 0 {
			tv := arr[typ.Vs:typ.Ve]
			if string(tv) != "null" && !jsonscan.StrIs(tv, true, "reasoning.text") {
				continue
			}
		}
		f(arr[text.Vs+1 : text.Ve-1])
	}
}
