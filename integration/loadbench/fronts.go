package main

import (
	"bytes"
	"encoding/json"
	"strings"
)

// The Messages and Responses front scenarios (issues #11 and #12).
//
// A Messages client is served three ways: passed through to an upstream that
// speaks Messages natively (stream and non-stream), and translated to a
// chat-only upstream (stream). A Responses client is translated to the
// chat-only upstream. reverse_proxy cannot translate, so in every one of
// them it forwards the client's request untouched to the fake upstream's
// native endpoint (/v1/messages or /v1/responses), which answers what a
// native server would: the same text, in the client's own wire format.
const (
	modeMsgNative     = "msg-native"     // Messages SSE from /v1/messages
	modeMsgNonStream  = "msg-nonstream"  // one Messages JSON from /v1/messages
	modeMsgTranslated = "msg-translated" // llm_route: chat stream; plain: Messages SSE
	modeRespTransl    = "resp-translated"
	modeGeminiTransl  = "gemini-translated" // llm_route: chat stream; plain: Google's SSE

	// clientMsgModel routes to the native Messages upstream; the translated
	// scenarios ask for clientModel, whose upstream serves only chat.
	clientMsgModel = "bench-msg"
)

// frontPayloads holds the bodies of the front scenarios.
type frontPayloads struct {
	reqMsgStream, reqMsgNonStream, reqMsgTranslated, reqResp, reqGemini []byte

	msgEvents     [][]byte // the native Messages stream, one write per event
	msgStreamBody []byte   // msgEvents joined
	msgCompletion []byte   // the native non-stream Messages body
	respEvents    [][]byte // the native Responses stream
	respBody      []byte   // respEvents joined
	geminiEvents  [][]byte // the native Gemini stream (streamGenerateContent?alt=sse)
	geminiBody    []byte   // geminiEvents joined

	text string // the answer's text in every scenario
}

// newFrontPayloads builds the front bodies; pieces are the text deltas of
// the chat stream (p.events), so every scenario carries the same answer.
func newFrontPayloads(pieces []string) *frontPayloads {
	f := &frontPayloads{text: strings.Join(pieces, "")}
	turns := []map[string]any{
		{"role": "user", "content": []any{map[string]any{"type": "text", "text": "Here is the handler's hot path. " +
			"It reads the request body into a pooled buffer, parses the model, claims a slot and proxies. " +
			"Is there an obvious allocation we could avoid per request?"}}},
		{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": "Two candidates: the header " +
			"clone for the outgoing request and the per-request timer for the first-byte watchdog."}}},
		{"role": "user", "content": "MaxIdleConnsPerHost is 1024, HTTP/1.1 only. What would you measure next?"},
	}
	msg := func(model string, stream bool) []byte {
		return mustJSON(map[string]any{
			"model":      model,
			"max_tokens": 512,
			"system":     []any{map[string]any{"type": "text", "text": systemPrompt}},
			"messages":   turns,
			"stream":     stream,
		})
	}
	f.reqMsgStream = msg(clientMsgModel, true)
	f.reqMsgNonStream = msg(clientMsgModel, false)
	f.reqMsgTranslated = msg(clientModel, true)
	f.reqResp = mustJSON(map[string]any{
		"model":        clientModel,
		"instructions": systemPrompt,
		"input": []any{
			map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text",
				"text": "Is there an obvious allocation we could avoid per request in the proxy's hot path?"}}},
		},
		"stream":            true,
		"store":             false,
		"max_output_tokens": 512,
	})

	// The Messages stream as Anthropic (and llama.cpp) send it.
	ev := func(name string, data any) []byte {
		return []byte("event: " + name + "\ndata: " + string(mustJSON(data)) + "\n\n")
	}
	f.msgEvents = append(f.msgEvents,
		ev("message_start", map[string]any{"type": "message_start", "message": map[string]any{
			"id": "msg_loadbench_0001", "type": "message", "role": "assistant", "model": "upstream-model",
			"content": []any{}, "stop_reason": nil, "stop_sequence": nil,
			"usage": map[string]any{"input_tokens": 312, "output_tokens": 1}}}),
		ev("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "text", "text": ""}}),
		ev("ping", map[string]any{"type": "ping"}))
	for _, s := range pieces {
		f.msgEvents = append(f.msgEvents, ev("content_block_delta", map[string]any{"type": "content_block_delta",
			"index": 0, "delta": map[string]any{"type": "text_delta", "text": s}}))
	}
	f.msgEvents = append(f.msgEvents,
		ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}),
		ev("message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil},
			"usage": map[string]any{"output_tokens": 86}}),
		ev("message_stop", map[string]any{"type": "message_stop"}))
	f.msgStreamBody = join(f.msgEvents)
	f.msgCompletion = append(mustJSON(map[string]any{
		"id": "msg_loadbench_0001", "type": "message", "role": "assistant", "model": "upstream-model",
		"content":     []any{map[string]any{"type": "text", "text": f.text}},
		"stop_reason": "end_turn", "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 312, "output_tokens": 86},
	}), '\n')

	// The Responses stream as OpenAI sends it (what the plain proxy relays).
	seq := 0
	rev := func(typ string, fields map[string]any) []byte {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		return ev(typ, fields)
	}
	resp := func(status string, output []any) map[string]any {
		return map[string]any{"id": "resp_loadbench_0001", "object": "response", "created_at": 1700000000,
			"status": status, "model": "upstream-model", "output": output}
	}
	item := func(status, text string) map[string]any {
		content := []any{}
		if status == "completed" {
			content = []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}
		}
		return map[string]any{"id": "msg_loadbench_0001", "type": "message", "role": "assistant",
			"status": status, "content": content}
	}
	part := func(text string) map[string]any {
		return map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
	}
	f.respEvents = append(f.respEvents,
		rev("response.created", map[string]any{"response": resp("in_progress", []any{})}),
		rev("response.in_progress", map[string]any{"response": resp("in_progress", []any{})}),
		rev("response.output_item.added", map[string]any{"output_index": 0, "item": item("in_progress", "")}),
		rev("response.content_part.added", map[string]any{"output_index": 0, "content_index": 0,
			"item_id": "msg_loadbench_0001", "part": part("")}))
	for _, s := range pieces {
		f.respEvents = append(f.respEvents, rev("response.output_text.delta", map[string]any{
			"output_index": 0, "content_index": 0, "item_id": "msg_loadbench_0001", "delta": s}))
	}
	done := resp("completed", []any{item("completed", f.text)})
	done["usage"] = map[string]any{"input_tokens": 312, "output_tokens": 86, "total_tokens": 398}
	f.respEvents = append(f.respEvents,
		rev("response.output_text.done", map[string]any{"output_index": 0, "content_index": 0,
			"item_id": "msg_loadbench_0001", "text": f.text}),
		rev("response.content_part.done", map[string]any{"output_index": 0, "content_index": 0,
			"item_id": "msg_loadbench_0001", "part": part(f.text)}),
		rev("response.output_item.done", map[string]any{"output_index": 0, "item": item("completed", f.text)}),
		rev("response.completed", map[string]any{"response": done}))
	f.respBody = join(f.respEvents)

	// A Gemini CLI turn (its shape: systemInstruction with role user, a
	// thinking config) and the stream Google sends back: data-only events
	// framed with CRLF, finishReason and the usage on the last one.
	f.reqGemini = mustJSON(map[string]any{
		"contents": []any{
			map[string]any{"role": "user", "parts": []any{map[string]any{"text": "Here is the handler's hot path. " +
				"Is there an obvious allocation we could avoid per request?"}}},
			map[string]any{"role": "model", "parts": []any{map[string]any{"text": "Two candidates: the header " +
				"clone for the outgoing request and the per-request timer for the first-byte watchdog."}}},
			map[string]any{"role": "user", "parts": []any{map[string]any{"text": "MaxIdleConnsPerHost is 1024, HTTP/1.1 only. What would you measure next?"}}},
		},
		"systemInstruction": map[string]any{"role": "user", "parts": []any{map[string]any{"text": systemPrompt}}},
		"generationConfig":  map[string]any{"temperature": 0, "maxOutputTokens": 512},
	})
	gev := func(data any) []byte { return []byte("data: " + string(mustJSON(data)) + "\r\n\r\n") }
	cand := func(text string, last bool) map[string]any {
		c := map[string]any{"content": map[string]any{"role": "model", "parts": []any{map[string]any{"text": text}}}, "index": 0}
		if last {
			c["finishReason"] = "STOP"
		}
		return c
	}
	for i, s := range pieces {
		ev := map[string]any{"candidates": []any{cand(s, i == len(pieces)-1)}, "modelVersion": "upstream-model",
			"responseId": "loadbench0001"}
		if i == len(pieces)-1 {
			ev["usageMetadata"] = map[string]any{"promptTokenCount": 312, "candidatesTokenCount": 86, "totalTokenCount": 398}
		}
		f.geminiEvents = append(f.geminiEvents, gev(ev))
	}
	f.geminiBody = join(f.geminiEvents)
	return f
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// sseEvent is the part of a Messages or Responses event the checks read.
type sseEvent struct {
	Type  string `json:"type"`
	Delta json.RawMessage
}

// validateMessagesStream checks a translated Messages stream: message_start
// first, message_stop last, every event named and typed alike, and the
// text_delta texts reassembling exactly to the answer.
func validateMessagesStream(body []byte, want string) error {
	var text strings.Builder
	var types []string
	for _, raw := range bytes.Split(body, []byte("\n\n")) {
		if len(raw) == 0 {
			continue
		}
		name, data, err := splitEvent(raw)
		if err != nil {
			return err
		}
		var e sseEvent
		if err := json.Unmarshal(data, &e); err != nil || e.Type != name {
			return invalid("messages: event %q with data type %q (%v)", name, e.Type, err)
		}
		types = append(types, e.Type)
		if e.Type == "content_block_delta" {
			var d struct{ Type, Text string }
			if json.Unmarshal(e.Delta, &d) == nil && d.Type == "text_delta" {
				text.WriteString(d.Text)
			}
		}
	}
	switch {
	case len(types) < 4 || types[0] != "message_start" || types[len(types)-1] != "message_stop":
		return invalid("messages: event sequence %v", types)
	case text.String() != want:
		return invalid("messages: text %q, want %q", text.String(), want)
	}
	return nil
}

// validateResponsesStream checks a translated Responses stream: every event
// typed with increasing sequence numbers, response.created first,
// response.completed last, the output_text deltas reassembling to the answer.
func validateResponsesStream(body []byte, want string) error {
	var text strings.Builder
	var types []string
	for i, raw := range bytes.Split(bytes.TrimSuffix(body, []byte("\n\n")), []byte("\n\n")) {
		name, data, err := splitEvent(raw)
		if err != nil {
			return err
		}
		var e struct {
			Type  string `json:"type"`
			Seq   *int   `json:"sequence_number"`
			Delta string `json:"delta"`
		}
		if err := json.Unmarshal(data, &e); err != nil || e.Type != name || e.Seq == nil || *e.Seq != i {
			return invalid("responses: event %d %q: type %q, sequence_number %v (%v)", i, name, e.Type, e.Seq, err)
		}
		types = append(types, e.Type)
		if e.Type == "response.output_text.delta" {
			text.WriteString(e.Delta)
		}
	}
	switch {
	case len(types) < 4 || types[0] != "response.created" || types[len(types)-1] != "response.completed":
		return invalid("responses: event sequence %v", types)
	case text.String() != want:
		return invalid("responses: text %q, want %q", text.String(), want)
	}
	return nil
}

// validateGeminiStream checks a translated Gemini stream: every event one
// `data:` line framed as Google frames it (CRLF CRLF: the Google SDKs' stream
// readers take nothing else), candidates' text parts reassembling to the
// answer, finishReason only on the last event.
func validateGeminiStream(body []byte, want string) error {
	if !bytes.HasSuffix(body, []byte("\r\n\r\n")) {
		return invalid("gemini: stream does not end with CRLF CRLF: %.60q", body[max(0, len(body)-60):])
	}
	var text strings.Builder
	evs := bytes.Split(bytes.TrimSuffix(body, []byte("\r\n\r\n")), []byte("\r\n\r\n"))
	for i, raw := range evs {
		data, ok := bytes.CutPrefix(raw, []byte("data: "))
		if !ok || bytes.ContainsAny(data, "\r\n") {
			return invalid("gemini: event %d not one `data:` line: %.60q", i, raw)
		}
		var e struct {
			Candidates []struct {
				Content struct {
					Parts []struct {
						Text    string `json:"text"`
						Thought bool   `json:"thought"`
					} `json:"parts"`
				} `json:"content"`
				FinishReason string `json:"finishReason"`
			} `json:"candidates"`
		}
		if err := json.Unmarshal(data, &e); err != nil || len(e.Candidates) != 1 {
			return invalid("gemini: event %d: %d candidates (%v)", i, len(e.Candidates), err)
		}
		c := e.Candidates[0]
		if last := i == len(evs)-1; (c.FinishReason != "") != last {
			return invalid("gemini: event %d of %d has finishReason %q", i, len(evs), c.FinishReason)
		}
		for _, part := range c.Content.Parts {
			if !part.Thought {
				text.WriteString(part.Text)
			}
		}
	}
	if text.String() != want {
		return invalid("gemini: text %q, want %q", text.String(), want)
	}
	return nil
}

// splitEvent reads `event: name\ndata: json` (the only shape these fronts
// send).
func splitEvent(raw []byte) (name string, data []byte, err error) {
	head, data, ok := bytes.Cut(raw, []byte("\n"))
	n, ok2 := bytes.CutPrefix(head, []byte("event: "))
	data, ok3 := bytes.CutPrefix(data, []byte("data: "))
	if !ok || !ok2 || !ok3 || bytes.IndexByte(data, '\n') >= 0 {
		return "", nil, invalid("event not `event:` + one `data:` line: %.60q", raw)
	}
	return string(n), data, nil
}

// frontPath is the client path of a scenario's mode.
func frontPath(mode string) string {
	switch mode {
	case modeMsgNative, modeMsgNonStream, modeMsgTranslated:
		return "/v1/messages"
	case modeRespTransl:
		return "/v1/responses"
	case modeGeminiTransl:
		return geminiPath
	}
	return "/v1/chat/completions"
}

// geminiPath is the Gemini scenario's client path, as the Google SDKs build
// it for the model clientModel.
const geminiPath = "/v1beta/models/" + clientModel + ":streamGenerateContent"

// frontURL is the path and query a scenario's client requests.
func frontURL(mode string) string {
	if mode == modeGeminiTransl {
		return geminiPath + "?alt=sse"
	}
	return frontPath(mode)
}

// isFrontMode reports whether mode is one of the front scenarios'.
func isFrontMode(mode string) bool { return frontPath(mode) != "/v1/chat/completions" }
