package gemini

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// sse frames chat chunks the way OpenAI does.
func sse(chunks ...string) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString("data: ")
		b.WriteString(c)
		b.WriteString("\n\n")
	}
	return b.String()
}

// checkEvent fails unless ev is exactly one Google-framed event:
// "data: " + one line of valid JSON + "\r\n\r\n", no raw U+2028/U+2029.
func checkEvent(t testing.TB, ev []byte) {
	t.Helper()
	if p := eventProblem(ev); p != "" {
		t.Fatalf("%s: %q", p, ev)
	}
}

// eventProblem says what is wrong with an event, "" when nothing.
func eventProblem(ev []byte) string {
	body, ok := bytes.CutPrefix(ev, []byte("data: "))
	if !ok || !bytes.HasSuffix(body, []byte("\r\n\r\n")) {
		return "event not framed as data: …\\r\\n\\r\\n"
	}
	body = body[:len(body)-4]
	if len(body) == 0 || bytes.ContainsAny(body, "\r\n") || !json.Valid(body) || body[0] != '{' {
		return "event payload is not one line of JSON"
	}
	if bytes.Contains(body, []byte("\u2028")) || bytes.Contains(body, []byte("\u2029")) {
		return "raw U+2028/U+2029 in the event"
	}
	return ""
}

func whole(s string) []string { return []string{s} }

func bytewise(s string) []string {
	out := make([]string, len(s))
	for i := 0; i < len(s); i++ { // bytes, not runes: a rune may be split
		out[i] = s[i : i+1]
	}
	return out
}

// run feeds up in the given pieces and closes the stream.
func run(t *testing.T, up string, info *Info, split func(string) []string) string {
	t.Helper()
	var out bytes.Buffer
	s := NewStream(info, func(ev []byte) error { checkEvent(t, ev); out.Write(ev); return nil })
	for _, p := range split(up) {
		if _, err := s.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !s.Finished() {
		t.Fatal("not finished after Close")
	}
	return out.String()
}

// toolStream is a chat stream in OpenAI's shapes: role chunk, text, two
// parallel tool calls (arguments in fragments), finish_reason, the
// include_usage chunk, [DONE].
var toolStream = sse(
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"content":"Checking"},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"content":" both."},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \"Paris\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"city\": "}}]},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"Rome\\u2028\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}`,
	`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":40,"total_tokens":160,"prompt_tokens_details":{"cached_tokens":100}}}`,
	`[DONE]`,
)

func ev(json string) string { return "data: " + json + "\r\n\r\n" }

const tail = `,"modelVersion":"gpt-x","responseId":"chatcmpl-9"}`

var wantToolEvents = ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":"Checking"}]},"index":0}]`+tail) +
	ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":" both."}]},"index":0}]`+tail) +
	ev(`{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"id":"call_a","name":"get_weather","args":{"city":"Paris"}}},{"functionCall":{"id":"call_b","name":"get_weather","args":{"city":"Rome\u2028"}}}]},"finishReason":"STOP","index":0}],`+
		`"usageMetadata":{"promptTokenCount":120,"candidatesTokenCount":40,"totalTokenCount":160,"cachedContentTokenCount":100}`+tail)

// deepSeekStream reasons first, reports usage in the finish chunk and sends
// no [DONE].
var deepSeekStream = sse(
	`{"id":"ds-1","object":"chat.completion.chunk","model":"deepseek-reasoner","choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":""},"finish_reason":null}]}`,
	`{"id":"ds-1","object":"chat.completion.chunk","model":"deepseek-reasoner","choices":[{"index":0,"delta":{"content":null,"reasoning_content":"The user greets."},"finish_reason":null}]}`,
	`{"id":"ds-1","object":"chat.completion.chunk","model":"deepseek-reasoner","choices":[{"index":0,"delta":{"content":"Hello","reasoning_content":null},"finish_reason":null}]}`,
	`{"id":"ds-1","object":"chat.completion.chunk","model":"deepseek-reasoner","choices":[{"index":0,"delta":{"content":"!","reasoning_content":null},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16,"completion_tokens_details":{"reasoning_tokens":4}}}`,
)

const dsTail = `,"modelVersion":"deepseek-reasoner","responseId":"ds-1"}`

func TestStreamGolden(t *testing.T) {
	for _, tc := range []struct {
		name, up string
		info     *Info
		want     string
	}{
		{"text and two parallel calls, usage after the finish chunk", toolStream, &Info{Model: "asked"}, wantToolEvents},
		{"thoughts with includeThoughts; usage in the finish chunk", deepSeekStream, &Info{IncludeThoughts: true},
			ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":"The user greets.","thought":true}]},"index":0}]`+dsTail) +
				ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":"Hello"}]},"index":0}]`+dsTail) +
				ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":"!"}]},"index":0}]`+dsTail) +
				ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"MAX_TOKENS","index":0}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":3,"totalTokenCount":16,"thoughtsTokenCount":4}`+dsTail)},
		{"no thoughts without includeThoughts", deepSeekStream, &Info{},
			ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":"Hello"}]},"index":0}]`+dsTail) +
				ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":"!"}]},"index":0}]`+dsTail) +
				ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"MAX_TOKENS","index":0}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":3,"totalTokenCount":16,"thoughtsTokenCount":4}`+dsTail)},
		{"usage before the finish: final at [DONE] with it",
			sse(`{"id":"u","model":"m","choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`,
				`{"id":"u","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, `[DONE]`), &Info{},
			ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":"a"}]},"index":0}],"modelVersion":"m","responseId":"u"}`) +
				ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":1,"candidatesTokenCount":1,"totalTokenCount":2},"modelVersion":"m","responseId":"u"}`)},
		{"no usage at all: final at [DONE] without usageMetadata; requested model",
			sse(`{"id":"n","choices":[{"index":0,"delta":{"content":"a`+"\u2029"+`"},"finish_reason":"stop"}]}`, `[DONE]`), &Info{Model: "asked"},
			ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":"a\u2029"}]},"index":0}],"modelVersion":"asked","responseId":"n"}`) +
				ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP","index":0}],"modelVersion":"asked","responseId":"n"}`)},
		{"cut call arguments after a length finish become {}",
			sse(`{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"k","function":{"name":"f","arguments":"{\"a\":"}}]}}]}`,
				`{"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`, `[DONE]`), &Info{},
			ev(`{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"id":"k","name":"f","args":{}}}]},"finishReason":"MAX_TOKENS","index":0}],"modelVersion":"m","responseId":"c"}`)},
		{"malformed call arguments: call left out, MALFORMED_FUNCTION_CALL",
			sse(`{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"k","function":{"name":"f","arguments":"{\"a\":"}}]}}]}`,
				`{"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`, `[DONE]`), &Info{},
			ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"MALFORMED_FUNCTION_CALL","index":0}],"modelVersion":"m","responseId":"c"}`)},
		{"chunks of choice 1 and junk ignored; CRLF framing",
			strings.ReplaceAll(sse(`{"id":"i","model":"m","choices":[{"index":1,"delta":{"content":"other"}},{"index":0,"delta":{"content":"mine"}}]}`, `not json`,
				`{"id":"i","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`), "\n", "\r\n") + ": comment\r\n\r\ndata: [DONE]\r\n\r\n", &Info{},
			ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":"mine"}]},"index":0}],"modelVersion":"m","responseId":"i"}`) +
				ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP","index":0}],"modelVersion":"m","responseId":"i"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, sp := range []struct {
				name  string
				split func(string) []string
			}{{"whole", whole}, {"bytewise", bytewise}} {
				if got := run(t, tc.up, tc.info, sp.split); got != tc.want {
					t.Errorf("%s:\n got:\n%s\nwant:\n%s", sp.name, got, tc.want)
				}
			}
		})
	}
}

// Only [DONE]: one final event, so the SDK sees a normal, empty answer.
func TestStreamOnlyDone(t *testing.T) {
	got := run(t, "data: [DONE]\n\n", &Info{Model: "asked"}, whole)
	want := `data: {"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP","index":0}],"modelVersion":"asked","responseId":"ID"}` + "\r\n\r\n"
	if randomID.ReplaceAllString(got, `"responseId":"ID"`) != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

// An {"error":…} chunk becomes Google's error event and ends the stream.
func TestStreamErrorChunk(t *testing.T) {
	for _, tc := range []struct{ chunk, want string }{
		{`{"error":{"message":"overloaded","type":"server_error","code":503}}`,
			`{"error":{"code":503,"message":"overloaded","status":"UNAVAILABLE","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"server_error","domain":"llm_route"}]}}`},
		{`{"error":{"message":"bad","code":"context_length_exceeded"}}`,
			`{"error":{"code":500,"message":"bad","status":"INTERNAL","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"context_length_exceeded","domain":"llm_route"}]}}`},
		{`{"error":"plain"}`, `{"error":{"code":500,"message":"plain","status":"INTERNAL"}}`},
	} {
		up := sse(`{"id":"e","model":"m","choices":[{"index":0,"delta":{"content":"a"}}]}`, tc.chunk, `{"id":"e","model":"m","choices":[{"index":0,"delta":{"content":"late"},"finish_reason":"stop"}]}`, `[DONE]`)
		for _, split := range []func(string) []string{whole, bytewise} {
			got := run(t, up, &Info{}, split)
			want := ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":"a"}]},"index":0}],"modelVersion":"m","responseId":"e"}`) + ev(tc.want)
			if got != want {
				t.Errorf("got:\n%s\nwant:\n%s", got, want)
			}
		}
	}
}

// Fail before a finish_reason ends with an error event (503, 504 for a
// timeout); after a finish_reason the answer is whole and gets its final
// event; after the end Fail does nothing.
func TestStreamFail(t *testing.T) {
	part := sse(`{"id":"f","model":"m","choices":[{"index":0,"delta":{"content":"half"}}]}`)
	text := ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":"half"}]},"index":0}],"modelVersion":"m","responseId":"f"}`)
	for _, tc := range []struct{ up, code, want string }{
		{part, "stream_stalled", text + ev(`{"error":{"code":503,"message":"msg","status":"UNAVAILABLE","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"stream_stalled","domain":"llm_route"}]}}`)},
		{part, "request_timeout", text + ev(`{"error":{"code":504,"message":"msg","status":"DEADLINE_EXCEEDED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"request_timeout","domain":"llm_route"}]}}`)},
		{part + sse(`{"id":"f","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`), "stream_stalled",
			text + ev(`{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP","index":0}],"modelVersion":"m","responseId":"f"}`)},
	} {
		var out bytes.Buffer
		s := NewStream(&Info{}, func(e []byte) error { checkEvent(t, e); out.Write(e); return nil })
		s.Write([]byte(tc.up))
		if err := s.Fail(tc.code, "msg"); err != nil || !s.Finished() {
			t.Fatalf("Fail = %v, finished %v", err, s.Finished())
		}
		if err := s.Fail(tc.code, "again"); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if out.String() != tc.want {
			t.Errorf("%s:\n got:\n%s\nwant:\n%s", tc.code, out.String(), tc.want)
		}
	}
}

// An emit error stops the stream; Write returns it from then on.
func TestStreamEmitError(t *testing.T) {
	boom := errors.New("client gone")
	s := NewStream(&Info{}, func([]byte) error { return boom })
	if _, err := s.Write([]byte(toolStream)); !errors.Is(err, boom) {
		t.Fatalf("Write = %v", err)
	}
	if _, err := s.Write([]byte("data: [DONE]\n\n")); !errors.Is(err, boom) {
		t.Fatalf("second Write = %v", err)
	}
	if err := s.Close(); !errors.Is(err, boom) {
		t.Fatalf("Close = %v", err)
	}
}

// A pooled Stream (Reset) gives the same events as a new one, with no
// state of the previous answer (calls, finish, usage, ids).
func TestStreamReset(t *testing.T) {
	var out bytes.Buffer
	emit := func(e []byte) error { out.Write(e); return nil }
	s := NewStream(&Info{}, emit)
	s.Write([]byte(toolStream))
	s.Close()
	out.Reset()
	s.Reset(&Info{IncludeThoughts: true}, emit)
	s.Write([]byte(deepSeekStream))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if want := run(t, deepSeekStream, &Info{IncludeThoughts: true}, whole); out.String() != want {
		t.Errorf("after Reset:\n%s\nwant:\n%s", out.String(), want)
	}
}

// Translating a stream chunk allocates nothing once the Stream's buffers
// have grown: text and thought deltas, a tool call fragment, and whole
// pooled streams after Reset.
func TestStreamZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("race detector allocates")
	}
	var n int
	emit := func(ev []byte) error { n += len(ev); return nil }
	info := &Info{Model: "m", IncludeThoughts: true}
	s := NewStream(info, emit)
	text := []byte(sse(`{"id":"chatcmpl-9","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}],"usage":null}`))
	thought := []byte(sse(`{"id":"chatcmpl-9","model":"gpt-x","choices":[{"index":0,"delta":{"reasoning_content":" hmm"}}]}`))
	call := []byte(sse(`{"id":"chatcmpl-9","model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}`))
	s.Write(text)
	half := len(text) / 2
	up := []byte(toolStream)
	for name, f := range map[string]func(){
		"text":        func() { s.Write(text) },
		"split text":  func() { s.Write(text[:half]); s.Write(text[half:]) },
		"thought":     func() { s.Write(thought) },
		"tool stream": func() { s.Reset(info, emit); s.Write(up); s.Close() },
		"call fragment": func() {
			s.Reset(info, emit)
			s.Write(call)
		},
	} {
		f()
		if a := testing.AllocsPerRun(50, f); a != 0 {
			t.Errorf("%s: %.1f allocs per run", name, a)
		}
	}
}
