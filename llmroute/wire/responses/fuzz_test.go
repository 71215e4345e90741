package responses

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// FuzzToChat: never a panic; the output is a JSON object or the error is an
// *Error with a status; the answer, whole or streamed, translates with the
// Info it gave (the stream's events stay well framed: the seeds are
// pretty-printed as recorded). The Codex seeds are 39 KB: run with
// -fuzzminimizetime 3s, or the default minimization of a new input eats
// the whole -fuzztime.
func FuzzToChat(f *testing.F) {
	for _, b := range codexBodies(f) {
		f.Add(b)
	}
	f.Add([]byte(toolsBody))
	f.Add([]byte(`{"model":"m","input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}]},{"type":"function_call","call_id":"c","name":"n","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"o"}]}]}`))
	f.Add([]byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}],"text":{"format":{"type":"json_schema","schema":{}}},"tool_choice":{"type":"custom","name":"x"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, opt := range []Options{{}, {ReasoningField: "reasoning_content"}} {
			out, info, err := ToChat(nil, body, opt)
			if err != nil {
				var e *Error
				if !errors.As(err, &e) || e.Status != 400 || e.Code == "" || !json.Valid(e.Body()) {
					t.Fatalf("error %#v", err)
				}
				continue
			}
			if !json.Valid(out) || out[0] != '{' || info == nil {
				t.Fatalf("invalid chat body %q from %q", out, body)
			}
			// The answer side works with whatever the request gave.
			resp, err := FromChat(nil, []byte(`{"choices":[{"message":{"content":"x","tool_calls":[{"id":"c","function":{"name":"apply_patch","arguments":"{}"}}]}}]}`), info)
			if err != nil || !json.Valid(resp) {
				t.Fatalf("FromChat with this info: %v %q", err, resp)
			}
			// So does the stream: its events (which echo request fields)
			// stay well framed whatever the request's formatting.
			var evs []byte
			st := NewStream(info, func(ev []byte) error { evs = append(evs, ev...); return nil })
			_, _ = st.Write([]byte(chatChunk(`{"content":"x"}`, "stop") + "data: [DONE]\n\n"))
			_ = st.Close()
			parseEvents(t, evs)
		}
	})
}

// FuzzStream: any upstream bytes in any chunking give well-formed SSE with
// JSON data, increasing sequence numbers, exactly one final event, and no
// think tag that the upstream did not send inside a JSON string.
func FuzzStream(f *testing.F) {
	f.Add([]byte(chatChunk(`{"reasoning_content":"a"}`, "")+chatChunk(`{"content":"b"}`, "stop")+usageChunk+"data: [DONE]\n\n"), uint8(3))
	f.Add([]byte(chatChunk(`{"tool_calls":[{"index":0,"id":"x","function":{"name":"apply_patch","arguments":"{\"input\":\"a\\nb\\ud83d\\ude00\"}"}}]}`, "tool_calls")), uint8(1))
	f.Add([]byte(chatChunk(`{"tool_calls":[{"index":0,"function":{"name":"exec_command","arguments":"{}"}},{"index":1,"function":{"name":"crm__lookup"}}]}`, "length")), uint8(7))
	f.Add([]byte("data: {\"error\":{\"message\":\"m\"}}\n\n"), uint8(2))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n"), uint8(5))
	info := infoFor(f, toolsBody)
	f.Fuzz(func(t *testing.T, up []byte, step uint8) {
		n := int(step%64) + 1
		var out []byte
		s := NewStream(info, func(ev []byte) error { out = append(out, ev...); return nil })
		for b := up; len(b) > 0; {
			k := min(n, len(b))
			_, _ = s.Write(b[:k])
			b = b[k:]
		}
		_ = s.Close()
		if !s.Finished() {
			t.Fatal("not finished")
		}
		evs := parseEvents(t, out)
		finals := 0
		for _, e := range evs {
			switch e.name {
			case "response.completed", "response.incomplete", "response.failed":
				finals++
			}
		}
		if finals != 1 || !strings.HasPrefix(evs[len(evs)-1].name, "response.") {
			t.Fatalf("%d final events", finals)
		}
		if bytes.Contains(out, []byte("data: [DONE]")) {
			t.Fatal("[DONE] out")
		}
		if bytes.Contains(out, []byte("<think")) && !bytes.Contains(up, []byte("<think")) {
			t.Fatal("think tag made up")
		}
	})
}
