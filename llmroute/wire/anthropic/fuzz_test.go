package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

func FuzzToChat(f *testing.F) {
	for _, name := range []string{"claude-code-turn1.json", "claude-code-turn2.json"} {
		f.Add(readSample(f, name), false, "")
	}
	f.Add([]byte(`{"model":"m","system":"s","messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}},{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"base64","media_type":"a","data":"b"}}]}]},{"role":"assistant","content":[{"type":"thinking","thinking":"x"},{"type":"tool_use","id":"i","name":"n","input":{"a":"\u00e9"}}]}],"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"tool","name":"f"},"thinking":{"type":"enabled","budget_tokens":5000},"stop_sequences":["x"],"stream":true}`), true, "reasoning")
	f.Add([]byte(`{"system":[{"type":"text","text":"x-anthropic-billing-header: a"},{"type":"text","text":"b"}],"messages":[]}`), false, "")
	f.Fuzz(func(t *testing.T, body []byte, effort bool, field string) {
		opt := Options{Effort: effort, ReasoningField: field}
		out, info, err := ToChat(nil, body, opt)
		if err != nil {
			if info != nil || len(out) != 0 {
				t.Fatalf("output with error %v", err)
			}
		} else {
			var chat struct {
				Messages []json.RawMessage `json:"messages"`
			}
			if !json.Valid(out) || json.Unmarshal(out, &chat) != nil || info == nil {
				t.Fatalf("ToChat(%q) = invalid %q", body, out)
			}
			sb, err := SessionBody(nil, body)
			if err != nil || !json.Valid(sb) {
				t.Fatalf("SessionBody(%q) = %q, %v", body, sb, err)
			}
		}
		if json.Valid(body) {
			if s := StripBillingBlock(nil, body); !json.Valid(s) {
				t.Fatalf("StripBillingBlock(%q) = invalid %q", body, s)
			}
		}
		if CountTokensEstimate(body) < 0 {
			t.Fatal("negative estimate")
		}
	})
}

// FuzzStream feeds arbitrary upstream bytes, split at fuzzed points, through
// the think-tag splitter and the translator: every emitted event is well
// formed, chunking never changes the output, the stream always ends with
// message_stop or an error event, and no opening think tag reaches a text delta.
func FuzzStream(f *testing.F) {
	f.Add([]byte(openAIToolStream), uint8(7))
	f.Add([]byte(deepSeekStream), uint8(1))
	f.Add([]byte(sse(`{"choices":[{"index":0,"delta":{"content":"<think>a</think>b"}}]}`, `{"error":"x"}`)), uint8(3))
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":3,\"function\":{\"arguments\":\"{\"}},{\"index\":1,\"id\":\"a\"}]}}]}\r\n\r\ndata: [DONE]"), uint8(2))
	f.Fuzz(func(t *testing.T, up []byte, step uint8) {
		// Ids the upstream did not give are random: compare without them.
		whole := randomID.ReplaceAllString(translate(t, up, len(up)+1), "ID")
		split := randomID.ReplaceAllString(translate(t, up, int(step%64)+1), "ID")
		if whole != split {
			t.Fatalf("chunking changed the output\nwhole:\n%s\nsplit:\n%s", whole, split)
		}
		if !strings.HasSuffix(whole, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") &&
			!strings.Contains(whole, "event: error\n") {
			t.Fatalf("no final event:\n%s", whole)
		}
		var text strings.Builder
		for _, line := range strings.Split(whole, "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				var ev struct {
					Delta struct{ Type, Text string }
				}
				json.Unmarshal([]byte(d), &ev)
				if ev.Delta.Type == "text_delta" {
					text.WriteString(ev.Delta.Text)
				}
			}
		}
		// A stray "</think>" outside a block is content (transform's rule);
		// an opening tag always starts reasoning.
		if strings.Contains(text.String(), "<think>") {
			t.Fatalf("think tag in text %q", text.String())
		}
	})
}

var randomID = regexp.MustCompile(`"(msg|toolu)_[0-9a-f]{24}"`)

// translate runs up through transform's think splitter and a Stream in
// pieces of n bytes.
func translate(t *testing.T, up []byte, n int) string {
	var out bytes.Buffer
	s := NewStream(&Info{}, func(ev []byte) error { checkEvent(t, ev); out.Write(ev); return nil })
	rw := transform.NewStreamRewriter(transform.ThinkSplit, func(b []byte) error { _, err := s.Write(b); return err })
	for len(up) > 0 {
		k := min(n, len(up))
		if _, err := rw.Write(up[:k]); err != nil {
			t.Fatal(err)
		}
		up = up[k:]
	}
	if err := rw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); errors.Is(err, ErrUnfinished) {
		// No finish_reason, no [DONE]: the core ends a cut stream so.
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
