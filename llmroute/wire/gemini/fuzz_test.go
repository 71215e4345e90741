package gemini

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"testing"
)

func FuzzToChat(f *testing.F) {
	for _, rq := range recordedCLI(f) {
		f.Add([]byte(rq.Body), "reasoning_content", true)
	}
	f.Add([]byte(`{"systemInstruction":"s","contents":[{"role":"model","parts":[{"functionCall":{"name":"f"}},{"text":"t","thought":true}]},{"parts":[{"functionResponse":{"name":"f","response":{"error":"x"},"parts":[{"inlineData":{"mimeType":"image/png","data":"AA"}}]}},{"fileData":{"mimeType":"image/png","fileUri":"https://x"}},{"text":"\u2028"}]}],`+
		`"tools":[{"functionDeclarations":[{"name":"f","parameters":{"type":"OBJECT","nullable":true,"properties":{"a":{"type":"ARRAY","items":{"type":"STRING"},"minItems":"2"}},"propertyOrdering":["a"]}}],"googleSearch":{}}],"toolConfig":{"functionCallingConfig":{"mode":"ANY","allowedFunctionNames":["f"]}},`+
		`"generationConfig":{"responseMimeType":"application/json","responseSchema":{"type":"STRING"},"thinkingConfig":{"thinkingBudget":3000},"stopSequences":["x"]}}`), "", false)
	f.Fuzz(func(t *testing.T, body []byte, field string, stream bool) {
		out, info, err := ToChat(nil, body, Options{ReasoningField: field, Model: "m", Stream: stream})
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Status != 400 || info != nil || len(out) != 0 {
				t.Fatalf("error %v with output %q", err, out)
			}
			if !json.Valid(ErrorBody(e.Status, e.Code, e.Message, 0)) {
				t.Fatal("invalid error body")
			}
		} else {
			var chat struct {
				Messages []struct {
					Role       string `json:"role"`
					ToolCallID string `json:"tool_call_id"`
					ToolCalls  []struct {
						ID string `json:"id"`
					} `json:"tool_calls"`
				} `json:"messages"`
			}
			if !json.Valid(out) || json.Unmarshal(out, &chat) != nil || info == nil {
				t.Fatalf("ToChat(%q) = invalid %q", body, out)
			}
			// Every call and every tool message has an id (a made-up one
			// when the body gave none).
			for _, m := range chat.Messages {
				if m.Role == "tool" && m.ToolCallID == "" {
					t.Fatalf("tool message without id in %s", out)
				}
				for _, c := range m.ToolCalls {
					if c.ID == "" {
						t.Fatalf("call without id in %s", out)
					}
				}
			}
			sb, err := SessionBody(nil, body)
			if err != nil || !json.Valid(sb) {
				t.Fatalf("SessionBody(%q) = %q, %v", body, sb, err)
			}
			again, _, _ := ToChat(nil, body, Options{ReasoningField: field, Model: "m", Stream: stream})
			if !bytes.Equal(out, again) {
				t.Fatal("two translations differ")
			}
		}
		if n, err := CountTokensEstimate(body); n < 0 || (err == nil) != (json.Valid(body) && bytes.HasPrefix(bytes.TrimSpace(body), []byte("{"))) {
			t.Fatalf("CountTokensEstimate = %d, %v", n, err)
		}
	})
}

func FuzzFromChat(f *testing.F) {
	f.Add([]byte(`{"id":"chatcmpl-9","model":"gpt-x","choices":[{"index":0,"message":{"role":"assistant","content":"a`+"\u2028"+`","reasoning_content":"r","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{\"a\":\n1}"}},{"function":{"name":"g","arguments":"[1]"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"completion_tokens_details":{"reasoning_tokens":5}}}`), true)
	f.Add([]byte(`{"choices":[{"message":{"content":[{"type":"text","text":"x"}],"refusal":"no"},"finish_reason":"length"}]}`), false)
	f.Fuzz(func(t *testing.T, chat []byte, thoughts bool) {
		out, err := FromChat(nil, chat, &Info{Model: "m", IncludeThoughts: thoughts})
		if err != nil {
			return
		}
		var r struct {
			Candidates []struct {
				Content struct {
					Parts []json.RawMessage `json:"parts"`
				} `json:"content"`
				FinishReason string `json:"finishReason"`
			} `json:"candidates"`
		}
		if !json.Valid(out) || json.Unmarshal(out, &r) != nil || len(r.Candidates) != 1 || len(r.Candidates[0].Content.Parts) == 0 || r.Candidates[0].FinishReason == "" {
			t.Fatalf("FromChat(%q) = %q", chat, out)
		}
		if bytes.Contains(out, []byte("\u2028")) || bytes.Contains(out, []byte("\u2029")) {
			t.Fatalf("raw U+2028/U+2029 in %q", out)
		}
	})
}

// madeUp matches the ids a stream makes up, which differ between runs.
var madeUp = regexp.MustCompile(`"call_[a-z0-9]{24}"|"responseId":"[0-9a-f]{16}"`)

// FuzzStream feeds arbitrary upstream bytes, split at fuzzed points: every
// event is one Google-framed line of JSON, chunking never changes the
// output, and the stream always ends with a final or an error event.
func FuzzStream(f *testing.F) {
	f.Add([]byte(toolStream), uint8(7), true)
	f.Add([]byte(deepSeekStream), uint8(1), true)
	f.Add([]byte(sse(`{"choices":[{"index":0,"delta":{"content":"a\u2028`+"\u2029"+`"}}]}`, `{"error":{"code":429,"message":"x"}}`)), uint8(3), false)
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":3,\"function\":{\"arguments\":\"{\"}},{\"index\":1,\"id\":\"a\"}]}}]}\r\n\r\ndata: [DONE]"), uint8(2), false)
	f.Fuzz(func(t *testing.T, up []byte, step uint8, thoughts bool) {
		info := &Info{Model: "m", IncludeThoughts: thoughts}
		whole := madeUp.ReplaceAllString(translate(t, up, len(up)+1, info), "ID")
		split := madeUp.ReplaceAllString(translate(t, up, int(step%64)+1, info), "ID")
		if whole != split {
			t.Fatalf("chunking changed the output\nwhole:\n%s\nsplit:\n%s", whole, split)
		}
		if !bytes.Contains([]byte(whole), []byte(`"finishReason":"`)) && !bytes.Contains([]byte(whole), []byte(`data: {"error":`)) {
			t.Fatalf("no final event:\n%s", whole)
		}
	})
}

// translate runs up through a Stream in pieces of n bytes, ending a cut
// stream with Fail as the core does.
func translate(t *testing.T, up []byte, n int, info *Info) string {
	var out bytes.Buffer
	s := NewStream(info, func(ev []byte) error { checkEvent(t, ev); out.Write(ev); return nil })
	for len(up) > 0 {
		k := min(n, len(up))
		if _, err := s.Write(up[:k]); err != nil {
			t.Fatal(err)
		}
		up = up[k:]
	}
	if err := s.Close(); errors.Is(err, ErrUnfinished) {
		if err := s.Fail("stream_interrupted", "cut"); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	if !s.Finished() {
		t.Fatal("not finished")
	}
	return out.String()
}
