package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestTranslatedAnswerOverMaxRewriteSize: a non-stream answer from a chat
// upstream larger than max_rewrite_size cannot be translated (the proxy
// would have to hold it whole): a Messages or Responses client gets an
// error in its own API's shape naming the setting, never the chat JSON. A
// stream of the same answer is translated event by event, a chat client
// gets the answer as it came, and an oversized upstream error reaches a
// Messages client in Anthropic's shape with its status.
func TestTranslatedAnswerOverMaxRewriteSize(t *testing.T) {
	text := strings.Repeat("word ", 400) // a 2 KB answer
	up := newUpstream(t, completion(text))
	conf := frontsConfig([]*fakeUpstream{up}, []bool{false})
	conf["max_rewrite_size"] = 1024
	p := startProxy(t, conf)

	read := func(resp *http.Response) (int, map[string]any, string) {
		t.Helper()
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("body is not JSON: %q", b)
		}
		return resp.StatusCode, m, string(b)
	}
	t.Run("messages", func(t *testing.T) {
		st, m, raw := read(p.postPath("/v1/messages", `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":"talk"}]}`))
		e, _ := m["error"].(map[string]any)
		if st != http.StatusBadGateway || m["type"] != "error" || e["type"] != "api_error" ||
			!strings.Contains(e["message"].(string), "max_rewrite_size") || strings.Contains(raw, "choices") {
			t.Fatalf("status %d body %s: want 502 in Anthropic's error shape naming max_rewrite_size", st, raw)
		}
	})
	t.Run("responses", func(t *testing.T) {
		st, m, raw := read(p.postPath("/v1/responses", `{"model":"m","input":"talk"}`))
		e, _ := m["error"].(map[string]any)
		if st != http.StatusBadGateway || e["code"] != "response_too_large" ||
			!strings.Contains(e["message"].(string), "max_rewrite_size") || strings.Contains(raw, "choices") {
			t.Fatalf("status %d body %s: want 502 response_too_large naming max_rewrite_size", st, raw)
		}
	})
	t.Run("messages stream is translated", func(t *testing.T) {
		body, err := faultRead(p.postPath("/v1/messages", `{"model":"m","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"talk"}]}`))
		if err != nil || !strings.HasSuffix(body, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") || strings.Count(body, "text_delta") != 400 {
			t.Fatalf("read error %v, body %q", err, tail(body, 300))
		}
	})
	t.Run("chat passes it through", func(t *testing.T) {
		st, m, _ := read(p.chat(`{"model":"m","messages":[{"role":"user","content":"talk"}]}`))
		if ch, _ := m["choices"].([]any); st != http.StatusOK || len(ch) != 1 {
			t.Fatalf("status %d body %v", st, m)
		}
	})
	t.Run("an oversized upstream error is translated from its start", func(t *testing.T) {
		up.setHandler(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"bad tools","type":"invalid_request_error","code":"bad_tools","detail":"`+strings.Repeat("x", 4000)+`"}}`)
		})
		defer up.setHandler(completion(text))
		st, m, raw := read(p.postPath("/v1/messages", `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":"talk"}]}`))
		e, _ := m["error"].(map[string]any)
		if st != http.StatusBadRequest || m["type"] != "error" || e["type"] != "invalid_request_error" ||
			!strings.Contains(e["message"].(string), "bad tools") || len(raw) > 2048 {
			t.Fatalf("status %d body %s: want the 400 in Anthropic's shape, its text bounded", st, raw)
		}
	})
	if len(p.logEntries("translated answer larger than max_rewrite_size")) != 2 {
		t.Errorf("want one WARN per refused answer: %v", p.logEntries("translated answer larger than max_rewrite_size"))
	}
}
