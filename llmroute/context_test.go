package llmroute

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/tiktoken-go/tokenizer"

	"github.com/llm-route/caddy-llm-route/llmroute/ledger"
)

func TestIsContextLength(t *testing.T) {
	for _, c := range []struct {
		body string
		want bool
	}{
		{`{"error":{"code":"context_length_exceeded","message":"x"}}`, true},
		{`{"error":{"type":"exceed_context_size_error"}}`, true},
		{`{"error":{"message":"The request Exceeds The Available Context Size, try increasing it"}}`, true},
		{`{"message":"This model's maximum context length is 4096 tokens."}`, true},
		{`{"message":"The input (5 tokens) is longer than the model's context length (4 tokens)."}`, true},
		{`{"error":{"message":"prompt is too long: 210000 tokens > 200000 maximum"}}`, true},
		{`{"error":{"message":"Your input exceeds the context window of this model."}}`, true},
		{`{"error":{"code":"content_policy_violation","message":"rejected by the safety system"}}`, false},
		{`{"error":{"code":"invalid_request_error","message":"temperature must be at most 2"}}`, false},
		{``, false},
	} {
		if got := isContextLength([]byte(c.body)); got != c.want {
			t.Errorf("isContextLength(%s) = %v, want %v", c.body, got, c.want)
		}
	}
}

func TestEstimateTokensFields(t *testing.T) {
	base := estimateTokens([]byte(`{"model":"m","messages":[{"role":"user","content":"hello there"}]}`))
	if base.output != 0 || base.prompt <= 0 {
		t.Fatalf("base estimate %+v", base)
	}
	// The model name is not prompt.
	long := estimateTokens([]byte(`{"model":"` + strings.Repeat("m", 400) + `","messages":[{"role":"user","content":"hello there"}]}`))
	if long.prompt != base.prompt {
		t.Errorf("a long model name changed the prompt estimate: %d vs %d", long.prompt, base.prompt)
	}
	for _, key := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
		e := estimateTokens([]byte(`{"model":"m", "` + key + `" : 4096,"messages":[]}`))
		if e.output != 4096 {
			t.Errorf("%s: output %d, want 4096", key, e.output)
		}
	}
	// A nested max_tokens is not the request's.
	if e := estimateTokens([]byte(`{"model":"m","messages":[{"max_tokens":99}]}`)); e.output != 0 {
		t.Errorf("nested max_tokens read: %+v", e)
	}
	// An inline image counts a flat 1000, not its base64 length.
	img := `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` +
		strings.Repeat("QUJD", 100000) + `"}}]}]}`
	if e := estimateTokens([]byte(img)); e.prompt < 1000 || e.prompt > 1100 {
		t.Errorf("inline image estimated %d tokens, want about 1000", e.prompt)
	}
	// Escapes count as the character they stand for; non-ASCII one each.
	if e := estimateTokens([]byte(`{"messages":["\u4f60\u597d","你好"]}`)); e.prompt != 4+2 {
		t.Errorf("non-ASCII estimate %d, want 4 (one per character) + 2 (the 8-byte key)", e.prompt)
	}
}

// bpeReference counts a request's prompt with a real BPE tokenizer the way
// OpenAI documents chat token counting: every string value (roles,
// contents, names, tool arguments) tokenized, 3 tokens of framing per
// message or input item, 3 to prime the reply, and tool definitions as
// their compact JSON. The model name and the sampling parameters are not
// prompt.
func bpeReference(t *testing.T, enc tokenizer.Codec, body []byte) int {
	t.Helper()
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	count := func(s string) int {
		n, err := enc.Count(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var strs func(v any) int
	strs = func(v any) int {
		switch x := v.(type) {
		case string:
			return count(x)
		case []any:
			n := 0
			for _, e := range x {
				n += strs(e)
			}
			return n
		case map[string]any:
			n := 0
			for _, e := range x {
				n += strs(e)
			}
			return n
		}
		return 0
	}
	total := 3
	for key, raw := range req {
		var v any
		_ = json.Unmarshal(raw, &v)
		switch key {
		case "messages", "input":
			if items, ok := v.([]any); ok {
				total += 3 * len(items)
			}
			total += strs(v)
		case "system", "instructions", "prompt":
			total += strs(v)
		case "tools":
			var compact bytes.Buffer
			_ = json.Compact(&compact, raw)
			total += count(compact.String())
		}
	}
	return total
}

// TestTokenEstimateAgainstBPE measures the router's estimate against the
// cl100k and o200k BPE tokenizers (tiktoken-go, offline, vocabularies
// embedded) on real chat bodies. The bounds are the documented error of
// the heuristic (estimateTokens).
func TestTokenEstimateAgainstBPE(t *testing.T) {
	code := "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfor i := 0; i < 10; i++ {\n\t\tfmt.Println(i * i)\n\t}\n}\n"
	prose := "The quick brown fox jumps over the lazy dog. Routers decide where each request goes from their own accounting, " +
		"fail over when an upstream breaks, and reshape request bodies with declarative patches. "
	chat := func(msgs ...[2]string) []byte {
		var m []map[string]string
		for _, x := range msgs {
			m = append(m, map[string]string{"role": x[0], "content": x[1]})
		}
		b, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": m, "stream": true, "max_tokens": 1024})
		return b
	}
	// The second request of each recorded agent session (shared/samples),
	// its body kept in testdata so the test runs anywhere.
	sample := func(name string) []byte {
		b, err := os.ReadFile("testdata/samples/" + name)
		if err != nil {
			return nil
		}
		return b
	}
	history, err := os.ReadFile("transform/testdata/openrouter_history.json")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		body     []byte
		min, max float64 // estimate / reference, for both tokenizers
	}{
		{"english chat", chat(
			[2]string{"system", "You are a helpful assistant. Answer briefly and precisely."},
			[2]string{"user", strings.Repeat(prose, 20)},
			[2]string{"assistant", strings.Repeat(prose, 5)},
			[2]string{"user", "Summarise the above in three sentences, please."}), 0.8, 1.3},
		{"code chat", chat(
			[2]string{"system", "You are a coding agent."},
			[2]string{"user", "Explain this program:\n" + strings.Repeat(code, 30)},
			[2]string{"assistant", "It prints the squares of 0 to 9.\n```go\n" + strings.Repeat(code, 10) + "```"}), 0.8, 1.3},
		{"russian chat", chat(
			[2]string{"user", strings.Repeat("Маршрутизатор решает, куда отправить каждый запрос, по собственному учёту слотов. ", 30)}), 0.75, 1.35},
		{"chinese chat", chat(
			[2]string{"user", strings.Repeat("路由器根据自己的槽位计数决定每个请求发往哪里，上游出错时切换到下一个。", 30)}), 0.75, 1.35},
		{"tool-call history", history, 0.8, 1.6}, // short strings: the keys weigh
		{"claude code messages (tools)", sample("claude-code-2.1.328.messages.body.json"), 0.8, 1.2},
		{"codex responses (tools)", sample("codex-0.169.0.responses.body.json"), 0.8, 1.2},
	}
	encs := map[string]tokenizer.Codec{}
	for _, name := range []tokenizer.Encoding{tokenizer.Cl100kBase, tokenizer.O200kBase} {
		enc, err := tokenizer.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		encs[string(name)] = enc
	}
	for _, c := range cases {
		if c.body == nil {
			t.Errorf("%s: sample missing", c.name)
			continue
		}
		est := estimateTokens(c.body).prompt
		for encName, enc := range encs {
			ref := bpeReference(t, enc, c.body)
			ratio := float64(est) / float64(ref)
			t.Logf("%-30s %-11s estimate %6d  BPE %6d  ratio %.2f", c.name, encName, est, ref, ratio)
			if ratio < c.min || ratio > c.max || math.IsNaN(ratio) {
				t.Errorf("%s (%s): estimate %d vs BPE %d (ratio %.2f), want within [%.2f, %.2f]",
					c.name, encName, est, ref, ratio, c.min, c.max)
			}
		}
	}
}

func TestFittingRoutes(t *testing.T) {
	mk := func(id string, window int, long *ledger.LongSlots) target {
		return target{up: &upstream{Upstream: ledger.Upstream{ID: id, Long: long}, window: window}}
	}
	ls := &ledger.LongSlots{}
	rt := &route{name: "m", targets: []target{mk("a", 1000, ls), mk("b", 0, nil), mk("c", 8000, ls), mk("d", 1000, nil)}}
	rt.prepareFit(500)
	ids := func(r *route) string {
		if r == nil {
			return "nil"
		}
		var s []string
		for _, t := range r.targets {
			id := t.up.ID
			if t.long != nil {
				id += "+long"
			}
			s = append(s, id)
		}
		return strings.Join(s, ",")
	}
	for _, c := range []struct {
		est  tokenEstimate
		want string
	}{
		{tokenEstimate{prompt: 100}, "a,b,c,d"},
		{tokenEstimate{prompt: 400, output: 600}, "a,b,c,d"}, // exactly the window fits
		{tokenEstimate{prompt: 400, output: 601}, "b,c"},
		{tokenEstimate{prompt: 600}, "a+long,b,c+long,d"},
		{tokenEstimate{prompt: 9000}, "b"}, // b's provider has no long bound
	} {
		if got := ids(rt.fitting(c.est)); got != c.want {
			t.Errorf("fitting(%+v) = %s, want %s", c.est, got, c.want)
		}
	}
	if got := rt.fitting(tokenEstimate{prompt: 100}); got != rt {
		t.Error("a small request does not use the route itself")
	}
	none := &route{name: "n", targets: []target{mk("a", 1000, nil)}}
	none.prepareFit(0)
	if got := none.fitting(tokenEstimate{prompt: 2000}); got != nil {
		t.Errorf("no window large enough: got %s, want nil", ids(got))
	}
}
