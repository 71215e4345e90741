package integration

// llm_proxy_tokens_total counts the usage the upstream reports on
// every front, native or translated, stream or not, with one meaning of
// "input" (every prompt token, cached ones included).

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// chatWithUsage answers chat completions with 20 prompt tokens (8 cached),
// 6 completion tokens (2 of them reasoning), streamed or not.
func chatWithUsage(w http.ResponseWriter, r *http.Request) {
	usage := `{"prompt_tokens":20,"completion_tokens":6,"total_tokens":26,"prompt_tokens_details":{"cached_tokens":8},"completion_tokens_details":{"reasoning_tokens":2}}`
	if !isStream(r) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-u","object":"chat.completion","created":1,"model":"real-model","choices":[{"index":0,"message":{"role":"assistant","content":"hi there"},"finish_reason":"stop"}],"usage":%s}`, usage)
		return
	}
	writeStream(w, []string{
		"data: " + chunk(`{"role":"assistant","content":"hi "}`, "") + "\n\n",
		"data: " + chunk(`{"content":"there"}`, "stop") + "\n\n",
		`data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[],"usage":` + usage + "}\n\n",
		"data: [DONE]\n\n",
	}, 0)
}

// anthropicWithUsage is a native Messages upstream reporting Anthropic's
// usage: input_tokens 12 beside 8 cache reads, 6 output tokens.
func anthropicWithUsage(w http.ResponseWriter, r *http.Request) {
	if !isStream(r) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_u","type":"message","role":"assistant","model":"real-model","content":[{"type":"text","text":"hi there"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":8,"output_tokens":6}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	ev := func(name, data string) { fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data) }
	ev("message_start", `{"type":"message_start","message":{"id":"msg_u","type":"message","role":"assistant","model":"real-model","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":8,"output_tokens":1}}}`)
	ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi there"}}`)
	ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
	ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":6}}`)
	ev("message_stop", `{"type":"message_stop"}`)
}

func TestTokensCountedOnEveryFront(t *testing.T) {
	chatUp := newUpstream(t, chatWithUsage)
	anthUp := newUpstream(t, anthropicWithUsage)
	gemUp := newUpstream(t, nativeGemini("hi there"))
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "pc", "url", chatUp.base()),
			obj("id", "pa", "url", anthUp.base(), "apis", []string{"messages"}, "auth", "x-api-key"),
			obj("id", "pg", "url", gemUp.URL+"/v1beta", "key", geminiProviderKey, "apis", []string{"gemini"}, "auth", "x-goog-api-key"),
		},
		[]map[string]any{
			obj("id", "chat-up", "provider", "pc", "model", "real-model"),
			obj("id", "anth-up", "provider", "pa", "model", "real-model"),
			obj("id", "gem-up", "provider", "pg", "model", "real-model"),
		},
		[]map[string]any{
			obj("name", "c", "upstreams", []string{"chat-up"}),
			obj("name", "a", "upstreams", []string{"anth-up"}),
			obj("name", "g", "upstreams", []string{"gem-up"}),
		},
	))
	messages := func(model string, stream bool) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":64,"stream":%v,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
	}
	responses := func(model string, stream bool) string {
		return fmt.Sprintf(`{"model":%q,"stream":%v,"input":"hi"}`, model, stream)
	}
	const gemini = `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`
	cases := []struct {
		name, path, body, upstream string
	}{
		{"chat", "/v1/chat/completions", chatBody("c", false), "chat-up"},
		{"chat stream", "/v1/chat/completions", chatBody("c", true), "chat-up"},
		{"messages translated", "/v1/messages", messages("c", false), "chat-up"},
		{"messages translated stream", "/v1/messages", messages("c", true), "chat-up"},
		{"responses translated", "/v1/responses", responses("c", false), "chat-up"},
		{"responses translated stream", "/v1/responses", responses("c", true), "chat-up"},
		{"messages native", "/v1/messages", messages("a", false), "anth-up"},
		{"messages native stream", "/v1/messages", messages("a", true), "anth-up"},
		{"gemini translated", "/v1beta/models/c:generateContent", gemini, "chat-up"},
		{"gemini translated stream", "/v1beta/models/c:streamGenerateContent?alt=sse", gemini, "chat-up"},
		{"gemini native", "/v1beta/models/g:generateContent", gemini, "gem-up"},
		{"gemini native stream", "/v1beta/models/g:streamGenerateContent?alt=sse", gemini, "gem-up"},
	}
	model := map[string]string{"chat-up": "c", "anth-up": "a", "gem-up": "g"}
	provider := map[string]string{"chat-up": "pc", "anth-up": "pa", "gem-up": "pg"}
	for _, c := range cases {
		// Every upstream reports 20 prompt tokens, 8 of them cached, and 6
		// output tokens.
		want := map[string]float64{"input": 20, "cached_input": 8, "output": 6}
		before := map[string]float64{}
		for typ := range want {
			before[typ] = p.metric("llm_proxy_tokens_total", "model", model[c.upstream], "upstream", c.upstream, "provider", provider[c.upstream], "type", typ)
		}
		resp, err := testClient.Post(p.URL+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", c.name, resp.StatusCode, body)
		}
		if !strings.Contains(body, "hi") {
			t.Fatalf("%s: body %s", c.name, body)
		}
		// The attempt records its metrics after the client has read the
		// last byte: wait for them.
		delta := func(typ string) float64 {
			return p.metric("llm_proxy_tokens_total", "model", model[c.upstream], "upstream", c.upstream, "provider", provider[c.upstream], "type", typ) - before[typ]
		}
		eventually(t, 5*time.Second, c.name+": tokens counted", func() bool { return delta("output") != 0 })
		for typ, n := range want {
			if got := delta(typ); got != n {
				t.Errorf("%s: tokens %s += %v, want %v", c.name, typ, got, n)
			}
		}
	}
}
