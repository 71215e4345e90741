package llmroute

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// TestJudgeVerdict: one clean word is a verdict, case, white space, a
// final period and a leading think block forgiven; anything else is none.
func TestJudgeVerdict(t *testing.T) {
	answer := func(content string) []byte {
		return []byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":` + string(jsonscan.AppendQuoted(nil, content)) + `}}]}`)
	}
	for content, want := range map[string]effort{
		"high": effortHigh, "  High\n": effortHigh, "MEDIUM.": effortMedium, "low": effortLow,
		"<think>hmm</think>\n\nlow": effortLow,
		"very high":                 effortNone, "high.": effortHigh, "high..": effortNone, "hard": effortNone, "": effortNone,
		`{"effort":"high"}`: effortNone, "<think>high": effortNone, "high\nbecause": effortNone, "minimal": effortNone,
	} {
		if got := judgeVerdict(answer(content)); got != want {
			t.Errorf("answer %q: %v, want %v", content, got, want)
		}
	}
	for _, raw := range []string{`high`, `{"choices":[]}`, `{"choices":[{"message":{"content":null}}]}`, `{"choices":[{"text":"high"}]}`} {
		if got := judgeVerdict([]byte(raw)); got != effortNone {
			t.Errorf("answer %s: %v, want none", raw, got)
		}
	}
}

// TestJudgeLastUserText: each front's last user words, and the 4 KiB cut
// at a character boundary.
func TestJudgeLastUserText(t *testing.T) {
	cases := []struct {
		sh   *ruleShape
		body string
		want string
	}{
		{&chatRules, `{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c\u00e9"}]}`, "cé"},
		{&chatRules, `{"messages":[{"role":"system","content":"s"}]}`, ""},
		{&messagesRules, `{"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]}]}`, "x\ny"},
		{&responsesRules, `{"input":"just this"}`, "just this"},
		{&responsesRules, `{"input":[{"role":"user","content":[{"type":"input_text","text":"q"}]},{"role":"assistant","content":[{"type":"output_text","text":"a"}]}]}`, "q"},
		{&nativeRules, `{"prompt":"complete me"}`, "complete me"},
		{&nativeRules, `{"input":["embed me"]}`, ""},
		{&geminiRules, `{"contents":[{"role":"user","parts":[{"text":"g1"},{"inlineData":{"mimeType":"image/png","data":""}},{"text":"g2"}]},{"role":"model","parts":[{"text":"m"}]}]}`, "g1\ng2"},
		{&geminiRules, `{"contents":[{"parts":[{"text":"no role"}]}]}`, "no role"},
		{&chatRules, `{"messages":[{"role":"user","content":"u"},{"role":"tool","content":"t"}]}`, "u"},
	}
	for _, c := range cases {
		if got := string(lastUserText(c.sh, []byte(c.body))); got != c.want {
			t.Errorf("%s: %q, want %q", c.body, got, c.want)
		}
	}
	long := strings.Repeat("€", 2000) // 3 bytes each
	got := lastUserText(&chatRules, []byte(`{"messages":[{"role":"user","content":"`+long+`"}]}`))
	if len(got) > judgeMaxText || len(got) < judgeMaxText-3 || !utf8.Valid(got) {
		t.Errorf("long text cut to %d bytes, valid %v", len(got), utf8.Valid(got))
	}
}

// TestJudgeDeadlineDefault: 250ms unless the config sets one.
func TestJudgeDeadlineDefault(t *testing.T) {
	h := &Handler{metrics: getMetrics()}
	if j := h.newJudge("auto", &Judge{Model: "clf"}, nil); j.deadline != 250*time.Millisecond {
		t.Errorf("default deadline %v, want 250ms", j.deadline)
	}
	d := Duration(time.Second)
	if j := h.newJudge("auto", &Judge{Model: "clf", Deadline: &d}, nil); j.deadline != time.Second {
		t.Errorf("deadline %v, want 1s", j.deadline)
	}
}
